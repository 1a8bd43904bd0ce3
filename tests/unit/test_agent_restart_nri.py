"""The NRI plugin across its own stop and the runtime's restarts (hami.node.nri.plugin), against
the fake runtime of test_nri_plugin: what a container being created at that moment gets."""

from __future__ import annotations

import asyncio
import struct

import pytest

from hami.node.nri import load
from hami.node.nri.plugin import NriPlugin
from hami.node.nri.ttrpc import UNKNOWN, RemoteError

from .test_nri_plugin import FakeRuntime, Hook, call, pod

_, pb = load()


class HeldHook(Hook):
    """A hook whose answer waits until released (a pod read on a slow API server)."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def create_container(self, pod, container):
        self.started.set()
        await self.release.wait()
        return await super().create_container(pod, container)


async def _ready(tmp_path, hook):
    runtime = await FakeRuntime(str(tmp_path / "nri.sock")).start()
    states: list[bool] = []

    async def on_ready(ready: bool) -> None:
        states.append(ready)

    plugin = NriPlugin(hook, socket=str(tmp_path / "nri.sock"), on_ready=on_ready, retry=0.05)
    running = asyncio.create_task(plugin.run())
    mux, ep, _ = await runtime.sessions.get()
    await call(
        ep, "Configure", pb.ConfigureRequest(runtime_name="containerd", runtime_version="v2.1.0"), pb.ConfigureResponse
    )
    await call(ep, "Synchronize", pb.SynchronizeRequest(), pb.SynchronizeResponse)
    while states != [True]:
        await asyncio.sleep(0.01)
    return runtime, plugin, running, mux, ep, states


def _create(ep, name: str):
    return asyncio.create_task(
        call(
            ep,
            "CreateContainer",
            pb.CreateContainerRequest(pod=pod("train"), container=pb.Container(id=f"id-{name}", name=name)),
            pb.CreateContainerResponse,
        )
    )


async def test_a_creation_in_flight_when_the_plugin_stops_gets_its_adjustment(tmp_path):
    """The agent's stop cancelled the session, which closed the connection under a
    CreateContainer the hook was answering: the runtime counts a closed connection as the
    plugin gone and creates that container without its adjustment (no GPU; on containerd 1.7
    never evicted, so it runs without one until it exits)."""
    hook = HeldHook()
    runtime, plugin, running, mux, ep, states = await _ready(tmp_path, hook)
    try:
        first = _create(ep, "gpu")
        await hook.started.wait()
        running.cancel()  # what the agent's stop does
        await asyncio.sleep(0.05)
        # a creation the runtime asks for meanwhile is refused (the kubelet retries it), not cut off
        with pytest.raises(RemoteError) as refused:
            await _create(ep, "late")
        assert refused.value.code == UNKNOWN and "stopping" in refused.value.message
        assert ("train", "late") not in hook.created
        hook.release.set()
        made = await first
        assert [(e.key, e.value) for e in made.adjust.env] == [("X", "1")]
        with pytest.raises(asyncio.CancelledError):
            await running
        assert states == [True, False]
    finally:
        running.cancel()
        await mux.close()
        await runtime.stop()


async def test_a_stop_waits_no_longer_than_the_hooks_own_deadline(tmp_path):
    """A hook that never answers holds the stop only until the plugin refuses the container
    itself (three quarters of the runtime's request timeout): the runtime gets a refusal, the
    connection is not cut under it."""
    hook = HeldHook()
    runtime, plugin, running, mux, ep, _ = await _ready(tmp_path, hook)
    try:
        await call(ep, "Configure", pb.ConfigureRequest(request_timeout=200), pb.ConfigureResponse)
        first = _create(ep, "gpu")
        await hook.started.wait()
        running.cancel()
        with pytest.raises(RemoteError) as refused:
            await first
        assert refused.value.code == UNKNOWN and "its grant was not found within" in refused.value.message
        with pytest.raises(asyncio.CancelledError):
            await running
    finally:
        running.cancel()
        await mux.close()
        await runtime.stop()


async def test_a_reading_cancelled_between_a_frames_header_and_its_payload_goes_on_where_it_stopped():
    """The stop's wait reads on with a new run of the mux (the cancel reached the one the
    session awaited): a header already taken must not be read again from the payload's bytes."""
    from hami.node.nri.ttrpc import REQUEST, RESPONSE, tpb

    from .test_nri_ttrpc import make_pair

    mux, peer = await make_pair()

    async def handler(service, method, payload):
        return b"answer:" + payload

    mux.endpoint(1, handler)
    raw = tpb.Request(service="svc", method="M", payload=b"p").SerializeToString()
    message = struct.pack(">IIBB", len(raw), 3, REQUEST, 0) + raw
    running = asyncio.create_task(mux.run())
    peer.writer.write(struct.pack(">II", 1, len(message)))  # the header alone
    while mux._header is None:
        await asyncio.sleep(0.01)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    running = asyncio.create_task(mux.run())
    peer.writer.write(message)
    stream, kind, data = await peer.read_message(1)
    assert (stream, kind) == (3, RESPONSE) and tpb.Response.FromString(data).payload == b"answer:p"
    running.cancel()
    await mux.close()


async def test_a_runtime_away_for_long_is_logged_once_not_at_every_dial(tmp_path, caplog, monkeypatch):
    """The plugin dials every second while the runtime is away (restarting, or NRI off on the
    node): each failed dial was a warning, 3600 lines an hour."""
    dials = 0
    real = asyncio.open_unix_connection

    async def counted(path, *args, **kwargs):
        nonlocal dials
        dials += 1
        return await real(path, *args, **kwargs)

    monkeypatch.setattr(asyncio, "open_unix_connection", counted)
    path = str(tmp_path / "nri.sock")
    plugin = NriPlugin(Hook(), socket=path, retry=0.001)
    with caplog.at_level("WARNING", logger="hami.node.nri.plugin"):
        running = asyncio.create_task(plugin.run())
        while dials < 30:
            await asyncio.sleep(0.01)
        lines = [r.getMessage() for r in caplog.records if "cannot register" in r.getMessage()]
        assert len(lines) == 1 and path in lines[0]
        runtime = await FakeRuntime(path).start()  # back: registered, and a later outage is told again
        mux, _, _ = await runtime.sessions.get()
        while plugin.sessions != 1:
            await asyncio.sleep(0.01)
        await runtime.stop()
        await mux.close()
        seen = dials
        while dials < seen + 5:
            await asyncio.sleep(0.01)
        lines = [r.getMessage() for r in caplog.records if "cannot register" in r.getMessage()]
        assert len(lines) == 2
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
