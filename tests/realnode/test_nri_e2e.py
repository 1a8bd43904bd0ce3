"""``devicePlugin.injection=nri`` end to end on the real node: the chart installed from the
product image with the device plugin registered on containerd's NRI socket (the node's own,
``RealNode.nri_socket``), GPU pods whose containers get their grant at creation from the NRI hook
(docs/nri.md), the fail-closed case (with the plugin not registered, a GPU container gets no
GPU at all), and two faults: the scheduler and the hook killed mid-burst, and a reboot of the node
(last in the module: it reboots the node under the installed product).

The scheduler here is main's: it may still take the node lock for every Bind; these tests check
injection (what each container gets, bind-phase written), not how fast pods bind.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest

from hami_devkit.cluster import KubeCluster

from . import test_chart_e2e as e2e
from . import test_dra_e2e as dra
from .product import DRIVER_IN_CONTAINER, STATE_IN_CONTAINER, Product, create_config_map, installed
from .test_chart_e2e import probe_container, probe_output, probe_pod, running, wait_pod

#: the probe's namespace fixture of test_chart_e2e.py, here over this module's product
gpu_namespace = e2e.gpu_namespace

INJECTION = "hami.io/node-injection"
BIND_PHASE = "hami.io/bind-phase"
NODE_LOCK = "hami.io/mutex.lock"
ALLOCATED = "hami.io/vgpu-devices-allocated"
#: the kubelet's device manager checkpoint, in the device-plugin directory
KUBELET_CHECKPOINT = "kubelet_internal_checkpoint"
#: stands for a GPU program: exits when the container was not given its GPU (CUDA would fail to
#: initialise), else runs on
GPU_PROGRAM = ["sh", "-c", '[ "$HAMI_NRI_INJECTION" = done ] || { echo "no GPU grant" >&2; exit 1; }; exec sleep 3600']
CUDA_ERROR_OUT_OF_MEMORY = 2
#: containerd's log line (logfmt, quotes escaped) once the plugin is registered and synchronized
CONNECTED = 'plugin \\"50-hami\\" connected and synchronized'


def nri_values(node) -> dict:
    return {"devicePlugin": {"injection": "nri", "nriSocket": str(node.nri_socket)}}


@pytest.fixture(scope="module")
def product(real_node_holder, real_cluster: KubeCluster, tmp_path_factory, request):
    yield from installed(
        real_node_holder,
        real_cluster,
        tmp_path_factory.mktemp("product-nri"),
        request,
        extra_values=nri_values,
        label="nri",
    )


def node_annotations(cluster: KubeCluster, product: Product) -> dict:
    return cluster.api("GET", f"/api/v1/nodes/{product.node.name}")["metadata"].get("annotations") or {}


def wait_success(cluster: KubeCluster, ns: str, name: str, product: Product) -> dict:
    return wait_pod(
        cluster,
        ns,
        name,
        lambda p: p["metadata"]["annotations"].get(BIND_PHASE) == "success",
        "bind-phase success",
        product,
    )


def _allocatable_gpus(cluster: KubeCluster, product: Product) -> int:
    node = cluster.api("GET", f"/api/v1/nodes/{product.node.name}")
    return int((node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", "0"))


def run_to_completion(cluster: KubeCluster, ns: str, pod: dict, product: Product, attempts: int = 5) -> dict:
    """Create ``pod`` and wait until it has finished. A pod the kubelet refused at admission
    because the device plugin it talks to was just replaced (``UnexpectedAdmissionError``: the
    old plugin's devices still unhealthy, a kubelet race the chart's upgrade opens) is created
    again once the node's allocatable GPUs are back (retrying at once failed five times within
    3 s: 2 runs in 8); any other end is returned."""
    name = pod["metadata"]["name"]
    for _ in range(attempts):
        cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        done = wait_pod(
            cluster, ns, name, lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "finished", product
        )
        if done["status"].get("reason") != "UnexpectedAdmissionError":
            return done
        cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
        cluster.wait_for(
            lambda: (
                name
                not in [p["metadata"]["name"] for p in cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]]
            ),
            f"pod {name} gone",
            timeout=60,
            interval=0.5,
        )
        cluster.wait_for(
            lambda: _allocatable_gpus(cluster, product) > 0,
            "the node's GPUs allocatable again",
            timeout=120,
            interval=0.5,
        )
    raise AssertionError(f"pod {ns}/{name} refused at admission {attempts} times: {done['status']}")


def test_the_plugin_registers_with_containerds_nri_and_says_so_on_the_node(product: Product, real_cluster: KubeCluster):
    real_cluster.wait_for(
        lambda: node_annotations(real_cluster, product).get(INJECTION) == "nri",
        f"node annotation {INJECTION}=nri",
        timeout=60,
        interval=0.5,
    )
    assert CONNECTED in product.node.log_path("containerd").read_text(errors="replace")
    (plugin,) = product.pods(selector="app.kubernetes.io/component=hami-device-plugin")
    command = next(c["command"] for c in plugin["spec"]["containers"] if c["name"] == "device-plugin")
    assert "--injection=nri" in command


def test_a_gpu_container_gets_the_limits_of_its_grant_at_creation(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    ns, name = gpu_namespace, "nri-pod"
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
    # the pod's own envFrom (which no admission rule reads) tries to lift its limits: the hook's
    # adjustment empties libvgpu settings the grant does not give and sets its own
    tenant_env = {
        "CUDA_DEVICE_SM_LIMIT_0": "100",
        "CUDA_DEVICE_MEMORY_LIMIT": "80g",
        "GPU_CORE_UTILIZATION_POLICY": "disable",
        "NVIDIA_VISIBLE_DEVICES": "all",  # one entry (the image sets none): the hook's replaces it
    }
    create_config_map(real_cluster, ns, "tenant-env", tenant_env)
    container = probe_container(product, "main", limits, ["1000", "2500", "--hold"])
    container["envFrom"] = [{"configMapRef": {"name": "tenant-env"}}]
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", probe_pod(name, [container]))
    out = probe_output(real_cluster, ns, name, "main")
    assert out["cuda_total_mib"] == 3000 and out["nvml_total_mib"] == 3000, out
    assert out["allocs"] == [0, CUDA_ERROR_OUT_OF_MEMORY], out
    env = out["env"]
    assert env["HAMI_NRI_INJECTION"] == "done", env
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-a1000000-"), env
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and env["CUDA_DEVICE_SM_LIMIT"] == "30", env
    assert [env.get(k) for k in list(tenant_env)[:3]] == ["", "", ""], env  # libvgpu reads an empty value as unset
    pod = wait_success(real_cluster, ns, name, product)
    granted = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    assert env["NVIDIA_VISIBLE_DEVICES"] in granted
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")


def test_an_image_that_sets_nvidia_visible_devices_itself_gets_its_grant(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    """CUDA's base images carry ``ENV NVIDIA_VISIBLE_DEVICES=all``. containerd puts the image's
    env and the kubelet's (Allocate's first) in one list without merging names, and its NRI (1.7)
    puts the last entry of a name back over a plugin's value: a deferred grant that wrote
    ``NVIDIA_VISIBLE_DEVICES=void`` left every such container with no GPU at all."""
    from hami_devkit.images import build_busybox_image

    image = build_busybox_image(env=["NVIDIA_VISIBLE_DEVICES=all"], ref="localhost/hami/busybox-cuda-env:latest")
    product.node.import_image(image.path)
    ns, name = gpu_namespace, "nri-cuda-image"
    container = {
        "name": "main",
        "image": image.ref,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", 'echo "visible=$NVIDIA_VISIBLE_DEVICES marker=$HAMI_NRI_INJECTION"; sleep 3600'],
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}},
    }
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
        },
    )

    def line() -> str | None:
        out = real_cluster.kubectl("logs", "-n", ns, name, "-c", "main", check=False).stdout
        return next((x for x in out.splitlines() if x.startswith("visible=")), None)

    got = real_cluster.wait_for(line, f"the output of {name}", timeout=120, interval=0.5)
    assert got.startswith("visible=GPU-a1000000-") and got.endswith("marker=done"), got
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")

    # the same image with the pod's own envFrom asking for every GPU: two entries, and the runtime
    # would keep the pod's over the hook's, so the container is not created
    create_config_map(real_cluster, ns, "all-gpus", {"NVIDIA_VISIBLE_DEVICES": "all"})
    greedy = {**container, "envFrom": [{"configMapRef": {"name": "all-gpus"}}]}
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "nri-greedy"},
            "spec": {"containers": [greedy], "terminationGracePeriodSeconds": 0},
        },
    )
    pod = wait_pod(
        real_cluster,
        ns,
        "nri-greedy",
        lambda p: _create_error(p, "NVIDIA_VISIBLE_DEVICES is set more than once"),
        "refused at creation",
        product,
    )
    assert not any(s.get("state", {}).get("running") for s in pod["status"]["containerStatuses"])
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/nri-greedy?gracePeriodSeconds=0")


def _create_error(pod: dict, text: str) -> bool:
    """The pod's container waits in CreateContainerError with ``text`` in its message."""
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerError" and text in waiting.get("message", ""):
            return True
    return False


