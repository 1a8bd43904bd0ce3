"""``firstAvailable`` requests on the DRA path: subrequests tried in order inside the allocator's
one search (hami.dra.fit), results named ``<request>/<subrequest>``, constraints and containers
that name the parent request."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core import SchedulerConfig
from hami.dra import fit
from hami.dra.model import SliceSettings, resource_slice
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import simulate_dra
from hami.sim.engine import SimulationError
from hami.vendors import build_vendors

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")


def node(name="n", n=2, mib=16384):
    gpus = [
        PhysicalGPU(i, f"GPU-{name}-{i}", "Tesla T4", mib, f"0000:{i + 1:02x}:00.0", 0, numa_node=i) for i in range(n)
    ]
    return resource_slice(name, gpus, SliceSettings(split_count=4))


def sub(name, memory, count=1, selector=None):
    out = {"name": name, "deviceClassName": "gpu.hami.io", "count": count, "capacity": {"requests": {"memory": memory}}}
    if selector:
        out["selectors"] = [{"cel": {"expression": selector}}]
    return out


def claim(name, request, constraints=None):
    devices = {"requests": [request]}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": devices},
    }


def exactly(memory, count=1):
    return {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu.hami.io", "count": count, "capacity": {"requests": {"memory": memory}}},
    }


def first(*subs):
    return {"name": "gpu", "firstAvailable": list(subs)}


def pod(name, *claims):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            "containers": [
                {"name": c, "image": "x", "resources": {"claims": [{"name": c, "request": "gpu"}]}} for c in claims
            ],
        },
    }


def run(slices, docs):
    r = simulate_dra(slices, docs, CFG)
    return {p.name: p for p in r.pods}, {c["name"]: c for c in r.claims}


def test_the_first_subrequest_that_can_be_had_wins_and_names_the_result():
    pods, claims = run([node()], [claim("c", first(sub("big", "20Gi"), sub("small", "4Gi"))), pod("p", "c")])
    assert [(r["request"], r["device"]) for r in claims["c"]["results"]] == [("gpu/small", "gpu-0")]
    # a container that names the parent request gets the subrequest's device
    assert [d["device"] for d in pods["p"].containers[0]["devices"]] == ["n/gpu-0"]
    pods, claims = run([node()], [claim("c", first(sub("two", "4Gi", count=2), sub("one", "4Gi"))), pod("p", "c")])
    assert [(r["request"], r["device"]) for r in claims["c"]["results"]] == [("gpu/two", "gpu-0"), ("gpu/two", "gpu-1")]


def test_a_later_claim_that_does_not_fit_sends_the_search_back_to_the_next_subrequest():
    """Two 16Gi GPUs. Claim a takes two 10Gi devices if it can, else one; claim b needs 10Gi. The
    allocator's one search tries a/two (gpu-0 + gpu-1), finds no room for b, and backs into a's
    next subrequest: a/one on gpu-0, b on gpu-1. Placing a on its own first would leave b pending."""
    docs = [
        claim("a", first(sub("two", "10Gi", count=2), sub("one", "10Gi"))),
        claim("b", exactly("10Gi")),
        pod("p", "a", "b"),
    ]
    pods, claims = run([node()], docs)
    assert pods["p"].status == "scheduled"
    assert [(r["request"], r["device"]) for r in claims["a"]["results"]] == [("gpu/one", "gpu-0")]
    assert [(r["request"], r["device"]) for r in claims["b"]["results"]] == [("gpu", "gpu-1")]


def test_subrequests_have_selectors_and_constraints_name_the_parent():
    numa1 = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
    c = claim(
        "c",
        first(sub("pair", "1Gi", count=2), sub("numa1", "1Gi", selector=numa1)),
        constraints=[{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/numaNode"}],
    )
    pods, claims = run([node()], [c, pod("p", "c")])
    # the two GPUs are on different NUMA nodes: the pair breaks the constraint, the selector picks gpu-1
    assert [(r["request"], r["device"]) for r in claims["c"]["results"]] == [("gpu/numa1", "gpu-1")]


def test_no_subrequest_fits_says_why_for_each():
    pods, _ = run([node(n=1)], [claim("c", first(sub("a", "20Gi"), sub("b", "17Gi"))), pod("p", "c")])
    assert pods["p"].status == "pending"
    assert pods["p"].reasons["n"] == (
        "claim c request gpu: no subrequest can be had (claim c request gpu/a: gpu-0: asks for more than the "
        "whole GPU; claim c request gpu/b: gpu-0: asks for more than the whole GPU)"
    )


def test_a_subrequest_whose_selector_fails_is_explained_not_a_crash():
    bad = {
        **sub("all", "1Gi"),
        "allocationMode": "All",
        "selectors": [{"cel": {"expression": 'device.attributes["gpu.hami.io"].nosuch'}}],
    }
    del bad["count"]
    found_pods, _ = run([node(n=1)], [claim("c", first(sub("big", "20Gi"), bad)), pod("p", "c")])
    assert "CEL runtime error on gpu-0: no such key: nosuch" in found_pods["p"].reasons["n"]
    requests, _ = fit.claim_spec_requests({"devices": {"requests": [first(sub("big", "20Gi"), bad)]}}, "s")
    why = fit.why_not(list(fit.devices_of([node(n=1)]).values()), requests, "c")
    assert why.startswith("claim c request gpu: no subrequest can be had (claim c request gpu/big: ")
    assert "gpu/all (allocationMode All): gpu-0: selector #0" in why and "CEL runtime error" in why


@pytest.mark.parametrize(
    "request_, what",
    [
        ({"name": "gpu", "firstAvailable": []}, "needs exactly one of 'exactly' and 'firstAvailable'"),
        ({"name": "gpu", "firstAvailable": [sub("a", "1Gi"), sub("a", "2Gi")]}, "subrequest names must be unique"),
        ({"name": "gpu", "firstAvailable": [sub(f"s{i}", "1Gi") for i in range(9)]}, "1 to 8 subrequests"),
        ({"name": "gpu", "firstAvailable": [{**sub("a", "1Gi"), "count": 0}]}, r"firstAvailable\[0\].count: must be"),
        ({"name": "gpu", "firstAvailable": [sub("a", "1Gi"), sub("b", "1Gi", count=33)]}, "33 devices asked"),
    ],
)
def test_bad_first_available_stops_the_run_naming_the_field(request_, what):
    with pytest.raises(SimulationError, match=what):
        run([node()], [claim("c", request_)])


def test_fit_request_most_is_the_largest_subrequest():
    reqs, _ = fit.claim_spec_requests(
        {"devices": {"requests": [first(sub("a", "1Gi", count=3), sub("b", "1Gi"))]}}, "spec"
    )
    assert [a.name for a in reqs[0].alternatives] == ["gpu/a", "gpu/b"] and reqs[0].most == 3


# ------------------------------------------------------------------ against a plain recursive search


def _reference(devices, claims):
    """The allocator's recursion written plainly: requests in order, a firstAvailable request's
    subrequests in order (each with everything after it), a request's devices distinct and in
    slice order after the last one taken, the first complete placement wins."""
    items = [(ci, r) for ci, c in enumerate(claims) for r in c.requests]
    used = [dict.fromkeys(fit.CAPACITIES, 0) for _ in devices]

    def request(k):
        if k == len(items):
            return []
        ci, r = items[k]
        for alt in r.alternatives or (r,):
            got = some(k, ci, alt, alt.count, 0)
            if got is not None:
                return got
        return None

    def some(k, ci, alt, n, start):
        if n == 0:
            return request(k + 1)
        for i in range(start, len(devices)):
            need = fit.wanted(devices[i], alt.capacity)
            if need is None or any(need[c] > devices[i].left(c) - used[i][c] for c in fit.CAPACITIES):
                continue
            for c in fit.CAPACITIES:
                used[i][c] += need[c]
            rest = some(k, ci, alt, n - 1, i + 1)
            for c in fit.CAPACITIES:
                used[i][c] -= need[c]
            if rest is not None:
                return [(ci, alt.name, i)] + rest
        return None

    return request(0)


_GIB = st.integers(1, 12).map(lambda g: f"{g}Gi")
_EXACT = st.fixed_dictionaries({"count": st.integers(1, 2), "memory": _GIB})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.integers(4, 16), min_size=1, max_size=3),
    claims=st.lists(
        st.lists(st.one_of(_EXACT, st.lists(_EXACT, min_size=1, max_size=3)), min_size=1, max_size=2),
        min_size=1,
        max_size=3,
    ),
)
def test_the_search_matches_a_plain_recursive_search(gpus, claims):
    sl = resource_slice(
        "n",
        [PhysicalGPU(i, f"GPU-{i}", "T4", g * 1024, "", 0) for i, g in enumerate(gpus)],
        SliceSettings(split_count=8),
    )
    devices = list(fit.devices_of([sl]).values())
    asks = []
    for ci, c in enumerate(claims):
        requests = []
        for ri, r in enumerate(c):
            if isinstance(r, list):
                req = first(*(sub(f"s{j}", x["memory"], x["count"]) for j, x in enumerate(r)))
            else:
                req = exactly(r["memory"], r["count"])
            requests.append({**req, "name": f"r{ri}"})
        reqs, _ = fit.claim_spec_requests({"devices": {"requests": requests}}, f"claim {ci}")
        asks.append(fit.ClaimAsk(f"c{ci}", reqs))
    want = _reference(devices, asks)
    found = fit.allocate_claims(devices, asks)
    got = None
    if found.picks is not None:
        got = [(ci, p.request, devices.index(p.device)) for ci, picks in enumerate(found.picks) for p in picks]
    assert got == want
