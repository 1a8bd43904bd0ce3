"""The Allocate flow against the API server (§6.4), serialised per plugin.

find the pod (node lock first; the fallback never guesses between two pods) -> pop one
annotation entry per kubelet container request -> build env and mounts -> patch the remainder
(and ``bind-phase=success`` when nothing is left) -> when nothing is left, hand the node lock
on. With ``release_delay`` > 0 (the default; the node says ``hami.io/node-lock-handoff=swap``)
the lock is left for the scheduler's next Bind on this node to swap over, which it does as
soon as it sees the pod finished: one lock write per pod instead of a release and a take. The
plugin removes it itself (one compare-and-remove of the value it read) only if it still holds
that value after the delay, and drops that pending removal as soon as a later read shows the
lock moved on. With 0 the lock is removed at once, right after the success write.
Any failure patches ``bind-phase=failed`` and releases the lock before the error goes back
to the kubelet.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from hami.core.codec import MigAllocation, decode_mig_allocations, decode_pod_devices, encode_mig_allocations
from hami.core.errors import CodecError
from hami.kube import nodelock
from hami.node.cdi import CdiConfig, apply as cdi_apply
from hami.node.layout import HookPaths, reset_cache_dir, write_grant
from hami.node.settings import NodeSettings
from hami.vendors.nvidia import MIG_ALLOCATIONS_ANNOTATION

from . import allocate as A
from .devices import physical_id
from .kube import Kube, describe
from hami.node.mig import MigError, MigManager, PlacementHeld, PlacementKept, PodRef

log = logging.getLogger(__name__)
#: what a failed API call raises: an answer that is an error, no connection, or no answer in time
#: (kube.API_TIMEOUT_S; the budget of the retried writes)
API_FAILURES = (ApiException, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def legacy_mig_grants(text: str, gpus: Iterable[str]) -> list[tuple[str, str]]:
    """The grants of ``gpus`` in a pod's ``hami.io/vgpu-devices-allocated`` written in HAMi's
    legacy MIG form, ``<GPU UUID>[<template>-<slot>]`` (before ``hami.io/vgpu-mig-allocations``):
    (GPU UUID, the device ID as written) pairs. A text that does not decode is searched for
    ``<GPU UUID>[`` instead: when in doubt, the pod is taken to hold an instance there."""
    mine = set(gpus)
    try:
        found = [cd.uuid for ctr in decode_pod_devices(text) for cd in ctr if "[" in cd.uuid]
    except CodecError:
        return [(g, f"{g}[...]") for g in sorted(mine) if f"{g}[" in text]
    return [(u.split("[", 1)[0], u) for u in dict.fromkeys(found) if u.split("[", 1)[0] in mine]


def mig_holders(
    pods: Iterable[A.PodView], gpus: Iterable[str]
) -> tuple[list[tuple[PodRef, MigAllocation]], dict[str, list[str]]]:
    """What this node's live pods (not ``Succeeded``/``Failed``) hold of its MIG GPUs ``gpus``:
    the instances their ``hami.io/vgpu-mig-allocations`` names with a GPU-instance id (an
    annotation that does not decode names none), and the GPUs they hold through HAMi's legacy
    grant (:func:`legacy_mig_grants`; GPU UUID -> "pod ns/name (... names '<grant>')")."""
    gpus = list(gpus)
    claims: list[tuple[PodRef, MigAllocation]] = []
    legacy: dict[str, list[str]] = {}
    for pod in pods:
        if pod.phase in ("Succeeded", "Failed"):
            continue
        for gpu, grant in legacy_mig_grants(pod.annotations.get(A.ALLOCATED, ""), gpus):
            legacy.setdefault(gpu, []).append(f"pod {pod.namespace}/{pod.name} ({A.ALLOCATED} names {grant!r})")
        try:
            entries = decode_mig_allocations(pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION, ""))
        except CodecError:
            continue
        claims += [(PodRef(pod.uid, pod.namespace, pod.name), e) for e in entries if e.gpu_instance_id is not None]
    return claims, legacy


class Allocator:
    def __init__(
        self,
        kube: Kube,
        settings: NodeSettings,
        paths: HookPaths,
        release_delay: float = 1.0,
        cdi: CdiConfig | None = None,
        mig: MigManager | None = None,
        *,
        gpus: Iterable[str],
        healthy: Callable[[str], bool] = lambda uuid: True,
        device_specs: A.DeviceSpecs | None = None,
    ) -> None:
        self.kube = kube
        #: this node's GPU UUIDs (the discovered devices): a grant naming anything else is refused
        self.gpus = frozenset(gpus)
        #: whether a GPU is healthy now (DeviceState.healthy): a grant naming one that had a fatal
        #: XID is refused, as the kubelet keeps its own picks off the IDs reported unhealthy
        self.healthy = healthy
        self.device_specs = device_specs  # --pass-device-specs
        self.mig = mig  # operatingmode mig: makes the instances the scheduler chose
        self.settings = settings
        self.paths = paths
        self.cdi = cdi or CdiConfig()
        self.node = kube.node_name
        self.release_delay = release_delay
        self._lock = asyncio.Lock()
        self._deferred: tuple[str, asyncio.Task] | None = None  # (lock value, its delayed removal)
        self.deferred_stats = {"released": 0, "taken_over": 0}
        self._answering: _Answer | None = None  # the answer of the call in flight, from its first write on
        self._lost: _Answer | None = None  # an answer the kubelet went away without (see allocate)

    async def find_pod(self, allocating: bool = False) -> tuple[A.PodView | None, str | None]:
        """(pod, the lock value read). The lock names the pod; without one, exactly one candidate.
        No pod with a lock value: the lock names a pod that no longer exists (stale).
        ``allocating``: called from Allocate, under the allocator's lock."""
        annotations, node_rv = await self.kube.node_annotations()
        raw = annotations.get(A.NODE_LOCK)
        if allocating and self._deferred is not None and self._deferred[0] != raw:
            self._drop_deferred()  # the scheduler swapped the lock over (or it is gone): nothing to remove
        lock = A.parse_node_lock(raw)
        if lock is not None:
            pod, cached = await self.kube.lock_owner(lock.namespace, lock.name, node_rv)
            if pod is None:
                return None, raw
            phase = pod.annotations.get(A.BIND_PHASE)
            ours_left = A.TO_ALLOCATE in nodelock.devices_pending(pod.annotations)
            if (phase == "failed" or (phase == "success" and not ours_left)) and pod.node_name == self.node:
                # (success with GPUs still to hand out: another vendor's plugin wrote it for its
                # own part of the pod, which is the pod being admitted all the same)
                # A lock left to be handed on names a pod whose allocation is over: it cannot be
                # the pod being admitted (each lock holder is allocated once). Not ours to touch
                # (its delayed removal, or the scheduler's swap, deals with it): look for the
                # pod the way HAMi does without a lock.
                log.info(
                    "node %s: the node lock names pod %s, whose allocation is over; looking for "
                    "the pending pod among this node's pods",
                    self.node,
                    pod.ref,
                )
                return A.choose_pending(await self.kube.pods_on_node(), self.node, finished=pod), None
            if cached:
                log.debug("pod %s: read from the watch cache (newer than the node lock)", pod.ref)
            if pod.node_name != self.node:
                # The kubelet only admits pods bound to it: the lock's pod is not the one being
                # admitted (its Bind is still in flight). Fail this call, touch nothing of that pod.
                raise _NotThisPod(
                    f"node {self.node}: the node lock names pod {pod.ref}, which is not bound to this node yet; "
                    "the pod being admitted is not known, the kubelet will retry"
                )
            return pod, raw
        return A.choose_pending(await self.kube.pods_on_node(), self.node), None

    async def allocate(self, requests: Sequence[int]) -> list[A.ContainerResponse]:
        """A call cancelled from its first write on (gRPC cancels it when the kubelet goes away:
        a kubelet restart) keeps its answer as lost: the kubelet never recorded it and, admitting
        the pod anew, asks for the same container again; that call finds the entry taken (the pod
        over, the lock maybe handed to the next pod, whose entry it would take). While the pod
        still waits for it, an Allocate that can be that retry gets the same answer again, and
        one that could as well be another pod's admission is refused touching neither pod."""
        async with self._lock:
            pod: A.PodView | None = None
            held: str | None = None  # the node lock value naming ``pod``, as read
            self._answering = None
            try:
                if self._lost is not None:
                    lost = await self._lost_retry(requests)
                    if lost is not None:
                        return await self._answer_again(lost)
                try:
                    pod, held = await self.find_pod(allocating=True)
                except _NotThisPod as exc:
                    log.error("Allocate failed: %s", exc)
                    raise A.AllocationError(str(exc)) from None
                if pod is None:
                    await self._drop_stale_lock(held)
                    raise A.AllocationError(
                        f"node {self.node}: the node lock {held!r} names a pod that no longer exists; "
                        "lock released, the kubelet will retry"
                    )
                return await self._allocate_pod(pod, requests, held)
            except A.AllocationError as exc:
                await self._fail(pod, str(exc), held)
                raise
            except API_FAILURES as exc:  # OSError also: a cache directory that cannot be made
                what = f"pod {pod.ref}" if pod else f"node {self.node}"
                msg = f"{what}: allocation failed: {_brief(exc)}"
                await self._fail(pod, msg, held)
                raise A.AllocationError(msg) from None
            except Exception as exc:  # noqa: BLE001 - whatever it is, the pod fails and the lock goes
                # (a value from the pod's spec the grant cannot carry raised ValueError past _fail:
                # bind-phase stayed allocating and the node's lock held, any tenant could do it)
                what = f"pod {pod.ref}" if pod else f"node {self.node}"
                msg = f"{what}: allocation failed: {exc}"
                log.exception("Allocate: unexpected failure")
                await self._fail(pod, msg, held)
                raise A.AllocationError(msg) from None
            except asyncio.CancelledError:
                if self._answering is not None:
                    self._lost = self._answering
                    log.warning(
                        "pod %s: Allocate cancelled (the kubelet went away) after its first write; its answer "
                        "is kept for the kubelet's retry",
                        self._lost.ref,
                    )
                raise
            finally:
                self._answering = None

    async def _lost_retry(self, requests: Sequence[int]) -> _Answer | None:
        """The lost answer when this call can be the kubelet's retry for it, else None (and the
        record dropped once the pod no longer waits for one: rejected, gone, or its writes never
        landed, which leaves its entry to hand out again the ordinary way)."""
        lost = self._lost
        assert lost is not None
        pod = await self.kube.get_pod(lost.namespace, lost.name)
        if (
            pod is None
            or pod.uid != lost.uid
            or pod.node_name != self.node
            or pod.phase != "Pending"
            or pod.annotations.get(A.BIND_PHASE) == "failed"
            or pod.annotations.get(A.TO_ALLOCATE) != lost.written
        ):
            self._lost = None
            return None
        if tuple(requests) != lost.requests:
            return None  # not the same container's request: not the retry, which may still come
        try:
            other, _ = await self.find_pod(allocating=True)
        except (A.AllocationError, _NotThisPod):
            other = None  # no pod is being admitted: the retry is the only call this can be
        if other is not None and other.uid != lost.uid and other.phase == "Pending":
            raise A.AllocationError(
                f"node {self.node}: the kubelet went away during pod {lost.ref}'s Allocate after its grant was "
                f"taken, and pod {other.ref} is now waiting for GPU allocation: this call may be either one's "
                f"(the kubelet names no pod); refused, neither pod's grant touched"
            )
        return lost

    async def _answer_again(self, lost: _Answer) -> list[A.ContainerResponse]:
        """The same answer as the lost one (its container is not created yet: its cache directory
        and grant file are made again), no write to the API server."""
        for r in lost.responses:
            if r.cache_dir:
                reset_cache_dir(r.cache_dir)
                write_grant(r.cache_dir, r.grant)
        self._lost = None
        log.info("pod %s: the kubelet's retry of an Allocate whose answer it lost; answered again", lost.ref)
        if lost.handed is not None:
            # the call was cut after the success write, before the lock was handed on: hand it
            # on now (with release_delay 0 it stayed for good: HAMi's scheduler, which does not
            # swap, waits out a lock for 5 minutes; found by review)
            if self.release_delay > 0 and self._deferred is None:
                self._defer_release(lost.handed)
            else:  # (now, not in place of another pod's release waiting for its delay)
                try:
                    await self.kube.release_held_lock(lost.handed)
                except API_FAILURES as exc:
                    log.error("node %s: cannot release the node lock of pod %s: %s", self.node, lost.ref, _brief(exc))
        return list(lost.responses)

    async def _allocate_pod(
        self, pod: A.PodView, requests: Sequence[int], held: str | None
    ) -> list[A.ContainerResponse]:
        pending, shift = A.pending_layout(pod, self.settings.resource_name)
        grants = [A.pop_next(pod, pending, n, gpus=self.gpus, resource=self.settings.resource_name) for n in requests]
        sick = sorted({d.uuid for g in grants for d in g.devices if not self.healthy(d.uuid)})
        if sick:
            raise A.AllocationError(
                f"pod {pod.ref}: its grant names GPU(s) {', '.join(sick)}, unhealthy on node {self.node} since it was "
                "placed (a fatal XID); refused"
            )
        mig_devices: list[list[str]] = [[] for _ in grants]
        mig_patch: dict[str, str] = {}
        if self.mig is not None:
            mig_devices, text = await self._make_mig(pod, grants, shift)
            mig_patch[MIG_ALLOCATIONS_ANNOTATION] = text
        responses = [
            cdi_apply(
                A.build_response(pod, g, self.settings, self.paths, m, self.device_specs),
                self.cdi,
                pod.uid,
                g.container.name,
            )
            for g, m in zip(grants, mig_devices)
        ]
        for r in responses:
            if r.cache_dir:
                reset_cache_dir(r.cache_dir)
                write_grant(r.cache_dir, r.grant)
        remains = A.remainder(pending, shift)
        # the pod's allocation is over when no vendor's devices are left to hand out: a pod asking
        # for another vendor's devices too keeps bind-phase and the lock for that vendor's plugin,
        # which finds its pod by the same lock (marked success here, the lock went to the next pod)
        others = [k for k in nodelock.devices_pending(pod.annotations) if k != A.TO_ALLOCATE]
        done = A.all_done(pending) and not others
        self._answering = _Answer(
            pod.namespace, pod.name, pod.uid, tuple(requests), tuple(responses), remains, held if done else None
        )
        if A.all_done(pending) and others:
            log.info("pod %s: its GPUs are allocated; %s still to be allocated by another plugin", pod.ref, others)
        handoff = done and held is not None and self.release_delay > 0
        patch = {A.TO_ALLOCATE: remains, **mig_patch}
        if done:
            patch[A.BIND_PHASE] = "success"
        # the label hami.io/vgpu-node is how a vGPU monitor (ours, HAMi's) finds this node's
        # pods; HAMi's scheduler sets it from Filter, ours (--decision-write=binding) leaves it here
        await self.kube.patch_pod_annotations(pod, patch, labels={A.VGPU_NODE: self.node})
        if done and not handoff:
            # The lock's one job, telling this plugin which pod the kubelet is admitting, is over
            # once the pod is marked (Allocate comes once per container; the lock stays until the
            # last one). Not before that write: a kubelet gone during it (the write cut) retries
            # this pod, which, its entry not taken on the pod, is found by the lock again; with
            # the lock handed on, the retry took the next pod's entry (found by review). A failed
            # write above marks the pod failed and releases the lock through _fail.
            await self._release_done(pod, held)
        if handoff:
            # the pod is marked: the scheduler swaps the lock over for its next Bind here on
            # seeing that; if none comes within release_delay, remove it ourselves
            self._defer_release(held)
        names = ", ".join(g.container.name for g in grants)
        log.info(
            "pod %s: allocated container(s) %s%s [pod reads: %d from the watch cache, %d from the API server]",
            pod.ref,
            names,
            " (pod complete)" if done else "",
            self.kube.pods.hits,
            self.kube.pods.misses,
        )
        return responses

    async def _make_mig(self, pod: A.PodView, grants: Sequence[A.Grant], shift: int = 0) -> tuple[list[list[str]], str]:
        """Create (or reuse) the MIG instances of these containers; returns each one's MIG device
        UUIDs and the pod's ``hami.io/vgpu-mig-allocations`` with their runtime identity added.
        Its container indexes follow the allocated annotation's layout (``shift``: an old
        layout's, counted without the init containers, as the ledger reads them; HAMi v2.10's
        list of the GPU containers' entries alone, :func:`hami.deviceplugin.allocate.allocated_layout`)."""
        raw = pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION, "")
        try:
            allocs = list(decode_mig_allocations(raw))
        except CodecError as exc:
            raise A.AllocationError(
                f"pod {pod.ref}: annotation {MIG_ALLOCATIONS_ANNOTATION}={raw!r} is invalid: {exc}"
            ) from None
        ref = PodRef(pod.uid, pod.namespace, pod.name)
        # its indexes count the allocated annotation's entries: HAMi v2.10's list of the GPU
        # containers' entries alone maps them to other containers (hami.core.ledger.entry_layout)
        layout = A.allocated_layout(pod, self.settings.resource_name)

        def owner(i: int) -> int:
            return layout.container(i) if layout.moves else i + shift

        out = []
        for g in grants:
            mine = sorted((a for a in allocs if owner(a.container) == g.index), key=lambda a: a.device)
            if [a.device for a in mine] != list(range(len(g.devices))) or any(
                a.gpu_uuid != d.uuid for a, d in zip(mine, g.devices)
            ):
                raise A.AllocationError(
                    f"pod {pod.ref}: container {g.container.name!r}: annotation {MIG_ALLOCATIONS_ANNOTATION} does not "
                    f"name one MIG instance per granted GPU ({[d.uuid for d in g.devices]}) (operatingmode is mig)"
                )
            made = await self._prepare_mig(ref, mine)
            index = {(a.container, a.device): a for a in made}
            allocs = [index.get((a.container, a.device), a) for a in allocs]
            out.append([a.mig_uuid for a in made])
        return out, encode_mig_allocations(allocs)

    async def _prepare_mig(self, ref: PodRef, allocs: list[MigAllocation]) -> list[MigAllocation]:
        assert self.mig is not None
        try:
            try:
                return await asyncio.to_thread(self.mig.prepare, ref, allocs)
            except (PlacementHeld, PlacementKept) as exc:
                # the holder may be a pod that is gone and not collected yet (or, on a GPU kept whole
                # at start-up, the pods holding it through HAMi's legacy grant may have ended): collect
                # now, then retry once
                log.info("%s; collecting instances of finished pods and retrying", exc)
                await self.collect_mig()
                return await asyncio.to_thread(self.mig.prepare, ref, allocs)
        except MigError as exc:
            raise A.AllocationError(str(exc)) from None

    async def collect_mig(self) -> list[str]:
        """Destroy the MIG instances of pods that are gone from this node or finished; on a GPU
        kept whole at start-up (HAMi's legacy MIG grant) that no live pod holds that way any more,
        the instances nobody claims (:meth:`MigManager.release_kept`). A pod list that cannot be
        read raises, and nothing is destroyed."""
        if self.mig is None:
            return []
        seen = self.mig.snapshot()  # instances made after this point belong to pods the list may miss
        pods = await self.kube.pods_on_node()
        live = {p.uid for p in pods if p.phase not in ("Succeeded", "Failed")}
        done = await asyncio.to_thread(self.mig.collect, live, seen)
        if self.mig.kept:
            claims, legacy = mig_holders(pods, self.mig.gpus)
            done += await asyncio.to_thread(self.mig.release_kept, set(legacy), claims)
        for line in done:
            log.info("MIG: %s", line)
        return done

    def _defer_release(self, value: str) -> None:
        if self._deferred is not None:
            self._deferred[1].cancel()
        task = asyncio.get_running_loop().create_task(self._release_later(value))
        self._deferred = (value, task)

    def _drop_deferred(self) -> None:
        if self._deferred is not None:
            self._deferred[1].cancel()
            self._deferred = None
            self.deferred_stats["taken_over"] += 1

    async def _release_later(self, value: str, delay: float | None = None) -> None:
        await asyncio.sleep(self.release_delay if delay is None else delay)
        async with self._lock:  # never between an Allocate's read of the lock and its use
            if self._deferred is None or self._deferred[0] != value:
                return
            self._deferred = None
            try:
                await self.kube.release_held_lock(value)  # left alone when already swapped over
                self.deferred_stats["released"] += 1
            except API_FAILURES as exc:
                log.error("node %s: cannot release the node lock %r: %s", self.node, value, _brief(exc))

    async def flush(self) -> None:
        """Remove a lock whose delayed removal is pending now (at shutdown: leave no lock behind)."""
        if self._deferred is not None:
            value, task = self._deferred
            task.cancel()
            await self._release_later(value, delay=0)

    async def reclaim_finished_lock(self) -> bool:
        """At start-up: a node lock naming a pod whose allocation is over (bind-phase success or
        failed, or the pod ended or is gone) is what a predecessor killed during its
        --lock-release-delay left; remove it (compare-and-remove of the value read, so a
        scheduler that swapped it over meanwhile wins). Returns whether one was removed."""
        annotations, _ = await self.kube.node_annotations()
        value = annotations.get(A.NODE_LOCK)
        owner = nodelock.parse_node_lock(value)
        if value is None or owner is None:
            return False
        pod = await self.kube.get_pod(owner.namespace, owner.name)
        phase = pod.annotations.get(A.BIND_PHASE) if pod is not None else None
        # success ends it only with no vendor's devices left (nodelock.finished): another vendor's
        # plugin writes it for its own part, and ours (or it) still finds the pod by this lock
        over = phase == "failed" or (phase == "success" and not nodelock.devices_pending(pod.annotations))
        if pod is not None and not (over or pod.phase in ("Succeeded", "Failed")):
            return False  # still being admitted: Allocate finds it by this lock
        await self.kube.release_held_lock(value)
        log.info("node %s: removed the node lock %r its finished owner left", self.node, value)
        return True

    async def _release_done(self, pod: A.PodView, held: str | None) -> None:
        """A failed release is logged, not fatal (the scheduler reclaims a lock whose owner has
        finished). With the lock value read in find_pod: one compare-and-remove of that value."""
        try:
            if held is not None:
                await self.kube.release_held_lock(held)
            elif not await self.kube.release_lock(pod):
                log.error("node %s: node lock of pod %s still held after retries", self.node, pod.ref)
        except API_FAILURES as exc:
            log.error("node %s: cannot release the node lock of pod %s: %s", self.node, pod.ref, _brief(exc))

    async def _fail(self, pod: A.PodView | None, msg: str, held: str | None = None) -> None:
        """Both writes are tried whatever the first one's fate (each bounded in time), so the
        kubelet gets its answer and the lock is not left behind by a failed pod write. The pod
        write names the pod's UID and the lock goes by the value read (``held``) when there was
        one: a pod deleted and re-created under its name meanwhile (a StatefulSet's, force
        deleted) is neither marked failed nor robbed of the lock the scheduler gave it."""
        log.error("Allocate failed: %s", msg)
        if pod is None:
            return
        try:
            await self.kube.patch_pod_annotations(pod, {A.BIND_PHASE: "failed"})
        except API_FAILURES as exc:
            log.error("pod %s: cannot set %s=failed: %s", pod.ref, A.BIND_PHASE, _brief(exc))
        try:
            if held is not None:
                await self.kube.release_held_lock(held)
            else:
                await self.kube.release_lock(pod)
        except API_FAILURES as exc:
            log.error("node %s: cannot release the node lock: %s", self.node, _brief(exc))

    async def _drop_stale_lock(self, value: str | None) -> None:
        annotations, rv = await self.kube.node_annotations()
        if value is not None and annotations.get(A.NODE_LOCK) == value:
            try:
                await self.kube.patch_node_annotations({A.NODE_LOCK: None}, rv)
            except API_FAILURES as exc:
                log.error("node %s: cannot release stale lock: %s", self.node, _brief(exc))


