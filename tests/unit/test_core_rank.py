"""The node search over the ledger's ranking (hami.core.rank) and the ``busy`` preference.

1. Property: on random clusters of a few node shapes, after random arrivals and deletions,
   the node ``filter_pod`` chooses among all nodes is the first, in the documented node order
   (node score with the pod's request: fullest first for binpack, emptiest for spread; ties by
   name), of the nodes where the pod fits on its own (each tried alone, an independent oracle).
2. The ranking holds every node exactly once, in its group, with its current usage.
3. ``busy`` nodes are chosen only when no other node fits; among them, fewer binds first.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core import Ledger, SchedulerConfig, filter_pod, schedule_pod
from hami.core.rank import NodeRanking, room
from hami.core.score import node_score
from hami.vendors import build_vendors

from ._corekit import ctr, node, pod

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHAPES = ({"n": 2, "mem": 8000}, {"n": 4, "mem": 16384}, {"n": 4, "mem": 16384, "cores": 200}, {"n": 1, "mem": 4000})


def config(policy: str) -> SchedulerConfig:
    return SchedulerConfig(build_vendors(), node_policy=policy)


def probe(i: int, g: int, mem: int, cores: int) -> dict:
    return pod(f"probe-{i}", containers=[ctr(gpu=g, mem=mem, cores=cores)])


@st.composite
def cases(draw):
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=5, max_size=12))
    arrivals = draw(
        st.lists(
            st.tuples(
                st.integers(1, 2),
                st.sampled_from([1000, 2000, 4000]),
                st.sampled_from([0, 10, 30, 60]),
                st.integers(0, 11),
            ),
            max_size=40,
        )
    )
    deletions = draw(st.lists(st.integers(0, 39), max_size=10))
    pods = draw(
        st.lists(
            st.tuples(st.integers(1, 3), st.sampled_from([500, 3000, 9000]), st.sampled_from([0, 20, 100])),
            min_size=1,
            max_size=4,
        )
    )
    return shapes, arrivals, deletions, pods, draw(st.sampled_from(["binpack", "spread"]))


def oracle(led: Ledger, p: dict, cfg: SchedulerConfig, policy: str) -> str | None:
    """The first node, in node order, where the pod fits when offered that node alone."""
    c = p["spec"]["containers"][0]["resources"]["limits"]
    nums, mem, cores = c["nvidia.com/gpu"], c["nvidia.com/gpumem"], c["nvidia.com/gpucores"]
    sign = -1 if policy == "binpack" else 1

    def score(n: str) -> float:
        s = led.summary(n)
        return node_score(
            s.used + nums, s.count, s.usedcores + cores * nums, s.totalcore, s.usedmem + mem * nums, s.totalmem
        )

    for n in sorted(led.node_names(), key=lambda n: (sign * score(n), n)):
        if filter_pod(p, [n], led, cfg, 0.0).node == n:
            return n
    return None


@SETTINGS
@given(cases())
def test_the_walk_chooses_the_first_fitting_node_in_node_order(case):
    shapes, arrivals, deletions, pods, policy = case
    cfg = config(policy)
    led = Ledger()
    for i, kw in enumerate(shapes):
        led.set_node(node(f"node-{i:02d}", **kw))
    names = led.node_names()
    placed = []
    for k, (g, mem, cores, where) in enumerate(arrivals):
        r = schedule_pod(probe(1000 + k, g, mem, cores), [names[where % len(names)]], led, cfg, 0.0)
        placed.append(r.allocation.key if r.allocation else None)
    for d in deletions:
        if d < len(placed) and placed[d]:
            led.remove_pod(placed[d])
    for i, (g, mem, cores) in enumerate(pods):
        p = probe(i, g, mem, cores)
        expected = oracle(led, p, cfg, policy)
        got = filter_pod(p, None, led, cfg, 0.0)
        assert got.node == expected, (policy, got.node, expected)
        assert filter_pod(p, names, led, cfg, 0.0).node == expected  # every name given: the same walk
        if expected is None:
            assert set(got.failed) == set(names)  # pending: every node gets its reason
        else:
            schedule_pod(p, None, led, cfg, 0.0)  # the next probe sees this one placed
    check_ranking(led)


def check_ranking(led: Ledger) -> None:
    """Every node once, in the group of its current totals, at its current usage."""
    seen = {}
    for binpack in (True, False):
        order = []
        for shape, rooms, names in led.ranking.groups(fullest_first=binpack):
            for n in names:
                s = led.summary(n)
                assert shape == (s.count, s.totalcore, s.totalmem, len(led.node(n).devices))
                assert set(rooms) == {v for v, vs in s.vendors.items() if vs.free_slot}
                for v, (mem, cores) in rooms.items():
                    vs = s.vendors[v]
                    assert cores == vs.max_free_cores and vs.max_free_mem <= mem < 2 * vs.max_free_mem + 1
                order.append(n)
        assert sorted(order) == led.node_names()
        seen[binpack] = order
    assert len(led.ranking) == len(led.node_names())


def test_ranking_orders_by_usage_within_a_shape_ties_by_name():
    r = NodeRanking()
    shape = (10, 100, 1000, 1)
    free = (room("NVIDIA", 1000, 100),)
    for name, used in (("b", 1), ("a", 1), ("c", 0), ("d", 3)):
        r.update(name, shape, free, used, 0, 0)
    [(got_shape, _, emptiest)] = list(r.groups(fullest_first=False))
    assert got_shape == shape and list(emptiest) == ["c", "a", "b", "d"]
    [(_, _, fullest)] = list(r.groups(fullest_first=True))
    assert list(fullest) == ["d", "a", "b", "c"]
    r.update("d", shape, (), 10, 0, 0)  # full: moves to another group
    assert sorted((sorted(o.items()), list(n)) for _, o, n in r.groups(fullest_first=True)) == [
        ([], ["d"]),
        ([("NVIDIA", (1023, 100))], ["a", "b", "c"]),
    ]
    r.remove("d")
    r.remove("d")  # twice: nothing happens
    assert len(r) == 3


def test_removed_node_leaves_the_ranking():
    led = Ledger()
    for n in ("n1", "n2"):
        led.set_node(node(n))
    led.remove_node("n1")
    assert [list(names) for _, _, names in led.ranking.groups(True)] == [["n2"]]
    assert filter_pod(probe(0, 1, 1000, 10), None, led, config("binpack"), 0.0).node == "n2"


def test_busy_nodes_are_chosen_only_when_nothing_else_fits():
    cfg = config("binpack")
    led = Ledger()
    for n in ("n1", "n2", "n3"):
        led.set_node(node(n, n=1))
    schedule_pod(probe(100, 1, 1000, 10), ["n1"], led, cfg, 0.0)  # n1 is the fullest: binpack's first
    p = probe(0, 1, 1000, 10)
    assert filter_pod(p, None, led, cfg, 0.0).node == "n1"
    assert filter_pod(p, None, led, cfg, 0.0, busy={"n1": 1}).node == "n2"
    assert filter_pod(p, ["n1", "n2", "n3"], led, cfg, 0.0, busy={"n1": 1}).node == "n2"
    # every node busy: the fewest binds in flight first, then the usual order
    assert filter_pod(p, None, led, cfg, 0.0, busy={"n1": 2, "n2": 1, "n3": 1}).node == "n2"
    # a few candidates out of many (the path that sorts the candidates): the same rule
    assert filter_pod(p, ["n1", "n3"], led, cfg, 0.0, busy={"n1": 1}).node == "n3"
    # the only node that fits is busy: it is chosen
    big = probe(1, 1, 16000, 10)
    schedule_pod(probe(101, 1, 15000, 10), ["n2"], led, cfg, 0.0)
    schedule_pod(probe(102, 1, 15000, 10), ["n3"], led, cfg, 0.0)
    assert filter_pod(big, None, led, cfg, 0.0).node is None
    assert filter_pod(probe(2, 1, 10000, 10), None, led, cfg, 0.0, busy={"n1": 3}).node == "n1"
