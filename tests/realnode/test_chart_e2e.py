"""End to end on the real node: the chart installed from the product image (tests/realnode/product.py,
once for this module), and GPU pods written as HAMi's user guide writes them, running real
containers on the fake driver under libvgpu."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_devkit.cluster import KubeCluster
from hami_devkit.errors import ApiError

from ..native.cshare import KERNEL_US, Trace
from .product import GPU_MEMORY_MIB, NAMESPACE, RELEASE, SPLIT_COUNT, Product, create_config_map, installed

PROBE = Path(__file__).with_name("gpu_probe.py")
REGISTER = "hami.io/node-nvidia-register"
CUDA_ERROR_OUT_OF_MEMORY = 2


@pytest.fixture(scope="module")
def product(real_node_holder, real_cluster: KubeCluster, tmp_path_factory, request):
    yield from installed(real_node_holder, real_cluster, tmp_path_factory.mktemp("product"), request)


@pytest.fixture
def gpu_namespace(real_cluster: KubeCluster, product: Product, real_namespace: str) -> str:
    """A namespace with the probe script as ConfigMap ``gpu-probe``."""
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{real_namespace}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gpu-probe"},
            "data": {"gpu_probe.py": PROBE.read_text()},
        },
    )
    return real_namespace


def probe_container(product: Product, name: str, limits: dict, args: list[str]) -> dict:
    return {
        "name": name,
        "image": product.images["hami"],
        "command": ["python", "/probe/gpu_probe.py", *args],
        "resources": {"limits": limits},
        "volumeMounts": [{"name": "probe", "mountPath": "/probe"}],
    }


def probe_pod(name: str, containers: list[dict], init: list[dict] | None = None) -> dict:
    spec = {
        "containers": containers,
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "probe", "configMap": {"name": "gpu-probe"}}],
    }
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_pod(
    cluster: KubeCluster, namespace: str, name: str, done, what: str, product: Product, timeout: float = 180
) -> dict:
    def probe():
        pod = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod if done(pod) else None

    try:
        return cluster.wait_for(probe, f"pod {namespace}/{name} {what}", timeout=timeout, interval=0.3)
    except TimeoutError as exc:
        pod = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        raise AssertionError(f"{exc}: {json.dumps(pod.get('status'), indent=1)}\n{product.describe()}") from None


def running(pod: dict) -> bool:
    return pod["status"].get("phase") == "Running" and all(
        c.get("ready") for c in pod["status"].get("containerStatuses") or [{}]
    )


def probe_output(cluster: KubeCluster, namespace: str, pod: str, container: str) -> dict:
    """The probe's JSON line of ``container``. Waited for in two steps: the container started
    (placing and starting a pod is the loaded kubelet's time: seconds late in CI, more after a
    containerd restart), then its line (the probe's own time)."""

    def started():
        got = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
        status = got.get("status") or {}
        for s in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            if s.get("name") == container and (
                {"running", "terminated"} & set(s.get("state") or {}) or s.get("lastState")
            ):
                return True
        return False

    cluster.wait_for(started, f"container {pod}/{container} started", timeout=180, interval=0.3)

    def line():
        out = cluster.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout
        return next((json.loads(x) for x in out.splitlines() if x.startswith("{")), None)

    return cluster.wait_for(line, f"probe output of {pod}/{container}", timeout=60, interval=0.3)


def samples(text: str, name: str) -> list[tuple[dict, float]]:
    return [
        (s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    ]


# ---------------------------------------------------------------------------------------------


def test_every_pod_of_the_chart_is_running_and_ready(product: Product, real_cluster: KubeCluster):
    pods = product.pods()
    containers = sorted(c["name"] for p in pods for c in p["spec"]["containers"])
    assert containers == ["device-plugin", "kube-scheduler", "vgpu-monitor", "vgpu-scheduler-extender"]
    # the monitor in a pod of its own, under its own read-only ServiceAccount (not the plugin's)
    (monitor,) = product.pods(selector="app.kubernetes.io/component=hami-vgpu-monitor")
    (plugin,) = product.pods(selector="app.kubernetes.io/component=hami-device-plugin")
    assert [c["name"] for c in monitor["spec"]["containers"]] == ["vgpu-monitor"]
    assert [c["name"] for c in plugin["spec"]["containers"]] == ["device-plugin"]
    assert monitor["spec"]["serviceAccountName"] == f"{RELEASE}-vgpu-monitor"
    assert plugin["spec"]["serviceAccountName"] == f"{RELEASE}-device-plugin"
    assert all(p["spec"]["nodeName"] == product.node.name for p in pods)
    # from the product image and the chart's default kube-scheduler image, none pulled
    images = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert images == {product.images["hami"], product.images["kube-scheduler"]}
    # the device plugin registered the node's GPUs through the node guard (a pod-bound token)
    node = real_cluster.api("GET", f"/api/v1/nodes/{product.node.name}")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(2 * SPLIT_COUNT)
    registered = node["metadata"]["annotations"][REGISTER]
    assert "GPU-a1000000-0000-4000-8000-000000000000" in registered and "A100" in registered
    policies = {
        p["metadata"]["name"]
        for p in real_cluster.api("GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies")["items"]
    }
    assert {"hami-device-plugin-node-guard", "hami-scheduler-pod-guard", "hami-allocation-guard"} <= policies


def test_a_user_guide_pod_gets_its_memory_limit_and_is_counted_until_deleted(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    ns, name = gpu_namespace, "gpu-pod"
    # as HAMi's user guide writes it (docs: "Allocate device memory"), with the probe as its program
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        probe_pod(name, [probe_container(product, "ubuntu-container", limits, ["1000", "2500", "1500", "--hold"])]),
    )
    pod = wait_pod(real_cluster, ns, name, running, "Running", product)
    assert pod["spec"]["schedulerName"] == "hami-scheduler"  # the webhook, reached through its Service
    assert pod["spec"]["nodeName"] == product.node.name
    out = probe_output(real_cluster, ns, name, "ubuntu-container")
    assert (out["cuInit"], out["cuMemGetInfo"], out["nvmlDeviceGetMemoryInfo"]) == (0, 0, 0), out
    assert out["cuda_total_mib"] == 3000 and out["nvml_total_mib"] == 3000, out
    # 1000 fits, 2500 more does not (CUDA_ERROR_OUT_OF_MEMORY) and the process goes on: 1500 fits
    assert out["allocs"] == [0, CUDA_ERROR_OUT_OF_MEMORY, 0], out
    assert out["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and out["env"]["CUDA_DEVICE_SM_LIMIT"] == "30"
    uuid = out["env"]["NVIDIA_VISIBLE_DEVICES"]

    def monitor_sees():
        text = product.monitor_metrics()
        used = [(lb, v) for lb, v in samples(text, "hami_vgpu_memory_used_bytes") if lb.get("pod") == name]
        limit = [(lb, v) for lb, v in samples(text, "hami_vgpu_memory_limit_bytes") if lb.get("pod") == name]
        return (used, limit) if used and used[0][1] >= 2500 << 20 else None

    used, limit = real_cluster.wait_for(monitor_sees, "the monitor reporting the container", timeout=90, interval=1)
    assert len(used) == 1, used
    ((labels, value),) = used
    assert labels == {
        "namespace": ns,
        "pod": name,
        "container": "ubuntu-container",
        "vdevice_index": "0",
        "device_uuid": uuid,
        "zone": "vGPU",
    }
    assert value >= 2500 << 20  # 1000 + 1500 MiB and the context
    assert limit == [(labels, float(3000 << 20))]
    allocated = [
        (lb, v)
        for lb, v in samples(product.scheduler_metrics(), "hami_vgpu_memory_allocated_bytes")
        if lb.get("pod") == name
    ]
    assert allocated == [
        (
            {
                "namespace": ns,
                "node": product.node.name,
                "pod": name,
                "container_index": "0",
                "device_uuid": uuid,
                "zone": "vGPU",
            },
            float(3000 << 20),
        )
    ]

    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")

    def forgotten():
        monitor = [
            lb for lb, _ in samples(product.monitor_metrics(), "hami_vgpu_memory_used_bytes") if lb.get("pod") == name
        ]
        scheduler = [
            lb
            for lb, _ in samples(product.scheduler_metrics(), "hami_vgpu_memory_allocated_bytes")
            if lb.get("pod") == name
        ]
        return not monitor and not scheduler

    real_cluster.wait_for(
        forgotten, "the pod gone from the monitor's and the scheduler's metrics", timeout=120, interval=1
    )


def test_each_container_and_init_container_sees_only_its_own_grant(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    ns = gpu_namespace
    first = probe_container(product, "first", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ["--hold"])
    second = probe_container(product, "second", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}, ["--hold"])
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", probe_pod("two", [first, second]))
    init = probe_container(product, "setup", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500}, ["1400", "200"])
    main = probe_container(product, "main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2500}, ["--hold"])
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", probe_pod("with-init", [main], init=[init]))
    for name in ("two", "with-init"):
        wait_pod(real_cluster, ns, name, running, "Running", product)
    seen = {
        c: probe_output(real_cluster, ns, pod, c)
        for pod, c in (("two", "first"), ("two", "second"), ("with-init", "setup"), ("with-init", "main"))
    }
    assert {
        c: (o["cuda_total_mib"], o["nvml_total_mib"], o["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"]) for c, o in seen.items()
    } == {
        "first": (1000, 1000, "1000m"),
        "second": (2000, 2000, "2000m"),
        "setup": (1500, 1500, "1500m"),
        "main": (2500, 2500, "2500m"),
    }
    assert seen["setup"]["allocs"] == [0, CUDA_ERROR_OUT_OF_MEMORY]  # its own 1500, not main's 2500
    for name in ("two", "with-init"):
        real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")


def test_a_pods_envfrom_does_not_lift_its_limits(product: Product, real_cluster: KubeCluster, gpu_namespace: str):
    """The kubelet puts a pod's ``envFrom`` after Allocate's env and no admission rule can read
    it, so before 30 Nov a ConfigMap lifted the memory limit and the compute share (lock mode).
    libvgpu now reads its settings from the grant file Allocate mounts read-only."""
    ns, name = gpu_namespace, "envfrom"
    tenant_env = {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "80g",
        "CUDA_DEVICE_MEMORY_LIMIT": "80g",
        "CUDA_DEVICE_SM_LIMIT": "100",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/mine.cache",
    }
    create_config_map(real_cluster, ns, "lift", tenant_env)
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
    container = probe_container(product, "main", limits, ["1000", "2500", "--hold"])
    container["envFrom"] = [{"configMapRef": {"name": "lift"}}]
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", probe_pod(name, [container]))
    wait_pod(real_cluster, ns, name, running, "Running", product)
    out = probe_output(real_cluster, ns, name, "main")
    assert out["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "80g", out  # the pod's value is in the env ...
    assert out["cuda_total_mib"] == 3000 and out["nvml_total_mib"] == 3000, out  # ... and changes nothing
    assert out["allocs"] == [0, CUDA_ERROR_OUT_OF_MEMORY], out

    def counted():  # the grant's region (the monitor reads it), not the pod's /tmp/mine.cache
        text = product.monitor_metrics()
        return [v for lb, v in samples(text, "hami_vgpu_memory_limit_bytes") if lb.get("pod") == name] or None

    assert real_cluster.wait_for(counted, "the monitor reporting the container", timeout=90, interval=1) == [
        float(3000 << 20)
    ]
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")

    # every GPU of the node through the pod's own NVIDIA_VISIBLE_DEVICES: libvgpu sees a GPU the
    # grant (HAMI_GRANT_DEVICES in the grant file) does not name and gives the process none
    create_config_map(real_cluster, ns, "all-gpus", {"NVIDIA_VISIBLE_DEVICES": "all"})
    greedy = probe_container(product, "main", limits, ["1000"])
    greedy["envFrom"] = [{"configMapRef": {"name": "all-gpus"}}]
    pod = probe_pod("all-gpus", [greedy])
    pod["spec"]["restartPolicy"] = "Never"
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    out = probe_output(real_cluster, ns, "all-gpus", "main")
    assert out["env"]["NVIDIA_VISIBLE_DEVICES"] == "all", out
    assert (out["cuInit"], out["ctx"], out["nvmlInit"]) == (100, 100, 4), out  # NO_DEVICE, NO_PERMISSION
    assert out["allocs"][0] != 0, out
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/all-gpus")


GPU0, GPU1 = "GPU-a1000000-0000-4000-8000-000000000000", "GPU-a1000000-0000-4000-8000-000000000001"

LOAD = Path(__file__).resolve().parents[2] / "native" / "build" / "tests" / "cshare_load"


def test_two_pods_on_one_gpu_get_their_30_and_70_percent_compute_shares(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    """HAMi's `gpucores` on the real node: two pods pinned to one GPU with the force policy, each
    running the saturating kernel load of the compute-share tests (tests/native/cshare.py) in its
    own container, so both are PID 1 of their own PID namespace and libvgpu finds each one's
    NVML PID by its probe. Shares come from the fake GPU's accounting (admitted launches times
    the kernel's device time, over the window both ran) and must be within 5 points of target.
    A loaded kubelet can start the second pod many seconds after the first (14 s in one CI run),
    so each container waits at a gate, a host directory mounted in both, until the test has seen
    both running; then `exec` makes the load PID 1 as before."""
    if not LOAD.is_file():
        pytest.fail(f"{LOAD} missing (run `make native`)", pytrace=False)
    ns, seconds = gpu_namespace, 10
    gate = product.workdir / f"gate-{ns}"
    gate.mkdir(mode=0o755)
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cshare-load"},
            "binaryData": {"cshare_load": base64.b64encode(LOAD.read_bytes()).decode()},
        },
    )
    for cores in (30, 70):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"share-{cores}", "annotations": {"nvidia.com/use-gpuuuid": GPU0}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "load",
                        "image": product.images["hami"],
                        "command": [
                            "sh",
                            "-c",
                            'until [ -e /gate/open ]; do sleep 0.05; done; exec /load/cshare_load "$@"',
                            "gated",
                            "plain",
                            str(KERNEL_US),
                            str(seconds),
                            "32",
                            "0",
                            "0",
                        ],
                        "env": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}],
                        "resources": {
                            "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": cores}
                        },
                        "volumeMounts": [
                            {"name": "load", "mountPath": "/load"},
                            {"name": "gate", "mountPath": "/gate", "readOnly": True},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "load", "configMap": {"name": "cshare-load", "defaultMode": 0o755}},
                    {"name": "gate", "hostPath": {"path": str(gate), "type": "Directory"}},
                ],
            },
        }
        real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    for cores in (30, 70):
        wait_pod(
            real_cluster,
            ns,
            f"share-{cores}",
            lambda p: p["status"].get("phase") != "Pending",
            "started",
            product,
            timeout=180,
        )
    (gate / "open").touch()
    traces = {}
    for cores in (30, 70):
        name = f"share-{cores}"
        pod = wait_pod(
            real_cluster,
            ns,
            name,
            lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
            "finished",
            product,
            timeout=180,
        )
        logs = real_cluster.kubectl("logs", "-n", ns, name, "-c", "load", check=False)
        assert pod["status"]["phase"] == "Succeeded", f"{name}: {pod['status']}\n{logs.stdout}{logs.stderr}"
        assert pod["spec"]["nodeName"] == product.node.name
        traces[cores] = Trace.parse(logs.stdout)
    began, ended = max(t.start for t in traces.values()), min(t.end for t in traces.values())
    print(f"real node, the two gated loads ran together for {ended - began:.0f} ms of {seconds * 1000}")
    assert ended - began > 3000, f"the two loads overlapped only {ended - began:.0f} ms"
    for cores, trace in traces.items():
        achieved = trace.share(began + 1000, ended - 50)  # after a second of settling
        print(f"real node, gpucores {cores} beside {100 - cores}: achieved {achieved:.1f}%")
        assert abs(achieved - cores) <= 5, (cores, achieved)
    for cores in (30, 70):
        real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/share-{cores}")


