"""Node liveness from the handshake annotation (reference §4.4), as pure functions.

The scheduler writes ``Requesting_<YYYY-MM-DD HH:MM:SS>`` (local time, no zone) into a vendor's
handshake annotation; a plugin that still speaks the legacy protocol answers ``Reported ...``.
HAMi up to v2.3 wrote the stamp as ``YYYY.MM.DD HH:MM:SS`` (Go layout ``2006.01.02 15:04:05``,
``time.Now()``: the writer's local time); such values stay on nodes after an upgrade, and both
forms are read (:func:`handshake_time`).
:func:`handshake_health` returns what HAMi's ``CheckHealth`` returns, plus the annotation value
to write when an update is due. ``now`` is passed in (a naive local ``datetime``).
NVIDIA adds its own rule on top (:func:`nvidia_health`): liveness is "the kubelet still
advertises ``nvidia.com/gpu``", refresh is "the registration text changed"; the small per-node
memory it needs lives in a :class:`HealthMemo` owned by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

HANDSHAKE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
# HAMi <= v2.3 (``2006.01.02 15:04:05``). Its own reader, Go's time.Parse, took that stamp as UTC
# although it was written in local time; read here as local time, as written (and as the current
# form is), so both agree wherever the old scheduler ran in this scheduler's zone
LEGACY_HANDSHAKE_TIME_FORMAT = "%Y.%m.%d %H:%M:%S"
REQUESTING = "Requesting"
HANDSHAKE_EXPIRY_S = 60


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    healthy: bool
    need_update: bool  # re-read the node's devices
    write_handshake: str | None = None  # value to patch into the handshake annotation, if any


def requesting_value(now: datetime) -> str:
    return f"{REQUESTING}_{now.strftime(HANDSHAKE_TIME_FORMAT)}"


def handshake_time(stamp: str) -> datetime | None:
    """The time after ``Requesting_`` (naive, local), in either form; None when it is neither.
    Read in the current form only, a stamp an earlier HAMi wrote never expired: a node whose
    device plugin had died kept its devices schedulable for good."""
    for layout in (HANDSHAKE_TIME_FORMAT, LEGACY_HANDSHAKE_TIME_FORMAT):
        try:
            return datetime.strptime(stamp, layout)
        except ValueError:
            continue
    return None


def handshake_health(
    value: str | None, allocatable: int, now: datetime, expiry_s: int = HANDSHAKE_EXPIRY_S
) -> HealthVerdict:
    """The generic algorithm: a fresh or unparsable ``Requesting_`` is healthy without update;
    an expired one is healthy only while the count resource is still allocatable; anything
    else (absent, ``Reported ...``) is answered with a new ``Requesting_<now>`` and an update."""
    if value and REQUESTING in value:
        _, _, stamp = value.partition("_")
        then = handshake_time(stamp)
        if then is None:
            return HealthVerdict(True, False)
        if (now - then).total_seconds() < expiry_s or allocatable > 0:
            return HealthVerdict(True, False)
        return HealthVerdict(False, False)
    return HealthVerdict(True, True, requesting_value(now))


@dataclass
class HealthMemo:
    """Per node: last seen allocatable count and registration text (NVIDIA's override)."""

    allocatable: dict[str, int] = field(default_factory=dict)
    register: dict[str, str] = field(default_factory=dict)

    def forget(self, node: str) -> None:
        self.allocatable.pop(node, None)
        self.register.pop(node, None)


def nvidia_health(
    memo: HealthMemo, node: str, allocatable: int, register_text: str, generic: HealthVerdict
) -> HealthVerdict:
    """NVIDIA's ``CheckHealth`` override; updates ``memo``."""
    before = memo.allocatable.get(node, 0)
    old_text = memo.register.get(node)
    memo.allocatable[node] = allocatable
    memo.register[node] = register_text
    if allocatable == 0 and before == 0:
        return generic
    if allocatable == 0:
        return HealthVerdict(False, False)
    if allocatable != before:
        return HealthVerdict(True, True, generic.write_handshake)
    if register_text != old_text:
        return HealthVerdict(generic.healthy, True, generic.write_handshake)
    return generic
