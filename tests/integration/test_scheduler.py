"""`hami scheduler` on the real control plane: kube-apiserver + kube-scheduler (profile
`hami-scheduler`, our extender over HTTPS) + kwok nodes, our webhook registered for the test
namespaces. kwok runs no device plugin, so `PluginStandIn` (tests/integration/_hami.py) plays
the node side of the handoff (pod named by the node lock -> bind-phase=success -> lock
released), through the API server, from annotations only. Every check reads the pods'
annotations from the API server, never the scheduler's memory.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from hami.core.codec import decode_pod_devices
from hami_devkit.cluster import ApiError, SchedulerConfig

from ._hami import (
    wait_all_allocated,
    claim_json,
    post_json_text,
    ALLOCATED,
    ROOT,
    LeaseHolder,
    PluginStandIn,
    SchedulerProcess,
    delete_webhook,
    device_usage,
    events,
    gpu_pod,
    gpu_uuid,
    label_namespace,
    make_gpu_node,
    placed,
    pods,
    register_webhook,
    wait_pods,
    wait_webhook_routes,
)

pytestmark = pytest.mark.integration
WEBHOOK_LABEL = "hami.io/webhook-test"


@pytest.fixture(scope="module", params=["binding", "filter"])
def hami(kube_cluster, request):
    """Every scenario runs with both --decision-write modes: the decision on the Binding (ours,
    the default) and HAMi's pod patch from Filter."""
    proc = SchedulerProcess(kube_cluster, f"--decision-write={request.param}").start()
    webhook = f"hami-test-{uuid.uuid4().hex[:6]}"
    kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=proc.extender()))
    register_webhook(kube_cluster, proc.url, webhook, WEBHOOK_LABEL)
    try:
        yield proc
    finally:
        delete_webhook(kube_cluster, webhook)
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()


@pytest.fixture(scope="module")
def standin(kube_cluster):
    with PluginStandIn(kube_cluster) as s:
        yield s


@pytest.fixture
def ns(kube_cluster, kube_namespace):
    label_namespace(kube_cluster, kube_namespace, WEBHOOK_LABEL)
    probe = gpu_pod("webhook-probe", kube_namespace, mem=1000)
    probe["spec"].pop("schedulerName")
    wait_webhook_routes(kube_cluster, kube_namespace, probe)
    return kube_namespace


def _group(kube_cluster, prefix: str, n: int, **kw) -> tuple[dict, list[str]]:
    group = f"{prefix}-{uuid.uuid4().hex[:5]}"
    names = [f"{group}-{i}" for i in range(n)]
    for name in names:
        make_gpu_node(kube_cluster, name, labels={"hami-group": group}, **kw)
    return {"hami-group": group}, names


def _create(cluster, ns: str, pod: dict) -> dict:
    return cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)


def _containers(p: dict) -> list:
    return decode_pod_devices(p["metadata"]["annotations"][ALLOCATED])


def _check_capacity(all_pods: list[dict], mem: int = 16384, split: int = 10) -> None:
    for uuid_, (slots, used_mem, used_cores) in device_usage(all_pods).items():
        assert slots <= split and used_mem <= mem and used_cores <= 100, (uuid_, slots, used_mem, used_cores)


def _dry_run_denied(cluster, ns: str, pod: dict, text: str) -> bool:
    """Whether creating ``pod`` (dry run) is refused with ``text`` in the reason."""
    try:
        cluster.api("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", pod)
    except ApiError as exc:
        if text in str(exc):
            return True
        raise
    return False


def allocated(p: dict) -> bool:
    return (p["metadata"].get("annotations") or {}).get("hami.io/bind-phase") == "success"


def _cleanup_nodes(cluster, names):
    for n in names:
        cluster.delete_node(n)


# ------------------------------------------------------------------------------------------
def test_deployment_of_30_mixed_pods_on_4_nodes(kube_cluster, hami, standin, ns):
    selector, nodes = _group(kube_cluster, "dep", 4)
    try:
        template = gpu_pod("x", ns, mem=2000, cores=10, node_selector=selector)
        template["spec"]["containers"].append(
            {
                "name": "side",
                "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 15}},
            }
        )
        template["spec"].pop("schedulerName")  # the webhook sets it
        kube_cluster.api(
            "POST",
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "mix"},
                "spec": {
                    "replicas": 30,
                    "selector": {"matchLabels": {"app": "mix"}},
                    "template": {"metadata": {"labels": {"app": "mix"}}, "spec": template["spec"]},
                },
            },
        )
        done = wait_pods(
            kube_cluster,
            ns,
            lambda ps: (
                ps
                if len(ps) == 30
                and all(p.get("status", {}).get("phase") == "Running" and placed(p) and allocated(p) for p in ps)
                else None
            ),
            "30 Running pods",
            180,
        )
        for p in done:
            node = p["spec"]["nodeName"]
            ann = p["metadata"]["annotations"]
            assert node in nodes and ann["hami.io/vgpu-node"] == node
            assert p["metadata"]["labels"]["hami.io/vgpu-node"] == node
            assert p["spec"]["schedulerName"] == "hami-scheduler"
            assert ann["hami.io/bind-phase"] == "success" and ann["hami.io/bind-time"].isdigit()
            (a,), (b,) = _containers(p)
            assert (a.usedmem, a.usedcores, b.usedmem, b.usedcores) == (2000, 10, 3000, 15)
            assert {a.uuid, b.uuid} <= {gpu_uuid(node, i) for i in range(8)}
        _check_capacity(done)
    finally:
        kube_cluster.api("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/mix", expect=(200, 202, 404))
        _cleanup_nodes(kube_cluster, nodes)