#: the NVIDIA pods of HAMi's user guide (as recorded in shared/reference: resource names,
#: annotations) and of docs/ (install.md, concepts.md), applied unchanged but for the program:
#: name, limits, annotations, what the container must see (None: the pod must stay Pending with
#: that reason code in its PodScheduled condition, since the node lacks what it asks for)
USER_GUIDE = [
    ("gpu-only", {"nvidia.com/gpu": 1}, {}, {"cuda_total_mib": GPU_MEMORY_MIB}),
    ("gpumem", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, {}, {"cuda_total_mib": 3000}),
    (
        "gpumem-percentage",
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},
        {},
        {"cuda_total_mib": GPU_MEMORY_MIB // 2},
    ),
    (
        "two-gpus",
        {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000},
        {},
        {"cuda_total_mib": 3000, "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m"},
    ),
    (
        "priority",
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/priority": 0},
        {},
        {"CUDA_TASK_PRIORITY": "0"},
    ),
    (
        "use-gputype",
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},
        {"nvidia.com/use-gputype": "A100"},
        {"cuda_total_mib": 1000},
    ),
    (
        "use-gpuuuid",
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},
        {"nvidia.com/use-gpuuuid": GPU1},
        {"NVIDIA_VISIBLE_DEVICES": GPU1},
    ),
    ("nouse-gputype", {"nvidia.com/gpu": 1}, {"nvidia.com/nouse-gputype": "A100"}, "CardTypeMismatch"),
    ("too-much-memory", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 50000}, {}, "CardInsufficientMemory"),
    ("three-gpus", {"nvidia.com/gpu": 3}, {}, "NodeInsufficientDevice"),
]


