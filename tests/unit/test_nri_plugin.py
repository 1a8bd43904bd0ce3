"""hami.node.nri.plugin against a fake runtime: registration, Configure, a split Synchronize,
CreateContainer (adjusted, refused), eviction after sync, and registering again when the runtime
goes away (containerd restarts)."""

from __future__ import annotations

import asyncio

import pytest

from hami.node.nri import load
from hami.node.nri.plugin import (
    PLUGIN_CONN,
    PLUGIN_SERVICE,
    RUNTIME_CONN,
    RUNTIME_SERVICE,
    NriPlugin,
    Refusal,
    check_index,
    event_mask,
)
from hami.node.nri.ttrpc import Mux, RemoteError

_, pb = load()


class FakeRuntime:
    """The runtime's side of NRI: accepts plugins, serves RegisterPlugin and UpdateContainers on
    conn 2, calls the plugin on conn 1, as containerd's adaptation does."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.registered: list[tuple[str, str]] = []
        self.updates: list = []
        self.sessions: asyncio.Queue = asyncio.Queue()

    async def start(self) -> FakeRuntime:
        self.server = await asyncio.start_unix_server(self._accept, self.path)
        return self

    async def _accept(self, reader, writer) -> None:
        mux = Mux(reader, writer)
        registered = asyncio.get_running_loop().create_future()

        async def runtime(service, method, payload):
            assert service == RUNTIME_SERVICE
            if method == "RegisterPlugin":
                req = pb.RegisterPluginRequest.FromString(payload)
                self.registered.append((req.plugin_name, req.plugin_idx))
                registered.set_result(None)
                return pb.Empty().SerializeToString()
            self.updates.append(pb.UpdateContainersRequest.FromString(payload))
            return b""

        mux.endpoint(RUNTIME_CONN, runtime)
        plugin = mux.endpoint(PLUGIN_CONN)
        reading = asyncio.create_task(mux.run())
        await registered
        await self.sessions.put((mux, plugin, reading))

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


async def call(plugin_ep, method: str, msg, reply):
    return reply.FromString(await plugin_ep.call(PLUGIN_SERVICE, method, msg.SerializeToString(), timeout=30))


class Hook:
    def __init__(self) -> None:
        self.created = []
        self.synced = None

    async def create_container(self, pod, container):
        self.created.append((pod.name, container.name))
        if container.name == "bad":
            raise Refusal(f"pod {pod.namespace}/{pod.name}: container bad has no grant")
        if container.name == "plain":
            return None
        adjust = pb.ContainerAdjustment()
        adjust.env.add(key="X", value="1")
        return adjust

    async def synchronized(self, pods, containers):
        self.synced = ([p.name for p in pods], [c.name for c in containers])
        return [(c.id, "created without its grant") for c in containers if c.name == "orphan"]


def pod(name="p"):
    return pb.PodSandbox(id="sb-" + name, name=name, uid="u-" + name, namespace="ns")


async def test_register_configure_sync_create_and_reconnect(tmp_path):
    runtime = await FakeRuntime(str(tmp_path / "nri.sock")).start()
    hook, states = Hook(), []

    async def on_ready(ready: bool) -> None:
        states.append(ready)

    plugin = NriPlugin(hook, socket=str(tmp_path / "nri.sock"), index="42", on_ready=on_ready, retry=0.05)
    running = asyncio.create_task(plugin.run())
    mux, ep, reading = await runtime.sessions.get()
    assert runtime.registered == [("hami", "42")]

    configured = await call(
        ep, "Configure", pb.ConfigureRequest(runtime_name="containerd", runtime_version="v1.7.35"), pb.ConfigureResponse
    )
    assert configured.events == event_mask(3, 4) == 0b1100  # RemovePodSandbox, CreateContainer
    assert plugin.runtime == "containerd v1.7.35"

    first = pb.SynchronizeRequest(pods=[pod("a")], containers=[pb.Container(id="c1", name="ok")], more=True)
    assert (await call(ep, "Synchronize", first, pb.SynchronizeResponse)).more is True
    assert states == [] and hook.synced is None
    last = pb.SynchronizeRequest(pods=[pod("b")], containers=[pb.Container(id="c2", name="orphan")], more=False)
    assert (await call(ep, "Synchronize", last, pb.SynchronizeResponse)).more is False
    assert hook.synced == (["a", "b"], ["ok", "orphan"])
    while states != [True]:
        await asyncio.sleep(0.01)
    assert plugin.ready
    # no unsolicited UpdateContainers to containerd 1.x: there it deadlocks against a concurrent
    # CreateContainer (lock order in its NRI v0.8), wedging every later creation of the node
    assert runtime.updates == []

    made = await call(
        ep,
        "CreateContainer",
        pb.CreateContainerRequest(pod=pod(), container=pb.Container(name="gpu")),
        pb.CreateContainerResponse,
    )
    assert [(e.key, e.value) for e in made.adjust.env] == [("X", "1")]
    # containerd 1.7 ignores an unsolicited eviction: the next creation's answer carries it, once
    assert [(e.container_id, e.reason) for e in made.evict] == [("c2", "created without its grant")]
    plain = await call(
        ep,
        "CreateContainer",
        pb.CreateContainerRequest(pod=pod(), container=pb.Container(name="plain")),
        pb.CreateContainerResponse,
    )
    assert not plain.HasField("adjust")
    assert list(plain.evict) == []
    with pytest.raises(RemoteError, match="container bad has no grant"):
        await call(
            ep,
            "CreateContainer",
            pb.CreateContainerRequest(pod=pod(), container=pb.Container(name="bad")),
            pb.CreateContainerResponse,
        )
    with pytest.raises(RemoteError, match="not served"):
        await call(ep, "StopContainer", pb.Empty(), pb.Empty)

    # the runtime restarts: the session ends, the plugin is not ready, then registers again
    await mux.close()
    mux2, ep2, _ = await runtime.sessions.get()
    assert states[:2] == [True, False]
    assert runtime.registered == [("hami", "42"), ("hami", "42")]
    await call(ep2, "Configure", pb.ConfigureRequest(), pb.ConfigureResponse)
    await call(ep2, "Synchronize", pb.SynchronizeRequest(), pb.SynchronizeResponse)
    while states != [True, False, True]:
        await asyncio.sleep(0.01)
    assert plugin.sessions == 2
    running.cancel()
    await mux2.close()
    await runtime.stop()


async def test_no_socket_yet_is_retried_until_the_runtime_listens(tmp_path):
    path = str(tmp_path / "late.sock")
    plugin = NriPlugin(Hook(), socket=path, retry=0.02)
    running = asyncio.create_task(plugin.run())
    await asyncio.sleep(0.1)  # a few failed dials
    assert plugin.sessions == 0 and not running.done()
    runtime = await FakeRuntime(path).start()
    mux, _, _ = await runtime.sessions.get()
    while plugin.sessions != 1:  # the answer to RegisterPlugin is on its way
        await asyncio.sleep(0.01)
    running.cancel()
    await mux.close()
    await runtime.stop()


@pytest.mark.parametrize("index", ["5", "100", "a1", "٣٣"])
def test_plugin_index_is_two_ascii_digits(index):
    with pytest.raises(ValueError, match="two digits"):
        check_index(index)


@pytest.mark.parametrize(
    "runtime, safe",
    [
        ("containerd v1.7.35", False),
        ("containerd 1.7.29", False),
        ("containerd v2.1.0", True),
        ("cri-o 1.31.0", True),
        ("", True),
    ],
)
def test_unsolicited_evictions_are_sent_only_where_they_cannot_deadlock(tmp_path, runtime, safe):
    plugin = NriPlugin(Hook(), socket=str(tmp_path / "nri.sock"))
    plugin.runtime = runtime
    assert plugin._unsolicited_updates_safe() is safe
