"""The NRI plugin: registration, the runtime's calls, reconnection.

One session (:meth:`NriPlugin.session`), as containerd/nri's Go stub runs it:

1. dial the runtime's NRI socket; serve ``nri.pkg.api.v1alpha1.Plugin`` on multiplex conn 1;
2. call ``Runtime/RegisterPlugin`` on conn 2 with the plugin's name and two-digit index (plugins
   are called in ascending index order);
3. the runtime calls ``Configure`` (naming its per-request timeout): the answer subscribes to
   CreateContainer and RemovePodSandbox;
4. the runtime calls ``Synchronize`` with the pods and containers it has (possibly split over
   several calls, ``more`` set on all but the last); after the last one the plugin is *ready*
   (``on_ready(True)``) and sees every container created from then on;
5. each ``CreateContainer`` goes to the :class:`ContainerHook`; its adjustment is the answer, a
   :class:`Refusal` it raises is an error status, which fails the container's creation. So is a
   hook that has not answered by :meth:`NriPlugin.answer_within`: past the runtime's request
   timeout (2 s by default) containerd drops the plugin's connection and creates the container
   without its adjustment, and every creation until the plugin is back goes the same way;
   ``RemovePodSandbox`` (a state change) goes to :meth:`ContainerHook.pod_removed`;
6. the session ends when the runtime closes the socket (containerd restarts, ``Shutdown``) or
   breaks the protocol; ``on_ready(False)`` is called in the background (the plugin dials
   again at once, whatever the agent's API server writes take). A session cancelled (the agent stops)
   first answers the creations in flight (:data:`FINISH_MARGIN` past the hook's own deadline
   at most) and refuses those that arrive meanwhile: the runtime takes a connection closed
   under a call for the plugin gone and creates that container without its adjustment.

:meth:`NriPlugin.run` runs sessions forever, dialling again every ``retry`` seconds: an NRI
plugin must register again after every runtime restart.

Synchronize also hands the hook the containers that already exist
(:meth:`ContainerHook.synchronized`): containers created while no session was up, which the
hook may want evicted (``Runtime/UpdateContainers`` with an eviction list).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Awaitable, Callable, Protocol, Sequence

from . import DEFAULT_SOCKET, load
from .ttrpc import UNIMPLEMENTED, UNKNOWN, ConnectionClosed, Mux, RemoteError

log = logging.getLogger(__name__)

# The runtime as the plugin's Configure names it ("containerd v1.7.35"): containerd 1.x.
_CONTAINERD_1 = re.compile(r"containerd v?1\.")
_, pb = load()

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
#: multiplex conn ids (nri pkg/net/multiplex/ttrpc.go)
PLUGIN_CONN, RUNTIME_CONN = 1, 2
#: NRI's event numbers (api.proto ``enum Event``); a subscription sets bit ``event - 1``
REMOVE_POD_SANDBOX, CREATE_CONTAINER = 3, 4
#: what containerd and CRI-O give a plugin per request unless configured otherwise (seconds);
#: Configure names the runtime's own (``request_timeout``, milliseconds)
DEFAULT_REQUEST_TIMEOUT = 2.0
#: the share of the runtime's request timeout the hook may take before the container is refused
#: (the rest covers the socket, the answer's encoding and a busy event loop)
ANSWER_SHARE = 0.75
#: how often a plugin that cannot register says so again while it keeps trying
RETRY_LOG_S = 60.0
#: what a stopping session waits for its answers in flight beyond the hook's own deadline (their
#: encoding and sending)
FINISH_MARGIN = 0.5
#: the longest refusal sent back: it becomes the container's error in the kubelet's event, and a
#: refusal may quote a pod's annotation (up to 256 KiB)
MAX_REFUSAL = 1024


def event_mask(*events: int) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class Refusal(Exception):
    """The container must not be created; the message says why (it reaches the kubelet)."""


class ContainerHook(Protocol):
    async def create_container(self, pod, container):  # -> pb.ContainerAdjustment | None
        """The adjustment for a container being created (None: leave it as it is)."""

    async def synchronized(self, pods: Sequence, containers: Sequence) -> list[tuple[str, str]]:
        """The runtime's existing pods and containers; returns (container id, reason) of those
        to evict."""

    async def pod_removed(self, pod) -> None:
        """The runtime removed a pod sandbox."""


def check_index(index: str) -> str:
    """NRI's rule (api.CheckPluginIndex): exactly two digits."""
    if len(index) != 2 or not index.isdigit() or not index.isascii():
        raise ValueError(f"NRI plugin index must be two digits, got {index!r}")
    return index


