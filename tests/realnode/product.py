"""The whole product on the real node, installed the way users install it: ``helm install`` of
``charts/hami`` from the product image, with the fake driver playing the host's NVIDIA driver.

:func:`install` (used by the ``product`` fixture of test_chart_e2e.py and by
bench/bench_realnode.py) does, on a running :class:`~hami_devkit.realnode.RealNode`:

1. imports the product image (``ghcr.io/hami-py/hami:<version>``, the chart's default) and the
   ``registry.k8s.io/kube-scheduler:<version>`` image into the node's containerd, so the
   chart's defaults run unchanged (``imagePullPolicy: IfNotPresent``, nothing pulled);
2. installs the fake driver like a host driver: ``libcuda.so.1``, ``libnvidia-ml.so.1`` and
   ``fakegpu.conf`` in ``<driver>/nvidia/lib64`` (docs/fakegpu.md, "Installed like a driver"),
   and a world-writable state directory every process of the "machine" shares;
3. relies on the node's kube-proxy (started with the node, :mod:`hami_devkit.kubeproxy`): pods
   reach the API server through the ``kubernetes`` Service, the API server reaches the webhook
   through its Service;
4. ``helm install`` with :func:`values`: the documented override for a node without the
   NVIDIA container runtime (``devicePlugin.driverMounts``, docs/install.md) plus the
   scheduler pinned to the real node (kwok's nodes run no containers), then waits until every
   pod of the release is Running and Ready.

``Product(front_end="dra")`` installs the DRA front end instead (docs/dra.md): ``frontEnd: dra``,
the node agent ``hami dra`` (``dra.enabled``) in place of the device plugin, pointed at the real
node's kubelet root and at the directory its containerd reads CDI specs from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from hami_devkit.controlplane import KubeCluster
from hami_devkit.errors import ApiError

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hami"
FAKE_DRIVER = ROOT / "native" / "build" / "fakegpu"
NAMESPACE = "hami-system"
RELEASE = "hami"
#: where GPU containers, the plugin and the monitor see the driver and the fake's state
DRIVER_IN_CONTAINER = "/usr/local/nvidia"
STATE_IN_CONTAINER = "/var/run/fakegpu"
#: the node's fake GPUs (two A100 40GB); a split count large enough for the 100-pod benchmark
GPU_MEMORY_MIB = 40960
FAKE_GPUS = [
    f"name=NVIDIA A100-SXM4-40GB,memory={GPU_MEMORY_MIB}Mi,uuid=GPU-a1000000-0000-4000-8000-00000000000{i}"
    for i in range(2)
]
SPLIT_COUNT = 60
MONITOR_PORT = 9394
REGISTER = "hami.io/node-nvidia-register"
SCHEDULER_METRICS_PORT = 9395


def values(
    node: str, driver: Path, state: Path, dra: dict[str, str] | None = None, hook: Path | None = None
) -> dict[str, Any]:
    """The chart values for the real node (see the module docstring); ``dra``: the DRA front end,
    with ``kubeletDir``, ``cdiDir`` and ``stateDir`` of the node; ``hook``: a directory of its own
    for libvgpu, ``ld.so.preload``, the regions and the lock directory (``global.gpuHookPath``,
    ``devicePlugin.lockPath``) instead of the host's ``/usr/local/vgpu`` and ``/tmp/vgpulock``."""
    out: dict[str, Any] = {
        "scheduler": {"nodeName": node},
        "devicePlugin": {
            "deviceSplitCount": SPLIT_COUNT,
            "driverMounts": [
                {"hostPath": str(driver), "containerPath": DRIVER_IN_CONTAINER},
                {"hostPath": str(state), "containerPath": STATE_IN_CONTAINER, "readOnly": False},
            ],
        },
    }
    if hook is not None:
        out["global"] = {"gpuHookPath": str(hook)}
        out["devicePlugin"]["lockPath"] = str(hook / "vgpulock")
    if dra is not None:
        out["frontEnd"] = "dra"
        out["devicePlugin"]["enabled"] = False  # one node agent per node: hami dra
        out["dra"] = {"enabled": True, **dra}
    return out


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``, mappings key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def create_config_map(cluster: Any, namespace: str, name: str, data: dict[str, str]) -> None:
    """A ConfigMap ``name`` in ``namespace`` (a pod's ``envFrom`` in the tests that try to lift
    its grant with one)."""
    cluster.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data},
    )


