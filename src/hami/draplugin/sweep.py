"""The periodic sweep of prepared claims that the API server no longer has.

The kubelet unprepares a claim when its last pod on the node is done. When it never does (the
kubelet restarted and lost track, the claim was force-deleted), the checkpoint would keep the
claim, its CDI spec and its region directory forever. Every ``--sweep-interval`` the agent reads
each claim its checkpoint holds from the API server (RBAC ``get`` on ``resourceclaims``, which
prepare already needs) and unprepares it when the answer is 404 (``deleted``) or a claim of that
name with another UID (``recreated``: the old one was deleted and a new one made under its name),
or when the claim's allocation has no result of this driver in this node's pool any more
(``deallocated``: deallocated, or allocated again elsewhere, under its UID; the kubelet
unprepares before a claim is deallocated, so an entry left then is one it lost track of).
A claim that a prepare answers while the sweep reads it (allocated here again meanwhile) is kept.

A claim whose unprepare fails (a dynamic MIG instance NVML will not destroy while processes are
still on it) is kept, counted as an error, and tried again by the next sweep.

Nothing is removed on any other answer: an API error, a timeout or a malformed reply is logged and
counted (``hami_dra_sweep_errors_total``), and the claim is kept until a later sweep can tell. A
claim that still exists is kept even while it is being deleted (the kubelet unprepares it then).

A grace period (``--sweep-grace``) gives the kubelet its chance first: a claim found gone is only
noted (``SweepResult.waiting``) and unprepared by a later sweep that still finds it gone at least
the grace period after the first; found again (same UID) it is forgotten. An API error in between
neither sweeps it nor resets the wait. :func:`sweep_loop` keeps the notes between sweeps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from hami.kube.client import KubeError

from .plugin import Driver
from .prepare import node_results

log = logging.getLogger(__name__)
RESOURCE_CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


class ClaimGetter(Protocol):
    """What the sweep needs of :class:`hami.kube.client.KubeClient`."""

    async def get(self, path: str, **query: Any) -> Any: ...


@dataclass
class SweepResult:
    kept: list[str] = field(default_factory=list)  # UIDs the API server still has
    swept: dict[str, str] = field(default_factory=dict)  # UID -> reason (deleted / recreated / deallocated)
    errors: dict[str, str] = field(default_factory=dict)  # UID -> why it could not be checked (kept)
    waiting: dict[str, str] = field(default_factory=dict)  # UID -> reason: gone, within the grace period


async def sweep_once(
    driver: Driver,
    kube: ClaimGetter,
    grace: float = 0.0,
    gone_since: dict[str, float] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> SweepResult:
    """Check every prepared claim once against the API server; unprepare the ones gone for at least
    ``grace`` seconds (``gone_since``: UID -> when a sweep first found it gone, kept by the caller
    between sweeps and updated here; with ``grace`` 0 a claim found gone is unprepared at once)."""
    out = SweepResult()
    gone_since = {} if gone_since is None else gone_since
    now = clock()
    refs = driver.checkpoint.refs()
    for uid in [u for u in gone_since if u not in refs]:  # unprepared meanwhile (by the kubelet)
        del gone_since[uid]
    for uid, (namespace, name) in sorted(refs.items()):
        mark = driver.mark(uid)  # a prepare that answers the claim while it is read keeps it
        if not namespace or not name:
            out.errors[uid] = "the checkpoint entry has no namespace/name"
            log.warning("sweep: claim %s: the checkpoint has no namespace/name for it; kept", uid)
            driver.metrics.sweep_errors.inc()
            continue
        reason = ""
        try:
            claim = await kube.get(RESOURCE_CLAIMS.format(namespace=namespace, name=name))
        except KubeError as exc:
            if exc.status != 404:
                out.errors[uid] = str(exc)
                log.warning("sweep: cannot read claim %s/%s (%s), kept: %s", namespace, name, uid, exc)
                driver.metrics.sweep_errors.inc()
                continue
            reason = "deleted"
        except Exception as exc:  # a timeout, a broken connection: never a reason to remove
            out.errors[uid] = str(exc) or type(exc).__name__
            log.warning("sweep: cannot read claim %s/%s (%s), kept: %r", namespace, name, uid, exc)
            driver.metrics.sweep_errors.inc()
            continue
        if not reason:
            meta = claim.get("metadata") if isinstance(claim, dict) else None
            got = meta.get("uid") if isinstance(meta, dict) else None
            if not got:
                out.errors[uid] = "the API server's answer has no metadata.uid"
                log.warning("sweep: claim %s/%s (%s): the answer has no metadata.uid; kept", namespace, name, uid)
                driver.metrics.sweep_errors.inc()
                continue
            if got == uid and node_results(claim, driver.node):
                out.kept.append(uid)
                gone_since.pop(uid, None)
                continue
            reason = "recreated" if got != uid else "deallocated"
        first = gone_since.setdefault(uid, now)
        if now - first < grace:
            out.waiting[uid] = reason
            log.info(
                "sweep: claim %s/%s (%s) is gone from the API server (%s); unprepared if still gone after %gs",
                namespace,
                name,
                uid,
                reason,
                grace,
            )
            continue
        gone_since.pop(uid, None)
        why = {
            "deleted": "the API server no longer has it",
            "recreated": "the API server has another claim by its name",
            "deallocated": "its allocation has no device of this node any more",
        }[reason]
        try:
            released = await driver.release(namespace, name, uid, why=f"swept, {why}", unless_answered_since=mark)
        except Exception as exc:  # a MIG instance NVML will not destroy yet, a checkpoint write that
            # failed: this claim stays recorded and is tried again by the next sweep, without a second
            # grace period; the others are still swept (found by review, 1 Dec)
            out.errors[uid] = str(exc) or type(exc).__name__
            gone_since[uid] = first
            log.warning("sweep: cannot unprepare claim %s/%s (%s), kept: %s", namespace, name, uid, exc)
            driver.metrics.sweep_errors.inc()
            continue
        if released:
            out.swept[uid] = reason
            driver.metrics.swept.labels(reason).inc()
    return out


async def sweep_loop(
    driver: Driver, kube: ClaimGetter, interval: float, stop: asyncio.Event, grace: float = 0.0
) -> None:
    """:func:`sweep_once` every ``interval`` seconds (the first after one interval) until ``stop``,
    a claim unprepared once gone for ``grace`` seconds."""
    gone_since: dict[str, float] = {}
    while True:
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
            return
        except asyncio.TimeoutError:
            pass
        try:
            result = await sweep_once(driver, kube, grace, gone_since)
        except Exception:  # a checkpoint write failure: logged, the next round tries again
            log.exception("sweep failed")
            continue
        if result.swept or result.errors or result.waiting:
            log.info(
                "sweep: %d kept, %d swept, %d waiting out the grace period, %d not checked",
                len(result.kept),
                len(result.swept),
                len(result.waiting),
                len(result.errors),
            )
