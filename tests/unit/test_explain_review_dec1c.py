"""Found by review, 1 Dec: the explainers and the simulation ignored what keeps a pod off nodes
before any device check: a DRA pod's allocated claims (they tie it to their node) and
``spec.schedulingGates`` (kube-scheduler does not schedule a gated pod at all)."""

from __future__ import annotations

import copy

from hami.core.codec import encode_node_devices_json
from hami.core.types import DeviceInfo
from hami.dra.explain import explain_pod
from hami.dra.model import MIB, SliceSettings, resource_slice
from hami.node.nvml import PhysicalGPU
from hami.scheduler.explain import render
from hami.scheduler.state import ClusterState
from hami.sim.engine import simulate
from hami.ui import model

from ._vendorkit import config

NOW = 1.7e9
KUEUE = "kueue.x-k8s.io/admission"


# ---------------------------------------------------------------------- DRA: allocated claims tie the pod
def _slice(node: str, uuid: str) -> dict:
    return resource_slice(node, [PhysicalGPU(0, uuid, "Tesla T4", 15360, "", 0)], SliceSettings(split_count=4))


def _claim(name: str, mem_mib: int, node: str | None = None) -> dict:
    claim: dict = {
        "metadata": {"namespace": "team", "name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.hami.io",
                            "capacity": {"requests": {"memory": f"{mem_mib}Mi", "cores": "10"}},
                        },
                    }
                ]
            }
        },
    }
    if node is not None:
        claim["status"] = {
            "allocation": {
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
                "devices": {
                    "results": [
                        {
                            "driver": "gpu.hami.io",
                            "pool": node,
                            "device": "gpu-0",
                            "consumedCapacity": {"memory": str(mem_mib * MIB), "cores": "10", "shares": "1"},
                        }
                    ]
                },
            }
        }
    return claim


def _dra_pod(shared: list[str]) -> dict:
    """Pod team/p: the shared claims named, plus its own claim p-mine (from a template)."""
    refs = [{"name": f"s{i}", "resourceClaimName": c} for i, c in enumerate(shared)]
    refs.append({"name": "m", "resourceClaimTemplateName": "t"})
    return {
        "metadata": {"name": "p", "namespace": "team", "uid": "u"},
        "spec": {
            "resourceClaims": refs,
            "containers": [{"name": "c", "resources": {"claims": [{"name": r["name"]} for r in refs]}}],
        },
        "status": {"phase": "Pending", "resourceClaimStatuses": [{"name": "m", "resourceClaimName": "p-mine"}]},
    }


def test_dra_explain_searches_only_the_node_an_allocated_claim_ties_the_pod_to():
    """Found by review, 1 Dec: claim `shared` allocated on n1 (15000 MiB of its T4), the pod's own
    claim p-mine (1000 MiB) fits only on n2, but kube-scheduler keeps the pod on n1: the search
    said "n2: fits"."""
    slices = [_slice("n1", "GPU-a"), _slice("n2", "GPU-b")]
    lines = explain_pod(_dra_pod(["shared"]), slices, [_claim("shared", 15000, "n1"), _claim("p-mine", 1000)])
    search = lines[lines.index(next(x for x in lines if x.startswith("the pod's unallocated claims"))) :]
    assert not any("fits" in x for x in search[1:]), search
    n1 = next(x for x in search if x.startswith("  n1: "))
    assert "memory 640 MiB short" in n1
    n2 = next(x for x in search if x.startswith("  n2: "))
    assert "tied to node n1" in n2 and "claim shared" in n2


def test_dra_explain_says_no_node_fits_when_allocated_claims_are_on_different_nodes():
    """Found by review, 1 Dec: claims `a` on n1 and `b` on n2 allocated, both used by the pod; its
    own claim fits on either GPU alone, but no one node holds all its claims."""
    slices = [_slice("n1", "GPU-a"), _slice("n2", "GPU-b")]
    claims = [_claim("a", 1000, "n1"), _claim("b", 1000, "n2"), _claim("p-mine", 1000)]
    lines = explain_pod(_dra_pod(["a", "b"]), slices, claims)
    text = "\n".join(lines)
    assert "no node fits" in text and "claim a on n1" in text and "claim b on n2" in text
    search = lines[lines.index(next(x for x in lines if x.startswith("the pod's unallocated claims"))) :]
    assert not any(": fits" in x for x in search), search