def test_the_user_guide_pods_apply_unchanged_and_run(product: Product, real_cluster: KubeCluster, gpu_namespace: str):
    ns = gpu_namespace
    whole = [e for e in USER_GUIDE if e[0] == "gpu-only"]  # a whole GPU: alone, after the others
    problems = []
    for wave in ([e for e in USER_GUIDE if e not in whole], whole):
        for name, limits, pod_annotations, _ in wave:
            pod = probe_pod(name, [probe_container(product, "main", limits, ["--hold"])])
            pod["metadata"]["annotations"] = pod_annotations
            real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        for name, limits, _, expected in wave:
            if isinstance(expected, str):

                def refused(pod: dict, expected: str = expected) -> bool:
                    conditions = {c["type"]: c for c in pod["status"].get("conditions") or []}
                    scheduled = conditions.get("PodScheduled", {})
                    return scheduled.get("status") == "False" and expected in scheduled.get("message", "")

                pod = wait_pod(real_cluster, ns, name, refused, f"Pending with {expected}", product, timeout=120)
                assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
                continue
            wait_pod(real_cluster, ns, name, running, "Running", product)
            out = probe_output(real_cluster, ns, name, "main")
            seen = {**out, **out["env"]}
            wrong = {k: seen.get(k) for k, v in expected.items() if seen.get(k) != v}
            if wrong or out["cuInit"] != 0:
                problems.append(f"{name}: expected {expected}, saw {wrong} ({out})")
        real_cluster.kubectl("delete", "pods", "--all", "-n", ns, "--wait=false")
        real_cluster.wait_for(
            lambda: not real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"],
            "the wave's pods gone",
            timeout=120,
            interval=0.5,
        )
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------- faults
# Each fault hits the node while GPU workloads run and more arrive; the workloads are
# Deployments, as in production: a pod bound while the device plugin is away is refused by the
# kubelet at admission (UnexpectedAdmissionError, as with any device plugin) and replaced.

