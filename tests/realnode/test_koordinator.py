"""Koordinator's "GPU share with HAMi" (issue 28) end to end on the real node, with our image as
HAMi-core: Koordinator v1.7.0's own koord-manager, koord-scheduler and koordlet (built by
``scripts/install-koord.sh``, run by :mod:`hami_devkit.koordinator`), containerd's NRI, the
``hami-daemon`` DaemonSet of Koordinator's chart running our product image, and the seed's
example pod (docs/integrations.md, "Koordinator").
"""

from __future__ import annotations

import gzip
import json
import os
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_devkit.cluster import KubeCluster
from hami_devkit.images import (
    ImageArchive,
    ImageUnavailable,
    Layer,
    _inputs_hash,
    _member,
    build_hami_image,
    images_dir,
    read_oci_archive,
    write_oci_archive,
)
from hami_devkit.koordinator import (
    DEVICE_ALLOCATED,
    HAMI_CORE,
    HAMI_DAEMON,
    HAMI_DAEMON_NAMESPACE,
    HOOK_DIR,
    ISOLATION_LABEL,
    MONITOR_PORT,
    SCHEDULER_NAME,
    Koordinator,
    KoordinatorUnavailable,
    find_koordinator,
    hami_daemon_objects,
)

from .product import FAKE_DRIVER, FAKE_GPUS, GPU_MEMORY_MIB, install_fake_driver

HERE = Path(__file__).resolve().parent
PROBE_REF = "localhost/hami/koord-gpu-probe:latest"
#: the fake driver's state directory inside a probe container (its own /tmp: one "machine" per
#: container is enough here, each pod's limit is checked in that pod)
PROBE_STATE = "/tmp/fakegpu"


def build_probe_image(hami: ImageArchive) -> ImageArchive:
    """``localhost/hami/koord-gpu-probe``: the product image plus the fake driver installed as a
    CUDA image's driver would be by the NVIDIA runtime (``/usr/local/nvidia/lib64``, on the
    image's ``LD_LIBRARY_PATH``, showing only the GPUs ``NVIDIA_VISIBLE_DEVICES`` names) and
    ``/probe/gpu_probe.py`` and ``/probe/cshare_load`` (the compute-share load of
    tests/native/cshare.py); the seed's pod runs it in place of ``nvidia/cuda``, whose driver
    would come from the runtime (the real node has none)."""
    probe = (HERE / "gpu_probe.py").read_bytes()
    load = (FAKE_DRIVER.parent / "tests" / "cshare_load").read_bytes()
    libs = {n: (FAKE_DRIVER / n).read_bytes() for n in ("libcuda.so.1", "libnvidia-ml.so.1")}
    conf = (
        "\n".join(
            [
                f"state_dir={PROBE_STATE}",
                "visible_devices_env=NVIDIA_VISIBLE_DEVICES",
                *(f"device {g}" for g in FAKE_GPUS),
            ]
        ).encode()
        + b"\n"
    )
    key = _inputs_hash(hami.path.name, probe, load, *libs.values(), conf)
    dest = images_dir() / f"koord-gpu-probe-{key}.oci.tar"
    if dest.is_file():
        return ImageArchive(path=dest, ref=PROBE_REF)
    parts = read_oci_archive(hami.path)
    layers = []
    with tarfile.open(hami.path) as outer:
        for desc in parts["manifest"]["layers"]:
            blob = _member(outer, "blobs/sha256/" + desc["digest"].removeprefix("sha256:")).read()
            layers.append(gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob)
    extra = Layer()
    for name, content in libs.items():
        extra.file(f"usr/local/nvidia/lib64/{name}", content, mode=0o755)
    extra.file("usr/local/nvidia/lib64/fakegpu.conf", conf)
    extra.file("probe/gpu_probe.py", probe)
    extra.file("probe/cshare_load", load, mode=0o755)
    config = dict(parts["config"]["config"])
    config.pop("Labels", None)
    return write_oci_archive(dest, PROBE_REF, [*layers, extra.tar()], config)


# ---------------------------------------------------------------------------------------------
# The set-up