def _place(kube_cluster, ns, pods_, timeout=60):
    for p in pods_:
        _create(kube_cluster, ns, p)
    names = {p["metadata"]["name"] for p in pods_}
    return {
        p["metadata"]["name"]: p
        for p in wait_pods(
            kube_cluster,
            ns,
            lambda ps: (
                ps
                if all(placed(p) for p in ps if p["metadata"]["name"] in names)
                and names <= {p["metadata"]["name"] for p in ps}
                else None
            ),
            f"pods {sorted(names)} placed",
            timeout,
        )
    }


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_node_and_gpu_policies(kube_cluster, hami, standin, ns, policy):
    selector, nodes = _group(kube_cluster, f"pol-{policy[:4]}", 2, gpus=2)
    try:
        ann = {"hami.io/node-scheduler-policy": policy, "hami.io/gpu-scheduler-policy": policy}
        first = _place(
            kube_cluster, ns, [gpu_pod("a", ns, mem=1000, cores=10, annotations=ann, node_selector=selector)]
        )
        got = _place(kube_cluster, ns, [gpu_pod("b", ns, mem=1000, cores=10, annotations=ann, node_selector=selector)])
        a, b = first["a"], got["b"]
        same_node = a["spec"]["nodeName"] == b["spec"]["nodeName"]
        same_gpu = _containers(a)[0][0].uuid == _containers(b)[0][0].uuid
        assert (same_node, same_gpu) == ((True, True) if policy == "binpack" else (False, False))
        # GPU level alone: same node forced by the selector, GPU policy decides the card
        host = {"kubernetes.io/hostname": nodes[0]}
        gpu_ann = {"hami.io/gpu-scheduler-policy": policy}
        c = _place(kube_cluster, ns, [gpu_pod("c", ns, mem=1000, cores=10, annotations=gpu_ann, node_selector=host)])[
            "c"
        ]
        d = _place(kube_cluster, ns, [gpu_pod("d", ns, mem=1000, cores=10, annotations=gpu_ann, node_selector=host)])[
            "d"
        ]
        same = _containers(c)[0][0].uuid == _containers(d)[0][0].uuid
        if policy == "spread":  # node 0 may hold a/b: spread still avoids the busier card
            assert not same
        else:
            assert same
    finally:
        _cleanup_nodes(kube_cluster, nodes)


