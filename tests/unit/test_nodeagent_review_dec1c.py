"""The node agent's defaults under faults (found by review, 1 Dec): a GPU with a fatal XID given
by the NRI hook, one GPU fallen off the bus stopping the whole plugin (and an XID on it marking
every GPU), the NRI hook's redial waiting on the API server, and a node switched back from
``nri`` to ``allocate`` saying nothing of the pods it can no longer serve."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import types

import pytest

from hami.deviceplugin import agent as agent_module
from hami.deviceplugin import allocate as A
from hami.deviceplugin.agent import NodeAgent
from hami.node import nvml
from hami.node.layout import HookPaths
from hami.node.nri import load
from hami.node.nri.plugin import NriPlugin, Refusal
from hami.node.nvml import PhysicalGPU, XidWatcher
from hami.node.settings import NodeSettings

from .test_deviceplugin_grant_checks import HERE, ctr, grant_text, nri_pod, sandbox
from .test_deviceplugin_injection import FakeKube as NriKube
from .test_nri_plugin import FakeRuntime, Hook, call

_, pb = load()
pynvml = nvml.pynvml


def _paths(tmp_path) -> HookPaths:
    return HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))


def _gpus(*uuids: str) -> list[PhysicalGPU]:
    return [
        PhysicalGPU(index=i, uuid=u, model="A100", memory_mib=40960, bus_id=str(i), numa=0) for i, u in enumerate(uuids)
    ]


# ------------------------------------------------------------------ 2: NRI hook and GPU health


def _nri_agent(kube, tmp_path) -> NodeAgent:
    return NodeAgent(
        kube,
        NodeSettings(),
        _gpus(HERE, "GPU-2"),
        tmp_path / "plugins",
        _paths(tmp_path),
        injection="nri",
        nri_socket=str(tmp_path / "nri.sock"),
    )


async def test_the_hook_refuses_a_first_grant_naming_a_gpu_with_a_fatal_xid(tmp_path):
    """Found by review, 1 Dec: in NRI mode a pod bound to GPU-1, which then had a fatal XID
    before its container was created (image pull, init containers), was given GPU-1 anyway; lock
    mode's Allocate refuses it."""
    obj = nri_pod(grant_text(HERE))
    kube = NriKube([obj])
    agent = _nri_agent(kube, tmp_path)
    await agent.state.mark_unhealthy([HERE])  # what the XID watcher does
    with pytest.raises(Refusal) as refused:
        await agent.injector.create_container(sandbox(obj), ctr())
    msg = str(refused.value)
    assert "pod ns/p" in msg and HERE in msg and "container 'c'" in msg and "unhealthy" in msg
    assert "XID" in msg and A.ALLOCATED in msg
    assert agent.injector.injected == 0
    assert agent.injector.records.get("uid-p") is None  # not recorded: nothing was served


async def test_a_pod_already_served_keeps_its_grant_when_the_gpu_turns_unhealthy(tmp_path):
    """Found by review, 1 Dec (the other side): a container restart reuses the grant, as the
    kubelet's stored Allocate answer does in lock mode."""
    obj = nri_pod(grant_text(HERE))
    kube = NriKube([obj])
    agent = _nri_agent(kube, tmp_path)
    await agent.injector.create_container(sandbox(obj), ctr())  # its first creation, GPU healthy
    await agent.state.mark_unhealthy([HERE])
    adjust = await agent.injector.create_container(sandbox(obj), ctr())  # restarted
    assert {e.key: e.value for e in adjust.env}["NVIDIA_VISIBLE_DEVICES"] == HERE
    assert agent.injector.injected == 2


# ------------------------------------------------------------------ 3: a GPU fallen off the bus


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def _lost() -> Exception:
    return pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


