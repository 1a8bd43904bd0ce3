"""The per-node locks shared by the scheduler and the device plugins (§5.8).

Most vendors share ``hami.io/mutex.lock``, value ``"<RFC3339 time>,<namespace>,<pod name>"``
(HAMi's format; a legacy value is a bare RFC3339 time). A vendor may declare its own lock
(``lock_annotation``, ``lock_format``, ``lock_expiry_seconds`` on the vendor class, e.g. Cambricon's
``cambricon.com/dsmlu.lock``: a bare RFC3339 time that expires after 2 minutes); :class:`LockSpec`
carries those three attributes and :func:`vendor_locks` lists the locks a pod's bind takes. The scheduler takes it in Bind before the Binding; the device plugin releases it
when Allocate ends (success or failure). Two writers never both win (§13 pitfall 6): taking a
free lock carries ``metadata.resourceVersion``; replacing or removing a held one is a JSON patch
whose ``test`` op names the value being replaced (:func:`swap_patch`), which the API server
applies atomically, so it needs no read first and no unrelated node write makes it conflict.

Beyond HAMi: the lock is also reclaimed (not only after its expiry) when its owner can no
longer be using it: the pod is gone, finished its allocation (``bind-phase`` success/failed),
ended without one (phase Failed/Succeeded: refused by the kubelet at admission), was re-placed
on another node, or is bound to another node. Pure decisions are here; the two
components bring their own API calls (``read``/``write`` callables).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Iterable, Mapping

from hami.core.names import (
    BIND_PHASE,
    NODE_INJECTION,
    NODE_LOCK,
    NODE_LOCK_HANDOFF,
    VGPU_NODE,
    is_devices_to_allocate,
)

# Beyond HAMi: a node annotation by which the node's device plugin says it leaves a finished
# pod's lock for the next Bind to swap over (one lock write per pod instead of a release and a
# take) and removes it itself only after a delay. Without it the scheduler waits for the
# plugin's own release first (HAMi's plugins release right after marking the pod).
LOCK_HANDOFF = NODE_LOCK_HANDOFF
HANDOFF_SWAP = "swap"

# Beyond HAMi (docs/nri.md): a node whose agent gives each container its grant when the container
# runtime creates it (NRI) needs no lock to tell its device plugin which pod an Allocate serves.
# Only the vendors that agent injects bind without the lock there; any other vendor in the pod
# (its own device plugin speaks HAMi's lock protocol) makes the Bind take the locks as anywhere.
INJECTION_NRI = "nri"
INJECTED_VENDORS = frozenset({"NVIDIA"})


@dataclass(frozen=True)
class NodeLock:
    time: str
    namespace: str
    name: str


def rfc3339(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def lock_value(now: datetime, namespace: str, name: str) -> str:
    """The annotation value for a lock taken at ``now`` by pod ``namespace/name``."""
    return f"{rfc3339(now)},{namespace},{name}"


OWNER, TIME = "owner", "time"  # value formats: "<RFC3339>,<ns>,<pod>" | bare "<RFC3339>"
FORMATS = (OWNER, TIME)


@dataclass(frozen=True)
class LockSpec:
    """One node lock: annotation key, value format, expiry (None: the caller's default)."""

    key: str = NODE_LOCK
    format: str = OWNER
    expiry_s: float | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"lock_format: {self.format!r} is not one of {', '.join(FORMATS)} (lock {self.key})")
        if not self.key:
            raise ValueError("lock_annotation: empty key")
        if self.expiry_s is not None and not self.expiry_s > 0:
            raise ValueError(f"lock_expiry_seconds: {self.expiry_s!r} must be > 0 (lock {self.key})")

    def value(self, now: datetime, namespace: str, name: str) -> str:
        return lock_value(now, namespace, name) if self.format == OWNER else rfc3339(now)

    def holder(self, value: str | None) -> NodeLock | None:
        """The pod a value names (owner format only; a bare time names nobody)."""
        return parse_node_lock(value) if self.format == OWNER else None

    def expiry(self, default: float) -> float:
        return default if self.expiry_s is None else self.expiry_s