def test_type_uuid_numa_and_exclusive_selection(kube_cluster, hami, standin, ns):
    selector, (t4,) = _group(kube_cluster, "t4", 1, gpus=4, numa_split=2)
    group = selector["hami-group"]
    a100 = f"{group}-a100"
    make_gpu_node(kube_cluster, a100, gpus=4, labels=selector, model="NVIDIA-A100-SXM4-40GB", mem=40960)
    try:
        want = gpu_uuid(t4, 3)
        got = _place(
            kube_cluster,
            ns,
            [
                gpu_pod(
                    "want-a100", ns, mem=1000, annotations={"nvidia.com/use-gputype": "A100"}, node_selector=selector
                ),
                gpu_pod(
                    "no-a100", ns, mem=1000, annotations={"nvidia.com/nouse-gputype": "a100"}, node_selector=selector
                ),
                gpu_pod("by-uuid", ns, mem=1000, annotations={"nvidia.com/use-gpuuuid": want}, node_selector=selector),
                gpu_pod(
                    "numa",
                    ns,
                    gpus=2,
                    mem=1000,
                    annotations={"nvidia.com/numa-bind": "true"},
                    node_selector={"kubernetes.io/hostname": t4},
                ),
                gpu_pod("whole", ns, node_selector={"kubernetes.io/hostname": a100}),
            ],
        )
        assert got["want-a100"]["spec"]["nodeName"] == a100
        assert got["no-a100"]["spec"]["nodeName"] == t4
        assert _containers(got["by-uuid"])[0][0].uuid == want
        numa = {int(d.uuid[-12:]) // 2 for d in _containers(got["numa"])[0]}
        assert len(_containers(got["numa"])[0]) == 2 and len(numa) == 1
        ((whole,),) = _containers(got["whole"])
        assert (whole.usedmem, whole.usedcores) == (40960, 100)  # plain nvidia.com/gpu: 1 is a whole card
        # a 3-GPU numa-bound pod cannot fit 2+2 NUMA groups; a type nobody has is unresolvable
        _create(
            kube_cluster,
            ns,
            gpu_pod(
                "numa3",
                ns,
                gpus=3,
                mem=100,
                annotations={"nvidia.com/numa-bind": "true"},
                node_selector={"kubernetes.io/hostname": t4},
            ),
        )
        _create(
            kube_cluster,
            ns,
            gpu_pod("h100", ns, mem=100, annotations={"nvidia.com/use-gputype": "H100"}, node_selector=selector),
        )
        msgs = kube_cluster.wait_for(
            lambda: (
                [
                    e["message"]
                    for e in events(kube_cluster, ns, "FilteringFailed")
                    if e["involvedObject"]["name"] in ("numa3", "h100")
                ]
                or None
            ),
            "FilteringFailed events",
            30,
        )
        assert any("NumaNotFit" in m for m in msgs) or any(
            "NumaNotFit" in e["message"] for e in events(kube_cluster, ns)
        )
        kube_cluster.wait_for(
            lambda: any(
                "CardTypeMismatch" in e["message"] and e["involvedObject"]["name"] == "h100"
                for e in events(kube_cluster, ns)
            ),
            "CardTypeMismatch event",
            30,
        )
    finally:
        _cleanup_nodes(kube_cluster, [t4, a100])


def test_init_containers_and_sidecars_accounting(kube_cluster, hami, standin, ns):
    selector, (node,) = _group(kube_cluster, "init", 1, gpus=1, mem=10000)
    try:
        pod = gpu_pod("mixed", ns, mem=3000, cores=10, node_selector=selector)
        lim = lambda m: {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": m, "nvidia.com/gpucores": 10}}  # noqa: E731
        pod["spec"]["initContainers"] = [
            {"name": "init", "image": "busybox", "resources": lim(5000)},
            {"name": "sidecar", "image": "busybox", "restartPolicy": "Always", "resources": lim(3000)},
        ]
        got = _place(kube_cluster, ns, [pod])["mixed"]
        init, side, app = _containers(got)  # annotation order: init containers first
        assert [c[0].usedmem for c in (init, side, app)] == [5000, 3000, 3000]
        # held: max(init peak 5000, sidecar + app 6000) = 6000 MiB -> 4000 left on the card
        _create(kube_cluster, ns, gpu_pod("too-big", ns, mem=4001, cores=10, node_selector=selector))
        fits = _place(kube_cluster, ns, [gpu_pod("fits", ns, mem=4000, cores=10, node_selector=selector)])["fits"]
        assert fits["spec"]["nodeName"] == node
        kube_cluster.wait_for(
            lambda: any(
                e["involvedObject"]["name"] == "too-big" and "CardInsufficientMemory" in e["message"]
                for e in events(kube_cluster, ns, "FilteringFailed")
            ),
            "too-big rejected",
            30,
        )
    finally:
        _cleanup_nodes(kube_cluster, [node])


def test_quota_at_admission_and_at_schedule_time(kube_cluster, hami, standin, ns, kube_namespace):
    selector, (node,) = _group(kube_cluster, "quota", 1, gpus=2)
    try:
        for space in (ns,):
            kube_cluster.api(
                "POST",
                f"/api/v1/namespaces/{space}/resourcequotas",
                {
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": "gpu"},
                    "spec": {"hard": {"limits.nvidia.com/gpumem": "5000"}},
                },
            )
        # the quota reaches the scheduler through its watch: wait until a pod over it is denied
        kube_cluster.wait_for(
            lambda: _dry_run_denied(
                kube_cluster, ns, gpu_pod("over", ns, mem=6000, node_selector=selector), "exceeding resource quota"
            ),
            "the quota known to the webhook",
            30,
        )
        _place(kube_cluster, ns, [gpu_pod("q1", ns, mem=3000, node_selector=selector)])
        with pytest.raises(ApiError) as denied:
            _create(kube_cluster, ns, gpu_pod("q2", ns, mem=3000, node_selector=selector))
        assert "exceeding resource quota" in str(denied.value)
        # without the webhook (label off), the extender's own check keeps the pod Pending
        kube_cluster.api(
            "PATCH",
            f"/api/v1/namespaces/{ns}",
            {"metadata": {"labels": {WEBHOOK_LABEL: None}}},
            content_type="application/merge-patch+json",
        )
        q3 = gpu_pod("q3", ns, mem=3000, cores=0, node_selector=selector)
        # the label change reaches the API server's admission cache a moment later
        kube_cluster.wait_for(
            lambda: not _dry_run_denied(kube_cluster, ns, q3, "exceeding resource quota"),
            "the webhook off for the namespace",
            30,
        )
        _create(kube_cluster, ns, q3)
        kube_cluster.wait_for(
            lambda: any(
                e["involvedObject"]["name"] == "q3" and "ResourceQuotaNotFit" in e["message"]
                for e in events(kube_cluster, ns, "FilteringFailed")
            ),
            "ResourceQuotaNotFit",
            30,
        )
    finally:
        _cleanup_nodes(kube_cluster, [node])


def test_impossible_pod_events_and_explain(kube_cluster, hami, standin, ns):
    selector, nodes = _group(kube_cluster, "imp", 2, gpus=2)
    try:
        _create(kube_cluster, ns, gpu_pod("huge", ns, mem=99999, cores=10, node_selector=selector))
        kube_cluster.wait_for(
            lambda: any("CardInsufficientMemory" in e["message"] for e in events(kube_cluster, ns, "FilteringFailed")),
            "FilteringFailed",
            30,
        )
        kube_cluster.wait_for(
            lambda: any(e["involvedObject"]["name"] == "huge" for e in events(kube_cluster, ns, "FailedScheduling")),
            "FailedScheduling",
            30,
        )
        assert pods(kube_cluster, ns)[0]["status"]["phase"] == "Pending"
        out = subprocess.run(
            [sys.executable, "-m", "hami", "explain", f"{ns}/huge", f"--kubeconfig={kube_cluster.kubeconfig}"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        )
        assert out.returncode == 0, out.stderr
        for node in nodes:
            assert node in out.stdout
        assert "2/2 CardInsufficientMemory" in out.stdout
        assert gpu_uuid(nodes[0], 1) in out.stdout and "99999" in out.stdout
    finally:
        _cleanup_nodes(kube_cluster, nodes)


def test_webhook_denials_and_mutations(kube_cluster, hami, ns):
    def deny(pod: dict, text: str) -> None:
        with pytest.raises(ApiError) as err:
            _create(kube_cluster, ns, pod)
        assert text in str(err.value), str(err.value)

    priv = gpu_pod("priv", ns, mem=100)
    priv["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    deny(priv, "privileged")
    pinned = gpu_pod("pinned", ns, mem=100)
    pinned["spec"]["nodeName"] = "somewhere"
    deny(pinned, "pod has node assigned")
    # a copy of a placed pod: the decision it carries is removed, the pod is placed afresh
    copied = _create(
        kube_cluster,
        ns,
        gpu_pod("copied", ns, mem=100, annotations={"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1,1:;"}),
    )
    assert "hami.io/vgpu-devices-allocated" not in (copied["metadata"].get("annotations") or {}), copied["metadata"]
    assert copied["spec"]["schedulerName"] == "hami-scheduler"
    pct = gpu_pod("pct", ns)
    pct["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = 150
    deny(pct, "0..100")
    off = gpu_pod("off", ns, mem=100)
    off["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    deny(off, "CUDA_DISABLE_CONTROL")
    # mutations: schedulerName, whole-card default, priority env
    plain = gpu_pod("plain", ns)
    plain["spec"]["schedulerName"] = "default-scheduler"
    plain["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = 0
    created = _create(kube_cluster, ns, plain)
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    c = created["spec"]["containers"][0]
    assert str(c["resources"]["limits"]["nvidia.com/gpucores"]) == "100"
    assert {"name": "CUDA_TASK_PRIORITY", "value": "0"} in c["env"]
    other = gpu_pod("volcano", ns, mem=100)
    other["spec"]["schedulerName"] = "volcano"
    assert _create(kube_cluster, ns, other)["spec"]["schedulerName"] == "volcano"
    # quantities in the forms the API server accepts are read as it reads them
    quantity = gpu_pod("quantity", ns)
    quantity["spec"]["schedulerName"] = "default-scheduler"
    quantity["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "1e0", "nvidia.com/gpumem": "1e3"}
    )
    created = _create(kube_cluster, ns, quantity)
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    assert "nvidia.com/gpucores" not in created["spec"]["containers"][0]["resources"]["limits"]  # memory given: shared
    # a pod asking for no device is left exactly as it was sent (no patch)
    cpu = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cpu-only", "namespace": ns},
        "spec": {
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"cpu": "1"}}}],
        },
    }
    created = _create(kube_cluster, ns, cpu)
    assert created["spec"]["schedulerName"] == "default-scheduler" and "env" not in created["spec"]["containers"][0]
    # the admin opt-in label allows the switch
    kube_cluster.api(
        "PATCH",
        f"/api/v1/namespaces/{ns}",
        {"metadata": {"labels": {"hami.io/allow-disable-control": "true"}}},
        content_type="application/merge-patch+json",
    )
    assert _create(kube_cluster, ns, off)["metadata"]["name"] == "off"


def test_kill_scheduler_mid_burst_then_restart(kube_cluster, hami, standin, ns):
    selector, nodes = _group(kube_cluster, "burst", 4)
    try:
        burst = [
            gpu_pod(f"p{i:03d}", ns, mem=1500 + 100 * (i % 7), cores=5 + i % 4, node_selector=selector)
            for i in range(100)
        ]
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(_create, kube_cluster, ns, p) for p in burst]
            kube_cluster.wait_for(lambda: sum(placed(p) for p in pods(kube_cluster, ns)) >= 20, "20 placed", 120, 0.2)
            hami.kill()
            at_kill = sum(placed(p) for p in pods(kube_cluster, ns))
            refused = [p for p, f in zip(burst, futures) if f.exception() is not None]
        try:
            for p, f in zip(burst, futures):  # creations racing the kill meet a webhook that is gone
                if f.exception() is not None and "failed calling webhook" not in str(f.exception()):
                    raise f.exception()
            assert at_kill < 100, "the scheduler was not killed mid-burst"
        finally:
            hami.start()
        for p in refused:  # as a client retries a refused create
            _create(kube_cluster, ns, p)
        done = wait_all_allocated(kube_cluster, ns, 100, 240, "100 pods placed after the restart")
        for p in done:
            assert p["metadata"]["annotations"]["hami.io/vgpu-node"] == p["spec"]["nodeName"]
        _check_capacity(done)
        kube_cluster.wait_for(
            lambda: (
                not [
                    n
                    for n in nodes
                    if "hami.io/mutex.lock"
                    in (kube_cluster.api("GET", f"/api/v1/nodes/{n}")["metadata"].get("annotations") or {})
                ]
            ),
            "no node lock left",
            30,
        )
    finally:
        _cleanup_nodes(kube_cluster, nodes)


def test_lock_of_a_vanished_pod_is_reclaimed_at_once(kube_cluster, hami, standin, ns):
    """A node lock naming a pod that no longer exists is taken over by the next Bind at once, for
    that pod, because its owner is gone (not after the 5-minute expiry). Found by review, 1 Dec:
    the check was a wall-clock bound; now it reads which pod took the lock over and why."""
    from hami.kube import nodelock

    from ._hami import NodeLockWatch

    selector, (node,) = _group(kube_cluster, "lock", 1, gpus=1)
    try:
        stale = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())},{ns},vanished"
        kube_cluster.api(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"annotations": {"hami.io/mutex.lock": stale}}},
            content_type="application/merge-patch+json",
        )
        with NodeLockWatch(kube_cluster, f"hami-group={selector['hami-group']}") as watch:
            _place(kube_cluster, ns, [gpu_pod("next", ns, mem=100, node_selector=selector)], timeout=30)
            watch.check_live(node)
        values = [v for n, _, v in watch.seen if n == node]
        held = [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
        assert held[0] == stale, held
        # the stale value was swapped straight over to the next pod's
        assert len(held) > 1 and nodelock.owned_by(held[1], ns, "next"), held
        # reclaimed (by the Bind, or by the stale-lock sweep before it) because its owner is gone
        assert f"{stale!r}: owner pod no longer exists" in hami.logs(), hami.logs()[-3000:]
    finally:
        _cleanup_nodes(kube_cluster, [node])


class _Seen:
    """A reflector's handler keeping the objects by name."""

    def __init__(self):
        self.items: dict[str, dict] = {}

    def replace(self, items, resource_version=None):
        self.items = {i["metadata"]["name"]: i for i in items}

    def apply(self, kind, obj):
        if kind == "DELETED":
            self.items.pop(obj["metadata"]["name"], None)
        else:
            self.items[obj["metadata"]["name"]] = obj


def test_watch_resumes_after_the_server_closes_it(kube_cluster, kube_namespace):
    """The API server ends every watch after timeoutSeconds: the reflector resumes from the last
    resourceVersion (no relist) and misses nothing. (Expiry -> relist is covered by
    tests/unit/test_reflector.py: a real API server keeps old versions in its watch cache too
    long to force a 410 here.)"""
    import asyncio

    from hami.kube.client import KubeClient
    from hami.kube.reflector import Reflector

    path = f"/api/v1/namespaces/{kube_namespace}/configmaps"
    kube_cluster.api("POST", path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before"}})

    async def scenario():
        kube = await KubeClient.connect(str(kube_cluster.kubeconfig))
        seen = _Seen()
        r = Reflector(kube, path, seen, watch_timeout=1)
        task = asyncio.create_task(r.run())
        try:
            await asyncio.wait_for(r.synced.wait(), 20)
            assert "before" in seen.items
            await asyncio.sleep(2.5)  # at least two server-side watch timeouts
            for name in ("after", "later"):
                await asyncio.to_thread(
                    kube_cluster.api,
                    "POST",
                    path,
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}},
                )
                await asyncio.sleep(1.2)
            for _ in range(100):
                if {"after", "later"} <= set(seen.items):
                    break
                await asyncio.sleep(0.1)
            assert {"before", "after", "later"} <= set(seen.items)
            assert r.relists == 1
        finally:
            task.cancel()
            await kube.close()

    asyncio.run(scenario())


