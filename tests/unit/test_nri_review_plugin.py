"""Review of hami.node.nri (plugin and ttrpc): the runtime's request deadline, a session that ends
while its post-sync work is in flight, the multiplex frame limit, and the pod-removal event."""

from __future__ import annotations

import asyncio
import struct

from hami.node.nri import load
from hami.node.nri.plugin import MAX_REFUSAL, PLUGIN_SERVICE, REMOVE_POD_SANDBOX, NriPlugin, Refusal, event_mask
from hami.node.nri.ttrpc import UNKNOWN, RemoteError

from .test_nri_plugin import FakeRuntime, Hook, call, pod
from .test_nri_ttrpc import make_pair

_, pb = load()


class SlowHook(Hook):
    """A hook whose pod read never answers (an API server that hangs)."""

    def __init__(self) -> None:
        super().__init__()
        self.removed: list[tuple[str, str]] = []

    async def create_container(self, pod, container):
        await asyncio.Event().wait()

    async def pod_removed(self, pod) -> None:
        self.removed.append((pod.id, pod.uid))


async def test_a_hook_slower_than_the_runtimes_deadline_is_answered_with_a_refusal(tmp_path):
    # containerd drops a plugin that has not answered within plugin_request_timeout (2 s by
    # default) and creates the container without its adjustment; the plugin must answer first,
    # with an error status, which only fails this container's creation (the kubelet retries)
    plugin = NriPlugin(SlowHook(), socket=str(tmp_path / "nri.sock"))
    await plugin._handle(PLUGIN_SERVICE, "Configure", pb.ConfigureRequest(request_timeout=200).SerializeToString())
    req = pb.CreateContainerRequest(pod=pod("train"), container=pb.Container(name="gpu"))
    try:
        await asyncio.wait_for(plugin._handle(PLUGIN_SERVICE, "CreateContainer", req.SerializeToString()), 30)
    except RemoteError as exc:
        assert exc.code == UNKNOWN  # not fatal for the runtime: the plugin stays connected
        assert "ns/train" in exc.message and "'gpu'" in exc.message and "0.2s" in exc.message
    else:
        raise AssertionError("a hook that never answers must be refused")


async def test_the_default_deadline_is_below_containerds_two_seconds(tmp_path):
    plugin = NriPlugin(SlowHook(), socket=str(tmp_path / "nri.sock"))
    await plugin._handle(PLUGIN_SERVICE, "Configure", pb.ConfigureRequest().SerializeToString())
    assert 0 < plugin.answer_within() < 2.0


async def test_a_session_ending_during_the_post_sync_eviction_leaves_the_node_not_ready(tmp_path):
    # CRI-O (unsolicited evictions are sent): the runtime goes away while the eviction is in
    # flight. The session's end says "not ready"; the eviction's failure must not say "ready"
    # after it (the node would keep hami.io/node-injection: nri with no hook connected)
    runtime = await FakeRuntime(str(tmp_path / "nri.sock")).start()
    asked = asyncio.Event()

    async def stalled_updates(service, method, payload):
        asked.set()
        await asyncio.Event().wait()

    states: list[bool] = []

    async def on_ready(ready: bool) -> None:
        states.append(ready)

    plugin = NriPlugin(Hook(), socket=runtime.path, on_ready=on_ready, retry=3600)
    running = asyncio.create_task(plugin.run())
    mux, ep, _ = await runtime.sessions.get()
    mux.endpoints[2].handler = stalled_updates  # the runtime's UpdateContainers never answers
    await call(
        ep, "Configure", pb.ConfigureRequest(runtime_name="cri-o", runtime_version="1.31.0"), pb.ConfigureResponse
    )
    orphan = pb.Container(id="c9", name="orphan", state=3)
    await call(ep, "Synchronize", pb.SynchronizeRequest(containers=[orphan]), pb.SynchronizeResponse)
    await asked.wait()
    await runtime.stop()
    await mux.close()  # the runtime goes away with the eviction unanswered
    while plugin._notify:
        await asyncio.gather(*list(plugin._notify), return_exceptions=True)
    assert not plugin.ready
    assert states == [False]  # never "ready" after the session ended
    running.cancel()


async def test_a_frame_over_nris_payload_limit_ends_the_connection_at_its_header():
    # NRI's multiplexer never writes a frame payload over 16 MiB; a header claiming more (garbage
    # on the socket) must not make this side buffer up to 4 GiB waiting for it
    mux, peer = await make_pair()
    reading = asyncio.create_task(mux.run())
    peer.writer.write(struct.pack(">II", 1, (16 << 20) + 1))
    reason = await asyncio.wait_for(reading, 30)
    assert "protocol error" in reason and "16777217" in reason
    peer.writer.close()


async def test_pod_sandbox_removal_is_subscribed_and_reaches_the_hook(tmp_path):
    hook = SlowHook()
    plugin = NriPlugin(hook, socket=str(tmp_path / "nri.sock"))
    configured = pb.ConfigureResponse.FromString(
        await plugin._handle(PLUGIN_SERVICE, "Configure", pb.ConfigureRequest().SerializeToString())
    )
    assert configured.events == event_mask(4, REMOVE_POD_SANDBOX) == 0b1100
    event = pb.StateChangeEvent(event=REMOVE_POD_SANDBOX, pod=pod("gone"))
    await plugin._handle(PLUGIN_SERVICE, "StateChange", event.SerializeToString())
    assert hook.removed == [("sb-gone", "u-gone")]


class LongRefusal(Hook):
    async def create_container(self, pod, container):
        raise Refusal("annotation hami.io/vgpu-devices-allocated=" + "x" * 300_000 + " is invalid")


async def test_a_refusal_quoting_a_huge_annotation_is_cut(tmp_path):
    """It becomes the kubelet's event for the container: a 256 KiB annotation went whole."""
    plugin = NriPlugin(LongRefusal(), socket=str(tmp_path / "nri.sock"))
    req = pb.CreateContainerRequest(pod=pod("train"), container=pb.Container(name="gpu"))
    try:
        await plugin._handle(PLUGIN_SERVICE, "CreateContainer", req.SerializeToString())
    except RemoteError as exc:
        assert exc.message.startswith("annotation hami.io/vgpu-devices-allocated=xxx")
        assert len(exc.message) == MAX_REFUSAL
    else:
        raise AssertionError("refused")
