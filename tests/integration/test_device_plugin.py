"""`hami device-plugin` end to end: real API server, fake NVML, kubelet stand-in.

The plugin runs as a real subprocess (`python -m hami device-plugin`) against the project's
fake ``libnvidia-ml.so.1``; the test process plays the kubelet (``KubeletStandIn``) and, until
``hami scheduler`` exists, the scheduler's side of the handoff: it writes the allocation
annotations, takes the node lock and creates the Binding exactly as the extender does (§5.5,
§5.8), through the real API server.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import re
import uuid

import grpc
import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hami.core.codec import decode_node_devices_json, decode_pod_devices, encode_pod_devices
from hami.core.types import ContainerDevice
from hami.deviceplugin import allocate as A
from hami.deviceplugin.api import HEALTHY, UNHEALTHY
from hami.deviceplugin.devices import physical_id
from hami_devkit.kubelet_standin import KubeletStandIn
from hami.deviceplugin.register import REGISTER
from hami_devkit.cluster import node_manifest
from hami.kube import nodelock

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAKE_NVML = ROOT / "native/build/fakegpu/libnvidia-ml.so.1"
RESOURCE = "nvidia.com/gpu"
SPLIT = 4
G0 = "GPU-f00dfeed-0000-4000-8000-000000000000"
G1 = "GPU-f00dfeed-0000-4000-8000-000000000001"
FAKE_DEVICES = "name=Tesla T4,memory=16G,pci=0000:3b:00.0;name=NVIDIA A100-SXM4-40GB,memory=40G,pci=0000:5e:00.0"


def _sysfs(root: Path) -> None:
    for bus, numa in (("0000:3b:00.0", "0"), ("0000:5e:00.0", "1")):
        d = root / "bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(numa + "\n")


class Plugin:
    """One `hami device-plugin` subprocess plus its kubelet stand-in and temp dirs."""

    def __init__(
        self,
        cluster,
        node: str,
        split: int = SPLIT,
        release_delay: float = 1.0,
        devices: str = FAKE_DEVICES,
        node_config: dict | None = None,
        extra_args: tuple[str, ...] = (),
        gpus: int = 2,
    ) -> None:
        self.cluster = cluster
        self.gpus = gpus
        self.devices = devices
        self.extra_args = extra_args
        self.node = node
        self.split = split
        self.release_delay = release_delay  # --lock-release-delay (1 s is the default)
        self.tmp = Path(tempfile.mkdtemp(prefix="hdp", dir="/tmp"))  # short: socket path limit
        self.plugin_dir = self.tmp / "dp"
        self.hook = self.tmp / "hook"
        self.state = self.tmp / "fg"
        self.state.mkdir()
        _sysfs(self.tmp / "sys")
        (self.tmp / "config.json").write_text(
            json.dumps(
                {
                    "nodeconfig": [
                        {
                            "name": node,
                            "devicesplitcount": split,
                            "enablenumatopology": True,
                            "enablegetpreferredallocation": True,
                            **(node_config or {}),
                        }
                    ]
                }
            )
        )
        self.kubelet = KubeletStandIn(self.plugin_dir)
        self.proc: subprocess.Popen | None = None
        self._stopped = False
        self.log = self.tmp / "plugin.log"

    async def start(self) -> None:
        await self.kubelet.start()
        await self.spawn()

    async def spawn(self) -> None:
        """Start the plugin process (again, after a kill) and wait until it registered with the kubelet."""
        seen = len(self.kubelet.registrations)
        env = {
            **os.environ,
            "FAKEGPU_DEVICES": self.devices,
            "FAKEGPU_STATE_DIR": str(self.state),
            "PYTHONPATH": str(ROOT / "src"),
        }
        cmd = [
            sys.executable,
            "-m",
            "hami",
            "device-plugin",
            "--node-name",
            self.node,
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--device-plugin-dir",
            str(self.plugin_dir),
            "--node-config",
            str(self.tmp / "config.json"),
            "--hook-path",
            str(self.hook),
            "--lock-dir",
            str(self.tmp / "vgpulock"),
            "--sysfs-root",
            str(self.tmp / "sys"),
            "--nvml-library",
            str(FAKE_NVML),
            "--register-interval",
            "0.5",
            "--poll-interval",
            "0.1",
            "--lock-release-delay",
            str(self.release_delay),
            "-v",
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        await self.kubelet.wait_for(
            lambda: (
                len(self.kubelet.registrations) > seen
                and len(self.kubelet.plugins.get(RESOURCE, _Empty).devices) == self.gpus * self.split
            ),
            30,
        )

    async def stop(self) -> None:
        """SIGTERM (the plugin's orderly shutdown) and the kubelet stand-in; once."""
        if self._stopped:
            return
        self._stopped = True
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        await self.kubelet.stop()

    def logs(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class _Empty:
    devices: dict = {}


def create_plain_node(cluster, name: str) -> None:
    """A Node no kubelet (not even kwok) manages: bound pods stay Pending, as during admission."""
    manifest = node_manifest(name, gpus=2, split_count=SPLIT)
    manifest["metadata"]["annotations"] = {}
    cluster.api("POST", "/api/v1/nodes", manifest)
    cluster.api(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": manifest["status"]},
        content_type="application/merge-patch+json",
    )


@pytest_asyncio.fixture(loop_scope="function")
async def plugin(kube_cluster, kube_api, request):
    if not FAKE_NVML.exists():
        pytest.skip(f"{FAKE_NVML} is not built (run `make -C native`)")
    node = f"dp-{uuid.uuid4().hex[:8]}"
    create_plain_node(kube_cluster, node)
    p = Plugin(kube_cluster, node)
    try:
        await p.start()
        yield p
    finally:
        await p.stop()
        print(f"--- hami device-plugin log (node {node}) ---\n{p.logs()[-8000:]}")
        kube_cluster.delete_node(node)
        p.cleanup()


# ------------------------------------------------------------------ the scheduler's side


def gpu_container(name: str, gpus: int, image: str = "busybox") -> dict:
    c = {"name": name, "image": image}
    if gpus:
        c["resources"] = {"limits": {RESOURCE: str(gpus)}}
    return c


async def create_pod(api, ns: str, name: str, containers: list[dict], init: list[dict] | None = None) -> dict:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": "nobody-schedules-this",
            "containers": containers,
            "initContainers": init or [],
            "terminationGracePeriodSeconds": 0,
        },
    }
    pod = await client.CoreV1Api(api).create_namespaced_pod(ns, body)
    return pod


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def take_lock(api, node: str, ns: str, name: str, timeout: float = 30) -> None:
    """The extender's SetNodeLock: wait until free, write with resourceVersion (§5.8); and, as our
    scheduler does on a node that declares hami.io/node-lock-handoff=swap, swap over at once a
    lock whose pod finished its allocation (test + replace of the value)."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = await core.read_node(node)
        held = (n.metadata.annotations or {}).get(A.NODE_LOCK)
        owner = A.parse_node_lock(held)
        if owner is not None and (n.metadata.annotations or {}).get(nodelock.LOCK_HANDOFF) == nodelock.HANDOFF_SWAP:
            try:
                phase = (await core.read_namespaced_pod(owner.name, owner.namespace)).metadata.annotations.get(
                    A.BIND_PHASE
                )
            except ApiException:
                phase = None
            if phase in ("success", "failed"):
                try:
                    await core.patch_node(
                        node,
                        nodelock.swap_patch(A.NODE_LOCK, held, f"{now_rfc3339()},{ns},{name}"),
                        _content_type="application/json-patch+json",
                    )
                    return
                except ApiException as exc:
                    if not nodelock.lost_swap(exc):
                        raise
        if A.NODE_LOCK not in (n.metadata.annotations or {}):
            body = {
                "metadata": {
                    "annotations": {A.NODE_LOCK: f"{now_rfc3339()},{ns},{name}"},
                    "resourceVersion": n.metadata.resource_version,
                }
            }
            try:
                await core.patch_node(node, body, _content_type="application/merge-patch+json")
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        await asyncio.sleep(0.02)
    raise TimeoutError(f"node lock on {node} not released within {timeout}s")


async def schedule_like_hami(
    api, node: str, ns: str, name: str, devices: list[list[ContainerDevice]], annotation: str | None = None
) -> None:
    """What Filter + Bind write: allocation annotations, node lock, bind-phase, Binding."""
    core = client.CoreV1Api(api)
    value = annotation if annotation is not None else encode_pod_devices(devices)
    await core.patch_namespaced_pod(
        name,
        ns,
        {
            "metadata": {
                "annotations": {
                    A.VGPU_NODE: node,
                    "hami.io/vgpu-time": str(int(time.time())),
                    A.TO_ALLOCATE: value,
                    A.ALLOCATED: value,
                },
                "labels": {A.VGPU_NODE: node},
            }
        },
        _content_type="application/merge-patch+json",
    )
    await take_lock(api, node, ns, name)
    await core.patch_namespaced_pod(
        name,
        ns,
        {"metadata": {"annotations": {A.BIND_PHASE: "allocating", A.BIND_TIME: str(int(time.time()))}}},
        _content_type="application/merge-patch+json",
    )
    await core.create_namespaced_pod_binding(
        name,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
        _preload_content=False,
    )


async def schedule_like_ours(api, node: str, ns: str, name: str, devices: list[list[ContainerDevice]]) -> None:
    """What our scheduler writes by default (--decision-write=binding): the node lock, then one
    Binding carrying every annotation (no pod patch, no label)."""
    value = encode_pod_devices(devices)
    await take_lock(api, node, ns, name)
    await client.CoreV1Api(api).create_namespaced_pod_binding(
        name,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": ns,
                "annotations": {
                    A.VGPU_NODE: node,
                    "hami.io/vgpu-time": str(int(time.time())),
                    A.TO_ALLOCATE: value,
                    A.ALLOCATED: value,
                    A.BIND_PHASE: "allocating",
                    A.BIND_TIME: str(int(time.time())),
                },
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
        _preload_content=False,
    )


async def lock_released(api, node: str, timeout: float = 10) -> None:
    """The node lock is gone within ``timeout`` (the plugin removes a finished pod's lock after
    its --lock-release-delay unless a Bind swapped it over first)."""
    deadline = time.monotonic() + timeout
    while A.NODE_LOCK in await node_annotations(api, node):
        assert time.monotonic() < deadline, f"node lock on {node} still held after {timeout}s"
        await asyncio.sleep(0.05)


def counts(pod) -> list[int]:
    ctrs = list(pod.spec.init_containers or []) + list(pod.spec.containers)
    return [int(((c.resources.limits if c.resources else None) or {}).get(RESOURCE, 0)) for c in ctrs]


async def node_annotations(api, node: str) -> dict:
    return (await client.CoreV1Api(api).read_node(node)).metadata.annotations or {}


async def pod_annotations(api, ns: str, name: str) -> dict:
    return (await client.CoreV1Api(api).read_namespaced_pod(name, ns)).metadata.annotations or {}


def dev(uuid: str, mem: int, cores: int = 0) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


def expected_env(devs: list[ContainerDevice]) -> dict:
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in devs), "CUDA_DEVICE_SM_LIMIT": str(devs[0].usedcores)}
    env.update({f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{d.usedmem}m" for i, d in enumerate(devs)})
    return env


# ------------------------------------------------------------------ tests


async def test_registration_annotation_written_from_nvml(plugin, kube_api):
    ann = await node_annotations(kube_api, plugin.node)
    devs = decode_node_devices_json(ann[REGISTER])
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.numa, d.health) for d in devs] == [
        (G0, 0, SPLIT, 16384, 100, "NVIDIA-Tesla T4", 0, True),
        (G1, 1, SPLIT, 40960, 100, "NVIDIA A100-SXM4-40GB", 1, True),
    ]
    assert ann["hami.io/node-handshake"].startswith("Reported ")
    ep = plugin.kubelet.plugins[RESOURCE]
    assert sorted(ep.devices) == sorted(f"{u}-{i}" for u in (G0, G1) for i in range(SPLIT))
    # unchanged devices -> no rewrite: the annotation's resourceVersion-relevant text stays put
    before = ann[REGISTER]
    await asyncio.sleep(1.2)  # two registration periods
    assert (await node_annotations(kube_api, plugin.node))[REGISTER] == before
    assert (
        plugin.logs().count(
            "wrote hami.io/node-handshake, hami.io/node-lock-handoff, hami.io/node-nvidia-register, "
            "hami.io/node-nvidia-score"
        )
        == 1
    )
    # the two GPUs share a host bridge and have no NVLink (topology.py): 30 each way
    assert json.loads(ann["hami.io/node-nvidia-score"]) == [
        {"uuid": G0, "score": {G1: 30}},
        {"uuid": G1, "score": {G0: 30}},
    ]
    assert (
        ann[nodelock.LOCK_HANDOFF] == "swap"
    )  # --lock-release-delay > 0 (default): finished pods' locks are swapped over


async def test_allocate_after_a_binding_that_carries_the_decision_labels_the_pod(plugin, kube_api, kube_namespace):
    """The decision arrives with the Binding alone: the plugin finds it, allocates, and adds the
    label hami.io/vgpu-node (by which vGPU monitors list a node's pods) in its success write."""
    ns = kube_namespace
    await create_pod(kube_api, ns, "bound", [gpu_container("main", 1)])
    devs = [[dev(G0, 2000, 20)]]
    await schedule_like_ours(kube_api, plugin.node, ns, "bound", devs)
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod("bound", ns)
    assert A.VGPU_NODE not in (pod.metadata.labels or {})
    [resp] = await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    envs = dict(resp.envs)
    assert {k: envs[k] for k in expected_env(devs[0])} == expected_env(devs[0])
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod("bound", ns)
    assert pod.metadata.annotations[A.BIND_PHASE] == "success"
    assert pod.metadata.labels[A.VGPU_NODE] == plugin.node
    await lock_released(kube_api, plugin.node)


async def test_a_finished_pods_lock_is_handed_on_never_removed_from_the_next_pod(plugin, kube_api, kube_namespace):
    """--lock-release-delay (default 1 s): the plugin leaves a finished pod's lock for the next
    Bind to swap over; its delayed removal is a compare-and-remove of the value it read, so a
    lock already naming the next pod stays; a lock nobody swaps over goes after the delay."""
    ns = kube_namespace
    for name in ("h1", "h2"):
        await create_pod(kube_api, ns, name, [gpu_container("main", 1)])
    await schedule_like_ours(kube_api, plugin.node, ns, "h1", [[dev(G0, 100)]])
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod("h1", ns)
    await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    assert (await pod_annotations(kube_api, ns, "h1"))[A.BIND_PHASE] == "success"
    await take_lock(kube_api, plugin.node, ns, "h2")  # swapped over (or taken, if the delay already passed)
    await asyncio.sleep(plugin.release_delay + 1.0)
    assert (await node_annotations(kube_api, plugin.node))[A.NODE_LOCK].endswith(f",{ns},h2")
    await client.CoreV1Api(kube_api).patch_node(
        plugin.node, {"metadata": {"annotations": {A.NODE_LOCK: None}}}, _content_type="application/merge-patch+json"
    )
    # nobody swaps: the plugin's own removal after the delay
    await schedule_like_ours(kube_api, plugin.node, ns, "h2", [[dev(G1, 100)]])
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod("h2", ns)
    await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    await lock_released(kube_api, plugin.node)


async def test_shutdown_removes_a_lock_left_for_the_handoff_and_withdraws_the_declaration(
    kube_cluster, kube_api, kube_namespace
):
    """A lock whose delayed removal is pending goes at shutdown (SIGTERM), and so does the node's
    hami.io/node-lock-handoff, so a plugin that replaces this one is not swapped over."""
    ns = kube_namespace
    node = f"dp-{uuid.uuid4().hex[:8]}"
    create_plain_node(kube_cluster, node)
    p = Plugin(kube_cluster, node, release_delay=60)
    try:
        await p.start()
        await create_pod(kube_api, ns, "last", [gpu_container("main", 1)])
        await schedule_like_ours(kube_api, node, ns, "last", [[dev(G0, 100)]])
        pod = await client.CoreV1Api(kube_api).read_namespaced_pod("last", ns)
        await p.kubelet.admit_pod(RESOURCE, counts(pod))
        ann = await node_annotations(kube_api, node)
        assert ann[A.NODE_LOCK].endswith(f",{ns},last") and ann[nodelock.LOCK_HANDOFF] == "swap"
        await p.stop()
        ann = await node_annotations(kube_api, node)
        assert A.NODE_LOCK not in ann and nodelock.LOCK_HANDOFF not in ann, ann
    finally:
        await p.stop()
        print(f"--- hami device-plugin log (node {node}) ---\n{p.logs()[-8000:]}")
        kube_cluster.delete_node(node)
        p.cleanup()


async def test_allocate_single_container(plugin, kube_api, kube_namespace):
    ns = kube_namespace
    await create_pod(kube_api, ns, "one", [gpu_container("main", 1)])
    devs = [[dev(G1, 3000, 30)]]
    await schedule_like_hami(kube_api, plugin.node, ns, "one", devs)
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod("one", ns)
    [resp] = await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    assert [physical_id(i) for i in plugin.kubelet.allocated[-1]] == [G1]  # GetPreferredAllocation followed the pod
    envs = dict(resp.envs)
    assert {k: envs[k] for k in expected_env(devs[0])} == expected_env(devs[0])
    assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(f"{plugin.hook}/vgpu/")
    assert envs["LIBCUDA_LOG_LEVEL"] == "1"
    mounts = {m.container_path: (m.host_path, m.read_only) for m in resp.mounts}
    cache = f"{plugin.hook}/vgpu/containers/{pod.metadata.uid}_main"
    assert mounts[f"{plugin.hook}/vgpu"] == (cache, False) and Path(cache).is_dir()
    assert mounts["/etc/ld.so.preload"] == (f"{plugin.hook}/vgpu/ld.so.preload", True)
    assert Path(plugin.hook, "vgpu/ld.so.preload").read_text() == f"{plugin.hook}/vgpu/libvgpu.so\n"
    ann = await pod_annotations(kube_api, ns, "one")
    assert ann[A.BIND_PHASE] == "success" and ann[A.TO_ALLOCATE] == ";" and ann[A.ALLOCATED] == encode_pod_devices(devs)
    await lock_released(kube_api, plugin.node)


async def test_allocate_takes_the_pod_from_its_watch_when_the_copy_postdates_the_lock(plugin, kube_api, kube_namespace):
    """The plugin watches its node's pods; a copy newer than the node (so newer than the lock)
    stands in for reading the pod, and the result is the same as from a read."""
    import re

    ns = kube_namespace
    await create_pod(kube_api, ns, "watched", [gpu_container("main", 1)])
    devs = [[dev(G0, 2000, 20)]]
    await schedule_like_hami(kube_api, plugin.node, ns, "watched", devs)
    await asyncio.sleep(2.0)  # the plugin's watch delivers the Binding (the kubelet's admission comes later too)
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod("watched", ns)
    [resp] = await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    envs = dict(resp.envs)
    assert {k: envs[k] for k in expected_env(devs[0])} == expected_env(devs[0])
    line = next(ln for ln in plugin.logs().splitlines() if f"pod {ns}/watched: allocated" in ln)
    cached, read = map(
        int, re.search(r"pod reads: (\d+) from the watch cache, (\d+) from the API server", line).groups()
    )
    assert cached >= 1, line
    ann = await pod_annotations(kube_api, ns, "watched")
    assert ann[A.BIND_PHASE] == "success" and ann[A.TO_ALLOCATE] == ";"
    await lock_released(kube_api, plugin.node)


async def test_multi_container_pod_with_gpu_init_container(plugin, kube_api, kube_namespace):
    ns = kube_namespace
    await create_pod(
        kube_api,
        ns,
        "multi",
        [gpu_container("sidecar", 0), gpu_container("worker", 2)],
        init=[gpu_container("warmup", 1)],
    )
    devs = [[dev(G0, 1000, 10)], [], [dev(G0, 2000, 20), dev(G1, 4000, 20)]]
    await schedule_like_hami(kube_api, plugin.node, ns, "multi", devs)
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod("multi", ns)
    assert counts(pod) == [1, 0, 2]
    init_resp, worker_resp = await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    assert {k: dict(init_resp.envs)[k] for k in expected_env(devs[0])} == expected_env(devs[0])
    assert {k: dict(worker_resp.envs)[k] for k in expected_env(devs[2])} == expected_env(devs[2])
    cache_dirs = [
        {m.container_path: m.host_path for m in r.mounts}[f"{plugin.hook}/vgpu"] for r in (init_resp, worker_resp)
    ]
    assert cache_dirs == [f"{plugin.hook}/vgpu/containers/{pod.metadata.uid}_{c}" for c in ("warmup", "worker")]
    assert (
        dict(init_resp.envs)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        != dict(worker_resp.envs)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    )
    ann = await pod_annotations(kube_api, ns, "multi")
    assert ann[A.BIND_PHASE] == "success" and ann[A.TO_ALLOCATE] == ";;;"
    await lock_released(kube_api, plugin.node)


async def test_twenty_pods_one_node(plugin, kube_api, kube_namespace):
    """Pods bound as fast as the lock allows; the kubelet admits them in the order it sees them."""
    ns = kube_namespace
    n = 20
    want: dict[str, list[ContainerDevice]] = {}
    for i in range(n):
        name = f"p{i:02d}"
        want[name] = [dev((G0, G1)[i % 2], 100 + i, i % 7)]
        await create_pod(kube_api, ns, name, [gpu_container("main", 1)])
    bound: asyncio.Queue = asyncio.Queue()

    async def scheduler():
        for name, devs in want.items():
            await schedule_like_hami(kube_api, plugin.node, ns, name, [devs])  # waits for the lock

    got: dict[str, dict] = {}

    async def kubelet():
        for _ in range(n):
            pod = await asyncio.wait_for(bound.get(), 60)
            [resp] = await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
            got[pod.metadata.name] = dict(resp.envs)
            plugin.kubelet.in_use.clear()  # containers finish; IDs are reusable

    watcher = watch_bound_pods(kube_api, ns, plugin.node, bound, n)
    await asyncio.wait_for(asyncio.gather(scheduler(), kubelet(), watcher), 120)
    for name, devs in want.items():
        assert {k: got[name][k] for k in expected_env(devs)} == expected_env(devs), name
        ann = await pod_annotations(kube_api, ns, name)
        assert ann[A.BIND_PHASE] == "success", name
    await lock_released(kube_api, plugin.node)


@pytest.mark.parametrize(
    "annotation, count, reason",
    [
        ("GPU-f00dfeed,NVIDIA;", 1, "is invalid"),
        (f"{G0},NVIDIA,1000,0:{G1},NVIDIA,1000,0:;", 1, r"has 2 GPU\(s\) .* asked for 1"),
    ],
)
async def test_bad_annotation_fails_cleanly(plugin, kube_api, kube_namespace, annotation, count, reason):
    ns = kube_namespace
    await create_pod(kube_api, ns, "bad", [gpu_container("main", count)])
    await schedule_like_hami(kube_api, plugin.node, ns, "bad", [], annotation=annotation)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plugin.kubelet.admit_pod(RESOURCE, [count])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"pod {ns}/bad" in err.value.details()
    assert re.search(reason, err.value.details()), err.value.details()
    assert (await pod_annotations(kube_api, ns, "bad"))[A.BIND_PHASE] == "failed"
    await lock_released(kube_api, plugin.node)


async def test_no_lock_and_two_candidates_is_refused(plugin, kube_api, kube_namespace):
    ns = kube_namespace
    core = client.CoreV1Api(kube_api)
    for name in ("a", "b"):
        await create_pod(kube_api, ns, name, [gpu_container("main", 1)])
        await schedule_like_hami(kube_api, plugin.node, ns, name, [[dev(G0, 100)]])
        await core.patch_node(
            plugin.node,
            {"metadata": {"annotations": {A.NODE_LOCK: None}}},
            _content_type="application/merge-patch+json",
        )  # a lost lock
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plugin.kubelet.admit_pod(RESOURCE, [1])
    assert "refusing to guess" in err.value.details() and f"{ns}/a, {ns}/b" in err.value.details()
    for name in ("a", "b"):  # neither pod was touched
        assert (await pod_annotations(kube_api, ns, name))[A.BIND_PHASE] == "allocating"


async def test_kubelet_restart_reregisters(plugin):
    await plugin.kubelet.restart()
    await plugin.kubelet.wait_for(lambda: len(plugin.kubelet.plugins.get(RESOURCE, _Empty).devices) == 2 * SPLIT, 20)
    assert plugin.kubelet.registrations == [(RESOURCE, "nvidia-gpu.sock")] * 2


async def test_xid_marks_device_unhealthy(plugin, kube_api):
    (plugin.state / "xid").write_text(f"{G1} 13\n{G1} 79\n")  # 13 is an application error: ignored
    ep = plugin.kubelet.plugins[RESOURCE]
    await plugin.kubelet.wait_for(lambda: ep.devices.get(f"{G1}-0") == UNHEALTHY, 20)
    assert {i: h for i, h in ep.devices.items() if i.startswith(G0)} == {f"{G0}-{i}": HEALTHY for i in range(SPLIT)}

    async def annotated_unhealthy():
        while True:
            devs = {
                d.id: d.health
                for d in decode_node_devices_json((await node_annotations(kube_api, plugin.node))[REGISTER])
            }
            if devs == {G0: True, G1: False}:
                return
            await asyncio.sleep(0.1)

    await asyncio.wait_for(annotated_unhealthy(), 20)


async def test_lock_of_an_unbound_pod_is_left_alone(plugin, kube_api, kube_namespace):
    """Bind in flight for pod 'next' while the kubelet admits something else: fail, touch nothing."""
    ns = kube_namespace
    core = client.CoreV1Api(kube_api)
    await create_pod(kube_api, ns, "next", [gpu_container("main", 1)])
    value = encode_pod_devices([[dev(G0, 100)]])
    await core.patch_namespaced_pod(
        "next",
        ns,
        {"metadata": {"annotations": {A.VGPU_NODE: plugin.node, A.TO_ALLOCATE: value, A.BIND_PHASE: "allocating"}}},
        _content_type="application/merge-patch+json",
    )
    await take_lock(kube_api, plugin.node, ns, "next")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plugin.kubelet.admit_pod(RESOURCE, [1])
    assert f"names pod {ns}/next, which is not bound to this node yet" in err.value.details()
    assert (await pod_annotations(kube_api, ns, "next"))[A.BIND_PHASE] == "allocating"
    assert (await node_annotations(kube_api, plugin.node))[A.NODE_LOCK].endswith(f",{ns},next")
    await core.patch_node(
        plugin.node, {"metadata": {"annotations": {A.NODE_LOCK: None}}}, _content_type="application/merge-patch+json"
    )


async def test_a_pod_write_never_lands_on_a_pod_re_created_under_the_same_name(kube_api, kube_namespace):
    """A StatefulSet's pod force-deleted and re-created while its Allocate ran (MIG instance
    creation takes seconds): the late success or failure write, by name, landed on the new pod
    and overwrote its decision with the old pod's grant (found by review). The write now names
    the UID read, which the real API server refuses (422: metadata.uid is immutable), nothing written."""
    from hami.deviceplugin import kube as dkube

    ns = kube_namespace
    first = pod_view_of(await create_pod(kube_api, ns, "sts-0", [gpu_container("main", 1)]))
    core = client.CoreV1Api(kube_api)
    await core.delete_namespaced_pod("sts-0", ns, grace_period_seconds=0)
    for _ in range(100):  # (no kubelet: the pod goes at once with a grace period of 0)
        try:
            await core.read_namespaced_pod("sts-0", ns)
        except ApiException as exc:
            if exc.status == 404:
                break
        await asyncio.sleep(0.1)
    second = await create_pod(kube_api, ns, "sts-0", [gpu_container("main", 1)])
    assert second.metadata.uid != first.uid
    kube = dkube.Kube(kube_api, "nowhere")
    with pytest.raises(ApiException) as err:
        await kube.patch_pod_annotations(first, {A.BIND_PHASE: "failed"}, labels={A.VGPU_NODE: "nowhere"})
    assert err.value.status == 422 and "metadata.uid" in err.value.body, err.value.body
    assert A.BIND_PHASE not in await pod_annotations(kube_api, ns, "sts-0")
    # the pod it was read as is written as ever
    await kube.patch_pod_annotations(pod_view_of(second), {A.BIND_PHASE: "failed"})
    assert (await pod_annotations(kube_api, ns, "sts-0"))[A.BIND_PHASE] == "failed"


def pod_view_of(pod) -> A.PodView:
    from hami.deviceplugin.kube import pod_view

    return pod_view(pod)


async def test_lock_of_a_deleted_pod_is_released(plugin, kube_api, kube_namespace):
    ns = kube_namespace
    await take_lock(kube_api, plugin.node, ns, "gone")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plugin.kubelet.admit_pod(RESOURCE, [1])
    assert "names a pod that no longer exists" in err.value.details()
    await lock_released(kube_api, plugin.node)


# ------------------------------------------------------------------ the full chain (needs `hami scheduler`)


def _scheduler_cli() -> str | None:
    """Why the full chain cannot run yet, or None when `hami scheduler` looks usable."""
    import importlib.util

    if importlib.util.find_spec("hami.scheduler.command") is None:
        return "hami scheduler is not built yet (hami.scheduler.command missing)"
    return None


async def watch_bound_pods(api, ns: str, node: str, seen: asyncio.Queue, count: int) -> None:
    """The kubelet's view: pods of ``ns`` bound to ``node``, in the order the API reports them."""
    from kubernetes_asyncio import watch

    names: set[str] = set()
    core = client.CoreV1Api(api)
    while len(names) < count:
        async with watch.Watch().stream(
            core.list_namespaced_pod, ns, field_selector=f"spec.nodeName={node}", timeout_seconds=30
        ) as stream:
            async for event in stream:
                pod = event["object"]
                if pod.metadata.name not in names:
                    names.add(pod.metadata.name)
                    await seen.put(pod)
                if len(names) >= count:
                    return


WEBHOOK_LABEL = "hami.io/webhook-test"


def _chain_pod(name: str, node: str, multi: bool) -> dict:
    limits = {RESOURCE: "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "5"}
    spec: dict = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
    }
    if multi:  # a GPU init container, and the GPU app container is not the first one
        spec["initContainers"] = [{"name": "warmup", "image": "busybox", "resources": {"limits": limits}}]
        spec["containers"] = [{"name": "log", "image": "busybox"}, {**spec["containers"][0], "name": "worker"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def test_full_chain_with_hami_scheduler(kube_cluster, kube_api, kube_namespace):
    """Webhook -> kube-scheduler + our extender -> Bind (node lock) -> kubelet stand-in -> Allocate."""
    why = _scheduler_cli()
    if why:
        pytest.skip(why)
    if not FAKE_NVML.exists():
        pytest.skip(f"{FAKE_NVML} is not built")
    from hami_devkit.cluster import SchedulerConfig

    from ._hami import SchedulerProcess, delete_webhook, label_namespace, register_webhook, wait_webhook_routes

    ns, n = kube_namespace, 20
    label_namespace(kube_cluster, ns, WEBHOOK_LABEL)
    sched = SchedulerProcess(kube_cluster).start()
    webhook = f"hami-dp-test-{uuid.uuid4().hex[:6]}"
    node = f"dp-{uuid.uuid4().hex[:8]}"
    # Ready (kwok), so kube-scheduler may pick it; 2 GPUs x 10 slots hold all pods at once
    kube_cluster.create_node(node, gpus=2, split_count=10)
    p = Plugin(kube_cluster, node, split=10)
    try:
        kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=sched.extender()))
        register_webhook(kube_cluster, sched.url, webhook, WEBHOOK_LABEL)
        await asyncio.to_thread(wait_webhook_routes, kube_cluster, ns, _chain_pod("probe", node, multi=False))
        await p.start()
        names = [f"c{i:02d}" for i in range(n)]
        for i, name in enumerate(names):
            created = await client.CoreV1Api(kube_api).create_namespaced_pod(
                ns, _chain_pod(name, node, multi=i % 5 == 4)
            )
            assert created.spec.scheduler_name == "hami-scheduler", "the webhook did not route the pod"
        seen: asyncio.Queue = asyncio.Queue()
        watcher = asyncio.create_task(watch_bound_pods(kube_api, ns, node, seen, n))
        responses: dict[str, list] = {}
        for _ in range(n):
            pod = await asyncio.wait_for(seen.get(), 60)
            responses[pod.metadata.name] = await p.kubelet.admit_pod(RESOURCE, counts(pod))
            p.kubelet.in_use.clear()
        await watcher
        for name, resps in responses.items():
            ann = await pod_annotations(kube_api, ns, name)
            granted = [list(c) for c in decode_pod_devices(ann[A.ALLOCATED]) if c]
            assert len(granted) == len(resps), name
            for devs, resp in zip(granted, resps):
                env = dict(resp.envs)
                assert {k: env[k] for k in expected_env(devs)} == expected_env(devs), name
            assert ann[A.BIND_PHASE] == "success", name
        multi = await client.CoreV1Api(kube_api).read_namespaced_pod("c04", ns)
        cache_dirs = [{m.container_path: m.host_path for m in r.mounts}[f"{p.hook}/vgpu"] for r in responses["c04"]]
        assert cache_dirs == [f"{p.hook}/vgpu/containers/{multi.metadata.uid}_{c}" for c in ("warmup", "worker")]
        await lock_released(kube_api, node)
    finally:
        delete_webhook(kube_cluster, webhook)
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        await p.stop()
        sched.stop()
        print(f"--- hami scheduler log ---\n{sched.logs()[-4000:]}\n--- plugin log ---\n{p.logs()[-4000:]}")
        kube_cluster.delete_node(node)
        p.cleanup()


async def test_cdi_cri_writes_a_valid_spec_and_allocate_names_cdi_devices(kube_cluster, kube_api, kube_namespace):
    """--device-list-strategy cdi-cri: the spec file of the fake node's GPUs (minors from the fake
    NVML), valid against the CDI schema fixture; Allocate answers with cdi_devices, not the env."""
    import jsonschema

    if not FAKE_NVML.exists():
        pytest.skip(f"{FAKE_NVML} is not built (run `make -C native`)")
    schema = json.loads((ROOT / "tests/unit/fixtures/cdi-spec.schema.json").read_text())
    node = f"dp-{uuid.uuid4().hex[:8]}"
    create_plain_node(kube_cluster, node)
    spec_dir = Path(tempfile.mkdtemp(prefix="hcdi", dir="/tmp"))
    p = Plugin(kube_cluster, node, extra_args=("--device-list-strategy=cdi-cri", f"--cdi-spec-dir={spec_dir}"))
    try:
        await p.start()
        spec = json.loads((spec_dir / "hami-gpu.json").read_text())
        jsonschema.validate(spec, schema, cls=jsonschema.Draft7Validator)
        assert spec["kind"] == "hami.io/gpu"
        assert [(d["name"], d["containerEdits"]["deviceNodes"]) for d in spec["devices"]] == [
            (G0, [{"path": "/dev/nvidia0"}]),
            (G1, [{"path": "/dev/nvidia1"}]),
        ]
        ns = kube_namespace
        await create_pod(kube_api, ns, "cdi", [gpu_container("main", 1)])
        devs = [[dev(G1, 3000, 30)]]
        await schedule_like_hami(kube_api, node, ns, "cdi", devs)
        pod = await client.CoreV1Api(kube_api).read_namespaced_pod("cdi", ns)
        [resp] = await p.kubelet.admit_pod(RESOURCE, counts(pod))
        assert [d.name for d in resp.cdi_devices] == [f"hami.io/gpu={G1}"]
        envs = dict(resp.envs)
        assert "NVIDIA_VISIBLE_DEVICES" not in envs
        assert {k: v for k, v in expected_env(devs[0]).items() if k != "NVIDIA_VISIBLE_DEVICES"}.items() <= envs.items()
        assert not dict(resp.annotations)
    finally:
        await p.stop()
        print(f"--- hami device-plugin log (node {node}) ---\n{p.logs()[-8000:]}")
        kube_cluster.delete_node(node)
        p.cleanup()
        shutil.rmtree(spec_dir, ignore_errors=True)
