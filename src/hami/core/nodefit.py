"""kube-scheduler's node filters that run before HAMi's extender (pure, no I/O).

In a live cluster kube-scheduler filters the nodes first and calls the extender with the ones
left, so a pod never reaches a node it does not tolerate or select. ``hami simulate`` has no
kube-scheduler: this module restates the filters of its default profile that decide on a node's
labels, taints and ``spec.unschedulable``, in the profile's order, and words a refusal as
kube-scheduler does:

1. ``NodeUnschedulable``: a cordoned node (``spec.unschedulable``), unless the pod tolerates
   ``node.kubernetes.io/unschedulable:NoSchedule`` -> ``node(s) were unschedulable``;
2. ``TaintToleration``: the node's first ``NoSchedule``/``NoExecute`` taint the pod does not
   tolerate -> ``node(s) had untolerated taint {key: value}``. A node whose ``Ready`` condition is
   present and not ``True`` has the taint the node lifecycle controller puts on it
   (``node.kubernetes.io/not-ready``, or ``node.kubernetes.io/unreachable`` for ``Unknown``);
3. ``NodeAffinity``: ``spec.nodeSelector`` and the required node affinity (``nodeSelectorTerms``:
   ``matchExpressions`` with ``In``/``NotIn``/``Exists``/``DoesNotExist``/``Gt``/``Lt`` and
   ``matchFields`` on ``metadata.name``) -> ``node(s) didn't match Pod's node affinity/selector``.

Per pod the asks are read once (:func:`pod_asks`, kube-scheduler's PreFilter), per node the facts
once (:func:`node_facts`); :func:`refusal` is the per-node Filter. What the API server refuses
(an unknown operator, ``In`` without values, a toleration with ``Exists`` and a value, ...) raises
:class:`NodeFitError` naming the field and the value. Resource fits, ports, volumes and
inter-pod (anti-)affinity are not restated: HAMi's extender answers for the devices.

Shapes: :data:`NODE_FIELDS` and :data:`POD_FIELDS` are the fields read here, for
:func:`hami.core.shape.check` before these functions run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from hami.core.shape import ListOf, MapOf

UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
FILTERED_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only scores
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_INT64 = (-(2**63), 2**63 - 1)

_REQUIREMENT = {"key": str, "operator": str, "values": ListOf(str)}
_TERM = {"matchExpressions": ListOf(_REQUIREMENT), "matchFields": ListOf(_REQUIREMENT)}
NODE_FIELDS = {
    "spec": {"unschedulable": bool, "taints": ListOf({"key": str, "value": str, "effect": str})},
    "status": {"conditions": ListOf({"type": str, "status": str})},
}
POD_FIELDS = {
    "spec": {
        "nodeSelector": MapOf(str),
        "tolerations": ListOf({"key": str, "operator": str, "value": str, "effect": str}),
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ListOf(_TERM)}}
        },
    }
}


class NodeFitError(ValueError):
    """A field the API server would refuse; the message names the field and the value."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str
    why: str = ""  # for a taint the node's Ready condition implies: which condition