#: the one GPU koordlet reports on this node (so that two pods asking half a GPU share it)
HOST_GPUS = FAKE_GPUS[:1]
#: the seed's pod asks 50 % of the GPU's memory: koord-scheduler grants it in bytes
HALF_BYTES = GPU_MEMORY_MIB * (1 << 20) // 2
HALF_MIB = GPU_MEMORY_MIB // 2
CUDA_ERROR_OUT_OF_MEMORY = 2
#: the metric names the seed lists for the hami-daemon pod's port 9394
SEED_METRICS = (
    "HostGPUMemoryUsage",
    "HostCoreUtilization",
    "vGPU_device_memory_usage_in_bytes",
    "vGPU_device_memory_limit_in_bytes",
    "Device_memory_desc_of_container",
    "Device_utilization_desc_of_container",
    "Device_last_kernel_of_container",
)


def _unavailable(reason: str) -> None:
    if os.environ.get("HAMI_REQUIRE_REAL_NODE") == "1":
        pytest.fail(f"HAMI_REQUIRE_REAL_NODE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def seed_pod(name: str, image: str, command: list[str]) -> dict:
    """The seed's ``pod-example``, verbatim but for its image and command (the probe in place
    of ``nvidia/cuda`` sleeping) and its cpu/memory (``cpu: 4`` does not fit the 2-CPU node)."""
    resources = {
        "cpu": "100m",
        "memory": "256Mi",
        "koordinator.sh/gpu.shared": 1,
        "koordinator.sh/gpu-core": 50,
        "koordinator.sh/gpu-memory-ratio": 50,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {ISOLATION_LABEL: HAMI_CORE}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Always",
            "containers": [
                {
                    "command": command,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "name": "curlimage",
                    "resources": {"limits": resources, "requests": resources},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                }
            ],
        },
    }


