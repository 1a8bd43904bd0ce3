"""A namespace quota counts a pod's peak over all its GPUs together (the steady phase, or one init
container's phase with the sidecars before it), as the webhook does. Each GPU's own peak summed
over-counted a pod whose init container and app containers use different GPUs: the webhook
admitted it within the quota and the scheduler refused it ResourceQuotaNotFit on every try."""

from __future__ import annotations

from hami.core import schedule_pod
from hami.core.usage import pod_peak
from hami.core.types import ContainerKind as K
from hami.webhook.admission import AdmissionSettings, _quota_excess

from . import _corekit as kit


def _pod():
    # sidecar 1000 MiB, init 6000 MiB, app 2 x 2000 MiB: at most 7000 at once (the init phase:
    # 6000 + 1000; steady: 1000 + 4000 = 5000)
    return kit.pod(
        "a",
        [kit.ctr("app", gpu=2, mem=2000, cores=10)],
        init=[kit.ctr("side", mem=1000, cores=10, sidecar=True), kit.ctr("setup", mem=6000, cores=30)],
        ns="team",
    )


def test_pod_peak_is_the_largest_phase_over_all_devices():
    picks = [(0, "NVIDIA", "g0", 1000, 10), (1, "NVIDIA", "g1", 6000, 30), (2, "NVIDIA", "g0", 2000, 10)]
    picks.append((2, "NVIDIA", "g1", 2000, 10))
    kinds = (K.SIDECAR, K.INIT, K.APP)
    assert pod_peak(picks, kinds, "NVIDIA") == (7000, 40)
    assert pod_peak(picks, kinds, "NVIDIA", app_only=True) == (5000, 30)
    assert pod_peak(picks, kinds, "other") == (0, 0)
    assert pod_peak([(0, "N", "d", 0, 0b1011)], (K.APP,), "N", masks=True) == (0, 3)


def test_the_scheduler_places_within_the_quota_what_the_webhook_admitted():
    led = kit.ledger(kit.node("n1", 2, mem=16000))
    led.set_quota("team", "q", {"limits.nvidia.com/gpumem": "8000"}, kit.CONFIG.vendors)
    p = _pod()
    assert _quota_excess(p, AdmissionSettings(kit.CONFIG.vendors), led.quota_room) == ""  # 7000 <= 8000
    r = schedule_pod(p, None, led, kit.CONFIG, 0)
    assert r.node == "n1", r.reasons()  # was 1/1 ResourceQuotaNotFit: counted 9000
    assert led.namespace_usage("team", "NVIDIA")[0] == 7000