def test_a_container_whose_env_replaces_allocates_marker_is_not_created(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    """Allocate writes the marker; a pod's envFrom replacing it would have the hook give nothing
    and the container keep the GPUs of the pod's choosing: refused at creation."""
    ns, name, named = gpu_namespace, "nri-marker", "HAMI_NRI_INJECTION"
    tenant_env = {"HAMI_NRI_INJECTION": "done", "NVIDIA_VISIBLE_DEVICES": "all"}
    create_config_map(real_cluster, ns, name, tenant_env)
    container = probe_container(product, "main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ["100"])
    container["envFrom"] = [{"configMapRef": {"name": name}}]
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", probe_pod(name, [container]))

    def refused(pod: dict) -> bool:
        return _create_error(pod, f"{named}=")

    pod = wait_pod(real_cluster, ns, name, refused, "refused at container creation", product)
    assert not any(s.get("state", {}).get("running") for s in pod["status"]["containerStatuses"])
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")


def test_two_gpu_containers_of_one_pod_each_get_their_own_grant(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str, busybox: str
):
    ns, name = gpu_namespace, "nri-two"
    small = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20}
    large = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5000, "nvidia.com/gpucores": 50}
    plain = {"name": "plain", "image": busybox, "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}
    pod = probe_pod(
        name,
        [
            probe_container(product, "small", small, ["--hold"]),
            plain,
            probe_container(product, "large", large, ["--hold"]),
        ],
    )
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    wait_pod(real_cluster, ns, name, running, "Running", product)
    got = {c: probe_output(real_cluster, ns, name, c) for c in ("small", "large")}
    assert got["small"]["cuda_total_mib"] == 2000 and got["large"]["cuda_total_mib"] == 5000, got
    assert got["small"]["env"]["CUDA_DEVICE_SM_LIMIT"] == "20" and got["large"]["env"]["CUDA_DEVICE_SM_LIMIT"] == "50"
    regions = {c: o["env"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"] for c, o in got.items()}
    assert regions["small"] != regions["large"], regions
    wait_success(real_cluster, ns, name, product)
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")


def test_a_container_that_switched_isolation_off_has_no_preload(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str, busybox: str
):
    """Allocate mounts ``/etc/ld.so.preload`` (libvgpu refuses a container the hook never
    served); for a container whose spec sets ``CUDA_DISABLE_CONTROL=true`` (allowed by its
    namespace's label) the hook removes that mount (NRI's removal marker), as the lock mode
    leaves it out; its sibling without the switch keeps it."""
    ns, name = gpu_namespace, "nri-no-control"
    real_cluster.api(
        "PATCH",
        f"/api/v1/namespaces/{ns}",
        {"metadata": {"labels": {"hami.io/allow-disable-control": "true"}}},
        content_type="application/merge-patch+json",
    )
    show = [
        "sh",
        "-c",
        'echo "marker=$HAMI_NRI_INJECTION preload=$(cat /etc/ld.so.preload 2>/dev/null || echo none)"; sleep 3600',
    ]

    def gpu(cname: str, env: list[dict]) -> dict:
        return {
            "name": cname,
            "image": busybox,
            "imagePullPolicy": "IfNotPresent",
            "command": show,
            "env": env,
            "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 500}},
        }

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [gpu("off", [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]), gpu("on", [])],
            "terminationGracePeriodSeconds": 0,
        },
    }
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def line(cname: str):
        def read() -> str | None:
            out = real_cluster.kubectl("logs", "-n", ns, name, "-c", cname, check=False).stdout
            return next((x for x in out.splitlines() if x.startswith("marker=")), None)

        return real_cluster.wait_for(read, f"the output of {name}/{cname}", timeout=120, interval=0.5)

    assert line("off") == "marker=done preload=none"
    on = line("on")
    assert on.startswith("marker=done preload=/") and on.endswith("/libvgpu.so"), on
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")


def test_after_a_containerd_restart_the_plugin_registers_again(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    log = product.node.log_path("containerd")
    offset = log.stat().st_size
    e2e.restart(product, "containerd")  # every NRI connection ends with containerd

    def registered_again() -> bool:
        text = log.read_bytes()
        text = text[offset:] if len(text) >= offset else text  # appended, or a new file
        return CONNECTED in text.decode(errors="replace")

    real_cluster.wait_for(registered_again, "the plugin registered with the new containerd", timeout=60, interval=0.5)
    real_cluster.wait_for(
        lambda: node_annotations(real_cluster, product).get(INJECTION) == "nri",
        f"node annotation {INJECTION}=nri again",
        timeout=60,
        interval=0.5,
    )
    ns, name = gpu_namespace, "nri-after-restart"
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500}
    real_cluster.api(
        "POST", f"/api/v1/namespaces/{ns}/pods", probe_pod(name, [probe_container(product, "main", limits, ["--hold"])])
    )
    out = probe_output(real_cluster, ns, name, "main")
    assert out["cuda_total_mib"] == 1500 and out["env"]["HAMI_NRI_INJECTION"] == "done", out
    wait_success(real_cluster, ns, name, product)
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")


@contextlib.contextmanager
def node_lock_watched(cluster: KubeCluster, product: Product):
    """Yields a list that collects every value of the node lock seen while the block runs (read
    five times a second; a failed read, e.g. while the API server restarts, is skipped)."""
    locks: list[str] = []
    stop = threading.Event()

    def watch_lock() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                value = node_annotations(cluster, product).get(NODE_LOCK)
                if value:
                    locks.append(value)
            stop.wait(0.2)

    watcher = threading.Thread(target=watch_lock, daemon=True)
    watcher.start()
    try:
        yield locks
    finally:
        stop.set()
        watcher.join(timeout=5)


def _injection_markers() -> dict[str, int]:
    """How many processes in the real node's pod cgroups carry each ``HAMI_NRI_INJECTION``
    value (``pending``: a container Allocate answered that the hook never served)."""
    counts: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if "hami-real-node" not in (entry / "cgroup").read_text():
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"HAMI_NRI_INJECTION="):
                value = item.split(b"=", 1)[1].decode(errors="replace")
                counts[value] = counts.get(value, 0) + 1
    return counts