@dataclass(frozen=True)
class _Answer:
    """One Allocate call's answer, and the to-allocate value its write leaves on the pod."""

    namespace: str
    name: str
    uid: str
    requests: tuple[int, ...]
    responses: tuple[A.ContainerResponse, ...]
    written: str
    # the node lock value read for the pod, when this answer ends its allocation (the lock is
    # handed on after the write: a call cut between the two leaves it to the retry)
    handed: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class _NotThisPod(Exception):
    """The lock names a pod the kubelet cannot be admitting (not bound here)."""


def _brief(exc: Exception) -> str:
    return describe(exc)


def preferred_ids(available: Sequence[str], must: Sequence[str], size: int, uuids: Sequence[str]) -> list[str]:
    """Kubelet IDs for one container: ``must`` first, then one ID on each annotated GPU, then any."""
    chosen = list(dict.fromkeys(must))[:size]
    for uuid in uuids:
        if len(chosen) >= size or any(physical_id(c) == uuid for c in chosen):
            continue
        match = next((a for a in available if physical_id(a) == uuid and a not in chosen), None)
        if match:
            chosen.append(match)
    chosen += [a for a in available if a not in chosen][: size - len(chosen)]
    return chosen


async def preferred_allocation(allocator: Allocator, requests: Sequence[tuple[Sequence[str], Sequence[str], int]]):
    """GetPreferredAllocation: align kubelet IDs with the pending pod's annotated GPUs (read-only)."""
    try:
        pod, _ = await allocator.find_pod()
        pending = A.pending_devices(pod, allocator.settings.resource_name) if pod else []
    except (A.AllocationError, _NotThisPod, *API_FAILURES) as exc:
        log.info("GetPreferredAllocation without a pending pod (%s); plain order", _brief(exc))
        pending = []
    # the entries pop_next takes, in its order: one naming a GPU (UUID-less padding, placed before
    # the GPU container's entry by the layout, made the first preference [''], found by review)
    entries = [
        [d.uuid for d in devs if d.uuid and d.type.startswith(A.NVIDIA_TYPE)] for devs in pending if A.granted(devs)
    ]
    out = []
    for i, (available, must, size) in enumerate(requests):
        uuids = entries[i] if i < len(entries) else []
        out.append(preferred_ids(available, must, size, uuids))
    return out