ALLOCATED = "hami.io/vgpu-devices-allocated"
NODE_LOCK = "hami.io/mutex.lock"


def _post(url: str, body: bytes, context=None) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_nobody_but_kube_scheduler_reaches_filter_or_bind(product: Product, real_cluster: KubeCluster):
    """From outside the scheduler pod's network namespace and with no credentials (the test
    process on the node's host network, as any pod or host process of the cluster would be):
    the pod's https port and the Service answer /filter and /bind with 404, the loopback
    extender port refuses the connection; /webhook is served there (the API server needs it)."""
    ip = product.pod_ip("hami-scheduler")
    service = real_cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/services/{RELEASE}-scheduler")
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    body = json.dumps(
        {"Pod": {"metadata": {"name": "x", "namespace": "default", "uid": "u"}}, "NodeNames": [product.node.name]}
    ).encode()
    targets = [f"https://{ip}:9443", f"https://{service['spec']['clusterIP']}:443"]
    for base in targets:
        for verb in ("filter", "bind"):
            assert _post(f"{base}/{verb}", body, insecure) == 404, f"{base}/{verb} must not be served"
        assert _post(f"{base}/webhook", b"{}", insecure) != 404  # served (the API server calls it)
    with pytest.raises(OSError):
        socket.create_connection((ip, 9080), timeout=5).close()