def test_a_claim_nested_deeper_than_orjson_reads_is_listed_and_watched(kube_cluster, kube_namespace):
    """The real API server stores a ResourceClaim whose opaque parameters (another driver's) nest
    1100 levels, deeper than orjson reads (1024): the list and the watch that carried it failed
    for good, so the scheduler's claim cache froze and, restarted, never synced (found by review).
    Listed and watched now, its deepest parts read as null."""
    import asyncio

    from hami.kube.client import KubeClient
    from hami.kube.reflector import Reflector

    path = f"/apis/resource.k8s.io/v1/namespaces/{kube_namespace}/resourceclaims"

    def create(name: str, depth: int) -> None:
        post_json_text(kube_cluster, path, claim_json(name, '{"p": ' + "[" * depth + '{"v": 1}' + "]" * depth + "}"))

    create("deep-before", 1100)

    async def scenario():
        kube = await KubeClient.connect(str(kube_cluster.kubeconfig))
        seen = _Seen()
        r = Reflector(kube, path, seen, watch_timeout=5)
        task = asyncio.create_task(r.run())
        try:
            await asyncio.wait_for(r.synced.wait(), 20)
            assert "deep-before" in seen.items
            for name, depth in (("deep-after", 1100), ("plain", 0)):
                await asyncio.to_thread(create, name, depth)
            for _ in range(100):
                if {"deep-after", "plain"} <= set(seen.items):
                    break
                await asyncio.sleep(0.1)
            assert {"deep-before", "deep-after", "plain"} <= set(seen.items) and r.relists == 1
        finally:
            task.cancel()
            await kube.close()

    asyncio.run(scenario())


