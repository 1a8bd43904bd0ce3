"""``decisionWrite: filter`` (HAMi's way: Filter patches its decision onto the pod): the patch is
made only while the pod is the pending pod Filter decided for. A cache that lags (a Binding that
landed late, a new leader's watch) lets Filter decide again for a pod already bound; the patch
then carries the resourceVersion of the copy it was built from, so the API server refuses it
(409) on a pod that changed since, the pod is read again, and a bound (or re-created) pod gets no
new decision: the reservation goes, the cache learns where the pod really is."""

from __future__ import annotations

from typing import Any

import pytest

from hami.kube.client import KubeError
from hami.scheduler.extender import DecisionMissing
from hami.scheduler.server import SchedulerService

from .test_scheduler_extender import FakeDecisionApi, _decision_setup, args
from .test_scheduler_state import pod


class _Api(FakeDecisionApi):
    """As FakeDecisionApi, and a patch naming a resourceVersion is refused (409) unless the pod
    is at that version, as the API server does."""

    async def merge_patch(self, path: str, body: Any) -> Any:
        if "/pods/" in path:
            p = self.pods.get(path.rsplit("/", 1)[1])
            want = (body.get("metadata") or {}).get("resourceVersion")
            if p is None:
                raise KubeError("PATCH", path, 404, "{}")
            if want is not None and want != p["metadata"]["resourceVersion"]:
                raise KubeError("PATCH", path, 409, '{"reason": "Conflict"}')
        return await super().merge_patch(path, body)


def _setup(*names: str) -> tuple[SchedulerService, _Api]:
    return _decision_setup("filter", *names, api_class=_Api)


def _bind(name: str, node_name: str) -> dict:
    return {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": node_name}


def _mem(svc: SchedulerService, name: str) -> list[int]:
    return [m for _, _, m, _ in svc.state.ledger.device_usage(name)]


async def test_a_second_filter_of_a_pod_whose_binding_the_cache_missed_patches_nothing_onto_it():
    """Pod a is placed on n1 and bound (the Binding lands, the watch does not show it yet). A
    second Filter (kube-scheduler retried: its Bind's answer was lost) decides n2 from the stale
    cache: its patch must not rewrite the bound pod's grant (it said n2 on a pod running on n1,
    n1's share looked free). The refusal rolls the reservation back and the cache learns the
    binding."""
    svc, api = _setup("a")
    ext = svc.extender
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1"])))["NodeNames"] == ["n1"]
    await ext.decision_recorded("ns", "a")
    assert await ext.bind(_bind("a", "n1")) == {"Error": ""}
    granted = dict(api.pods["a"]["metadata"]["annotations"])
    assert api.pods["a"]["spec"]["nodeName"] == "n1"
    assert not (svc.state.pod("ns", "a") or {}).get("spec", {}).get("nodeName")  # the watch lags

    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n2"])))["NodeNames"] == ["n2"]
    with pytest.raises(DecisionMissing, match="already bound to node n1"):
        await ext.decision_recorded("ns", "a")
    assert api.pods["a"]["metadata"]["annotations"] == granted  # nothing written onto the bound pod
    assert len(api.pod_patches) == 1
    assert svc.state.pod("ns", "a")["spec"]["nodeName"] == "n1"  # the cache caught up
    assert _mem(svc, "n1") == [600] and _mem(svc, "n2") == [0]
    answer = await ext.bind(_bind("a", "n2"))
    assert "already bound to node n1" in answer["Error"] and len(api.bindings) == 1


async def test_a_pod_recreated_under_the_same_name_gets_no_decision_of_its_predecessor():
    """The pod Filter decided for was deleted and created again (same name, new UID) before the
    patch went out: the decision is not written onto the newcomer."""
    svc, api = _setup("a")
    ext = svc.extender
    newcomer = pod("a", mem=600, uid="uid-a2")
    newcomer["metadata"]["resourceVersion"] = "7"
    real_merge = api.merge_patch

    async def recreated_first(path: str, body: Any) -> Any:
        if "/pods/" in path:
            api.pods["a"] = newcomer
        return await real_merge(path, body)

    api.merge_patch = recreated_first
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1"])))["NodeNames"] == ["n1"]
    with pytest.raises(DecisionMissing, match="uid-a2"):
        await ext.decision_recorded("ns", "a")
    assert api.pods["a"]["metadata"]["annotations"] == {} and api.pod_patches == []
    assert not svc.state.ledger.is_reserved("uid-a") and _mem(svc, "n1") == [0]


async def test_a_refilter_whose_earlier_patch_landed_is_written_on_the_version_it_made():
    """Patches of one pod are chained: the second is made on the version the first left (from the
    cache, or read again after a 409), not refused for it."""
    svc, api = _setup("a")
    ext = svc.extender
    sent = svc.state.pod("ns", "a")
    assert (await ext.filter(args(sent, ["n1"])))["NodeNames"] == ["n1"]
    assert (await ext.filter(args(sent, ["n2"])))["NodeNames"] == ["n2"]
    await ext.decision_recorded("ns", "a")
    assert api.pods["a"]["metadata"]["annotations"]["hami.io/vgpu-node"] == "n2"
    assert len(api.pod_patches) == 2
    assert await ext.bind(_bind("a", "n2")) == {"Error": ""}


async def test_a_deposed_replica_does_not_write_its_decision_over_the_next_leaders():
    """The Lease moved while this replica's patch was refused for a stale version (the new
    leader wrote its own decision onto the pod): it is not made again over the new one."""
    svc, api = _setup("a")
    ext = svc.extender
    real_merge = api.merge_patch

    async def new_leader_first(path: str, body: Any) -> Any:
        if "/pods/" in path and not api.pod_patches:
            p = api.pods["a"]
            meta = p["metadata"]
            new = {"hami.io/vgpu-node": "n2"}
            api.pods["a"] = {**p, "metadata": {**meta, "annotations": new, "resourceVersion": "9"}}
            svc.leader.is_leader = False
        return await real_merge(path, body)

    api.merge_patch = new_leader_first
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1"])))["NodeNames"] == ["n1"]
    with pytest.raises(DecisionMissing, match="lost the lease"):
        await ext.decision_recorded("ns", "a")
    assert api.pods["a"]["metadata"]["annotations"] == {"hami.io/vgpu-node": "n2"} and api.pod_patches == []
