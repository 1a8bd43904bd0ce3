"""``hami explain``'s verdicts agree with the scheduler on the same inputs (property).

On random clusters (NVIDIA with MIG, unhealthy and cordoned GPUs, Hygon DCU, AMD; background
pods; a namespace quota) and random probe pods (type / UUID selections, numa-bind, the
topology-aware and mutex policies, several containers), :func:`pending_verdict`:

- says a node fits exactly where the scheduler's own filter, asked about that node alone, places
  the pod, and otherwise gives that node the reason the scheduler gives it (the
  ``FilteringFailed`` line), in HAMi's format, with counts that add up to the devices considered;
- chooses a node (``It fits now``) exactly when some node fits, and the node the scheduler chooses;
- marks each device with a reason its node's counts include, as many devices per reason as the
  count says, and shows each device's usage as the ledger holds it (plus the pod's own earlier
  containers' part).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hami.core import SchedulerConfig, filter_pod
from hami.core.explain import pending_verdict
from hami.core.reasons import parse_reason

from .test_core_refuse import QUOTAS, SETTINGS, VENDORS, devices_st, drawn_cluster, request_st

NOT_COUNTED = ("not considered", "considered, but too few")


@SETTINGS
@given(
    st.lists(devices_st, min_size=1, max_size=5),
    st.lists(request_st, max_size=10),
    st.lists(request_st, min_size=1, max_size=3),
    st.sampled_from(QUOTAS),
    st.sampled_from(("binpack", "spread")),
    st.data(),
)
def test_explain_agrees_with_the_scheduler(nodes, background, reqs, quota, policy, data):
    cfg = SchedulerConfig(VENDORS, node_policy=policy)
    led, p, _ = drawn_cluster(nodes, background, reqs, quota, data, cfg)
    usage = {n: {d.id: (s, m, c) for d, s, m, c in led.device_usage(n)} for n in led.node_names()}

    verdict = pending_verdict(p, led, cfg, VENDORS, 0.0)

    live = filter_pod(p, None, led, cfg, 0.0, exact=True)
    assert verdict.chosen == live.node
    assert (verdict.chosen is None) == (not any(v.fits for v in verdict.nodes))
    assert {v.node for v in verdict.nodes} == set(led.node_names())
    for v in verdict.nodes:
        alone = filter_pod(p, [v.node], led, cfg, 0.0, exact=True)
        assert v.fits == (alone.node == v.node), v
        if v.fits:
            continue
        failure = alone.failed[v.node]
        assert v.reason == failure.render()
        if live.node is None:  # the FilteringFailed line for this node says the same
            assert live.failed[v.node].render() == v.reason
        if failure.bare:
            continue
        counts = parse_reason(v.reason)
        assert all(total == failure.total for _, total in counts.values())
        assert sum(n for n, _ in counts.values()) == failure.total
        marked: dict[str, int] = {}
        for dv in v.devices:
            held = usage[v.node][dv.device.id]
            assert (dv.slots - dv.pod_slots, dv.mem - dv.pod_mem, dv.cores - dv.pod_cores) == held
            if not dv.reason.startswith(NOT_COUNTED) and dv.reason != "ok":
                marked[dv.reason] = marked.get(dv.reason, 0) + 1
        assert marked == {code: n for code, (n, _) in counts.items()}, (v.reason, marked)
