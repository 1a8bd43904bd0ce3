"""Why a claim does not fit on the DRA path: use per GPU from slices and allocated claims, and the
allocator's search over a pending pod's claims together."""

from hami.node.nvml import PhysicalGPU
from hami.dra.explain import claim_requests, describe, shortfall, usage
from hami.dra.model import MIB, SliceSettings, resource_slice

GPUS = [PhysicalGPU(0, "GPU-a", "Tesla T4", 15360, "", 0), PhysicalGPU(1, "GPU-b", "Tesla T4", 15360, "", 0)]


def claim(name, device, memory=None, cores="10", pool="n1"):
    consumed = {"cores": cores, "shares": "1"}
    if memory is not None:
        consumed["memory"] = memory
    return {
        "metadata": {"namespace": "ns", "name": name},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": "gpu.hami.io",
                            "pool": pool,
                            "device": device,
                            "request": "gpu",
                            "consumedCapacity": consumed,
                        }
                    ]
                }
            }
        },
    }


def uses():
    sl = resource_slice("n1", GPUS, SliceSettings(split_count=2, default_cores=5))
    other = {"spec": {"driver": "other.example.com", "pool": {"name": "n1"}, "devices": [{"name": "x"}]}}
    return usage(
        [sl, other],
        [
            claim("a", "gpu-0", "10000Mi"),
            claim("b", "gpu-0", "2000Mi", "95"),
            claim("c", "gpu-1", "15Gi", "0"),
            claim("gone", "gpu-9", "1Mi"),
        ],
    )


def test_usage_sums_consumed_capacity_per_gpu_and_names_the_claims():
    u = uses()
    assert sorted(u) == [("n1", "gpu-0"), ("n1", "gpu-1")]
    g0 = u[("n1", "gpu-0")]
    assert g0.used == {"memory": 12000 * MIB, "cores": 105, "shares": 2} and g0.claims == ["ns/a", "ns/b"]
    assert describe(u) == [
        "n1/gpu-0: memory 12000/15360 MiB, cores 105/100, shares 2/2",
        "n1/gpu-1: memory 15360/15360 MiB, cores 0/100, shares 1/2",
    ]


def test_shortfall_names_what_is_missing_with_the_policy_defaults_applied():
    u = uses()
    g0, g1 = u[("n1", "gpu-0")], u[("n1", "gpu-1")]
    assert shortfall(g0, {"memory": "3000Mi", "cores": "1"}) == "cores 6 short, shares 1 short"
    assert shortfall(g1, {"memory": "100Mi"}) == "memory 100 MiB short"  # cores default 5 fit
    assert shortfall(g1, {}) == "memory 15360 MiB short"  # no memory asked: all of it
    assert shortfall(g1, {"memory": "20000Mi"}) == "asks for more than the whole GPU"
    fresh = usage([resource_slice("n1", GPUS, SliceSettings())], [])[("n1", "gpu-0")]
    assert shortfall(fresh, {"memory": "1000001", "cores": "50"}) == ""  # rounds up to 1 MiB: fits
    assert describe({("n1", "gpu-0"): fresh}, {"memory": "3000Mi"}) == [
        "n1/gpu-0: memory 0/15360 MiB, cores 0/100, shares 0/10 -> fits"
    ]


def test_claim_requests_reads_exact_requests():
    c = {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "1Gi"}}},
                    },
                    {"name": "any", "firstAvailable": []},
                ]
            }
        }
    }
    assert claim_requests(c) == [("gpu", {"memory": "1Gi"})]


def _pending_pod(*claims):
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims]},
    }


def _unallocated(name, memory):
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": memory}}},
                    }
                ]
            }
        },
    }


def test_explain_replays_the_search_over_the_pods_claims_together():
    """Each claim fits a GPU alone; together the first must move to gpu-1 for the second, and a
    third does not fit beside them: the explanation says so, naming the claim."""
    from hami.dra.explain import explain_pod

    sl = resource_slice(
        "n1",
        [PhysicalGPU(0, "GPU-a", "A10", 23028, "", 0), PhysicalGPU(1, "GPU-b", "T4", 15360, "", 0)],
        SliceSettings(),
    )
    claims = [_unallocated("small", "8000Mi"), _unallocated("big", "20000Mi"), _unallocated("more", "8000Mi")]
    lines = explain_pod(_pending_pod("small", "big"), [sl], claims)
    assert lines[-2:] == [
        "the pod's unallocated claims together, as kube-scheduler's allocator searches them, pool by pool:",
        "  n1: fits (small on gpu-1, big on gpu-0)",
    ]
    lines = explain_pod(_pending_pod("small", "big", "more"), [sl], claims)
    assert lines[-1] == (
        "  n1: claim more request gpu: gpu-0: memory 4972 MiB short; gpu-1: memory 640 MiB short "
        "(after the pod's claims small on gpu-1, big on gpu-0; no other placement of them leaves "
        "room either)"
    )
    placed = {**_pending_pod("small", "big"), "spec": {**_pending_pod("small", "big")["spec"], "nodeName": "n1"}}
    assert not any("allocator searches" in line for line in explain_pod(placed, [sl], claims))
    # firstAvailable: the first subrequest is too big for either GPU, the second fits
    subs = [
        {"name": "a", "deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "40000Mi"}}},
        {"name": "b", "deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "1Gi"}}},
    ]
    alt = {
        "metadata": {"namespace": "ns", "name": "alt"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subs}]}},
    }
    assert explain_pod(_pending_pod("alt"), [sl], [alt])[-1] == "  n1: fits (alt on gpu-0)"
    bad = {
        "metadata": {"namespace": "ns", "name": "bad"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu.hami.io", "selectors": [{"cel": {"expression": "1 +"}}]},
                    }
                ]
            }
        },
    }
    assert explain_pod(_pending_pod("bad"), [sl], [bad])[-1].startswith("kube-scheduler's search is not replayed: ")