def _fake_discovery(monkeypatch, lost_at: str) -> None:
    """Two GPUs; GPU 0 answers ``lost_at`` (handle, uuid, memory) with GpuIsLost."""

    def handle(i):
        if i == 0 and lost_at == "handle":
            raise _lost()
        return _Handle(i)

    def uuid(h):
        if h.index == 0 and lost_at == "uuid":
            raise _lost()
        return f"GPU-{h.index:08d}-0000-0000-0000-000000000000"

    def memory(h):
        if h.index == 0 and lost_at == "memory":
            raise _lost()
        return types.SimpleNamespace(total=16 << 30)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", handle)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", uuid)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo", lambda h: types.SimpleNamespace(busId=b"00000000:3B:00.0"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA X")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", lambda h: (0, 0))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda h: (8, 0))


@pytest.mark.parametrize("lost_at", ["handle", "uuid", "memory"])
def test_discovery_leaves_out_a_lost_gpu_and_serves_the_others(monkeypatch, tmp_path, caplog, lost_at):
    """Found by review, 1 Dec: NVMLError_GpuIsLost from GPU 0 raised out of discover, the plugin
    crash-looped and the node offered none of its healthy GPUs."""
    _fake_discovery(monkeypatch, lost_at)
    with caplog.at_level(logging.ERROR):
        gpus = nvml.discover(NodeSettings(), tmp_path)
    assert [g.index for g in gpus] == [1]
    line = next(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert line.startswith("GPU 0") and "left out" in line and str(_lost()) in line


def _device(cell: ctypes.c_int):
    """An NVML handle (c_nvmlDevice_t) pointing at ``cell``: a new pointer object each call, as
    each read of an event's ``device`` field is."""
    return ctypes.cast(ctypes.addressof(cell), pynvml.c_nvmlDevice_t)


def _xid_watcher(monkeypatch, cells: dict[str, ctypes.c_int], event_device):
    """A watcher of ``cells``' GPUs whose one event (XID 79) is on ``event_device``, whose UUID
    NVML cannot read (GpuIsLost)."""
    event = types.SimpleNamespace(device=event_device, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=79)
    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", lambda: "set")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", lambda uuid: _device(cells[uuid]))
    monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda handle, kinds, es: None)
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", lambda es, ms: event)

    def uuid_of(handle):
        raise _lost()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", uuid_of)
    marked: list[list[str]] = []
    failed: list[list[str]] = []
    watcher = XidWatcher(list(cells), marked.append, on_failure=failed.append)
    watcher._wait_once(watcher._register())
    return marked, failed


def test_an_xid_on_a_gpu_nvml_cannot_name_marks_that_gpu_only(monkeypatch):
    """Found by review, 1 Dec: nvmlDeviceGetUUID failing on the event's (lost) device made it an
    unknown device, and every GPU of the node was marked unhealthy."""
    cells = {"GPU-0": ctypes.c_int(0), "GPU-1": ctypes.c_int(1)}
    marked, failed = _xid_watcher(monkeypatch, cells, _device(cells["GPU-1"]))
    assert marked == [["GPU-1"]] and failed == []


def test_an_xid_on_a_handle_of_no_registered_gpu_still_marks_them_all(monkeypatch):
    """(found by review, 1 Dec) A device that truly cannot be identified keeps HAMi's behaviour."""
    cells = {"GPU-0": ctypes.c_int(0), "GPU-1": ctypes.c_int(1)}
    stranger = ctypes.c_int(2)
    marked, failed = _xid_watcher(monkeypatch, cells, _device(stranger))
    assert marked == [] and failed == [["GPU-0", "GPU-1"]]


# ------------------------------------------------------------------ 4: the redial after containerd restarts