class NriPlugin:
    def __init__(
        self,
        hook: ContainerHook,
        socket: str = DEFAULT_SOCKET,
        name: str = "hami",
        index: str = "50",
        on_ready: Callable[[bool], Awaitable[None]] | None = None,
        retry: float = 1.0,
        timeout: float = 5.0,
    ) -> None:
        self.hook = hook
        self.socket = socket
        self.name = name
        self.index = check_index(index)
        self.on_ready = on_ready
        self.retry = retry
        self.timeout = timeout
        self.ready = False
        self.stopping = False  # a cancelled session answering its creations in flight
        self.sessions = 0
        self.runtime = ""  # "containerd v1.7.35", from Configure
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT  # the runtime's, from Configure
        self._sync_pods: list = []
        self._sync_containers: list = []
        self._runtime_ep = None
        self._mux: Mux | None = None  # the session's connection
        self._notify: set[asyncio.Task] = set()
        #: on_ready's calls (_say_ready): the value to tell, the value told last, the task telling it
        self._ready_wanted: bool | None = None
        self._ready_told: bool | None = None
        self._ready_task: asyncio.Task | None = None
        # containers to evict that the runtime may not have evicted yet (container id -> reason):
        # some runtimes carry out only the evictions in an answer to a container event, so they
        # ride on the next CreateContainer answer too (containerd 1.7's NRI v0.8 drops both
        # kinds: there an unserved container runs without a GPU until it exits; docs/nri.md)
        self._owed: dict[str, str] = {}

    # -- the runtime's calls -------------------------------------------------------------------

    def answer_within(self) -> float:
        """Seconds the hook is given for one container: a share of the runtime's request timeout."""
        return self.request_timeout * ANSWER_SHARE

    async def _handle(self, service: str, method: str, payload: bytes) -> bytes:
        if service != PLUGIN_SERVICE:
            raise RemoteError(UNIMPLEMENTED, f"service {service} is not served")
        if method == "CreateContainer":
            req = pb.CreateContainerRequest.FromString(payload)
            if self.stopping:  # refused, the kubelet creates it again (the next plugin serves it)
                raise RemoteError(
                    UNKNOWN,
                    f"pod {req.pod.namespace}/{req.pod.name}: container {req.container.name!r}: the hami NRI "
                    "plugin is stopping: refused, to be created again",
                )
            within = self.answer_within()
            try:
                adjust = await asyncio.wait_for(self.hook.create_container(req.pod, req.container), within)
            except Refusal as exc:
                text = str(exc)
                if len(text) > MAX_REFUSAL:
                    text = text[: MAX_REFUSAL - 1] + "…"
                raise RemoteError(UNKNOWN, text) from None
            except asyncio.TimeoutError:
                # an error status only fails this creation (the kubelet retries it); no answer by
                # the runtime's deadline would cost the connection and every creation meanwhile
                text = (
                    f"pod {req.pod.namespace}/{req.pod.name}: container {req.container.name!r}: its grant was not "
                    f"found within {within:.1f}s (the runtime waits {self.request_timeout:.1f}s for a plugin): refused"
                )
                log.warning("NRI: %s", text)
                raise RemoteError(UNKNOWN, text) from None
            out = pb.CreateContainerResponse()
            if adjust is not None:
                out.adjust.CopyFrom(adjust)
            owed = {c: r for c, r in self._owed.items() if c != req.container.id}
            if owed:
                out.evict.extend(pb.ContainerEviction(container_id=c, reason=r) for c, r in owed.items())
                self._owed.clear()
                log.warning("NRI: evicting %d container(s) created without their grant", len(owed))
            return out.SerializeToString()
        if method == "Configure":
            req = pb.ConfigureRequest.FromString(payload)
            self.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
            self.request_timeout = req.request_timeout / 1000 if req.request_timeout > 0 else DEFAULT_REQUEST_TIMEOUT
            log.info(
                "NRI: configured by %s (request timeout %.1fs)",
                self.runtime or "an unnamed runtime",
                self.request_timeout,
            )
            return pb.ConfigureResponse(events=event_mask(CREATE_CONTAINER, REMOVE_POD_SANDBOX)).SerializeToString()
        if method == "Synchronize":
            return await self._synchronize(pb.SynchronizeRequest.FromString(payload))
        if method == "StateChange":
            event = pb.StateChangeEvent.FromString(payload)
            removed = getattr(self.hook, "pod_removed", None)
            if event.event == REMOVE_POD_SANDBOX and removed is not None:
                try:
                    await asyncio.wait_for(removed(event.pod), self.answer_within())
                except Exception as exc:  # noqa: BLE001 - an error status would fail the sandbox's removal
                    log.warning("NRI: pod %s/%s removed: %s", event.pod.namespace, event.pod.name, exc)
            return pb.Empty().SerializeToString()
        if method == "Shutdown":
            return pb.Empty().SerializeToString()
        raise RemoteError(UNIMPLEMENTED, f"{method} is not served (not subscribed)")

    async def _synchronize(self, req) -> bytes:
        self._sync_pods += list(req.pods)
        self._sync_containers += list(req.containers)
        if req.more:
            return pb.SynchronizeResponse(more=True).SerializeToString()
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        evict = await self.hook.synchronized(pods, containers)
        log.info("NRI: synchronized with %d pod(s), %d container(s)", len(pods), len(containers))
        self._later(self._after_sync(evict, self._mux))
        return pb.SynchronizeResponse(more=False).SerializeToString()

    def _unsolicited_updates_safe(self) -> bool:
        """Whether the runtime may be sent an unsolicited ``UpdateContainers``. Not containerd
        1.x: its NRI (v0.8) handles one under the adaptation's lock and then containerd's own,
        while a ``CreateContainer`` takes them in the other order, so the two running at once
        deadlock every later container creation of the node (the kubelet's retries then fail
        with "failed to reserve container name"; seen in the real-node kill-mid-burst test), and
        it drops the evictions such a request carries anyway."""
        return _CONTAINERD_1.match(self.runtime) is None

    async def _after_sync(self, evict: list[tuple[str, str]], mux: Mux | None) -> None:
        """Ready, once the evictions are asked for; nothing if the session (``mux``) has ended by
        then: its end already said "not ready", and a late "ready" would have the node say
        ``nri`` with no hook connected."""
        if mux is None or mux.closed:
            return
        self.ready = True
        if evict:
            if self._unsolicited_updates_safe():
                await self._evict(evict)
            else:
                self._owed.update(evict)
                log.warning(
                    "NRI: %d container(s) were created without their grant; %s cannot be asked to evict them "
                    "safely (they are named again in the next creation's answer)",
                    len(evict),
                    self.runtime,
                )
        if mux.closed:
            return
        self._say_ready(True)

    async def _evict(self, evict: list[tuple[str, str]]) -> None:
        """Ask the runtime to evict now (a runtime whose NRI applies unsolicited evictions does),
        and owe the same evictions to the next CreateContainer answer, which other runtimes
        honour (evicting a stopped container again is a no-op)."""
        self._owed.update(evict)
        req = pb.UpdateContainersRequest(evict=[pb.ContainerEviction(container_id=c, reason=r) for c, r in evict])
        try:
            await self._runtime_ep.call(RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), self.timeout)
            log.warning(
                "NRI: asked the runtime to evict %d container(s) created without their grant "
                "(again with the next container creation)",
                len(evict),
            )
        except (RemoteError, ConnectionClosed, asyncio.TimeoutError) as exc:
            log.error("NRI: eviction of %d container(s) failed: %s (owed to the next creation)", len(evict), exc)

    def _say_ready(self, ready: bool) -> asyncio.Task | None:
        """Tell ``on_ready`` (the agent writes the node's annotation, on the API server) in the
        background, in order, one call in flight at most: a value asked for while one is in flight
        is told after it (the latest only). Awaited in the session's end, a containerd restart had
        the plugin dial again only once the API server answered (a node read retried for 15 s and
        a 30 s patch with it unreachable), every container created meanwhile without its grant
        (found by review, 1 Dec). Returns the task telling it (None: no ``on_ready``)."""
        if self.on_ready is None:
            return None
        self._ready_wanted = ready
        if self._ready_task is None or self._ready_task.done():
            self._ready_task = asyncio.get_running_loop().create_task(self._tell_ready(), name="hami-nri-ready")
            self._notify.add(self._ready_task)  # (with the session's other background work)
            self._ready_task.add_done_callback(self._notify.discard)
        return self._ready_task

    async def _tell_ready(self) -> None:
        assert self.on_ready is not None
        while self._ready_wanted is not None and self._ready_wanted != self._ready_told:
            ready = self._ready_wanted
            try:
                await self.on_ready(ready)
            except Exception:  # noqa: BLE001 - the plugin lives on; the agent's own loops write again
                log.exception("NRI: telling the agent the hook is %s failed", "ready" if ready else "gone")
            self._ready_told = ready

    async def _cancel_telling(self) -> None:
        task, self._ready_task = self._ready_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _tell_now(self, ready: bool) -> None:
        """The agent stops: a call in flight is cut short, and ``ready`` told here."""
        if self.on_ready is None:
            return
        await self._cancel_telling()
        self._ready_wanted = self._ready_told = ready
        try:
            await self.on_ready(ready)
        except Exception:  # noqa: BLE001 - stopping; logged
            log.exception("NRI: telling the agent the hook is %s failed", "ready" if ready else "gone")

    def _later(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._notify.add(task)
        task.add_done_callback(self._notify.discard)

    # -- sessions ------------------------------------------------------------------------------

    async def session(self) -> str:
        """Dial, register, serve until the runtime goes away; returns why the session ended."""
        self.stopping = False
        reader, writer = await asyncio.open_unix_connection(self.socket)
        mux = self._mux = Mux(reader, writer)
        served = mux.endpoint(PLUGIN_CONN, self._handle)  # before registering: Configure follows at once
        self._runtime_ep = mux.endpoint(RUNTIME_CONN)
        reading = asyncio.get_running_loop().create_task(mux.run())
        try:
            req = pb.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            await self._runtime_ep.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(), self.timeout)
            self.sessions += 1
            log.info("NRI: registered as %s-%s on %s", self.index, self.name, self.socket)
            return await reading
        except asyncio.CancelledError:
            # the agent stops: the runtime's calls in flight are answered before the connection
            # closes (closed under a CreateContainer, the container is created without its
            # adjustment), new creations refused meanwhile; the connection then closes with no
            # await in between, so nothing arrives unanswered after the wait. The cancel reached
            # the reading too (awaited here): it goes on where it stopped, for the answers' time
            self.stopping = True
            if not mux.closed:
                if reading.cancelled():
                    reading = asyncio.get_running_loop().create_task(mux.run())
                if not await served.finish(self.answer_within() + FINISH_MARGIN):
                    log.warning("NRI: stopping with calls of the runtime still unanswered")
            raise
        finally:
            await mux.close()
            reading.cancel()
            was_ready, self.ready = self.ready, False
            self._sync_pods, self._sync_containers = [], []
            if was_ready:
                if self.stopping:  # the agent stops: told before the task ends, as ever
                    await self._tell_now(False)
                else:
                    self._say_ready(False)

    async def run(self) -> None:
        """Sessions until cancelled, dialling again ``retry`` seconds after each one ends. A dial
        that fails is logged at the first failure, then every :data:`RETRY_LOG_S` while it goes on:
        once a second, a node whose runtime has NRI off (or a runtime restarting for minutes)
        wrote a warning a second for as long as it lasted."""
        try:
            await self._sessions()
        finally:  # (a call of on_ready still in flight goes with the plugin)
            await self._cancel_telling()

    async def _sessions(self) -> None:
        loop = asyncio.get_running_loop()
        failing: tuple[float, float] | None = None  # (first failure, last line) of the failures since a session
        while True:
            before = self.sessions
            try:
                reason = await self.session()
                log.warning("NRI: session ended (%s); registering again", reason)
            except (OSError, ConnectionClosed, RemoteError, asyncio.TimeoutError) as exc:
                now = loop.time()
                if failing is None or now - failing[1] >= RETRY_LOG_S:
                    since = f", failing for {now - failing[0]:.0f}s" if failing is not None else ""
                    log.warning(
                        "NRI: cannot register on %s (%s); retrying every %gs%s", self.socket, exc, self.retry, since
                    )
                    failing = (failing[0] if failing is not None else now, now)
            except Exception:  # noqa: BLE001 - whatever the runtime sent, the plugin lives on and dials again
                log.exception("NRI: session on %s failed; registering again in %.0fs", self.socket, self.retry)
            if self.sessions != before:  # it registered: a failure from now on is a new outage
                failing = None
            await asyncio.sleep(self.retry)
