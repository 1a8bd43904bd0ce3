"""Shape checks for objects that come from outside (files, HTTP bodies) before the core reads them.

The core reads Pods and Nodes as plain dicts and trusts the types the API server guarantees
(``metadata.annotations`` is a map of strings, ``spec.containers`` a list of objects, ...).
Anything else — a YAML file, an extender or webhook body — is checked here first, so bad input
is one :class:`ShapeError` naming the field, never an ``AttributeError`` deep in a vendor.

Two checks:

* :func:`check_tree`: the value is a tree of JSON types (dict with string keys, list, str, int,
  float, bool, None) of bounded depth and size, without cycles. YAML anchors may share a subtree
  (counted once per use, so an alias bomb is refused by size), but a recursive alias is refused.
* :func:`check_pod` / :func:`check_node`: every field the core and the vendors read has its
  Kubernetes type (``null`` counts as absent, as in the API). Fields nobody reads are not looked
  at. Values are not range-checked here (quantities are parsed where they are used).
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import CoreError

#: a DNS-1123 label (a namespace); a subdomain (a pod's or a node's name) is labels joined by '.'
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


def is_dns1123_label(value: str) -> bool:
    return len(value) <= 63 and _DNS1123_LABEL.match(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    return 0 < len(value) <= 253 and all(_DNS1123_LABEL.match(part) for part in value.split("."))


MAX_DEPTH = 64  # a Pod nests about 12 deep (affinity terms); 64 is generous
MAX_NODES = 20_000_000  # values in one object tree, aliases expanded (a 64 MiB file holds fewer)


class ShapeError(CoreError):
    """A value of the wrong JSON type, too deep, too large or recursive."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


FAST_BUDGET = 200_000  # values the quick pass visits before it leaves the tree to the exact walk