async def test_a_session_ending_with_a_slow_on_ready_redials_at_once(tmp_path):
    """Found by review, 1 Dec: the session's end awaited on_ready(False), the agent's API server
    write (up to 45 s with it unreachable), before the plugin dialled containerd again."""
    runtime = await FakeRuntime(str(tmp_path / "nri.sock")).start()
    states: list[bool] = []
    api_back = asyncio.Event()

    async def on_ready(ready: bool) -> None:
        states.append(ready)
        if not ready:
            await api_back.wait()  # the API server does not answer

    plugin = NriPlugin(Hook(), socket=str(tmp_path / "nri.sock"), on_ready=on_ready, retry=0.01)
    running = asyncio.create_task(plugin.run())
    try:
        mux, ep, _ = await runtime.sessions.get()
        await call(ep, "Configure", pb.ConfigureRequest(), pb.ConfigureResponse)
        await call(ep, "Synchronize", pb.SynchronizeRequest(), pb.SynchronizeResponse)
        while states != [True]:
            await asyncio.sleep(0.01)
        await mux.close()  # containerd restarts
        # (bounded only so the old code fails instead of hanging: it dialled after api_back)
        mux2, ep2, _ = await asyncio.wait_for(runtime.sessions.get(), 10)
        assert states == [True, False] and not api_back.is_set()
        await call(ep2, "Configure", pb.ConfigureRequest(), pb.ConfigureResponse)
        await call(ep2, "Synchronize", pb.SynchronizeRequest(), pb.SynchronizeResponse)
        api_back.set()
        while states != [True, False, True]:  # told in order, once the slow call is done
            await asyncio.sleep(0.01)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert states == [True, False, True, False]  # the stop is still told before run ends
        await mux2.close()
    finally:
        running.cancel()
        await runtime.stop()


async def test_the_agent_writes_nothing_when_the_hook_session_ends(tmp_path, monkeypatch):
    """(found by review, 1 Dec) The session's end keeps hami.io/node-injection as it is (KEEP): the
    agent's registration write there waited on the API server for nothing."""
    agent = _nri_agent(NriKube([]), tmp_path)
    writes: list[int] = []

    async def sync_once() -> None:
        writes.append(1)

    monkeypatch.setattr(agent.registrar, "sync_once", sync_once)
    monkeypatch.setattr(agent_module, "NRI_START_GRACE_S", 3600)
    await agent._injection_ready(False)
    try:
        assert writes == [] and agent.registrar.injection == agent_module.KEEP
    finally:
        agent._grace.cancel()


# ------------------------------------------------------------------ 1: switching back to allocate


class _NodeKube(NriKube):
    def __init__(self, pods: list[dict]) -> None:
        super().__init__(pods)
        self.node: dict[str, str] = {}

    async def pods_on_node(self):
        return [A.pod_view_from_object(p) for p in self.by_name.values()]

    async def patch_node_annotations(self, values, resource_version=None):
        self.node.update({k: v for k, v in values.items() if v is not None})


async def test_allocate_mode_start_names_the_pods_the_nri_hook_served(tmp_path, caplog):
    """Found by review, 1 Dec: a node switched from injection nri back to allocate; its pods
    admitted in NRI mode keep the kubelet's stored 'pending' answer and get no GPU when a
    container restarts. The start says so, naming them."""
    served = nri_pod(grant_text(HERE))
    kube = _NodeKube([served])
    grants = tmp_path / "hook" / "vgpu" / "nri" / "grants"
    assert str(grants) == f"{_paths(tmp_path).vgpu_dir}/nri/grants"  # where the NRI hook records its grants
    grants.mkdir(parents=True)
    (grants / "uid-p").write_text('{"allocated": "x", "sandbox": "sb"}')
    (grants / "uid-gone").write_text('{"allocated": "x", "sandbox": "sb"}')  # a pod no longer on the node
    agent = NodeAgent(
        kube, NodeSettings(), _gpus(HERE), tmp_path / "plugins", _paths(tmp_path), ignored_xids=None, pod_watch=False
    )
    with caplog.at_level(logging.WARNING):
        await agent.start()
        await agent.stop()
    lines = [r.getMessage() for r in caplog.records if "admitted while it was nri" in r.getMessage()]
    assert len(lines) == 1
    assert "ns/p (uid uid-p)" in lines[0] and "uid-gone" not in lines[0] and "Recreate" in lines[0]
