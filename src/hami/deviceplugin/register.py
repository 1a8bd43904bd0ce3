"""Keeps ``hami.io/node-nvidia-register`` equal to what this node has (§4.3, §4.4).

The annotation is rewritten only when its text would change (a health change, a config
change, a restart with different GPUs, someone editing it). With every rewrite, and whenever
the handshake reads ``Deleted_…`` (a stale verdict of an old scheduler, A3), the plugin writes
``hami.io/node-handshake: Reported <time>`` so that any HAMi-compatible scheduler re-reads
the node's devices. The loop runs every ``interval`` seconds, after ``retry`` seconds on an
error, and at once when a device's health changes.

**Legacy handshake.** HAMi's schedulers before v2.8 (``util.CheckHealth`` and later
``device.CheckHealth`` for NVIDIA, until HAMi commit 140b2cb5, Nov 2025) write
``Requesting_<time>`` on a node whose handshake says anything else, and if it still says so
60 s later they write ``Deleted_<time>`` and drop the node's GPUs until it changes; HAMi's
plugin of that time answered by writing ``Reported <time>`` every 30 s. Ours, like HAMi's since,
writes nothing periodically, and our scheduler (like HAMi's since v2.8) leaves its one
``Requesting_`` standing, so an answer would only make it request again: two node writes a cycle
for nothing. ``legacy_handshake`` decides whether a ``Requesting_`` is answered:

* ``"on"``: always, within :data:`ANSWER_WITHIN_S` of its writing (the loop checks at least
  that often);
* ``"off"``: never;
* ``"auto"`` (the default): once the handshake shows a scheduler that expires requests
  (:func:`expiring_scheduler`: a ``Deleted_`` written over a request this plugin read and left
  unanswered, or a request in the dotted time format of HAMi before 2025), and from then on
  until the plugin restarts. An old scheduler thus takes this node's GPUs away once, for at most
  one ``interval``, after the plugin starts; ``"on"`` avoids even that.

It also keeps ``hami.io/node-injection`` (``NODE_INJECTION``) equal to :attr:`Registrar.injection`:
``nri`` while the NRI hook is registered and synchronized (``--injection=nri``, injection.py),
absent otherwise, so a stale value left by an earlier run is removed.
"""

from __future__ import annotations

import asyncio
import logging
import re
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

LEGACY_HANDSHAKE_MODES = ("auto", "on", "off")
#: how old a legacy scheduler's request may get before it is answered, at most: HAMi expires it
#: after 60 s, on a 15 s pass (and on every node event); HAMi's own plugin answered every 30 s
ANSWER_WITHIN_S = 30.0
#: ``Requesting_2024.11.11 04:14:36``: the time format of HAMi's schedulers before 2025, all of
#: which expire requests (ours and HAMi's since write Go's time.DateTime, 2024-11-11 04:14:36)
_DOTTED = re.compile(r"Requesting_\d{4}\.\d{2}\.\d{2} ")


#: Registrar.injection while a starting plugin's NRI hook has not yet registered: the node's
#: ``hami.io/node-injection`` is left as it is (see agent.py, the start-up grace)
KEEP = "keep"


def handshake_value(now: datetime) -> str:
    return f"Reported {now.strftime('%Y-%m-%d %H:%M:%S')}"


def expiring_scheduler(before: str | None, value: str) -> str | None:
    """Why the handshake ``value`` (read after ``before``, the value this plugin read last time,
    None at its first read) shows a scheduler that drops a node whose request goes unanswered
    (HAMi before v2.8), or None. A ``Deleted_`` alone proves nothing: it may be a verdict left
    from before this plugin ran (HAMi#1839) or a newer scheduler's on a node without GPUs."""
    if before is not None and "Requesting" in before and "Requesting" not in value and "Deleted" in value:
        return f"the scheduler replaced the unanswered {before!r} by {value!r}"
    if _DOTTED.search(value):
        return f"the scheduler writes the time format of HAMi before 2025 ({value!r})"
    return None