def test_scheduler_and_plugin_killed_together_mid_burst_no_lock_no_double_booking(
    product: Product, real_cluster: KubeCluster, real_namespace: str, busybox: str
):
    """Issue 29's fault test on the lockless path: 30 GPU pods placed without the node lock
    while the scheduler and the device plugin (the NRI hook) are SIGKILLed together. Every pod
    ends Running with one grant, no GPU over capacity (``assert_settled``), the node lock is never
    taken, and no container is left running with the Allocate-time marker ``pending`` (one created
    while the hook was down has no GPU; its program exits and the kubelet creates it again, with
    its grant)."""
    ns = real_namespace
    real_cluster.wait_for(
        lambda: node_annotations(real_cluster, product).get(INJECTION) == "nri",
        f"node annotation {INJECTION}=nri",
        timeout=120,
        interval=0.5,
    )
    with node_lock_watched(real_cluster, product) as locks:
        e2e.sleepers(real_cluster, ns, busybox, "nri-burst", 30, gpumem=200, command=GPU_PROGRAM)

        def under_way() -> bool:
            items = real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            return len(items) == 30 and sum(1 for p in items if p["spec"].get("nodeName")) >= 5

        real_cluster.wait_for(under_way, "the burst under way", timeout=120, interval=0.2)
        killed = e2e._kill_product_processes("scheduler", "device-plugin")
        assert len(killed) >= 2, f"expected the scheduler and the device plugin, killed {killed}"
        e2e.assert_settled(product, real_cluster, ns, 30, timeout=600)
        # containers the kubelet created while the hook was down start with no GPU (fail closed);
        # containerd 1.7's NRI (v0.8) drops a plugin's evictions, so such a container is created
        # again, with its grant, when it exits: as a GPU program does that finds no GPU (above)
        real_cluster.wait_for(
            lambda: _injection_markers().get("pending", 0) == 0,
            "no container left with HAMI_NRI_INJECTION=pending",
            timeout=180,
            interval=1.0,
        )
    assert not locks, f"the node lock was taken on an NRI node: {sorted(set(locks))}"
    assert _injection_markers().get("done", 0) >= 30, _injection_markers()
    real_cluster.api("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/nri-burst")


