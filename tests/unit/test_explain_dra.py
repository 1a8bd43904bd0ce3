"""``hami explain`` on a pod that uses DRA claims: the DRA explanation, not an extender verdict."""

from hami.core import SchedulerConfig
from hami.node.nvml import PhysicalGPU
from hami.dra.explain import explain_pod
from hami.dra.model import MIB, SliceSettings, resource_slice
from hami.scheduler.explain import render
from hami.scheduler.state import ClusterState
from hami.vendors import build_vendors

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
SLICE = resource_slice("n1", [PhysicalGPU(0, "GPU-a", "Tesla T4", 15360, "", 0)], SliceSettings(split_count=4))
WHOLE = {
    "metadata": {"namespace": "team", "name": "whole"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "whole-gpu.hami.io"}}]}},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "driver": "gpu.hami.io",
                        "pool": "n1",
                        "device": "gpu-0",
                        "consumedCapacity": {"memory": str(15360 * MIB), "cores": "0", "shares": "1"},
                    }
                ]
            }
        }
    },
}
SHARE = {
    "metadata": {"namespace": "team", "name": "share-gpu"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.hami.io",
                        "capacity": {"requests": {"memory": "100Mi", "cores": "1"}},
                    },
                }
            ]
        }
    },
}


def dra_pod(extra_limits=None):
    res = {"claims": [{"name": "gpu"}]}
    if extra_limits:
        res["limits"] = extra_limits
    return {
        "metadata": {"name": "share", "namespace": "team", "uid": "u1"},
        "spec": {
            "schedulerName": "default-scheduler",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
            "containers": [{"name": "main", "resources": res}],
        },
        "status": {"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "share-gpu"}]},
    }


def test_a_dra_pod_gets_the_dra_explanation_and_no_extender_verdict():
    state = ClusterState(CFG)
    out = render(dra_pod(), state, [], 0.0, ([SLICE], [WHOLE, SHARE]))
    assert "It uses DRA ResourceClaims" in out and "hami dra --explain team/share" in out
    assert "  n1/gpu-0: memory 15360/15360 MiB, cores 0/100, shares 1/4 -> memory 100 MiB short" in out
    assert "fits on none" not in out and "requests no device" not in out
    for line in explain_pod(dra_pod(), [SLICE], [WHOLE, SHARE]):
        assert f"  {line}" in out


def test_a_dra_pod_that_also_asks_the_extender_gets_both_and_unreadable_claims_are_said():
    state = ClusterState(CFG)
    out = render(dra_pod({"nvidia.com/gpu": 1}), state, [], 0.0, None)
    assert "could not be read" in out and "It also asks for devices through the extender" in out
    assert "fits on none of the 0 nodes" in out


def test_an_extender_pod_is_explained_as_before():
    state = ClusterState(CFG)
    pod = {
        "metadata": {"name": "p", "namespace": "team", "uid": "u2"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        "status": {"phase": "Pending"},
    }
    out = render(pod, state, [], 0.0)
    assert "DRA" not in out and "fits on none of the 0 nodes" in out


def test_explain_pod_says_where_a_claim_is_allocated_and_which_is_not_created_yet():
    p = dra_pod()
    p["spec"]["resourceClaims"].append({"name": "later", "resourceClaimTemplateName": "t"})
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "whole"}]
    lines = explain_pod(p, [SLICE], [WHOLE, SHARE])
    assert lines[0] == "pod team/share: node (none)"
    assert "claim whole: allocated on n1/gpu-0" in lines
    assert any(line.startswith("claim later: not created yet") for line in lines)
    assert explain_pod(p, [], [])[1] == "no gpu.hami.io GPU is published"