def check_tree(value: Any, where: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Raise :class:`ShapeError` unless ``value`` is an acyclic JSON tree within the limits.
    With ``max_nodes`` at most :data:`FAST_BUDGET`, a tree over it costs the quick pass alone
    (cut at the limit): the exact walk would visit all of it, whatever its size, to say so."""
    budget = min(max_nodes, FAST_BUDGET)
    verdict = _quick(value, max_depth, budget)
    if verdict is True:
        return  # (the common case: an ordinary pod or node; the walk below names what is wrong)
    if budget == max_nodes and (verdict == _OVER or _more_than(value, max_nodes)):
        # (the quick pass stops at the first fault: one early, a list nested too deep, left the
        # rest of a huge body to the walk, seconds of it; found by review)
        raise ShapeError(f"{where}: more than {max_nodes} values (with aliases expanded)")
    _walk(value, where, max_depth, max_nodes)


def _more_than(value: Any, limit: int) -> bool:
    """Whether ``value`` holds more than ``limit`` values (shared subtrees counted per use, as the
    walk counts them); at most ``limit`` steps, whatever its shape (a cycle, any depth)."""
    left = limit - 1
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            children: Any = node.values()
        elif type(node) is list:
            children = node
        else:
            continue
        left -= len(node)
        if left < 0:
            return True
        stack.extend(c for c in children if type(c) is dict or type(c) is list)
    return False


_OVER = "over"  # what _quick says of a tree with more values than its budget


def _quick_ok(value: Any, max_depth: int, budget: int) -> bool:
    """:func:`_quick` as a yes or no."""
    return _quick(value, max_depth, budget) is True


def _quick(value: Any, max_depth: int, budget: int) -> bool | str:
    """True when ``value`` is plainly a JSON tree within the limits: every container within
    ``max_depth`` levels, at most ``budget`` values in all (shared subtrees counted per use, so a
    cycle or an alias bomb runs out of depth or budget), string keys, finite floats. :data:`_OVER`
    when it holds more than ``budget`` values (counted so far), False otherwise: "not shown here"
    (the exact walk decides and words the error). About ten times cheaper than the walk: no
    paths built, no memo; it runs on every extender body and watched object."""
    left = [budget - 1]  # the root; each container then counts its children

    def fine(node: Any, depth: int) -> bool:
        if depth > max_depth:
            return False
        if type(node) is dict:
            items: Any = node.values()
            if not all(type(k) is str for k in node):
                return False
        else:
            items = node
        left[0] -= len(node)
        if left[0] < 0:
            return False
        for child in items:
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:
                continue
            if kind is dict or kind is list:
                if not fine(child, depth + 1):
                    return False
            elif kind is not float or not math.isfinite(child):
                return False
        return True

    kind = type(value)
    if kind is dict or kind is list:
        return fine(value, 1) or (_OVER if left[0] < 0 else False)
    return value is None or kind is str or kind is int or kind is bool or (kind is float and math.isfinite(value))


def _walk(value: Any, where: str, max_depth: int, max_nodes: int) -> None:
    """The exact check: the first fault, with its path."""
    # iterative post-order over distinct containers: (height, expanded size) memoised per id
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool, str]] = [(value, False, where)]
    while stack:
        node, done, path = stack.pop()
        if not isinstance(node, (dict, list)):
            _check_scalar(node, path)
            continue
        ident = id(node)
        if done:
            active.discard(ident)
            children = node.values() if isinstance(node, dict) else node
            kids = [memo.get(id(c), (0, 1)) for c in children]
            height = 1 + max((h for h, _ in kids), default=0)
            size = 1 + sum(s for _, s in kids)
            if size > max_nodes:
                raise ShapeError(f"{path}: more than {max_nodes} values (with aliases expanded)")
            memo[ident] = (height, size)
            continue
        if ident in memo:
            if memo[ident][0] + len(active) > max_depth:  # a shared subtree, deeper here
                raise ShapeError(f"{path}: nested more than {max_depth} levels deep")
            continue
        if ident in active:
            raise ShapeError(f"{path}: contains itself (a recursive alias)")
        if len(active) >= max_depth:
            raise ShapeError(f"{path}: nested more than {max_depth} levels deep")
        if type(node) is list and _all_str(node):  # e.g. ExtenderArgs.NodeNames: thousands of leaves
            if len(node) + 1 > max_nodes:
                raise ShapeError(f"{path}: more than {max_nodes} values (with aliases expanded)")
            memo[ident] = (1, len(node) + 1)
            continue
        active.add(ident)
        stack.append((node, True, path))
        if isinstance(node, dict):
            for k, c in node.items():
                if not isinstance(k, str):
                    raise ShapeError(f"{path}: map key {_show(k)} is a {_kind(k)}, keys must be strings")
                stack.append((c, False, f"{path}.{k}" if len(path) < 200 else path))
        else:
            stack.extend((c, False, f"{path}[{i}]" if len(path) < 200 else path) for i, c in enumerate(node))


def _all_str(items: list) -> bool:
    return set(map(type, items)) <= {str}  # (twice as fast as all(type(x) is str ...))


def _check_scalar(value: Any, where: str) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ShapeError(f"{where}: {value!r} is not a number JSON can carry")
        return
    raise ShapeError(f"{where}: a {type(value).__name__} value is not JSON (use a string)")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:56] + "...'"


# ----------------------------------------------------------------------------- schemas
# A schema is a type (str, bool, int), QTY, MapOf(schema), ListOf(schema) or a dict of
# field -> schema (an object whose other fields are not checked).


class MapOf:
    def __init__(self, item: Any) -> None:
        self.item = item


class ListOf:
    def __init__(self, item: Any) -> None:
        self.item = item


QTY = "quantity"  # a string or a number (parsed later, with the field named)

META = {
    "name": str,
    "namespace": str,
    "uid": str,
    "resourceVersion": str,
    "generateName": str,
    "annotations": MapOf(str),
    "labels": MapOf(str),
}
CONTAINER = {
    "name": str,
    "restartPolicy": str,
    "resources": {"limits": MapOf(QTY), "requests": MapOf(QTY)},
    "env": ListOf({"name": str, "value": str}),
    "securityContext": {"privileged": bool},
}
POD = {
    "apiVersion": str,
    "kind": str,
    "metadata": META,
    "spec": {
        "containers": ListOf(CONTAINER),
        "initContainers": ListOf(CONTAINER),
        "schedulerName": str,
        "nodeName": str,
        "runtimeClassName": str,
        "nodeSelector": MapOf(str),
    },
    "status": {
        "phase": str,
        "initContainerStatuses": ListOf({"name": str, "state": {"terminated": {"exitCode": int}}}),
    },
}
NODE = {
    "apiVersion": str,
    "kind": str,
    "metadata": META,
    "status": {"capacity": MapOf(QTY), "allocatable": MapOf(QTY)},
}
QUOTA = {
    "apiVersion": str,
    "kind": str,
    "metadata": META,
    "spec": {
        "hard": MapOf(QTY),
        # (read to tell a scoped quota; until 1 Dec a string or list here crashed hami simulate: review)
        "scopes": ListOf(str),
        "scopeSelector": {"matchExpressions": ListOf({"scopeName": str, "operator": str, "values": ListOf(str)})},
    },
}


def check(value: Any, schema: Any, where: str) -> None:
    """Raise :class:`ShapeError` naming the first field (``where`` + path) of the wrong type."""
    if value is None:
        return
    if isinstance(schema, dict):
        _check_fields(value, schema, where)
    elif isinstance(schema, MapOf):
        _check_map(value, schema.item, where)
    elif isinstance(schema, ListOf):
        _check_list(value, schema.item, where)
    elif schema is QTY:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ShapeError(f"{where}: must be a quantity (string or number), got {_kind(value)} {_show(value)}")
    elif schema is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShapeError(f"{where}: must be an integer, got {_kind(value)} {_show(value)}")
    elif not isinstance(value, schema) or (schema is not bool and isinstance(value, bool)):
        want = {str: "a string", bool: "a boolean"}.get(schema, schema.__name__)
        raise ShapeError(f"{where}: must be {want}, got {_kind(value)} {_show(value)}")


def _check_fields(value: Any, schema: dict, where: str) -> None:
    """An object: the fields the schema names, where present (other fields are not looked at)."""
    if not isinstance(value, dict):
        raise ShapeError(f"{where}: must be a map, got {_kind(value)} {_show(value)}")
    for key, sub in schema.items():
        if key in value:
            check(value[key], sub, f"{where}.{key}" if where else key)


def _check_map(value: Any, item: Any, where: str) -> None:
    """A map of string keys to ``item`` values (a null string value is refused: labels, annotations)."""
    if not isinstance(value, dict):
        raise ShapeError(f"{where}: must be a map, got {_kind(value)} {_show(value)}")
    for key, sub in value.items():
        if not isinstance(key, str):
            raise ShapeError(f"{where}: key {_show(key)} must be a string")
        if sub is None and item is str:
            raise ShapeError(f"{where}[{key}]: must be a string, got null")
        check(sub, item, f"{where}[{key}]")


def _check_list(value: Any, item: Any, where: str) -> None:
    """A list of ``item`` values, none of them null."""
    if not isinstance(value, list):
        raise ShapeError(f"{where}: must be a list, got {_kind(value)} {_show(value)}")
    if item is str and _all_str(value):
        return  # (the loop below would find nothing; it names the first bad element otherwise)
    for i, sub in enumerate(value):
        if sub is None:  # an absent field may be null; a list element may not
            raise ShapeError(f"{where}[{i}]: must not be null")
        check(sub, item, f"{where}[{i}]")


def check_object(obj: Any, schema: Any, where: str) -> None:
    """:func:`check_tree` then :func:`check` (an object must be a map)."""
    check_tree(obj, where or "object")
    if not isinstance(obj, dict):
        raise ShapeError(f"{where or 'object'}: must be a map, got {_kind(obj)}")
    check(obj, schema, where)


def check_pod(pod: Any, where: str = "") -> None:
    check_object(pod, POD, where)


def check_node(node: Any, where: str = "") -> None:
    check_object(node, NODE, where)