class Setup:
    """Koordinator, the hami-daemon and the probe image on the session's real node."""

    def __init__(self, cluster: KubeCluster, node, workdir: Path, busybox: str) -> None:
        self.cluster, self.node, self.workdir, self.busybox = cluster, node, workdir, busybox
        self.koord: Koordinator | None = None
        self.images: dict[str, str] = {}
        self.timings: dict[str, float] = {}

    def start(self) -> Setup:
        began = time.monotonic()
        hami = build_hami_image()
        probe = build_probe_image(hami)
        for image in (hami, probe):
            self.node.import_image(image.path)
        self.images = {"hami": hami.ref, "probe": probe.ref}
        driver, _state = install_fake_driver(self.workdir / "host", HOST_GPUS)
        # koordlet mounts these host paths into every HAMi-core container: the library (put
        # there by the hami-daemon) and the lock directory HAMi's device plugin would create
        Path("/tmp/vgpulock").mkdir(exist_ok=True)
        Path("/tmp/vgpulock").chmod(0o777)
        self.cluster.kubectl("label", "node", self.node.name, f"{ISOLATION_LABEL}={HAMI_CORE}", "--overwrite")
        # koordlet counts an empty pod list from the kubelet as a failure and waits
        self.cluster.api("POST", "/api/v1/namespaces/default/pods", self._placeholder(), expect=(201, 409))
        self.koord = Koordinator(self.cluster, self.node, driver / "lib64", self.workdir / "koord")
        self.koord.start()
        objects = hami_daemon_objects(hami.ref, node=self.node.name, driver=(str(driver), "/usr/local/nvidia"))
        self.cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
        self.timings["start"] = time.monotonic() - began
        self.wait("the node's koordinator.sh/gpu.shared allocatable", self._gpu_allocatable, 240)
        self.wait("koordlet's NRI plugin registered with containerd", self._nri_registered, 240)
        self.wait("the hami-daemon pod Running and Ready", self._daemon_ready, 180)
        # Ready once its container started (the chart gives it no probe): the monitor listens later
        self.wait(f"the hami-daemon's monitor serving on {MONITOR_PORT}", self._monitor_serves, 120)
        self.timings["ready"] = time.monotonic() - began
        return self

    def _placeholder(self) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "koordlet-placeholder"},
            "spec": {
                "nodeName": self.node.name,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "c",
                        "image": self.busybox,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "3600"],
                    }
                ],
            },
        }

    def wait(self, what: str, probe, timeout: float) -> object:
        try:
            return self.cluster.wait_for(probe, what, timeout=timeout, interval=1)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None

    def _gpu_allocatable(self) -> bool:
        node = self.cluster.api("GET", f"/api/v1/nodes/{self.node.name}")
        return node["status"].get("allocatable", {}).get("koordinator.sh/gpu.shared") == str(100 * len(HOST_GPUS))

    def _nri_registered(self) -> bool:
        log = self.node.log_path("containerd").read_text(errors="replace")
        return 'registered as \\"00-koordlet_nri\\"' in log

    def daemon_pod(self) -> dict | None:
        pods = self.cluster.api(
            "GET", f"/api/v1/namespaces/{HAMI_DAEMON_NAMESPACE}/pods?labelSelector=app.kubernetes.io/name={HAMI_DAEMON}"
        )["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return live[0] if len(live) == 1 else None

    def _daemon_ready(self) -> bool:
        pod = self.daemon_pod()
        return bool(pod) and all(c.get("ready") for c in pod["status"].get("containerStatuses") or [{}])

    def _monitor_serves(self) -> bool:
        try:
            return bool(self.metrics())
        except OSError:
            return False

    def metrics(self) -> str:
        pod = self.daemon_pod()
        assert pod, self.describe()
        url = f"http://{pod['status']['podIP']}:{MONITOR_PORT}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    def describe(self) -> str:
        out = [self.koord.log_tails(25) if self.koord else "(Koordinator not started)"]
        out.append(self.cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout)
        out.append(
            self.cluster.kubectl(
                "logs", "-n", HAMI_DAEMON_NAMESPACE, f"ds/{HAMI_DAEMON}", "--tail=20", check=False
            ).stdout
        )
        return "\n".join(out)

    def stop(self) -> None:
        # the DaemonSet's pod runs `sh -c`, which leaves SIGTERM to the default 30 s grace period
        self.cluster.kubectl(
            "delete", "-n", HAMI_DAEMON_NAMESPACE, f"daemonset/{HAMI_DAEMON}", "--wait=false", check=False
        )
        self.cluster.kubectl(
            "delete", "pods", "-n", HAMI_DAEMON_NAMESPACE, "-l", f"app.kubernetes.io/name={HAMI_DAEMON}",
            "--grace-period=0", "--force", "--wait=false", check=False,
        )  # fmt: skip
        self.cluster.kubectl("delete", "pod", "-n", "default", "koordlet-placeholder", "--wait=false", check=False)
        if self.koord:
            self.koord.stop()
        self.cluster.kubectl("label", "node", self.node.name, f"{ISOLATION_LABEL}-", check=False)


@pytest.fixture(scope="module")
def koord(real_node_holder, real_cluster: KubeCluster, tmp_path_factory, request):
    try:
        find_koordinator()
    except KoordinatorUnavailable as exc:
        _unavailable(str(exc))
    node = real_node_holder.get()
    try:
        setup = Setup(real_cluster, node, tmp_path_factory.mktemp("koord"), real_node_holder.busybox.ref)
        setup.start()
    except ImageUnavailable as exc:
        _unavailable(str(exc))
    request.config.stash.setdefault("hami_chart_timings", {}).update(
        {f"koordinator {k}": v for k, v in setup.timings.items()}
    )
    yield setup
    setup.stop()


@pytest.fixture
def ns(real_namespace: str) -> str:
    return real_namespace


def probe_command(*args: str, kernels: bool = False) -> list[str]:
    """The probe (one JSON line, then holding its allocations), after a line naming what
    ``LD_PRELOAD`` the container was given (the probe reports only the CUDA variables); with
    ``kernels``, first 0.2 s of kernel launches by the compute load in the same container (so
    that its region records a last kernel)."""
    load = "/probe/cshare_load plain 1000 0.2 32 0 0 >/dev/null && " if kernels else ""
    script = f'echo "LD_PRELOAD=$LD_PRELOAD"; {load}exec python /probe/gpu_probe.py "$@"'
    return ["sh", "-c", script, "probe", *args]


def wait_running(setup: Setup, ns: str, name: str) -> dict:
    def probe():
        pod = setup.cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        statuses = pod["status"].get("containerStatuses") or [{}]
        return pod if pod["status"].get("phase") == "Running" and all(c.get("ready") for c in statuses) else None

    try:
        return setup.cluster.wait_for(probe, f"pod {ns}/{name} Running", timeout=120, interval=0.5)
    except TimeoutError as exc:
        pod = setup.cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        raise AssertionError(f"{exc}: {json.dumps(pod['status'], indent=1)}\n{setup.describe()}") from None


def probe_output(setup: Setup, ns: str, name: str) -> tuple[dict, str]:
    """The probe's JSON line and the ``LD_PRELOAD`` line of pod ``name``."""

    def lines():
        out = setup.cluster.kubectl("logs", "-n", ns, name, check=False).stdout.splitlines()
        found = next((json.loads(x) for x in out if x.startswith("{")), None)
        preload = next((x.partition("=")[2] for x in out if x.startswith("LD_PRELOAD=")), None)
        return (found, preload) if found is not None else None

    try:
        return setup.cluster.wait_for(lines, f"probe output of {ns}/{name}", timeout=60, interval=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{setup.describe()}") from None


def delete_pods(setup: Setup, ns: str, *names: str) -> None:
    """Delete the pods and wait until they are gone (their GPU share is free again)."""
    for name in names:
        setup.cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0", expect=(200, 404))

    def gone() -> bool:
        items = setup.cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return not {p["metadata"]["name"] for p in items} & set(names)

    setup.wait(f"pods {', '.join(names)} gone", gone, 60)


def samples(text: str, name: str) -> list[tuple[dict, float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


# ---------------------------------------------------------------------------------------------
# The tests


def test_koordlet_reports_the_fake_gpu_and_koord_manager_the_nodes_gpu_resources(koord: Setup):
    device = koord.cluster.api(
        "GET", f"/apis/scheduling.koordinator.sh/v1alpha1/devices/{koord.node.name}"
    )  # written by koordlet from the fake NVML
    (gpu,) = device["spec"]["devices"]
    assert gpu["id"] == "GPU-a1000000-0000-4000-8000-000000000000" and gpu["minor"] == 0 and gpu["health"]
    assert gpu["resources"]["koordinator.sh/gpu-memory"] == "40Gi"
    allocatable = koord.cluster.api("GET", f"/api/v1/nodes/{koord.node.name}")["status"]["allocatable"]
    assert allocatable["koordinator.sh/gpu.shared"] == "100"
    assert allocatable["koordinator.sh/gpu-memory-ratio"] == "100"


def test_the_seed_pod_sees_half_the_gpu_and_cannot_allocate_past_it(koord: Setup, ns: str):
    name = "pod-example"
    koord.cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        seed_pod(name, koord.images["probe"], probe_command("15000", "8000", "--hold", kernels=True)),
    )
    pod = wait_running(koord, ns, name)
    # placed by koord-scheduler (the node runs no other scheduler for it) with its grant
    assert pod["spec"]["nodeName"] == koord.node.name
    (grant,) = json.loads(pod["metadata"]["annotations"][DEVICE_ALLOCATED])["gpu"]
    assert grant["minor"] == 0
    assert grant["resources"] == {
        "koordinator.sh/gpu-core": "50",
        "koordinator.sh/gpu-memory": "20Gi",
        "koordinator.sh/gpu-memory-ratio": "50",
    }
    out, preload = probe_output(koord, ns, name)
    # what koordlet's NRI hook injected (GPUEnvInject, HamiCoreVGPUMonitor)
    env = out["env"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0", env
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == str(HALF_BYTES), env
    assert env["CUDA_DEVICE_SM_LIMIT"] == "50", env
    uid = pod["metadata"]["uid"]
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"{HOOK_DIR}/{uid}_curlimage.cache", env
    assert preload == f"{HOOK_DIR}/libvgpu.so"
    # our libvgpu (copied by the hami-daemon) enforces it on the fake driver
    assert out["cuda_total_mib"] == HALF_MIB and out["nvml_total_mib"] == HALF_MIB, out
    assert out["allocs"] == [0, CUDA_ERROR_OUT_OF_MEMORY], out
    # the region lands where the hami-daemon's monitor reads it
    region = Path(HOOK_DIR) / "containers" / f"{uid}_curlimage" / f"{uid}_curlimage.cache"
    assert region.is_file(), sorted(p.name for p in region.parent.iterdir())

    def listed() -> str | None:
        text = koord.metrics()
        return (
            text
            if any(labels.get("podname") == name for labels, _ in samples(text, "vGPU_device_memory_limit_in_bytes"))
            else None
        )

    text = koord.wait("the monitor lists the seed's container", listed, 60)
    assert isinstance(text, str)
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert not set(SEED_METRICS) - names, sorted(set(SEED_METRICS) - names)
    (limit,) = [v for labels, v in samples(text, "vGPU_device_memory_limit_in_bytes") if labels.get("podname") == name]
    (usage,) = [v for labels, v in samples(text, "vGPU_device_memory_usage_in_bytes") if labels.get("podname") == name]
    assert limit == HALF_BYTES
    assert usage >= 15000 * (1 << 20)
    delete_pods(koord, ns, name)


def test_two_seed_pods_on_the_one_gpu_keep_their_own_limits(koord: Setup, ns: str):
    a = seed_pod("pod-a", koord.images["probe"], probe_command("12000", "--hold"))
    b = seed_pod("pod-b", koord.images["probe"], probe_command("21000", "--hold"))
    b["spec"]["containers"][0]["resources"]["limits"]["koordinator.sh/gpu-memory-ratio"] = 25
    b["spec"]["containers"][0]["resources"]["requests"]["koordinator.sh/gpu-memory-ratio"] = 25
    for pod in (a, b):
        koord.cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    pods = {p["metadata"]["name"]: wait_running(koord, ns, p["metadata"]["name"]) for p in (a, b)}
    grants = {n: json.loads(p["metadata"]["annotations"][DEVICE_ALLOCATED])["gpu"] for n, p in pods.items()}
    assert [g[0]["minor"] for g in grants.values()] == [0, 0], grants
    out = {n: probe_output(koord, ns, n)[0] for n in pods}
    assert out["pod-a"]["cuda_total_mib"] == HALF_MIB and out["pod-a"]["allocs"] == [0], out["pod-a"]
    quarter = GPU_MEMORY_MIB // 4
    assert out["pod-b"]["cuda_total_mib"] == quarter, out["pod-b"]
    assert out["pod-b"]["allocs"] == [CUDA_ERROR_OUT_OF_MEMORY], out["pod-b"]
    assert out["pod-b"]["env"]["CUDA_DEVICE_MEMORY_LIMIT"] == str(quarter << 20)
    delete_pods(koord, ns, *pods)


def test_the_compute_share_holds_near_the_grant_alone_on_the_gpu(koord: Setup, ns: str):
    """koordlet sets ``CUDA_DEVICE_SM_LIMIT`` and no policy; alone on its GPU, the pod is held to
    its ``gpu-core`` as HAMi-core holds it (libvgpu reads koordlet's settings as ``force``; its own
    default caps only while the GPU is shared, and the pod ran at ~100% before). The load
    (tests/native/cshare.py) launches 1 ms kernels for 4 s and prints its timeline; the share is
    device time over wall time once the limiter has settled (after 1.5 s)."""
    name = "pod-compute"
    pod = seed_pod(name, koord.images["probe"], ["/probe/cshare_load", "plain", "1000", "4", "32", "0", "0"])
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0]["env"] = [
        {"name": "FAKEGPU_SAMPLE_PERIOD_US", "value": "50000"},  # as tests/native/cshare.py
    ]
    koord.cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def finished() -> dict | None:
        got = koord.cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        return got if got["status"].get("phase") in ("Succeeded", "Failed") else None

    done = koord.wait(f"pod {name} finished", finished, 120)
    assert isinstance(done, dict) and done["status"]["phase"] == "Succeeded", done
    text = koord.cluster.kubectl("logs", "-n", ns, name).stdout
    timeline = [line.split() for line in text.splitlines() if line and not line.startswith("done")]
    t, n = [float(a) for a, _ in timeline], [int(b) for _, b in timeline]
    start = next(i for i, x in enumerate(t) if x >= t[0] + 1500)
    share = (n[-1] - n[start]) * 1.0 / (t[-1] - t[start]) * 100  # 1 ms of device time per launch
    print(f"koordinator: compute share under gpu-core 50, alone, no policy set: {share:.1f}%")
    assert 35 <= share <= 56, f"achieved {share:.1f}% of the GPU under a 50% grant"
    delete_pods(koord, ns, name)