_FOLLOWER = "ok: follower (%s does not hold the lease)"


def test_two_replicas_only_the_lease_holder_filters(kube_cluster, kube_namespace):
    """Leader election as HAMi does it: each replica follows the Lease that the kube-scheduler in
    its own pod holds. Here the test writes that Lease (holderIdentity `<pod>_<uuid>`), renewed
    every 2 s as kube-scheduler does: a lease not renewed for the renew deadline (10 s) stops
    counting for the replica that follows it."""
    ns, lease = kube_namespace, "hami-scheduler-test"
    flags = ("--leader-elect", f"--leader-elect-resource-name={lease}", f"--leader-elect-resource-namespace={ns}")
    with LeaseHolder(kube_cluster, ns, lease, "replica-a") as holder:
        a = SchedulerProcess(kube_cluster, *flags, "--leader-elect-identity=replica-a", tls=False).start()
        b = SchedulerProcess(kube_cluster, *flags, "--leader-elect-identity=replica-b", tls=False).start(
            wait_ready=False
        )
        try:
            # both are ready (a rolling update needs the new pod Ready while the old one leads); the
            # body says which one leads (the chart's Service selects the leader by its pod label)
            kube_cluster.wait_for(lambda: b.get("/readyz") == 200, "replica b ready", 30)
            time.sleep(2.0)
            assert (a.answer("/readyz"), b.answer("/readyz")) == ((200, "ok: leader"), (200, _FOLLOWER % "replica-b"))
            holder.give("replica-b")
            kube_cluster.wait_for(
                lambda: (
                    (a.answer("/readyz"), b.answer("/readyz")) == ((200, _FOLLOWER % "replica-a"), (200, "ok: leader"))
                ),
                "failover to b",
                30,
            )
            import json as _json
            import urllib.request

            # a real pending pod of ours that no node can take: kube-scheduler never calls an
            # extender for it, the test calls /filter itself
            p = gpu_pod("direct", ns, mem=100, node_selector={"no": "such-node"})
            created = _create(kube_cluster, ns, p)
            req = lambda url: urllib.request.urlopen(
                urllib.request.Request(  # noqa: E731
                    url + "/filter",
                    data=_json.dumps({"Pod": created, "NodeNames": []}).encode(),
                    headers={"Content-Type": "application/json"},
                ),
                timeout=30,
            ).read()
            assert "not the leader" in _json.loads(req(a.url))["Error"]
            assert _json.loads(req(b.url))["Error"] == ""
        finally:
            a.stop()
            b.stop()


