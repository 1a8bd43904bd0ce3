"""The per-node lock ``hami.io/mutex.lock`` shared by the scheduler and the device plugin (§5.8).

Value: ``"<RFC3339 time>,<namespace>,<pod name>"`` (HAMi's format; a legacy value is a bare
RFC3339 time). The scheduler takes it in Bind before the Binding; the device plugin releases it
when Allocate ends (success or failure). Every write carries ``metadata.resourceVersion`` so two
writers never both win (§13 pitfall 6).

Beyond HAMi: the lock is also reclaimed (not only after its expiry) when its owner can no
longer be using it: the pod is gone, finished its allocation (``bind-phase`` success/failed),
was re-placed on another node, or is bound to another node. Pure decisions are here; the two
components bring their own API calls (``read``/``write`` callables).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping

NODE_LOCK = "hami.io/mutex.lock"
BIND_PHASE = "hami.io/bind-phase"
VGPU_NODE = "hami.io/vgpu-node"


@dataclass(frozen=True)
class NodeLock:
    time: str
    namespace: str
    name: str


def lock_value(now: datetime, namespace: str, name: str) -> str:
    """The annotation value for a lock taken at ``now`` by pod ``namespace/name``."""
    return f"{now.astimezone(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')},{namespace},{name}"


def _time(text: str) -> datetime | None:
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def parse_node_lock(value: str | None) -> NodeLock | None:
    """``"<RFC3339>,<ns>,<name>"`` -> NodeLock; a legacy bare timestamp or garbage -> None."""
    if not value:
        return None
    parts = value.split(",")
    if len(parts) != 3 or not all(parts) or _time(parts[0]) is None:
        return None
    return NodeLock(*parts)


def lock_time(value: str) -> datetime | None:
    """When the lock was taken (both formats); None when unreadable."""
    return _time(value.split(",")[0])


def owned_by(value: str | None, namespace: str, name: str) -> bool:
    lock = parse_node_lock(value)
    return lock is not None and (lock.namespace, lock.name) == (namespace, name)


MISSING = object()  # owner lookup answer: the pod does not exist


def stale_reason(value: str, node: str, now: datetime, expiry_s: float, owner: Any) -> str | None:
    """Why an existing lock on ``node`` may be taken over; None when it is live.

    ``owner`` is the owner pod dict, :data:`MISSING` when it does not exist, or None when the
    lock names no pod (legacy value).
    """
    taken = lock_time(value)
    if taken is None:
        return "unreadable lock value"
    if (now - taken).total_seconds() > expiry_s:
        return f"expired (taken {taken.isoformat()}, expiry {expiry_s:g}s)"
    if owner is None:
        return None
    if owner is MISSING:
        return "owner pod no longer exists"
    meta, spec = owner.get("metadata") or {}, owner.get("spec") or {}
    annotations = meta.get("annotations") or {}
    if meta.get("deletionTimestamp"):
        return "owner pod is being deleted"
    if annotations.get(BIND_PHASE) in ("success", "failed"):
        return f"owner pod finished its allocation (bind-phase={annotations[BIND_PHASE]})"
    if spec.get("nodeName") and spec["nodeName"] != node:
        return f"owner pod is bound to node {spec['nodeName']}"
    if annotations.get(VGPU_NODE) and annotations[VGPU_NODE] != node:
        return f"owner pod was placed on node {annotations[VGPU_NODE]}"
    return None


class LockContention(Exception):
    """The node is locked by another live pod."""

    def __init__(self, node: str, value: str) -> None:
        self.node, self.value = node, value
        super().__init__(f"node {node} is locked by {value!r}")


def _conflict(exc: BaseException) -> bool:
    return getattr(exc, "status", None) == 409


ReadNode = Callable[[], Awaitable[tuple[Mapping[str, str], str]]]  # -> (annotations, resourceVersion)
WriteNode = Callable[[Mapping[str, Any], str], Awaitable[None]]  # (annotations patch, resourceVersion)


async def release(read: ReadNode, write: WriteNode, owner: tuple[str, str] | None,
                  attempts: int = 5, delay: float = 0.05) -> bool:
    """Remove the lock if ``owner`` (namespace, name) holds it (any lock when ``owner`` is None).

    Returns True when the lock is gone afterwards or belongs to another pod (left in place);
    False when every attempt lost a write race.
    """
    for _ in range(attempts):
        annotations, rv = await read()
        value = annotations.get(NODE_LOCK)
        if value is None or (owner is not None and not owned_by(value, *owner)):
            return True
        try:
            await write({NODE_LOCK: None}, rv)
            return True
        except Exception as exc:  # noqa: BLE001 - only write conflicts are retried
            if not _conflict(exc):
                raise
        await asyncio.sleep(delay)
        delay *= 2
    return False