def install_fake_driver(root: Path, gpus: list[str] = FAKE_GPUS) -> tuple[Path, Path]:
    """``<root>/nvidia/lib64/{libcuda.so.1,libnvidia-ml.so.1,fakegpu.conf}`` and ``<root>/state``;
    returns (driver root, state directory) on the host."""
    missing = [n for n in ("libcuda.so.1", "libnvidia-ml.so.1") if not (FAKE_DRIVER / n).is_file()]
    if missing:
        raise FileNotFoundError(f"fake driver {', '.join(missing)} not in {FAKE_DRIVER} (run `make native`)")
    driver, state = root / "nvidia", root / "state"
    lib = driver / "lib64"
    lib.mkdir(parents=True, exist_ok=True)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        shutil.copy(FAKE_DRIVER / name, lib / name)
    conf = [
        f"state_dir={STATE_IN_CONTAINER}",
        "visible_devices_env=NVIDIA_VISIBLE_DEVICES",
        *(f"device {spec}" for spec in gpus),
    ]
    (lib / "fakegpu.conf").write_text("\n".join(conf) + "\n")
    for path in (root, driver, lib):
        path.chmod(0o755)
    state.mkdir(exist_ok=True)
    state.chmod(0o777)  # GPU containers run as any user
    return driver, state