def test_without_the_nri_plugin_a_gpu_container_gets_no_gpu(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str, tmp_path_factory
):
    """The plugin pointed at a directory where no runtime listens: Allocate still answers (it
    needs no pod), but no hook gives the container its grant. The container keeps what its image
    says of ``NVIDIA_VISIBLE_DEVICES``; for an image that says ``all`` (CUDA's base images) the
    NVIDIA runtime would show it every GPU of the node with the driver, which the pod's hostPath
    volumes stand in for here. Allocate's libvgpu, preloaded with the marker still ``pending``,
    gives it no device: CUDA ``CUDA_ERROR_NO_DEVICE`` (100), NVML ``NVML_ERROR_NO_PERMISSION`` (4),
    even with the pod's ``envFrom`` setting the marker to ``done`` (libvgpu also finds the marker
    file Allocate mounts beside it, which only the hook removes). Before 30 Nov the same container
    ran on the fake driver with no limit (``cuInit`` 0)."""
    nowhere = tmp_path_factory.mktemp("no-nri")
    product.upgrade({"devicePlugin": {"nriSocket": str(nowhere / "nri.sock")}})
    real_cluster.wait_for(
        lambda: INJECTION not in node_annotations(real_cluster, product),
        f"node annotation {INJECTION} withdrawn",
        timeout=60,
        interval=0.5,
    )
    ns, name = gpu_namespace, "nri-off"
    # the pod's own envFrom (no admission rule reads it) claims the hook's marker and every GPU
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "claims-done"},
            "data": {"HAMI_NRI_INJECTION": "done", "NVIDIA_VISIBLE_DEVICES": "all"},
        },
    )
    check = (
        "import ctypes, json, os\n"
        "out = {'visible': os.environ.get('NVIDIA_VISIBLE_DEVICES'), 'marker': os.environ.get('HAMI_NRI_INJECTION'),\n"
        "       'limit': os.environ.get('CUDA_DEVICE_MEMORY_LIMIT_0'),\n"
        "       'preload': open('/etc/ld.so.preload').read().strip() if os.path.exists('/etc/ld.so.preload') else None}\n"
        "cuda, nvml = ctypes.CDLL('libcuda.so.1'), ctypes.CDLL('libnvidia-ml.so.1')\n"
        "count = ctypes.c_int(-1)\n"
        "out.update(cu_init=cuda.cuInit(0), cu_count=cuda.cuDeviceGetCount(ctypes.byref(count)), "
        "nvml_init=nvml.nvmlInit_v2())\n"
        "print(json.dumps(out), flush=True)\n"
    )
    driver, state = product.driver, product.state
    container = {
        "name": "main",
        "image": product.images["hami"],
        "command": ["python", "-c", check],
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}},
        "envFrom": [{"configMapRef": {"name": "claims-done"}}],
        "volumeMounts": [
            {"name": "driver", "mountPath": DRIVER_IN_CONTAINER, "readOnly": True},
            {"name": "state", "mountPath": STATE_IN_CONTAINER},
        ],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [container],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "volumes": [
                {"name": "driver", "hostPath": {"path": str(driver), "type": "Directory"}},
                {"name": "state", "hostPath": {"path": str(state), "type": "Directory"}},
            ],
        },
    }
    done = run_to_completion(real_cluster, ns, pod, product)
    logs = real_cluster.kubectl("logs", "-n", ns, name, "-c", "main", check=False).stdout
    lines = [x for x in logs.splitlines() if x.startswith("{")]
    assert lines, logs
    out = json.loads(lines[0])
    # the pod's values won over Allocate's marker; the file Allocate mounted beside libvgpu did not go
    assert out["visible"] == "all" and out["marker"] == "done" and out["limit"] is None, out
    assert out["preload"] and out["preload"].endswith("/libvgpu.so"), out
    assert (out["cu_init"], out["cu_count"], out["nvml_init"]) == (100, 3, 4), out
    assert "grant was never applied" in logs, logs
    assert done["metadata"]["annotations"].get(BIND_PHASE) != "success"
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")