def sleepers(
    cluster: KubeCluster,
    ns: str,
    image: str,
    name: str,
    replicas: int,
    gpumem: int = 500,
    command: list[str] | None = None,
) -> None:
    labels = {"app": name}
    cluster.api(
        "POST",
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "main",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "command": command or ["sleep", "3600"],
                                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": gpumem}},
                            }
                        ],
                    },
                },
            },
        },
    )


def assert_settled(product: Product, cluster: KubeCluster, ns: str, count: int, timeout: float = 300) -> dict:
    """``count`` live pods in ``ns``, every one Running with exactly one grant; no GPU over
    capacity; no node lock left; the node's GPUs advertised (waited for: a fault takes a while
    to heal). Returns how many pods ended refused (Failed) on the way."""
    from hami.core.codec import decode_pod_devices

    state: dict = {}

    def settled() -> bool:
        pods = cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        live = [
            p
            for p in pods
            if p["status"].get("phase") not in ("Failed", "Succeeded") and not p["metadata"].get("deletionTimestamp")
        ]
        node = cluster.api("GET", f"/api/v1/nodes/{product.node.name}")
        state.update(
            live=len(live),
            running=sum(running(p) for p in live),
            refused=len(pods) - len(live),
            lock=node["metadata"].get("annotations", {}).get(NODE_LOCK),
            advertised=product.gpus_advertised(),
            product=product.product_pods_ready(),
        )
        return (
            state["live"] == count
            and state["running"] == count
            and state["lock"] is None
            and state["advertised"]
            and state["product"]
            and product.webhook_serves()
        )

    try:
        cluster.wait_for(settled, f"{count} pods Running, no node lock, GPUs advertised", timeout=timeout, interval=0.5)
    except TimeoutError as exc:
        pods = cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        waiting = {
            p["metadata"]["name"]: [
                p["status"].get("phase"),
                p["status"].get("reason"),
                [c.get("state") for c in p["status"].get("containerStatuses") or []],
                [c.get("message") for c in p["status"].get("conditions") or []],
            ]
            for p in pods
            if not running(p)
        }
        raise AssertionError(
            f"{exc}: {state}; not running: {json.dumps(waiting)[:3000]}\n{product.describe()}"
        ) from None
    used: dict[str, list[int]] = {}
    for pod in cluster.api("GET", "/api/v1/pods")["items"]:
        grant = (pod["metadata"].get("annotations") or {}).get(ALLOCATED)
        if not grant or pod["status"].get("phase") not in ("Running", "Pending"):
            continue
        devices = [d for container in decode_pod_devices(grant) for d in container]
        if pod["metadata"]["namespace"] == ns:
            assert len(devices) == 1, (pod["metadata"]["name"], grant)  # exactly one grant
        for d in devices:
            used.setdefault(d.uuid, []).append(d.usedmem)
    for uuid, mems in used.items():
        assert sum(mems) <= GPU_MEMORY_MIB and len(mems) <= SPLIT_COUNT, (uuid, mems)
    return state