@dataclass
class Product:
    cluster: KubeCluster
    node: Any
    workdir: Path
    driver: Path | None = None
    state: Path | None = None
    front_end: str = "extender"  # or "dra"
    images: dict[str, str] = field(default_factory=dict)
    #: chart values over :func:`values` (e.g. ``devicePlugin.injection: nri``, test_nri_e2e.py)
    extra_values: dict[str, Any] = field(default_factory=dict)
    archives: dict[str, Path] = field(default_factory=dict)  # ref -> OCI archive (to import again)
    timings: dict[str, float] = field(default_factory=dict)

    # -- helm ----------------------------------------------------------------------------------

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        home = self.workdir / "helm"
        env = {
            **os.environ,
            **self.cluster.env(),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        binary = str((self.cluster.binaries or {}).get("helm") or "helm")
        result = subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}\n{self.describe()}"
            )
        return result

    # -- lifecycle -----------------------------------------------------------------------------

    def install(self, images: list[Any]) -> Product:
        began = time.monotonic()
        for image in images:
            self.node.import_image(image.path)
            self.images[image.ref.split(":")[0].rsplit("/", 1)[-1]] = image.ref
            self.archives[image.ref] = Path(image.path)
        self.timings["import images"] = time.monotonic() - began
        self.driver, self.state = install_fake_driver(self.workdir / "host")
        if self.node.proxy is None:
            raise AssertionError("the real node runs no kube-proxy: the chart's Services would not work")
        values_file = self.workdir / "values.yaml"
        dra = hook = None
        if self.front_end == "dra":
            dra_state = self.workdir / "dra-state"
            dra_state.mkdir(exist_ok=True)
            dra = {
                "kubeletDir": str(self.node.kubelet_root),
                "cdiDir": str(self.node.cdi_dir),
                "stateDir": str(dra_state),
            }
            # nothing the extender's install left in /usr/local/vgpu can stand in for what the
            # DRA agent must prepare itself (ld.so.preload, the lock directory)
            hook = self.workdir / "hook"
        chosen = merged(values(self.node.name, self.driver, self.state, dra, hook), self.extra_values)
        values_file.write_text(yaml.safe_dump(chosen))
        began = time.monotonic()
        self.helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "-f",
            str(values_file),
            "--wait",
            "--timeout",
            "5m",
        )
        self.wait_ready()
        self.timings["helm install to all Ready"] = time.monotonic() - began
        return self

    def upgrade(self, overrides: dict[str, Any]) -> None:
        """``helm upgrade`` keeping the installed values, ``overrides`` over them; waits until
        every pod of the release is Running and Ready again."""
        values_file = self.workdir / "upgrade-values.yaml"
        values_file.write_text(yaml.safe_dump(overrides))
        self.helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values", "-f", str(values_file),
            "--wait", "--timeout", "5m",
        )  # fmt: skip
        self.wait_ready()

    def uninstall(self) -> list[str]:
        problems = []
        try:
            self.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")
        except Exception as exc:  # noqa: BLE001 - teardown reports, never hides the test's result
            problems.append(f"helm uninstall: {exc}")
        return problems

    # -- state ---------------------------------------------------------------------------------

    def pods(self, namespace: str = NAMESPACE, selector: str = "") -> list[dict]:
        query = f"?labelSelector={selector}" if selector else ""
        return self.cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods{query}")["items"]

    def product_pods_ready(self) -> bool:
        pods = self.pods()
        return bool(pods) and all(
            p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
            for p in pods
        )

    def wait_ready(self, timeout: float = 300) -> None:
        # the node agent and the monitor's own DaemonSet (<release>-dra-monitor with the DRA front end)
        agents = ["dra", "dra-monitor"] if self.front_end == "dra" else ["device-plugin", "vgpu-monitor"]

        def ready() -> bool:
            deployment = self.cluster.api(
                "GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{RELEASE}-scheduler"
            )
            daemonsets = [
                self.cluster.api("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}-{agent}")
                for agent in agents
            ]
            return (
                deployment["status"].get("readyReplicas") == deployment["spec"]["replicas"]
                and all(
                    d["status"].get("numberReady") == d["status"].get("desiredNumberScheduled") == 1 for d in daemonsets
                )
                and self.product_pods_ready()
                and self.gpus_advertised()
                and self.webhook_serves()
            )

        try:
            self.cluster.wait_for(
                ready, "every pod of the chart Running and Ready, the GPUs advertised", timeout=timeout, interval=0.5
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None

    def gpus_advertised(self) -> bool:
        """The kubelet advertises every GPU slot and the plugin's registration is on the Node
        (DRA: the node's ResourceSlice lists every GPU)."""
        if self.front_end == "dra":
            slices = self.cluster.api(
                "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={self.node.name}"
            )["items"]
            return sum(len(s["spec"].get("devices") or []) for s in slices) == len(FAKE_GPUS)
        node = self.cluster.api("GET", f"/api/v1/nodes/{self.node.name}")
        return node["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(
            len(FAKE_GPUS) * SPLIT_COUNT
        ) and REGISTER in node["metadata"].get("annotations", {})

    def webhook_serves(self) -> bool:
        """A GPU pod (dry run) comes back with ``schedulerName: hami-scheduler``: the API server
        reaches the webhook through its Service (a scheduler pod just Ready may not be in
        kube-proxy's rules yet: a GPU pod created then is refused, the webhook failing closed)."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "webhook-check"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        }
        try:
            made = self.cluster.api("POST", "/api/v1/namespaces/default/pods?dryRun=All", pod)
        except ApiError as exc:
            if "failed calling webhook" in str(exc):
                return False
            raise
        if self.front_end == "dra":  # the request became a claim from a template
            return bool(made["spec"].get("resourceClaims"))
        return made["spec"].get("schedulerName") == "hami-scheduler"

    def pod_ip(self, component: str) -> str:
        (pod,) = [
            p
            for p in self.pods(selector=f"app.kubernetes.io/component={component}")
            if not p["metadata"].get("deletionTimestamp")
        ]
        return pod["status"]["podIP"]

    def metrics(self, component: str, port: int) -> str:
        with urllib.request.urlopen(f"http://{self.pod_ip(component)}:{port}/metrics", timeout=10) as response:
            return response.read().decode()

    def monitor_metrics(self) -> str:
        # the monitor's own DaemonSet: <release>-vgpu-monitor, or <release>-dra-monitor with the DRA front end
        component = "hami-dra-monitor" if self.front_end == "dra" else "hami-vgpu-monitor"
        return self.metrics(component, MONITOR_PORT)

    def scheduler_metrics(self) -> str:
        return self.metrics("hami-scheduler", SCHEDULER_METRICS_PORT)

    def describe(self) -> str:
        """The product pods' states and their containers' last log lines (for failure reports)."""
        lines = []
        try:
            for pod in self.pods():
                name = pod["metadata"]["name"]
                statuses = {
                    c["name"]: (c.get("ready"), list(c.get("state", {}))[:1], c.get("restartCount"))
                    for c in pod["status"].get("containerStatuses") or []
                }
                lines.append(f"--- pod {name}: {pod['status'].get('phase')} {json.dumps(statuses)}")
                for container in [c["name"] for c in pod["spec"]["containers"]]:
                    logs = self.cluster.kubectl(
                        "logs", "-n", NAMESPACE, name, "-c", container, "--tail=15", check=False
                    )
                    lines.append(f"  [{container}] " + (logs.stdout or logs.stderr).strip().replace("\n", "\n  "))
        except Exception as exc:  # noqa: BLE001 - a report of a broken cluster must not fail itself
            lines.append(f"(could not describe the product: {exc})")
        return "\n".join(lines)


def installed(
    real_node_holder: Any,
    cluster: KubeCluster,
    workdir: Path,
    request: Any,
    front_end: str = "extender",
    extra_values: Any = None,
    label: str = "",
) -> Iterator[Product]:
    """A module fixture's body: the product images built (skip, or fail under
    ``HAMI_REQUIRE_REAL_NODE=1``, when they cannot be), the chart installed on the session's real
    node, the timings kept for the summary; uninstalled afterwards (a leftover fails the module)."""
    import pytest

    from hami_devkit.images import ImageUnavailable, build_hami_image, build_kube_scheduler_image

    node = real_node_holder.get()
    try:
        images = [build_hami_image(), build_kube_scheduler_image()]
    except ImageUnavailable as exc:
        if os.environ.get("HAMI_REQUIRE_REAL_NODE") == "1":
            pytest.fail(f"HAMI_REQUIRE_REAL_NODE=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))
    began = time.monotonic()
    if callable(extra_values):  # values that depend on the node (its NRI socket)
        extra_values = extra_values(node)
    product = Product(cluster, node, workdir, front_end=front_end, extra_values=extra_values or {})
    try:
        product.install(images)
    except BaseException:
        product.uninstall()
        raise
    prefix = f"{label} " if label else "" if front_end == "extender" else f"{front_end} "
    request.config.stash.setdefault("hami_chart_timings", {}).update(
        {**{prefix + k: v for k, v in product.timings.items()}, prefix + "install total": time.monotonic() - began}
    )
    yield product
    problems = product.uninstall()
    assert not problems, problems