def _other_gpu_pods(cluster: KubeCluster, ns: str) -> list[str]:
    """Live pods with a grant outside ``ns`` (an earlier test's, its namespace still going)."""
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in cluster.api("GET", "/api/v1/pods")["items"]
        if p["metadata"]["namespace"] != ns
        and (p["metadata"].get("annotations") or {}).get(ALLOCATED)
        and p["status"].get("phase") in ("Pending", "Running")
    ]


def _gpu_containers(cluster: KubeCluster, ns: str) -> dict[str, str]:
    """containerID -> pod name, of the live pods' running containers in ``ns``."""
    out = {}
    for pod in cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        for status in pod["status"].get("containerStatuses") or []:
            if "running" in (status.get("state") or {}) and status.get("containerID"):
                out[status["containerID"]] = pod["metadata"]["name"]
    return out


def _served(count: int) -> bool:
    markers = _injection_markers()
    return markers.get("pending", 0) == 0 and markers.get("done", 0) >= count


def test_node_rebooted_with_nri_pods_running_no_double_booking(
    product: Product, real_cluster: KubeCluster, real_namespace: str, busybox: str, real_node_holder
):
    """Issue 29's reboot fault on the lockless path (last in the module). Four GPU pods of
    15000 MiB run (two on each 40960 MiB GPU, the most that fit); the node loses power
    (``test_dra_e2e._reboot_in_place``: every container killed, ``/run`` and the NRI socket gone,
    the kubelet's device checkpoint and the node annotations left as they were) and boots:
    containerd, the kubelet, the device plugin pod, its NRI registration again. Afterwards four
    pods (the same, or the replacements of those the kubelet refused at boot) run in new
    containers, each served by the hook (``HAMI_NRI_INJECTION=done``, none ``pending``), one
    grant each, no GPU over capacity (``assert_settled``); two pods of 10000 MiB placed after the
    reboot fit only one on each GPU, next to the two pods already there (a GPU counted twice, e.g.
    with a refused pod's grant, leaves one of them Pending; one counted short puts both on it,
    over capacity); the node lock is never taken."""
    ns = real_namespace
    # the test before this one pointed the plugin at a socket nobody serves
    product.upgrade({"devicePlugin": {"nriSocket": str(product.node.nri_socket)}})
    real_cluster.wait_for(
        lambda: node_annotations(real_cluster, product).get(INJECTION) == "nri",
        f"node annotation {INJECTION}=nri",
        timeout=120,
        interval=0.5,
    )
    real_cluster.wait_for(
        lambda: not _other_gpu_pods(real_cluster, ns),
        "no GPU pod left of the tests before",
        timeout=300,
        interval=1.0,
    )
    # that test's pod was bound with the node lock (no hook registered: the node was a lock node);
    # the scheduler's sweep releases the lock once its owner is gone
    real_cluster.wait_for(
        lambda: NODE_LOCK not in node_annotations(real_cluster, product),
        "no node lock left of the test before",
        timeout=300,
        interval=1.0,
    )
    with node_lock_watched(real_cluster, product) as locks:
        e2e.sleepers(real_cluster, ns, busybox, "nri-reboot", 4, gpumem=15000, command=GPU_PROGRAM)
        e2e.assert_settled(product, real_cluster, ns, 4)
        real_cluster.wait_for(lambda: _served(4), "four containers served by the hook", timeout=180, interval=1.0)
        before = _gpu_containers(real_cluster, ns)
        assert len(before) == 4, before
        (plugin,) = product.pods(selector="app.kubernetes.io/component=hami-device-plugin")
        log = product.node.log_path("containerd")
        offset = log.stat().st_size

        # the kubelet's device checkpoint is on disk and outlives the power cut, but the harness's
        # host clean-up removes it: put back, or the kubelet re-allocates every GPU pod at once
        # at boot, and its device manager may panic on that (kubernetes/kubernetes#136021: pod
        # workers' Allocate share devicesToReuse; seen here once, the kubelet dead after boot)
        checkpoint = product.node.device_plugins_dir / KUBELET_CHECKPOINT
        saved = checkpoint.read_bytes()

        def while_down() -> None:
            # /var/run is a tmpfs: the runtime's NRI socket does not outlive the power cut
            product.node.nri_socket.unlink(missing_ok=True)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.write_bytes(saved)

        try:
            dra._reboot_in_place(product, real_cluster, while_down)
            product.wait_ready()
        except BaseException:
            real_node_holder.stop(keep_workdir=True)  # the next module gets a fresh node
            raise

        # the plugin's annotation outlived the power cut; registered again means: the new
        # containerd says so
        real_cluster.wait_for(
            lambda: CONNECTED in log.read_bytes()[offset:].decode(errors="replace"),
            "the plugin registered with the rebooted node's containerd",
            timeout=120,
            interval=0.5,
        )
        assert node_annotations(real_cluster, product).get(INJECTION) == "nri"
        (again,) = product.pods(selector="app.kubernetes.io/component=hami-device-plugin")
        assert (
            again["status"]["containerStatuses"][0]["containerID"]
            != plugin["status"]["containerStatuses"][0]["containerID"]
        ), "the device plugin's container did not start again"

        # at boot the kubelet admits the pods again before the device plugin has registered and,
        # with its checkpoint naming nvidia.com/gpu, refuses them (UnexpectedAdmissionError); the
        # ReplicaSet's creations of replacements were refused while the webhook was down, so its
        # controller backs off (minutes: test_chart_e2e's reboot waits it out): touch it to sync now
        _touch_replicasets(real_cluster, ns)
        e2e.assert_settled(product, real_cluster, ns, 4, timeout=600)
        real_cluster.wait_for(
            lambda: _served(4), "every container served by the hook after the reboot", timeout=300, interval=1.0
        )
        after = _gpu_containers(real_cluster, ns)
        # new containers (of the same pods, or of their replacements): none left of before the boot
        assert len(after) == 4 and not set(after) & set(before), (before, after)

        e2e.sleepers(real_cluster, ns, busybox, "nri-after-reboot", 2, gpumem=10000, command=GPU_PROGRAM)
        e2e.assert_settled(product, real_cluster, ns, 6, timeout=300)
        real_cluster.wait_for(
            lambda: _served(6), "the two new containers served by the hook", timeout=180, interval=1.0
        )
    assert not locks, f"the node lock was taken on an NRI node: {sorted(set(locks))}"
    used = _grants_per_gpu(real_cluster, ns)
    assert sorted(used.values()) == [[10000, 15000, 15000]] * 2, used
    for name in ("nri-reboot", "nri-after-reboot"):
        real_cluster.api("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")


def _touch_replicasets(cluster: KubeCluster, ns: str) -> None:
    """An annotation written on every ReplicaSet of ``ns``: its controller syncs it at once (an
    update event), whatever back-off its earlier failed creations left."""
    for rs in cluster.api("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets")["items"]:
        cluster.api(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns}/replicasets/{rs['metadata']['name']}",
            {"metadata": {"annotations": {"test.hami.io/touched": str(time.time())}}},
            content_type="application/merge-patch+json",
        )


def _grants_per_gpu(cluster: KubeCluster, ns: str) -> dict[str, list[int]]:
    """GPU uuid -> the MiB granted on it to the live pods of ``ns`` (sorted)."""
    from hami.core.codec import decode_pod_devices

    used: dict[str, list[int]] = {}
    for pod in cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]:
        grant = (pod["metadata"].get("annotations") or {}).get(ALLOCATED)
        if not grant or pod["status"].get("phase") not in ("Pending", "Running"):
            continue
        for container in decode_pod_devices(grant):
            for device in container:
                used.setdefault(device.uuid, []).append(device.usedmem)
    return {uuid: sorted(mems) for uuid, mems in used.items()}