HAMI_LOCK = LockSpec()


def vendor_lock(vendor: Any) -> LockSpec | None:
    """The lock a vendor declares (None: it takes none). Raises ValueError naming a bad attribute."""
    key = getattr(vendor, "lock_annotation", None)
    if not key:
        return None
    return LockSpec(key, getattr(vendor, "lock_format", OWNER), getattr(vendor, "lock_expiry_seconds", None))


def vendor_locks(vendors: Iterable[Any], names: Iterable[str]) -> list[LockSpec]:
    """The locks a bind takes for a pod requesting the vendors ``names``: one per distinct key,
    in the order of the vendors' backend keys (HAMi sorts backends by key)."""
    wanted = set(names)
    out: list[LockSpec] = []
    for vendor in sorted(vendors, key=lambda v: v.name):
        spec = vendor_lock(vendor) if vendor.name in wanted else None
        if spec is not None and all(s.key != spec.key for s in out):
            out.append(spec)
    return out


def injects_at_creation(node: Mapping[str, Any] | None) -> bool:
    """The node says its agent injects each container's grant at creation (``hami.io/node-injection: nri``)."""
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(NODE_INJECTION) == INJECTION_NRI


def lockless(node: Mapping[str, Any] | None, vendors: Iterable[str]) -> bool:
    """A Bind of a pod asking for the vendors ``vendors`` (names) on ``node`` takes no lock: the
    node injects at creation and every vendor asked for is one its agent injects."""
    wanted = set(vendors)
    return bool(wanted) and wanted <= INJECTED_VENDORS and injects_at_creation(node)


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
OWNER_FINISHED = "owner pod finished its allocation"  # the stale reason a handoff waits on


def devices_pending(annotations: Mapping[str, str]) -> list[str]:
    """The pod's ``hami.io/<vendor>-devices-to-allocate`` annotations that still name a device
    (a device plugin has its part of the pod still to hand out); an emptied one is only
    separators (``;``, ``:``, ``,``)."""
    return sorted(k for k, v in annotations.items() if is_devices_to_allocate(k) and _names_device(str(v)))


def _names_device(value: str) -> bool:
    """Some ``UUID,TYPE,MEM,CORES`` entry of a to-allocate value names a device. HAMi's releases
    that padded a GPU-less container after a GPU one with a zero ``ContainerDevice`` wrote
    ``,,0,0`` there, which no plugin hands out (HAMi's own counts the pod done once the value no
    longer holds its device word); any other text left counts as a device."""
    for entry in value.replace(";", ":").split(":"):
        if entry.strip(" ,\n") and not entry.startswith(","):
            return True
    return False