@dataclass(frozen=True)
class NodeFacts:
    """What the filters read of one Node."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str  # "Equal" or "Exists"
    value: str
    effect: str  # "" = every effect

    def tolerates(self, taint: Taint) -> bool:
        """k8s ``Toleration.ToleratesTaint``: an empty key with ``Exists`` tolerates every taint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, value: str | None) -> bool:
        """One ``matchExpressions`` entry against the node's label (None: the node has none)."""
        op = self.operator
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        # Gt / Lt: both sides integers (a label or a value that is not one matches nothing)
        have, want = _integer(value), _integer(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want


@dataclass(frozen=True)
class Term:
    """One ``nodeSelectorTerms`` entry: all of its requirements (an empty term selects nothing)."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, node: NodeFacts) -> bool:
        if not self.expressions and not self.fields:
            return False
        return all(r.matches(node.labels.get(r.key)) for r in self.expressions) and all(
            r.matches(node.name) for r in self.fields
        )


@dataclass(frozen=True)
class PodAsks:
    """What a pod asks of a node (read once per pod)."""

    selector: Mapping[str, str]
    terms: tuple[Term, ...] | None  # None: no required node affinity
    tolerations: tuple[Toleration, ...]

    @property
    def anything(self) -> bool:
        return bool(self.selector) or self.terms is not None

    def tolerates(self, taint: Taint) -> bool:
        return any(t.tolerates(taint) for t in self.tolerations)


def _integer(text: str | None) -> int | None:
    """A decimal integer as Go's ``strconv.ParseInt(text, 10, 64)`` reads one (an optional sign,
    ASCII digits, within int64), else None."""
    if text is None or not _DECIMAL.fullmatch(text) or len(text.lstrip("+-").lstrip("0")) > 19:
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


# ---------------------------------------------------------------------- nodes


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """A Node (its shape checked against :data:`NODE_FIELDS`) -> :class:`NodeFacts`."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    taints = [Taint(t.get("key") or "", t.get("value") or "", t.get("effect") or "") for t in spec.get("taints") or ()]
    ready = next((c for c in (node.get("status") or {}).get("conditions") or () if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") != "True":
        key = UNREACHABLE_TAINT if ready.get("status") == "Unknown" else NOT_READY_TAINT
        if not any(t.key == key and t.effect == "NoSchedule" for t in taints):
            taints.append(Taint(key, "", "NoSchedule", f"the node's Ready condition is {ready.get('status')!r}"))
    return NodeFacts(
        name=str(meta.get("name") or ""),
        labels=dict(meta.get("labels") or {}),
        taints=tuple(taints),
        unschedulable=spec.get("unschedulable") is True,
    )


# ---------------------------------------------------------------------- pods

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _requirement(raw: Mapping[str, Any], where: str, fields: bool) -> Requirement:
    key, op, values = raw.get("key") or "", raw.get("operator") or "", tuple(raw.get("values") or ())
    if not key:
        raise NodeFitError(f"{where}.key: must be set")
    if fields and key != "metadata.name":
        raise NodeFitError(f"{where}.key: {key!r}: matchFields supports metadata.name only")
    allowed = ("In", "NotIn") if fields else _OPERATORS
    if op not in allowed:
        raise NodeFitError(f"{where}.operator: {op!r} is not one of {', '.join(allowed)}")
    if fields and len(values) != 1:
        raise NodeFitError(f"{where}.values: {list(values)}: must be one value for matchFields")
    if op in ("In", "NotIn") and not values:
        raise NodeFitError(f"{where}.values: must be non-empty with operator {op}")
    if op in ("Exists", "DoesNotExist") and values:
        raise NodeFitError(f"{where}.values: {list(values)}: must be empty with operator {op}")
    if op in ("Gt", "Lt") and len(values) != 1:
        raise NodeFitError(f"{where}.values: {list(values)}: must be one value with operator {op}")
    return Requirement(key, op, values)


def _terms(spec: Mapping[str, Any]) -> tuple[Term, ...] | None:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    where = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    if not required.get("nodeSelectorTerms"):
        raise NodeFitError(f"{where}: must have at least one node selector term")
    out = []
    for i, term in enumerate(required.get("nodeSelectorTerms") or ()):
        at = f"{where}[{i}]"
        out.append(
            Term(
                tuple(
                    _requirement(r, f"{at}.matchExpressions[{k}]", False)
                    for k, r in enumerate(term.get("matchExpressions") or ())
                ),
                tuple(
                    _requirement(r, f"{at}.matchFields[{k}]", True) for k, r in enumerate(term.get("matchFields") or ())
                ),
            )
        )
    return tuple(out)


def _toleration(raw: Mapping[str, Any], where: str) -> Toleration:
    key, op = raw.get("key") or "", raw.get("operator") or "Equal"
    value, effect = raw.get("value") or "", raw.get("effect") or ""
    if op not in ("Equal", "Exists"):
        raise NodeFitError(f"{where}.operator: {op!r} is not one of Equal, Exists")
    if op == "Exists" and value:
        raise NodeFitError(f"{where}.value: {value!r}: must be empty with operator Exists")
    if not key and op != "Exists":
        raise NodeFitError(f"{where}.operator: {op!r}: must be Exists when the key is empty")
    if effect and effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise NodeFitError(f"{where}.effect: {effect!r} is not one of NoSchedule, PreferNoSchedule, NoExecute")
    return Toleration(key, op, value, effect)


def pod_asks(pod: Mapping[str, Any]) -> PodAsks:
    """A Pod (its shape checked against :data:`POD_FIELDS`) -> :class:`PodAsks`. Raises
    :class:`NodeFitError` on what the API server refuses."""
    spec = pod.get("spec") or {}
    return PodAsks(
        selector=dict(spec.get("nodeSelector") or {}),
        terms=_terms(spec),
        tolerations=tuple(
            _toleration(t, f"spec.tolerations[{i}]") for i, t in enumerate(spec.get("tolerations") or ())
        ),
    )


# ---------------------------------------------------------------------- the filter


def refusal(asks: PodAsks, node: NodeFacts) -> str | None:
    """kube-scheduler's reason for leaving ``node`` out for a pod asking ``asks``, or None when
    the node passes these filters (the first filter that refuses names the reason)."""
    if node.unschedulable and not asks.tolerates(Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")):
        return UNSCHEDULABLE
    for taint in node.taints:
        if taint.effect in FILTERED_EFFECTS and not asks.tolerates(taint):
            why = f" ({taint.why})" if taint.why else ""
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}{why}"
    if any(node.labels.get(k) != v for k, v in asks.selector.items()):
        return AFFINITY
    if asks.terms is not None and not any(t.matches(node) for t in asks.terms):
        return AFFINITY
    return None


def filter_nodes(asks: PodAsks, nodes: Iterable[NodeFacts]) -> dict[str, str]:
    """``node -> reason`` for every node of ``nodes`` the pod cannot go to (empty: all pass)."""
    out = {}
    for node in nodes:
        why = refusal(asks, node)
        if why is not None:
            out[node.name] = why
    return out


def left_out(
    pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], names: Iterable[str]
) -> tuple[dict[str, str], str]:
    """``node -> reason`` for the nodes of ``names`` (looked up in ``nodes``) that these filters
    leave out for ``pod``, and why they could not be applied at all ("" when they were: a pod the
    API server would not have taken leaves every node in). A Node whose fields cannot be read is
    not said to be left out."""
    try:
        asks = pod_asks(pod)
    except (NodeFitError, AttributeError, TypeError, ValueError) as exc:
        return {}, str(exc)
    out: dict[str, str] = {}
    for name in names:
        node = nodes.get(name)
        if node is None:
            continue
        try:
            why = refusal(asks, node_facts(node))
        except (AttributeError, TypeError, ValueError):
            continue
        if why:
            out[name] = why
    return out, ""