def test_replicas_without_a_kube_scheduler_beside_them_campaign_for_a_lease_of_their_own(kube_cluster, kube_namespace):
    """``--leader-elect-mode=campaign`` (the chart's kube-scheduler in a pod of its own): the
    replicas elect one leader among themselves on the real API server; a leader that stops gives
    the Lease up and the other leads within seconds; one killed outright (no release) is replaced
    once its record has stood still for the lease duration."""
    ns, lease = kube_namespace, "hami-extender-test"
    path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{lease}"
    flags = (
        "--leader-elect",
        "--leader-elect-mode=campaign",
        f"--leader-elect-resource-name={lease}",
        f"--leader-elect-resource-namespace={ns}",
    )
    procs = [
        SchedulerProcess(
            kube_cluster, *flags, "--shutdown-delay=60s", f"--leader-elect-identity=replica-{x}", tls=False
        ).start(wait_ready=False)
        for x in "abc"
    ]

    def roles() -> list[str]:
        return [p.answer("/readyz")[1] for p in procs]

    try:
        for p in procs:
            p.wait_ready()
        kube_cluster.wait_for(lambda: roles().count("ok: leader") == 1, "one leader of three", 30)
        time.sleep(3.0)  # renewals keep it: still exactly one, the same one
        first = roles().index("ok: leader")
        assert roles().count("ok: leader") == 1 and roles()[first] == "ok: leader"
        holder = kube_cluster.api("GET", path)["spec"]["holderIdentity"]
        assert holder.startswith(f"replica-{'abc'[first]}_")
        # SIGTERM hands the Lease over at once: another replica leads while the stopping one is
        # still in its shutdown delay (serving the webhook), not a lease duration after it exits
        procs[first].proc.terminate()
        rest = [p for i, p in enumerate(procs) if i != first]
        kube_cluster.wait_for(
            lambda: [p.answer("/readyz")[1] for p in rest].count("ok: leader") == 1, "a new leader", 30
        )
        assert procs[first].proc.poll() is None, "the Lease was given up only at exit"
        assert procs[first].answer("/readyz")[0] == 200  # still serving (the webhook) through its delay
        assert "gave the leader Lease" in procs[first].logs()
        procs[first].kill()
        second = next(p for p in rest if p.answer("/readyz")[1] == "ok: leader")
        other = next(p for p in rest if p is not second)
        # killed outright: no release; the last replica takes over once the record stood still
        renewed = kube_cluster.api("GET", path)["spec"]["renewTime"]
        second.kill()
        kube_cluster.wait_for(lambda: other.answer("/readyz")[1] == "ok: leader", "the last replica leads", 45)
        after = kube_cluster.api("GET", path)["spec"]
        assert after["holderIdentity"].startswith(other.extra[-1].split("=")[1] + "_")
        assert after["renewTime"] != renewed and after["leaseTransitions"] >= 2
    finally:
        for p in procs:
            p.kill()  # (a stop would sit out the 60 s delay)
            p.stop()