@pytest.fixture
def fault_namespace(real_cluster: KubeCluster, product: Product, real_namespace: str) -> str:
    return real_namespace


def restart(product: Product, component: str) -> None:
    """Stop and start one of the node's processes (``kubelet``, ``containerd``) as it was."""
    process = product.node.components[component]
    process.stop()
    process.start()


def test_fault_device_plugin_pod_deleted(
    product: Product, real_cluster: KubeCluster, fault_namespace: str, busybox: str
):
    ns = fault_namespace
    sleepers(real_cluster, ns, busybox, "before", 2)
    assert_settled(product, real_cluster, ns, 2)
    (plugin,) = product.pods(selector="app.kubernetes.io/component=hami-device-plugin")
    real_cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{plugin['metadata']['name']}")
    sleepers(real_cluster, ns, busybox, "during", 2)  # while the DaemonSet brings a new one
    assert_settled(product, real_cluster, ns, 4)
    (again,) = product.pods(selector="app.kubernetes.io/component=hami-device-plugin")
    assert again["metadata"]["uid"] != plugin["metadata"]["uid"]


def test_fault_kubelet_restart(product: Product, real_cluster: KubeCluster, fault_namespace: str, busybox: str):
    ns = fault_namespace
    sleepers(real_cluster, ns, busybox, "before", 2)
    assert_settled(product, real_cluster, ns, 2)
    restart(product, "kubelet")
    sleepers(real_cluster, ns, busybox, "during", 2)
    assert_settled(product, real_cluster, ns, 4)


def test_fault_containerd_restart(product: Product, real_cluster: KubeCluster, fault_namespace: str, busybox: str):
    ns = fault_namespace
    sleepers(real_cluster, ns, busybox, "before", 2)
    assert_settled(product, real_cluster, ns, 2)
    restart(product, "containerd")
    sleepers(real_cluster, ns, busybox, "during", 2)
    assert_settled(product, real_cluster, ns, 4)


def test_fault_scheduler_pod_deleted_mid_burst(
    product: Product, real_cluster: KubeCluster, fault_namespace: str, busybox: str
):
    ns = fault_namespace
    sleepers(real_cluster, ns, busybox, "burst", 50, gpumem=200)

    def under_way() -> bool:
        # every pod created (through the webhook: a pod the ReplicaSet tries to create while the
        # scheduler pod is gone is refused, the chart's webhook failing closed for GPU pods, and
        # created once it is back), and the placements started
        items = real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return len(items) == 50 and sum(1 for p in items if p["spec"].get("nodeName")) >= 10

    real_cluster.wait_for(under_way, "the burst under way", timeout=120, interval=0.2)
    (scheduler,) = product.pods(selector="app.kubernetes.io/component=hami-scheduler")
    real_cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{scheduler['metadata']['name']}")
    assert_settled(product, real_cluster, ns, 50, timeout=600)


