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