def test_dra_explain_on_the_tied_node_still_searches_it():
    """The allocated claim's node is searched as before: room there, the pod fits there only."""
    slices = [_slice("n1", "GPU-a"), _slice("n2", "GPU-b")]
    lines = explain_pod(_dra_pod(["shared"]), slices, [_claim("shared", 2000, "n1"), _claim("p-mine", 1000)])
    assert "  n1: fits (p-mine on gpu-0)" in lines
    assert not any(x.startswith("  n2: fits") for x in lines)


# ---------------------------------------------------------------------- scheduling gates
def _node() -> dict:
    dev = DeviceInfo(
        id="GPU-0",
        index=0,
        count=10,
        devmem=16384,
        devcore=100,
        type="NVIDIA-Tesla T4",
        numa=0,
        health=True,
        vendor="NVIDIA",
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "annotations": {
                "hami.io/node-nvidia-register": encode_node_devices_json([dev]),
                "hami.io/node-handshake": "Reported 2099-01-01 00:00:00",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": "10"}, "capacity": {"nvidia.com/gpu": "10"}},
    }


def _gpu_pod(name: str, gated: bool) -> dict:
    pod: dict = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": "u-" + name},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}}}
            ],
        },
        "status": {"phase": "Pending"},
    }
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": KUEUE}]
    return pod


def _state(*pods: dict) -> ClusterState:
    st = ClusterState(config(), "hami-scheduler")
    st.node_handler.replace([_node()])
    st.pod_handler.replace([copy.deepcopy(p) for p in pods])
    return st


def test_simulate_leaves_a_gated_pod_pending_and_holding_nothing():
    """Found by review, 1 Dec: a Kueue-gated pod (10000 MiB) came first and was placed on the only
    16 GiB GPU, so the admitted pod after it was reported pending for memory."""
    r = simulate([_node()], [_gpu_pod("a-queued", True), _gpu_pod("b-admitted", False)], config())
    by_name = {o.name: o for o in r.pods}
    gated, admitted = by_name["a-queued"], by_name["b-admitted"]
    assert (gated.status, gated.node, gated.reasons) == ("pending", None, {"*": f"scheduling gated ({KUEUE})"})
    assert (admitted.status, admitted.node) == ("scheduled", "n1")


def test_hami_explain_says_a_gated_pod_is_gated_not_that_it_fits():
    """Found by review, 1 Dec: `hami explain` on a Kueue-gated pod said "It fits now"."""
    pod = _gpu_pod("a-queued", True)
    text = render(copy.deepcopy(pod), _state(pod), [], NOW)
    assert "fits now" not in text.lower()
    assert f"scheduling gated ({KUEUE})" in text
    ungated = _gpu_pod("a-queued", False)  # the same pod without the gate still fits
    assert "It fits now" in render(copy.deepcopy(ungated), _state(ungated), [], NOW)


def test_ui_pending_verdict_of_a_gated_pod_says_gated():
    """Found by review, 1 Dec: the UI's pending list said fitsNow for a Kueue-gated pod."""
    state = _state(_gpu_pod("a-queued", True))
    doc = model.pending_document(state, NOW, "hami-scheduler")
    [item] = doc["items"]
    assert (item["name"], item["fitsNow"], item["wouldChoose"], item["error"]) == ("a-queued", False, None, None)
    assert f"scheduling gated ({KUEUE})" in item["summary"]
    assert [r["memoryMiB"] for r in item["requests"]] == [10000]


def test_dra_explain_says_a_gated_pod_is_gated_instead_of_searching():
    """Found by review, 1 Dec: `hami dra --explain` of a gated DRA pod replayed the search ("fits")."""
    pod = _dra_pod([])
    pod["spec"]["schedulingGates"] = [{"name": KUEUE}]
    lines = explain_pod(pod, [_slice("n1", "GPU-a")], [_claim("p-mine", 1000)])
    assert any(f"scheduling gated ({KUEUE})" in x for x in lines)
    assert not any(": fits" in x for x in lines if x.startswith("  n1"))