def _kill_product_processes(*programs: str) -> list[int]:
    """SIGKILL the node's processes running ``hami <program>`` (inside the real node's pod
    cgroups only, never a process of the test session); returns their host PIDs."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        names = [w.rsplit("/", 1)[-1] for w in words]
        if "hami-real-node" in cgroup and "hami" in names and any(p in words for p in programs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def test_fault_scheduler_and_device_plugin_killed_together_mid_burst(
    product: Product, real_cluster: KubeCluster, fault_namespace: str, busybox: str
):
    """Both of our components crash at the same moment (SIGKILL, no shutdown path) while pods
    are being placed; the kubelet restarts both containers."""
    ns = fault_namespace
    sleepers(real_cluster, ns, busybox, "both", 30, gpumem=200)

    def under_way() -> bool:
        items = real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return len(items) == 30 and sum(1 for p in items if p["spec"].get("nodeName")) >= 5

    real_cluster.wait_for(under_way, "the burst under way", timeout=120, interval=0.2)
    killed = _kill_product_processes("scheduler", "device-plugin")
    assert len(killed) >= 2, f"expected the scheduler and the device plugin, killed {killed}"
    assert_settled(product, real_cluster, ns, 30, timeout=600)


def test_fault_api_server_restarted_mid_burst(
    product: Product, real_cluster: KubeCluster, fault_namespace: str, busybox: str
):
    """kube-apiserver is killed while pods are being placed and comes back 3 s later: the
    scheduler's and the plugin's watches, binds and allocations recover."""
    ns = fault_namespace
    sleepers(real_cluster, ns, busybox, "apiserver", 30, gpumem=200)

    def under_way() -> bool:
        items = real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return len(items) == 30 and sum(1 for p in items if p["spec"].get("nodeName")) >= 5

    real_cluster.wait_for(under_way, "the burst under way", timeout=120, interval=0.2)
    real_cluster.restart("kube-apiserver", down_for=3.0)
    assert_settled(product, real_cluster, ns, 30, timeout=600)


def test_fault_node_stopped_and_started_again(
    product: Product, real_cluster: KubeCluster, real_node_holder, fault_namespace: str, busybox: str
):
    """A "reboot": every process of the node stops and the host is cleaned (containers, mounts,
    network, cgroups), then a node of the same name starts (last in the module: it replaces the
    node under the installed product)."""
    ns = fault_namespace
    sleepers(real_cluster, ns, busybox, "before", 2)
    assert_settled(product, real_cluster, ns, 2)
    problems = real_node_holder.stop()  # kube-proxy too: it stops and starts with the node
    assert not problems, problems
    node = real_node_holder.get()
    for ref, archive in product.archives.items():
        node.import_image(archive)
    product.node = node
    # the webhook is back with the scheduler pod; GPU pods the ReplicaSets tried to create before
    # that were refused (the webhook fails closed for GPU pods) and are created at the controller's
    # next retry, whose back-off doubles with each refusal (5 ms up to 1000 s): minutes after an
    # outage this long. (With HAMi's failurePolicy Ignore they went to default-scheduler and
    # stayed Pending for ever: CI saw it once.)
    product.wait_ready()
    sleepers(real_cluster, ns, busybox, "after", 2)
    assert_settled(product, real_cluster, ns, 4, timeout=900)


def test_a_scheduler_upgrade_rolls_over_to_a_new_pod_that_leads(
    product: Product, real_cluster: KubeCluster, fault_namespace: str, busybox: str
):
    """``helm upgrade`` that changes the scheduler's pod template: the Deployment's rolling update
    starts the new pod while the old one leads. The new pod must become Ready as a follower (were
    readiness tied to the lease, the rollout, and ``helm upgrade --wait``, would never finish),
    then lead once the old pod has gone, and place pods."""
    ns = fault_namespace
    selector = "app.kubernetes.io/component=hami-scheduler"
    (old,) = product.pods(selector=selector)
    assert old["metadata"]["labels"].get("hami.io/scheduler-role") == "leader"
    # all through the upgrade, a GPU pod is created every 0.2 s (dry run: admitted, nothing made):
    # the webhook must answer each one, through the handover too
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "probe-"},
        "spec": {"containers": [{"name": "c", "image": busybox, "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }
    answered, refused, stop = [0], [], threading.Event()

    def admit() -> None:
        while not stop.is_set():
            try:
                real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", probe, expect=(201,), timeout=15)
                answered[0] += 1
            except ApiError as exc:
                refused.append(str(exc))
            stop.wait(0.2)

    prober = threading.Thread(target=admit, daemon=True)
    prober.start()
    product.upgrade({"scheduler": {"podAnnotations": {"hami.test/rollout": old["metadata"]["uid"]}}})

    def new_leader() -> dict | None:
        pods = [p for p in product.pods(selector=selector) if not p["metadata"].get("deletionTimestamp")]
        if len(pods) != 1 or pods[0]["metadata"]["uid"] == old["metadata"]["uid"]:
            return None
        return pods[0] if pods[0]["metadata"]["labels"].get("hami.io/scheduler-role") == "leader" else None

    new = real_cluster.wait_for(new_leader, "the new scheduler pod leading", timeout=120, interval=0.5)
    assert new["metadata"]["annotations"]["hami.test/rollout"] == old["metadata"]["uid"]
    time.sleep(3)  # the new leader's first seconds too
    stop.set()
    prober.join(30)
    assert answered[0] > 20 and refused == [], (answered[0], refused[:3], len(refused))
    sleepers(real_cluster, ns, busybox, "after-upgrade", 2)
    assert_settled(product, real_cluster, ns, 2)


def _may(cluster: KubeCluster, user: str, verb: str, resource: str, subresource: str = "") -> bool:
    """What RBAC lets ``user`` do, as the API server answers a SubjectAccessReview."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "resource": resource, "subresource": subresource, "namespace": "x"},
        },
    }
    return bool(cluster.api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"]["allowed"])


def test_kube_scheduler_in_a_pod_of_its_own_schedules_gpu_pods_and_the_extender_loses_its_roles(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str, busybox: str
):
    """``scheduler.kubeScheduler.separatePod`` on a running release: kube-scheduler moves to a
    Deployment and ServiceAccount of its own and calls /filter and /bind through the scheduler's
    Service (kube-proxy on the node; the node has no cluster DNS, so the Service's name comes from
    ``hostAliases``) with its client certificate; the extender's replicas campaign for a Lease of
    their own. GPU pods are placed and get their limits; the extender's ServiceAccount can no
    longer delete pods or write their status, kube-scheduler's can. Switched back afterwards."""
    ns = gpu_namespace
    service = real_cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/services/{RELEASE}-scheduler")
    host = f"{RELEASE}-scheduler.{NAMESPACE}.svc"
    extender_sa = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-scheduler"
    kube_sa = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-kube-scheduler"
    assert _may(real_cluster, extender_sa, "delete", "pods")  # HAMi's layout: kube-scheduler's roles shared
    separate = {"separatePod": True, "hostAliases": [{"ip": service["spec"]["clusterIP"], "hostnames": [host]}]}
    try:
        product.upgrade({"scheduler": {"kubeScheduler": separate}})
        (ks,) = product.pods(selector="app.kubernetes.io/component=kube-scheduler")
        assert ks["spec"]["serviceAccountName"] == f"{RELEASE}-kube-scheduler"
        assert [c["name"] for c in ks["spec"]["containers"]] == ["kube-scheduler"]

        def extender_leads() -> dict | None:
            pods = [
                p
                for p in product.pods(selector="app.kubernetes.io/component=hami-scheduler")
                if not p["metadata"].get("deletionTimestamp")
            ]
            if len(pods) != 1 or [c["name"] for c in pods[0]["spec"]["containers"]] != ["vgpu-scheduler-extender"]:
                return None
            return pods[0] if pods[0]["metadata"]["labels"].get("hami.io/scheduler-role") == "leader" else None

        ext = real_cluster.wait_for(extender_leads, "the extender pod alone, leading", timeout=120, interval=0.5)
        lease = real_cluster.api(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/hami-scheduler-extender"
        )
        assert lease["spec"]["holderIdentity"].startswith(ext["metadata"]["name"] + "_")
        # RBAC as the API server applies it: Kubernetes' scheduler roles are kube-scheduler's alone
        for verb, resource, sub in (
            ("delete", "pods", ""),
            ("update", "pods", "status"),
            ("update", "persistentvolumes", ""),
        ):
            assert not _may(real_cluster, extender_sa, verb, resource, sub), (verb, resource, sub)
            assert _may(real_cluster, kube_sa, verb, resource, sub), (verb, resource, sub)
        assert _may(real_cluster, extender_sa, "create", "pods", "binding")  # Bind is the extender's
        # a GPU pod scheduled through the Service gets its limits on the node
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}
        real_cluster.api(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            probe_pod("separate", [probe_container(product, "main", limits, ["500", "1800", "--hold"])]),
        )
        pod = wait_pod(real_cluster, ns, "separate", running, "Running", product)
        assert pod["spec"]["nodeName"] == product.node.name
        out = probe_output(real_cluster, ns, "separate", "main")
        assert out["cuda_total_mib"] == 2000 and out["allocs"] == [0, CUDA_ERROR_OUT_OF_MEMORY], out
        sleepers(real_cluster, ns, busybox, "separate-sleepers", 2)
        assert_settled(product, real_cluster, ns, 3)
        # kube-scheduler reached the extender over https, and no other way
        logs = real_cluster.kubectl("logs", "-n", NAMESPACE, ext["metadata"]["name"], check=False).stdout
        assert "campaigning as" in logs and "client certificates of --extender-client-ca" in logs, logs[-2000:]
    finally:
        product.upgrade({"scheduler": {"kubeScheduler": {"separatePod": False, "hostAliases": []}}})
    # helm deletes the Deployment with background propagation: its pod goes when the garbage
    # collector and the kubelet get to it, which --wait does not wait for (seconds when loaded)
    real_cluster.wait_for(
        lambda: not product.pods(selector="app.kubernetes.io/component=kube-scheduler"),
        "the separate kube-scheduler pod gone",
        timeout=120,
        interval=0.5,
    )
    assert _may(real_cluster, extender_sa, "delete", "pods")
