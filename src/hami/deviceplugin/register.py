"""Keeps ``hami.io/node-nvidia-register`` equal to what this node has (§4.3, §4.4).

The annotation is rewritten only when its text would change (a health change, a config
change, a restart with different GPUs, someone editing it). With every rewrite, and whenever
the handshake reads ``Deleted_…`` (a stale verdict of an old scheduler, A3), the plugin writes
``hami.io/node-handshake: Reported <time>`` so that any HAMi-compatible scheduler re-reads
the node's devices. The loop runs every ``interval`` seconds, after ``retry`` seconds on an
error, and at once when a device's health changes.

It also keeps ``hami.io/node-injection`` (``NODE_INJECTION``) equal to :attr:`Registrar.injection`:
``nri`` while the NRI hook is registered and synchronized (``--injection=nri``, injection.py),
absent otherwise, so a stale value left by an earlier run is removed.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Callable

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from hami.core.codec import encode_node_devices_json, encode_pair_scores
from hami.core.names import NODE_INJECTION
from hami.kube.nodelock import HANDOFF_SWAP, LOCK_HANDOFF
from hami.vendors.nvidia import NvidiaVendor

from .devices import DeviceState
from .kube import Kube

log = logging.getLogger(__name__)

REGISTER = NvidiaVendor.register_annotation
HANDSHAKE = NvidiaVendor.handshake_annotation
SCORE = NvidiaVendor.score_annotation


def handshake_value(now: datetime) -> str:
    return f"Reported {now.strftime('%Y-%m-%d %H:%M:%S')}"


def registration_patch(
    state: DeviceState,
    annotations: dict[str, str],
    now: datetime,
    handoff: bool = True,
    injection: str | None = None,
) -> dict[str, str | None] | None:
    """The annotations to write, or None when the node already says the right thing.
    ``handoff``: this plugin leaves a finished pod's node lock for the scheduler to swap over
    (``hami.io/node-lock-handoff=swap``, see allocator.py); False removes that declaration.
    ``injection``: the value ``hami.io/node-injection`` must have (None: absent)."""
    value = encode_node_devices_json(state.registration())
    patch: dict[str, str | None] = {}
    if annotations.get(REGISTER) != value:
        patch[REGISTER] = value
    if state.pair_scores is not None:
        scores = encode_pair_scores(state.pair_scores)
        if annotations.get(SCORE) != scores:
            patch[SCORE] = scores
    if patch or annotations.get(HANDSHAKE, "").startswith("Deleted"):
        patch[HANDSHAKE] = handshake_value(now)
    if handoff and annotations.get(LOCK_HANDOFF) != HANDOFF_SWAP:
        patch[LOCK_HANDOFF] = HANDOFF_SWAP
    elif not handoff and LOCK_HANDOFF in annotations:
        patch[LOCK_HANDOFF] = None
    if annotations.get(NODE_INJECTION) != injection:
        patch[NODE_INJECTION] = injection
    return patch or None


class Registrar:
    def __init__(
        self,
        kube: Kube,
        state: DeviceState,
        interval: float = 30.0,
        retry: float = 5.0,
        clock: Callable[[], datetime] = datetime.now,
        handoff: bool = True,
    ) -> None:
        self.handoff = handoff
        #: what hami.io/node-injection must say: "nri" while the NRI hook is ready, else None
        self.injection: str | None = None
        self.kube = kube
        self.state = state
        self.interval = interval
        self.retry = retry
        self.clock = clock
        self.writes = 0

    async def sync_once(self) -> bool:
        """Write the annotation if needed; True when something was written."""
        annotations, _ = await self.kube.node_annotations()
        patch = registration_patch(self.state, annotations, self.clock(), self.handoff, self.injection)
        if patch is None:
            return False
        await self.kube.patch_node_annotations(patch)
        self.writes += 1
        log.info("node %s: wrote %s", self.kube.node_name, ", ".join(sorted(patch)))
        return True

    async def run(self) -> None:
        seen = -1
        while True:
            delay = self.interval
            try:
                seen = self.state.version
                await self.sync_once()
            except (ApiException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                log.error("node %s: registration failed (%s); retrying in %.0fs", self.kube.node_name, exc, self.retry)
                delay = self.retry
            await self.state.wait_change(seen, timeout=delay)
