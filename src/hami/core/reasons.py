"""Structured filter-failure reasons that render to HAMi's strings (§5.7).

A node that cannot take a pod yields a :class:`NodeFailure`: which container failed, how many
devices failed for each reason, and which UUIDs. ``str(failure)`` gives HAMi's
``"<count>/<total> <Reason>"`` items, sorted and joined by ``", "``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Reason(str, Enum):
    """Reason codes, spelled exactly as HAMi spells them."""

    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    NUMA_NOT_FIT = "NumaNotFit"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
    CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    NODE_UNFIT_POD = "NodeUnfitPod"
    NODE_FIT_POD = "NodeFitPod"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    MODE_NOT_FIT = "ModeNotFit"
    # MetaX sGPU's own codes
    CARD_UNHEALTHY = "CardUnhealthy"
    CARD_QOS_POLICY_MISMATCH = "CardQosPolicyMismatch"
    CARD_APP_CLASS_MISMATCH = "CardAppClassMismatch"
    # node-level, not from a device walk
    NODE_UNREGISTERED = "node unregistered"
    #: the scheduler's ``--node-label-selector`` leaves the node out (HAMi says "node unregistered")
    NODE_LABEL_SELECTOR_MISMATCH = "NodeLabelSelectorMismatch"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """Why one node cannot take the pod."""

    total: int  # devices considered (HAMi's <cards>)
    counts: tuple[tuple[Reason, int], ...]  # sorted by reason code
    devices: tuple[tuple[Reason, tuple[str, ...]], ...] = ()  # UUIDs per reason
    container: int = -1  # index (annotation order) of the container that failed; -1 = node-level
    vendor: str = ""
    bare: bool = False  # node-level reason: HAMi prints the code alone, without counts
    #: no eviction can cure it (the node has too few devices of the vendor, or none with the
    #: memory asked): set only by a producer that knows it from the node's devices, never from
    #: usage; the extender lists such nodes in ``FailedAndUnresolvableNodes``
    final: bool = False

    def render(self) -> str:
        if self.bare:
            return ", ".join(r.value for r, _ in self.counts)
        items = sorted(f"{n}/{self.total} {r.value}" for r, n in self.counts)
        return ", ".join(items)

    def __str__(self) -> str:
        return self.render()

    def codes(self) -> tuple[Reason, ...]:
        return tuple(r for r, _ in self.counts)


@dataclass(slots=True)
class ReasonCounter:
    """Accumulates per-device reasons during one container's walk over a node."""

    total: int
    by_reason: dict[Reason, list[str]] = field(default_factory=dict)

    def add(self, reason: Reason, uuid: str = "") -> None:
        self.by_reason.setdefault(reason, []).append(uuid)

    def failure(self, container: int, vendor: str) -> NodeFailure:
        keys = sorted(self.by_reason, key=lambda r: r.value)
        return NodeFailure(
            total=self.total,
            counts=tuple((r, len(self.by_reason[r])) for r in keys),
            devices=tuple((r, tuple(u for u in self.by_reason[r] if u)) for r in keys),
            container=container,
            vendor=vendor,
        )


UNREGISTERED = NodeFailure(total=0, counts=((Reason.NODE_UNREGISTERED, 1),), bare=True)
#: a node the scheduler's ``--node-label-selector`` leaves out (no eviction brings it in)
NOT_SELECTED = NodeFailure(total=0, counts=((Reason.NODE_LABEL_SELECTOR_MISMATCH, 1),), bare=True, final=True)


def parse_reason(text: str) -> dict[str, tuple[int, int]]:
    """HAMi ``ParseReason``: ``"1/4 A, 3/4 B"`` -> ``{"A": (1, 4), "B": (3, 4)}``."""
    out: dict[str, tuple[int, int]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        frac, _, code = item.partition(" ")
        num, _, den = frac.partition("/")
        if not (num.isdigit() and den.isdigit() and code):
            raise ValueError(f"reason item {item!r} is not '<n>/<total> <Reason>'")
        out[code] = (int(num), int(den))
    return out
