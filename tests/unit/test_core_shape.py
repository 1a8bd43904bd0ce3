"""``hami.core.shape.check``: one row per kind of schema (object, map, list, quantity, int, str, bool)."""

import pytest

from hami.core.shape import QTY, ListOf, MapOf, ShapeError, check

SCHEMA = {
    "name": str,
    "labels": MapOf(str),
    "limits": MapOf(QTY),
    "ports": ListOf({"port": int}),
    "args": ListOf(str),
    "privileged": bool,
    "spec": {"replicas": int},
}

# (description, value, error or None)
CASES = [
    (
        "every field right",
        {
            "name": "a",
            "labels": {"k": "v"},
            "limits": {"gpu": 1, "mem": "2Gi"},
            "ports": [{"port": 80}],
            "args": ["x"],
            "privileged": True,
            "spec": {"replicas": 2},
        },
        None,
    ),
    ("null fields count as absent", {"name": None, "labels": None, "ports": None, "spec": {"replicas": None}}, None),
    ("fields nobody reads are not looked at", {"other": {1: object()}}, None),
    ("object not a map", {"spec": [1]}, "x.spec: must be a map, got list [1]"),
    ("map not a map", {"labels": "a=b"}, "x.labels: must be a map, got string 'a=b'"),
    ("map key not a string", {"labels": {1: "v"}}, "x.labels: key 1 must be a string"),
    ("null string in a map", {"labels": {"k": None}}, "x.labels[k]: must be a string, got null"),
    ("map value of the wrong type", {"labels": {"k": 3}}, "x.labels[k]: must be a string, got number 3"),
    ("list not a list", {"args": "x"}, "x.args: must be a list, got string 'x'"),
    ("null list element", {"ports": [{"port": 1}, None]}, "x.ports[1]: must not be null"),
    ("list of strings, one not", {"args": ["a", 2]}, "x.args[1]: must be a string, got number 2"),
    (
        "field inside a list element",
        {"ports": [{"port": "80"}]},
        "x.ports[0].port: must be an integer, got string '80'",
    ),
    (
        "quantity of the wrong type",
        {"limits": {"gpu": True}},
        "x.limits[gpu]: must be a quantity (string or number), got boolean True",
    ),
    ("int given a float", {"spec": {"replicas": 1.5}}, "x.spec.replicas: must be an integer, got number 1.5"),
    ("int given a bool", {"spec": {"replicas": False}}, "x.spec.replicas: must be an integer, got boolean False"),
    ("bool given an int", {"privileged": 1}, "x.privileged: must be a boolean, got number 1"),
    ("str given a bool", {"name": True}, "x.name: must be a string, got boolean True"),
]


@pytest.mark.parametrize("value, error", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check(value, error):
    if error is None:
        check(value, SCHEMA, "x")
    else:
        with pytest.raises(ShapeError) as exc:
            check(value, SCHEMA, "x")
        assert str(exc.value) == error


def test_an_empty_where_names_the_field_alone():
    with pytest.raises(ShapeError, match=r"^spec\.replicas: must be an integer"):
        check({"spec": {"replicas": "2"}}, SCHEMA, "")


# ----------------------------------------------------------------------------- check_tree's quick pass
import math  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hami.core import shape  # noqa: E402

_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.sampled_from([b"x", 1j, (1, 2)]),  # not JSON
)
_trees = st.recursive(
    _leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 3)), kids, max_size=4),
    ),
    max_leaves=40,
)


def _exact(value, depth, nodes):
    try:
        shape._walk(value, "v", depth, nodes)
    except ShapeError as exc:
        return str(exc)
    return None


@settings(max_examples=400, deadline=None)
@given(tree=_trees, depth=st.integers(1, 6), nodes=st.integers(1, 60))
def test_the_quick_pass_accepts_only_what_the_exact_walk_accepts(tree, depth, nodes):
    quick = shape._quick_ok(tree, depth, nodes)
    exact = _exact(tree, depth, nodes)
    if quick:
        assert exact is None, f"quick pass accepted {tree!r}: {exact}"
    # and check_tree says what the exact walk says, word for word, except that a tree over a
    # limit within the quick pass's budget is refused for its size without the walk (which,
    # visiting it all, may first meet another fault)
    try:
        shape.check_tree(tree, "v", depth, nodes)
        got = None
    except ShapeError as exc:
        got = str(exc)
    if got == f"v: more than {nodes} values (with aliases expanded)":
        assert exact is not None and shape._more_than(tree, nodes)
    else:
        assert got == exact


def test_a_tree_over_a_small_limit_costs_the_quick_pass_alone(monkeypatch):
    """The webhook's bound (WEBHOOK_MAX_VALUES): 1.3 million empty lists in 4 MiB took the walk
    seconds on the scheduler's event loop to refuse (found by review); now the quick pass stops
    at the limit and says so."""

    def no_walk(*args):
        raise AssertionError("the exact walk ran")

    monkeypatch.setattr(shape, "_walk", no_walk)
    attack = {"request": {"object": {"spec": {"x": [[] for _ in range(1_300_000)]}}}}
    with pytest.raises(ShapeError, match="^request body: more than 200000 values"):
        shape.check_tree(attack, "request body", max_nodes=shape.FAST_BUDGET)
    shape.check_tree({"request": {"object": {"spec": {"x": [[]] * 1000}}}}, "b", max_nodes=shape.FAST_BUDGET)
    # a fault the quick pass meets first (a list nested too deep) does not hand the rest to the
    # walk (found by review: 5.4 s for this body)
    deep: list = []
    for _ in range(70):
        deep = [deep]
    with pytest.raises(ShapeError, match="more than 200000 values"):
        shape.check_tree({"a": deep, "z": attack}, "request body", max_nodes=shape.FAST_BUDGET)
    loop: list = []
    loop.append(loop)  # a cycle: counted to the limit, not for ever
    with pytest.raises(ShapeError, match="more than 1000 values"):
        shape.check_tree([loop], "v", max_nodes=1000)


def test_the_quick_pass_accepts_an_ordinary_tree_and_leaves_faults_to_the_walk():
    pod = {"metadata": {"name": "p", "annotations": {"a": "b"}}, "spec": {"containers": [{"name": "c", "x": 1.5}]}}
    assert shape._quick_ok(pod, 64, 1000)
    values = 1 + 2 + 2 + 1 + 1 + 1 + 2  # every container's children, and the root
    assert shape._quick_ok(pod, 64, values) and not shape._quick_ok(pod, 64, values - 1)
    assert not shape._quick_ok(pod, 3, 1000)  # containers nest 4 deep (root, spec, list, container)
    assert shape._quick_ok(pod, 4, 1000)
    for bad in (math.inf, math.nan, b"x", {1: "k"}):
        assert not shape._quick_ok({"a": [bad]}, 64, 1000)
    loop: list = []
    loop.append(loop)
    assert not shape._quick_ok(loop, 64, 1000)  # runs out of depth, then the walk names it
    with pytest.raises(ShapeError, match="contains itself"):
        shape.check_tree(loop, "v")
    shared = ["x"] * 50
    bomb = [[shared] * 50] * 50  # 125,000 values with the aliases expanded
    assert not shape._quick_ok(bomb, 64, 100_000)
    with pytest.raises(ShapeError, match="more than 100000 values"):
        shape.check_tree(bomb, "v", max_nodes=100_000)