def test_a_decision_for_a_pod_deleted_before_its_bind_gives_the_capacity_back(kube_cluster, hami, standin, ns):
    """A pod deleted between its Filter and its Bind (with --decision-write=filter, its decision
    patch may fail too): the reservation goes (a real pod then gets the capacity) and its Bind
    fails. A pod that never existed gets no reservation at all (the next test)."""
    import json as _json
    import ssl
    import urllib.request

    selector, (node,) = _group(kube_cluster, "rollback", 1, gpus=1)
    try:
        ctx = ssl.create_default_context(cadata=kube_cluster.ca_pem.decode())

        def call(verb: str, body: dict) -> dict:
            req = urllib.request.Request(
                f"{hami.url}/{verb}", data=_json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            return _json.loads(urllib.request.urlopen(req, context=ctx, timeout=30).read())

        # pending, and never offered to us by kube-scheduler (no node matches its selector)
        phantom = _create(kube_cluster, ns, gpu_pod("phantom", ns, mem=16000, cores=10, node_selector={"no": "such"}))
        assert call("filter", {"Pod": phantom, "NodeNames": [node]})["NodeNames"] == [node]
        kube_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/phantom?gracePeriodSeconds=0")
        kube_cluster.wait_for(
            lambda: not [p for p in pods(kube_cluster, ns) if p["metadata"]["name"] == "phantom"], "the pod deleted"
        )
        answer = call(
            "bind", {"PodName": "phantom", "PodNamespace": ns, "PodUID": phantom["metadata"]["uid"], "Node": node}
        )
        assert "not found" in answer["Error"] or "cannot record" in answer["Error"] or "404" in answer["Error"]
        real = _place(kube_cluster, ns, [gpu_pod("real", ns, mem=16000, cores=10, node_selector=selector)], timeout=30)
        assert real["real"]["spec"]["nodeName"] == node
    finally:
        _cleanup_nodes(kube_cluster, [node])


def _extender_call(hami, path: str, body: dict) -> dict:
    """One call to the scheduler's /filter or /bind, as kube-scheduler makes it (its TLS port here)."""
    import json
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cadata=hami.cluster.ca_pem.decode())
    req = urllib.request.Request(
        hami.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        return json.loads(resp.read())


def test_filters_for_pods_that_are_not_real_and_pending_reserve_nothing(kube_cluster, hami, standin, ns):
    """Random UIDs, a wrong UID for an existing name, another scheduler's pod, a bound pod: each
    Filter asks for every GPU of the node and is refused with a clear Error, and a real pod that
    needs the whole node is placed afterwards: nothing was held."""
    selector, (node,) = _group(kube_cluster, "real", 1, gpus=2)
    try:
        whole = gpu_pod("x", ns, gpus=2, mem=16384, node_selector=selector)
        someone_elses = gpu_pod("other", ns, mem=1000, node_selector={"no": "such-node"})
        someone_elses["spec"]["schedulerName"] = "someone-else"
        other = _create(kube_cluster, ns, someone_elses)
        plain = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bound", "namespace": ns},
            "spec": {
                "schedulerName": "hami-scheduler",
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        }
        bound = _create(kube_cluster, ns, plain)
        # a pending pod of ours that no node can take (its Filters must not stack reservations)
        waiting = _create(kube_cluster, ns, gpu_pod("waiting", ns, gpus=2, mem=16384, node_selector={"no": "such"}))

        def forged(name: str, uid: str) -> dict:
            p = {**whole, "metadata": {**whole["metadata"], "name": name, "uid": uid}}
            return {"Pod": p, "NodeNames": [node], "Nodes": None}

        cases = [(forged(f"ghost-{i}", str(uuid.uuid4())), "does not exist") for i in range(3)]
        cases += [
            (forged("waiting", str(uuid.uuid4())), f"has UID {waiting['metadata']['uid']}"),
            (forged("other", other["metadata"]["uid"]), "is for scheduler 'someone-else'"),
            (forged("bound", bound["metadata"]["uid"]), f"already bound to node {node}"),
        ]
        for body, text in cases:
            answer = _extender_call(hami, "/filter", body)
            assert text in answer["Error"] and "nothing is reserved" in answer["Error"], answer
            assert not answer.get("NodeNames")
        for _ in range(3):  # a real pending pod's Filter, offered the node: one reservation, replaced
            answer = _extender_call(hami, "/filter", forged("waiting", waiting["metadata"]["uid"]))
            assert answer["Error"] == "" and answer["NodeNames"] == [node], answer
        kube_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/waiting?gracePeriodSeconds=0")
        # the whole node is free again: a real pod that needs all of it is placed
        done = _place(kube_cluster, ns, [{**whole, "metadata": {**whole["metadata"], "name": "whole"}}])
        assert done["whole"]["spec"]["nodeName"] == node
        assert sorted(c.usedmem for c in _containers(done["whole"])[0]) == [16384, 16384]
    finally:
        _cleanup_nodes(kube_cluster, [node])


def test_after_sigterm_the_scheduler_serves_out_its_shutdown_delay(kube_cluster):
    """--shutdown-delay: a terminating pod leaves the Services' endpoints a moment after SIGTERM,
    so the listeners stay open for the delay (calls routed here meanwhile are answered, each with
    Connection: close so that callers' kept-alive connections move to the other replica); then it
    exits cleanly. SIGINT, or a second signal, ends the wait at once."""
    import signal as _signal

    import http.client

    def connection_header() -> str | None:
        conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            return response.getheader("Connection")
        finally:
            conn.close()

    proc = SchedulerProcess(kube_cluster, "--shutdown-delay=6s", tls=False).start()
    try:
        assert connection_header() != "close"  # keep-alive while it serves normally
        proc.proc.send_signal(_signal.SIGTERM)
        time.sleep(0.5)
        assert proc.proc.poll() is None and proc.get("/healthz") == 200  # still serving
        # ... and every answer closes its connection: callers' pooled connections drain from it
        assert connection_header() == "close"
        kube_cluster.wait_for(lambda: "stopping in 6s" in proc.logs(), "the delay logged", 10)
        proc.proc.send_signal(_signal.SIGTERM)  # a second one: no more waiting
        assert proc.proc.wait(30) == 0
    finally:
        proc.stop()
    # without a delay (SchedulerProcess's default here, as a process no Service routes to)
    quick = SchedulerProcess(kube_cluster, tls=False).start()
    try:
        quick.proc.send_signal(_signal.SIGTERM)
        assert quick.proc.wait(30) == 0
        assert "--shutdown-delay" not in quick.logs()
    finally:
        quick.stop()