def finished(owner: Any) -> bool:
    """The owner pod can never need its lock again, whatever happens next (its allocation
    ended, or it is being deleted before it was bound); a cached copy saying so needs no fresh
    read. ``bind-phase: success`` ends it only once no vendor's devices are left to hand out: in
    a pod asking for two vendors' devices, HAMi's plugins write success when their own part is
    done, and the other plugin, finding its pod by this lock, would meet the next pod's name.
    A pod being deleted once bound may still be admitted (a kubelet that first sees it with its
    deletion set still calls Allocate), so it is not finished while it is allocating."""
    if owner is None or owner is MISSING:
        return False
    meta = owner.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    phase = annotations.get(BIND_PHASE)
    return (
        (bool(meta.get("deletionTimestamp")) and not (owner.get("spec") or {}).get("nodeName"))
        or phase == "failed"
        or (phase == "success" and not devices_pending(annotations))
        or (owner.get("status") or {}).get("phase") in ("Failed", "Succeeded")
    )


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
    if annotations.get(BIND_PHASE) == "failed" or (
        annotations.get(BIND_PHASE) == "success" and not devices_pending(annotations)
    ):
        return f"{OWNER_FINISHED} (bind-phase={annotations[BIND_PHASE]})"
    phase = (owner.get("status") or {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        # e.g. the kubelet refused it at admission (UnexpectedAdmissionError: bound while the
        # device plugin was restarting), so no Allocate will ever release the lock
        return f"owner pod ended ({phase}) before its allocation"
    if spec.get("nodeName") == node:
        # bound here, allocation not finished: the device plugin finds it by this lock, even
        # while it is being deleted (a kubelet that first sees it then still admits it and calls
        # Allocate; with the lock handed on, that call took the next pod's grant, and the next
        # pod, finding itself done, this one's). It ends with the pod gone, ended or expired.
        return None
    if meta.get("deletionTimestamp"):
        return "owner pod is being deleted"
    if spec.get("nodeName"):
        return f"owner pod is bound to node {spec['nodeName']}"
    if annotations.get(VGPU_NODE) and annotations[VGPU_NODE] != node:
        return f"owner pod was placed on node {annotations[VGPU_NODE]}"
    return None


def _pointer(key: str) -> str:
    """The JSON pointer (RFC 6901) of annotation ``key``."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def swap_patch(key: str, old: str, new: str | None) -> list[dict[str, Any]]:
    """A JSON patch that sets annotation ``key`` to ``new`` (removes it when None) only while it
    still holds ``old``; otherwise the API server rejects it whole (HTTP 422) and writes nothing."""
    path = _pointer(key)
    change = {"op": "remove", "path": path} if new is None else {"op": "replace", "path": path, "value": new}
    return [{"op": "test", "path": path, "value": old}, change]


def lost_swap(exc: BaseException) -> bool:
    """A :func:`swap_patch` (or a resourceVersion-guarded write) found the lock changed."""
    return getattr(exc, "status", None) in (409, 422)


class LockContention(Exception):
    """The node is locked by another live pod. The message names no pod: it reaches the waiting
    pod's events (BindingFailed, kube-scheduler's FailedScheduling), which its namespace reads, and
    the lock's owner may be another tenant's (found by review, 1 Dec); ``value`` has it for logs."""

    def __init__(self, node: str, value: str) -> None:
        self.node, self.value = node, value
        taken = lock_time(value) if value else None
        since = f" since {taken.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}" if taken is not None else ""
        super().__init__(f"node {node} is locked by another pod's device allocation{since}")


def _conflict(exc: BaseException) -> bool:
    return getattr(exc, "status", None) == 409


ReadNode = Callable[[], Awaitable[tuple[Mapping[str, str], str]]]  # -> (annotations, resourceVersion)
WriteNode = Callable[[Mapping[str, Any], str], Awaitable[None]]  # (annotations patch, resourceVersion)


async def release(
    read: ReadNode,
    write: WriteNode,
    owner: tuple[str, str] | None,
    attempts: int = 5,
    delay: float = 0.05,
    *,
    key: str = NODE_LOCK,
    value: str | None = None,
) -> bool:
    """Remove the lock ``key`` if ``owner`` (namespace, name) holds it (any lock when ``owner``
    is None); with ``value``, only while the lock still has exactly that value (how a bare-time
    lock, which names no pod, is released by the one who wrote it).

    Returns True when the lock is gone afterwards or belongs to another pod (left in place);
    False when every attempt lost a write race.
    """
    for _ in range(attempts):
        annotations, rv = await read()
        current = annotations.get(key)
        if (
            current is None
            or (value is not None and current != value)
            or (value is None and owner is not None and not owned_by(current, *owner))
        ):
            return True
        try:
            await write({key: None}, rv)
            return True
        except Exception as exc:  # noqa: BLE001 - only write conflicts are retried
            if not _conflict(exc):
                raise
        await asyncio.sleep(delay)
        delay *= 2
    return False