def registration_patch(
    state: DeviceState,
    annotations: dict[str, str],
    now: datetime,
    handoff: bool = True,
    injection: str | None = None,
    answer_requests: bool = False,
) -> dict[str, str | None] | None:
    """The annotations to write, or None when the node already says the right thing.
    ``handoff``: this plugin leaves a finished pod's node lock for the scheduler to swap over
    (``hami.io/node-lock-handoff=swap``, see allocator.py); False removes that declaration.
    ``injection``: the value ``hami.io/node-injection`` must have (None: absent; :data:`KEEP`:
    whatever it says now).
    ``answer_requests``: a ``Requesting_…`` handshake is answered with ``Reported <now>`` (a
    legacy scheduler's request, see the module docstring)."""
    value = encode_node_devices_json(state.registration())
    patch: dict[str, str | None] = {}
    if annotations.get(REGISTER) != value:
        patch[REGISTER] = value
    if state.pair_scores is not None:
        scores = encode_pair_scores(state.pair_scores)
        if annotations.get(SCORE) != scores:
            patch[SCORE] = scores
    shake = annotations.get(HANDSHAKE, "")
    if patch or shake.startswith("Deleted") or (answer_requests and "Requesting" in shake):
        patch[HANDSHAKE] = handshake_value(now)
    if handoff and annotations.get(LOCK_HANDOFF) != HANDOFF_SWAP:
        patch[LOCK_HANDOFF] = HANDOFF_SWAP
    elif not handoff and LOCK_HANDOFF in annotations:
        patch[LOCK_HANDOFF] = None
    if injection != KEEP and annotations.get(NODE_INJECTION) != injection:
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
        legacy_handshake: str = "auto",
    ) -> None:
        if legacy_handshake not in LEGACY_HANDSHAKE_MODES:
            raise ValueError(f"legacy_handshake: expected one of {LEGACY_HANDSHAKE_MODES}, got {legacy_handshake!r}")
        self.legacy_handshake = legacy_handshake
        #: a Requesting_ handshake is answered (see the module docstring)
        self.answering = legacy_handshake == "on"
        self._last_handshake: str | None = None  # as read last time (None: not read yet)
        self.handoff = handoff
        #: what hami.io/node-injection must say: "nri" while the NRI hook is ready, else None
        self.injection: str | None = None
        self.kube = kube
        self.state = state
        self.interval = interval
        self.retry = retry
        self.clock = clock
        self.writes = 0

    def delay(self) -> float:
        """Seconds until the next check: ``interval``, at most :data:`ANSWER_WITHIN_S` while
        requests are answered."""
        return min(self.interval, ANSWER_WITHIN_S) if self.answering else self.interval

    def _learn(self, shake: str) -> None:
        before, self._last_handshake = self._last_handshake, shake
        if self.legacy_handshake != "auto" or self.answering:
            return
        why = expiring_scheduler(before, shake)
        if why:
            self.answering = True
            log.warning(
                "node %s: %s: a HAMi scheduler before v2.8 drops a node whose handshake request is not "
                "answered within 60 s; answering its requests from now on (--legacy-handshake=auto; "
                "'on' answers from the start)",
                self.kube.node_name,
                why,
            )

    async def sync_once(self) -> bool:
        """Write the annotation if needed; True when something was written."""
        annotations, _ = await self.kube.node_annotations()
        self._learn(annotations.get(HANDSHAKE, ""))
        patch = registration_patch(
            self.state, annotations, self.clock(), self.handoff, self.injection, answer_requests=self.answering
        )
        if patch is None:
            return False
        await self.kube.patch_node_annotations(patch)
        self.writes += 1
        log.info("node %s: wrote %s", self.kube.node_name, ", ".join(sorted(patch)))
        return True

    async def run(self) -> None:
        seen = -1
        while True:
            delay = self.delay()
            try:
                seen = self.state.version
                await self.sync_once()
            except (ApiException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                log.error("node %s: registration failed (%s); retrying in %.0fs", self.kube.node_name, exc, self.retry)
                delay = self.retry
            except Exception as exc:  # noqa: BLE001 - the loop must outlive an outage whatever it answers
                # (a proxy's own page in place of the node: the JSON error ended this task, and the
                # plugin, which stops when any of its tasks does)
                log.error(
                    "node %s: registration failed (%s: %s); retrying in %.0fs",
                    self.kube.node_name,
                    type(exc).__name__,
                    exc,
                    self.retry,
                )
                delay = self.retry
            await self.state.wait_change(seen, timeout=delay)
