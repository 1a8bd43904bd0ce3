"""AMD's cores quota is in compute units, the unit its grants record and the ledger counts: the
scheduler's fit checked a pick in percent (50 for a 50% share) while the ledger charged the grant's
CUs (152 on a 304-CU MI300X), so a namespace quota of 100 let one 50% pod in and then refused even
a 10% one. The webhook, which cannot know the CUs before a GPU is chosen, leaves that check to
the scheduler (its memory check stays)."""

from __future__ import annotations

from hami.core import rebuild, schedule_pod
from hami.webhook.admission import AdmissionSettings, _quota_excess

from ._vendorkit import NOW, admit, config, ctr, pod
from .test_vendor_amd import CORES, GPU, MEM, amd_node

CFG = config()


def _place(ledger, name: str, pct: int):
    p = admit(pod(name, [ctr(limits={GPU: 1, MEM: 1024, CORES: pct})], ns="team"), CFG)
    return schedule_pod(p, None, ledger, CFG, NOW)


def test_the_fit_counts_the_quota_in_compute_units_as_the_ledger_does():
    ledger, _ = rebuild([amd_node(n=2)], [], CFG.vendors)
    ledger.set_quota("team", "q", {"limits.amd.com/gpucores": "304"}, CFG.vendors)  # one MI300X's CUs
    first, second = _place(ledger, "a", 50), _place(ledger, "b", 50)
    assert first.node and second.node  # 152 + 152 = 304 CUs
    assert ledger.namespace_usage("team", "AMD")[1] == 304
    third = _place(ledger, "c", 1)  # 3 CUs more: over
    assert third.node is None and "ResourceQuotaNotFit" in str(third.reasons())


def test_a_share_over_the_quotas_compute_units_is_refused_before_it_is_placed():
    ledger, _ = rebuild([amd_node(n=2)], [], CFG.vendors)
    ledger.set_quota("team", "q", {"limits.amd.com/gpucores": "100"}, CFG.vendors)
    assert _place(ledger, "big", 50).node is None  # 152 CUs > 100: before, it was placed
    assert _place(ledger, "small", 10).node is not None  # 30 CUs
    assert ledger.namespace_usage("team", "AMD")[1] == 30


def test_the_webhook_checks_the_memory_quota_but_not_amds_cores():
    ledger, _ = rebuild([amd_node(n=2)], [], CFG.vendors)
    ledger.set_quota("team", "q", {"limits.amd.com/gpucores": "304", "limits.amd.com/gpumem": "2048"}, CFG.vendors)
    s = AdmissionSettings(CFG.vendors)
    # 4 GPUs at 100%: 400 in percent (refused before, as if the quota were in percent), 4 x 304
    # CUs for the scheduler to refuse once it sees the GPUs
    ok = admit(pod("p", [ctr(limits={GPU: 4, MEM: 256, CORES: 100})], ns="team"), CFG)
    assert _quota_excess(ok, s, ledger.quota_room) == ""
    big = admit(pod("p", [ctr(limits={GPU: 1, MEM: 4096, CORES: 10})], ns="team"), CFG)
    assert "amd.com/gpumem" in _quota_excess(big, s, ledger.quota_room)


def test_the_cores_quota_check_of_the_core_api_leaves_amd_to_the_fit_too():
    from hami.core import pod_request, quota_admission_check

    ledger, _ = rebuild([amd_node(n=2)], [], CFG.vendors)
    ledger.set_quota("team", "q", {"limits.amd.com/gpucores": "304"}, CFG.vendors)
    p = admit(pod("p", [ctr(limits={GPU: 4, MEM: 256, CORES: 100})], ns="team"), CFG)
    assert quota_admission_check(ledger, pod_request(p, CFG.vendors), CFG.vendors) is None  # 400 "percent"
