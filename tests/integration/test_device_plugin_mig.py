"""Dynamic MIG end to end: the plugin (real subprocess, fake NVML with MIG) registers its GPUs'
MIG geometry, the scheduler core places a pod from that registration, the plugin's Allocate
creates the instance the core chose and hands the container its MIG device, and the instance
goes when the pod goes — also across a plugin killed and restarted in between (real API server,
kubelet stand-in)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from hami.core import SchedulerConfig, admit_pod
from hami.core.codec import decode_mig_allocations, decode_node_devices_json
from hami.core.ledger import Ledger, node_devices_from_object
from hami.core.schedule import schedule_pod
from hami.deviceplugin import allocate as A
from hami.vendors import build_vendors

from .test_device_plugin import FAKE_NVML, RESOURCE, ROOT, Plugin, counts, create_plain_node, lock_released, take_lock

pytestmark = pytest.mark.integration

A100 = "GPU-f00dfeed-0000-4000-8000-000000000000"
H100 = "GPU-f00dfeed-0000-4000-8000-000000000001"
DEVICES = (
    "name=NVIDIA A100-SXM4-40GB,memory=40Gi,pci=0000:3b:00.0;name=NVIDIA H100 80GB HBM3,memory=80Gi,pci=0000:5e:00.0"
)
MIG = "hami.io/vgpu-mig-allocations"


@pytest_asyncio.fixture(loop_scope="function")
async def mig_plugin(kube_cluster, kube_api):
    if not FAKE_NVML.exists():
        pytest.skip(f"{FAKE_NVML} is not built (run `make -C native`)")
    node = f"mig-{uuid.uuid4().hex[:8]}"
    create_plain_node(kube_cluster, node)
    p = Plugin(
        kube_cluster,
        node,
        devices=DEVICES,
        node_config={"operatingmode": "mig"},
        extra_args=("--mig-collect-interval", "0.2"),
    )
    try:
        await p.start()
        yield p
    finally:
        await p.stop()
        print(f"--- hami device-plugin log (node {node}) ---\n{p.logs()[-8000:]}")
        kube_cluster.delete_node(node)
        p.cleanup()


def instances(p: Plugin) -> dict[str, list]:
    """What the fake driver has now (read-only, from another process of the same machine)."""
    code = (
        "import json; from hami.node.nvml import MigNvml, open_nvml;"
        f"open_nvml({str(FAKE_NVML)!r}); n = MigNvml();"
        f"print(json.dumps({{g: [[i.gi, i.profile, i.start, i.mig_uuid] for i in n.instances(g)] for g in {[A100, H100]!r}}}))"
    )
    env = {**os.environ, "FAKEGPU_DEVICES": DEVICES, "FAKEGPU_STATE_DIR": str(p.state), "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def place_with_the_core(api, node: str, ns: str, name: str, gpumem: int) -> dict:
    """Create a pod and decide it the way the extender does, from the node's registration as the
    plugin wrote it; bind it with the decision (lock, then one Binding, as our scheduler does)."""
    core = client.CoreV1Api(api)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": "nobody",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {RESOURCE: "1", "nvidia.com/gpumem": str(gpumem)}},
                }
            ],
        },
    }
    created = api.sanitize_for_serialization(await core.create_namespaced_pod(ns, body))
    node_obj = api.sanitize_for_serialization(await core.read_node(node))
    config = SchedulerConfig(build_vendors())
    ledger = Ledger()
    ledger.set_node(node_devices_from_object(node_obj, config.vendors))
    admitted, _ = admit_pod(created, config.vendors)
    result = schedule_pod(admitted, [node], ledger, config, 0.0)
    assert result.node == node, result.reasons()
    ann = {**result.annotations, A.BIND_PHASE: "allocating", A.BIND_TIME: "1"}
    await take_lock(api, node, ns, name)
    await core.create_namespaced_pod_binding(
        name,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "annotations": ann},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
        _preload_content=False,
    )
    return ann


async def wait_until(probe, what: str, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_registration_carries_the_mig_geometry(mig_plugin, kube_api):
    ann = (await client.CoreV1Api(kube_api).read_node(mig_plugin.node)).metadata.annotations
    devs = {d.id: d for d in decode_node_devices_json(ann["hami.io/node-nvidia-register"])}
    assert devs[A100].mode == "mig" and devs[A100].count == 7 and devs[A100].devcore == 100
    assert [p.name for p in devs[A100].mig_profiles] == [
        "1g.5gb",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ]
    assert [p.name for p in devs[H100].mig_profiles][-1] == "7g.80gb"


async def test_allocate_creates_the_chosen_instance_and_the_pod_gone_destroys_it(mig_plugin, kube_api, kube_namespace):
    ns, core = kube_namespace, client.CoreV1Api(kube_api)
    decided = await place_with_the_core(kube_api, mig_plugin.node, ns, "m1", gpumem=9000)
    [chosen] = decode_mig_allocations(decided[MIG])
    pod = await core.read_namespaced_pod("m1", ns)
    [resp] = await mig_plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    envs = dict(resp.envs)
    have = instances(mig_plugin)[chosen.gpu_uuid]
    assert [(i[1], i[2]) for i in have] == [(chosen.profile, chosen.start)]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == have[0][3] and have[0][3].startswith("MIG-")
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"].endswith("m") and envs["CUDA_DEVICE_SM_LIMIT"] == "100"
    ann = (await core.read_namespaced_pod("m1", ns)).metadata.annotations
    [made] = decode_mig_allocations(ann[MIG])
    assert (made.mig_uuid, made.gpu_instance_id, made.compute_instance_id) == (have[0][3], have[0][0], 0)
    assert ann[A.BIND_PHASE] == "success"
    await lock_released(kube_api, mig_plugin.node)
    await core.delete_namespaced_pod("m1", ns, grace_period_seconds=0)
    await wait_until(lambda: instances(mig_plugin)[chosen.gpu_uuid] == [], "the instance of the deleted pod to go")


async def test_a_killed_plugin_keeps_live_instances_and_still_cleans_up(mig_plugin, kube_api, kube_namespace):
    ns, core = kube_namespace, client.CoreV1Api(kube_api)
    await place_with_the_core(kube_api, mig_plugin.node, ns, "k1", gpumem=19000)
    pod = await core.read_namespaced_pod("k1", ns)
    [resp] = await mig_plugin.kubelet.admit_pod(RESOURCE, counts(pod))
    before = instances(mig_plugin)
    mig_plugin.proc.kill()
    mig_plugin.proc.wait()
    await mig_plugin.spawn()
    assert instances(mig_plugin) == before  # the running pod keeps its instance (same MIG UUID)
    assert dict(resp.envs)["NVIDIA_VISIBLE_DEVICES"] in json.dumps(before)
    await lock_released(kube_api, mig_plugin.node)
    await core.delete_namespaced_pod("k1", ns, grace_period_seconds=0)
    await wait_until(lambda: all(v == [] for v in instances(mig_plugin).values()), "clean-up after the restart")


async def test_asymmetric_nvlinks_raise_a_node_warning_event(kube_cluster, kube_api):
    """Topology: a pair whose NVLink counts disagree scores 0 and the node gets HAMi's Warning
    event AsymmetricGPUP2PLink."""
    node = f"asym-{uuid.uuid4().hex[:8]}"
    create_plain_node(kube_cluster, node)
    p = Plugin(kube_cluster, node, devices="name=Tesla V100-SXM2-32GB,nvlink=1x2;name=Tesla V100-SXM2-32GB,nvlink=0x1")
    try:
        await p.start()
        ann = (await client.CoreV1Api(kube_api).read_node(node)).metadata.annotations
        assert json.loads(ann["hami.io/node-nvidia-score"])[0]["score"] == {H100: 0}
        events = await client.CoreV1Api(kube_api).list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node},reason=AsymmetricGPUP2PLink"
        )
        assert len(events.items) == 1 and events.items[0].type == "Warning" and A100 in events.items[0].message
    finally:
        await p.stop()
        kube_cluster.delete_node(node)
        p.cleanup()


async def test_full_chain_topology_aware_and_mig_through_the_extender(kube_cluster, kube_api, kube_namespace):
    """Webhook -> kube-scheduler + our extender -> Bind -> kubelet stand-in -> Allocate, on two
    nodes whose plugins read the fake driver: a 4-GPU board whose NVLink pair is GPUs 1 and 3
    (a topology-aware 2-GPU pod gets them, from the scores the plugin published; without the
    scores every pair ties and GPUs 0 and 1 would be taken) and a MIG node (the extender picks
    profile and placement, the plugin makes that instance)."""
    from hami_devkit.cluster import SchedulerConfig

    from ._hami import SchedulerProcess, delete_webhook, label_namespace, register_webhook, wait_webhook_routes
    from .test_device_plugin import WEBHOOK_LABEL, _chain_pod, _scheduler_cli, watch_bound_pods

    if _scheduler_cli() or not FAKE_NVML.exists():
        pytest.skip(_scheduler_cli() or "the fake NVML is not built")
    links = {0: "2x1", 1: "3x2", 2: "0x1", 3: "1x2"}
    board = ";".join(
        f"name=Tesla V100-SXM2-32GB,memory=32Gi,pci=0000:{0x18 + 0x10 * i:02x}:00.0,nvlink={links[i]},"
        f"host_bridge=0,numa=0"
        for i in range(4)
    )
    gpu = [f"GPU-f00dfeed-0000-4000-8000-{i:012d}" for i in range(4)]
    ns = kube_namespace
    label_namespace(kube_cluster, ns, WEBHOOK_LABEL)
    sched = SchedulerProcess(kube_cluster).start()
    webhook = f"hami-topo-{uuid.uuid4().hex[:6]}"
    topo_node, mig_node = f"topo-{uuid.uuid4().hex[:6]}", f"migc-{uuid.uuid4().hex[:6]}"
    kube_cluster.create_node(topo_node, gpus=4, split_count=2)
    kube_cluster.create_node(mig_node, gpus=2, split_count=2)
    topo = Plugin(kube_cluster, topo_node, split=2, devices=board, gpus=4)
    mig = Plugin(
        kube_cluster,
        mig_node,
        split=2,
        devices=DEVICES,
        node_config={"operatingmode": "mig"},
        extra_args=("--mig-collect-interval", "0.2"),
    )
    core = client.CoreV1Api(kube_api)
    try:
        kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=sched.extender()))
        register_webhook(kube_cluster, sched.url, webhook, WEBHOOK_LABEL)
        await asyncio.to_thread(wait_webhook_routes, kube_cluster, ns, _chain_pod("probe", topo_node, multi=False))
        await topo.start()
        await mig.start()
        pair = _chain_pod("pair", topo_node, multi=False)
        pair["metadata"]["annotations"] = {"hami.io/gpu-scheduler-policy": "topology-aware"}
        pair["spec"]["containers"][0]["resources"]["limits"] = {RESOURCE: "2"}
        cut = _chain_pod("cut", mig_node, multi=False)
        cut["spec"]["containers"][0]["resources"]["limits"] = {RESOURCE: "1", "nvidia.com/gpumem": "15000"}
        for body in (pair, cut):
            created = await core.create_namespaced_pod(ns, body)
            assert created.spec.scheduler_name == "hami-scheduler", "the webhook did not route the pod"
        for plugin, name in ((topo, "pair"), (mig, "cut")):
            seen: asyncio.Queue = asyncio.Queue()
            watcher = asyncio.create_task(watch_bound_pods(kube_api, ns, plugin.node, seen, 1))
            pod = await asyncio.wait_for(seen.get(), 60)
            await watcher
            assert pod.metadata.name == name
            [resp] = await plugin.kubelet.admit_pod(RESOURCE, counts(pod))
            if plugin is topo:
                got = sorted(dict(resp.envs)["NVIDIA_VISIBLE_DEVICES"].split(","))
                assert got == [gpu[1], gpu[3]], got
            else:
                ann = (await core.read_namespaced_pod("cut", ns)).metadata.annotations
                [made] = decode_mig_allocations(ann[MIG])
                assert made.profile == {A100: "3g.20gb", H100: "1g.20gb"}[made.gpu_uuid], made  # smallest >= 15000 MiB
                have = instances(mig)[made.gpu_uuid]
                assert [(i[1], i[2], i[3]) for i in have] == [(made.profile, made.start, made.mig_uuid)]
                assert dict(resp.envs)["NVIDIA_VISIBLE_DEVICES"] == made.mig_uuid
        await core.delete_namespaced_pod("cut", ns, grace_period_seconds=0)
        await wait_until(lambda: all(v == [] for v in instances(mig).values()), "the MIG instance to go with its pod")
    finally:
        delete_webhook(kube_cluster, webhook)
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        for p in (topo, mig):
            await p.stop()
        sched.stop()
        print(
            f"--- hami scheduler log ---\n{sched.logs()[-4000:]}\n--- topo plugin ---\n{topo.logs()[-3000:]}\n"
            f"--- mig plugin ---\n{mig.logs()[-3000:]}"
        )
        kube_cluster.delete_node(topo_node)
        kube_cluster.delete_node(mig_node)
        topo.cleanup()
        mig.cleanup()
