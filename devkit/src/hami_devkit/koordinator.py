"""Koordinator's own processes beside the harness's cluster and real node (issue 28).

``scripts/install-koord.sh`` (``make koord``) builds koord-scheduler, koordlet and koord-manager
of :data:`KOORD_VERSION` into ``<cache>/koord/<version>/bin`` and copies the CRDs to
``<cache>/koord/<version>/crd``. This module runs them as the harness runs the Kubernetes
components: one :class:`~hami_devkit.process.Component` each, logging to a file, dying with the
test process.

- :func:`apply_crds`: Koordinator's CRDs, applied before either koord-scheduler or koordlet
  starts (both wait for informers on them).
- :func:`scheduler_config`: a ``KubeSchedulerConfiguration`` with one profile,
  ``schedulerName: koord-scheduler``, running ``DeviceShare`` and ``Reservation`` (DeviceShare's
  Reserve step needs the reservation nominator only ``Reservation`` sets up; alone, the scheduler
  crashes, docs/integrations.md).
- :class:`Koordinator`: starts koord-manager (its ``noderesource`` controller with the
  ``GPUDeviceResource`` plugin writes the node's ``koordinator.sh/gpu*`` allocatable from the
  ``Device`` object, ``koordinator.sh/gpu.shared`` only with the feature gate
  ``EnableSyncGPUSharedResource``; ``nodeslo`` writes the ``NodeSLO`` koordlet's host-application collector
  waits for, without which koordlet never starts its runtime hooks; its webhooks are off), koord-scheduler, and koordlet on the host in
  ``agent_mode=hostMode`` with ``GPUEnvInject`` (and ``Accelerators``, which reads the GPUs
  through NVML and writes the ``Device`` object), its NRI plugin on the real node's NRI socket
  and the fake driver's ``libnvidia-ml.so.1`` on its ``LD_LIBRARY_PATH``.
- :func:`hami_daemon_objects`: the ``hami-daemon`` DaemonSet of Koordinator's chart for a given
  image (ours, in tests/realnode/test_koordinator.py).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami_devkit.binaries import cache_dir
from hami_devkit.errors import ClusterError
from hami_devkit.nodehost import CGROUP_FS, CGROUP_ROOT
from hami_devkit.process import Component, free_port

#: keep equal to KOORD_VERSION's default in scripts/install-koord.sh
KOORD_VERSION = os.environ.get("HAMI_KOORD_VERSION") or "v1.7.0"
BINARIES = ("koord-scheduler", "koordlet", "koord-manager")
SCHEDULER_NAME = "koord-scheduler"
#: the node label and pod label DeviceShare matches for HAMi-core isolation
ISOLATION_LABEL = "koordinator.sh/gpu-isolation-provider"
HAMI_CORE = "HAMi-core"
DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
#: koordlet's feature gates: GPUEnvInject (the HAMi-core hook), Accelerators (NVML, the Device
#: object), HamiCoreVGPUMonitor (regions under /usr/local/vgpu/containers); the gates that
#: would change the host's cgroups or resctrl off
KOORDLET_GATES = {
    "GPUEnvInject": True,
    "Accelerators": True,
    "HamiCoreVGPUMonitor": True,
    "BECPUSuppress": False,
    "CPUBurst": False,
    "RdtResctrl": False,
    "CPUSetAllocator": False,
    "GroupIdentity": False,
    "BatchResource": False,
    "NodeTopologyReport": False,
}


class KoordinatorUnavailable(ClusterError):
    """Koordinator's binaries or CRDs are not built; the message says how to build them."""


def koord_dir(version: str = KOORD_VERSION) -> Path:
    return cache_dir() / "koord" / version


def find_koordinator(version: str = KOORD_VERSION) -> dict[str, Path]:
    """The three binaries and the CRD directory (key ``crd``); raises
    :class:`KoordinatorUnavailable` naming what is missing."""
    root = koord_dir(version)
    found = {name: root / "bin" / name for name in BINARIES}
    missing = [name for name, path in found.items() if not os.access(path, os.X_OK)]
    crd = root / "crd"
    if not crd.is_dir() or not list(crd.glob("*.yaml")):
        missing.append("CRDs")
    if missing:
        raise KoordinatorUnavailable(
            f"Koordinator {version}: {', '.join(missing)} not in {root}; run scripts/install-koord.sh (`make koord`)"
        )
    return {**found, "crd": crd}


def scheduler_config(kubeconfig: Path) -> dict[str, Any]:
    """koord-scheduler's configuration: one profile named :data:`SCHEDULER_NAME` with
    DeviceShare and Reservation (see the module docstring), no leader election."""
    both = {"enabled": [{"name": "Reservation"}, {"name": "DeviceShare"}]}
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "preFilter": both,
                    "filter": both,
                    "postFilter": {"enabled": [{"name": "Reservation"}]},
                    "preScore": {"enabled": [{"name": "Reservation"}]},
                    "score": {
                        "enabled": [{"name": "Reservation", "weight": 5000}, {"name": "DeviceShare", "weight": 1}]
                    },
                    "reserve": both,
                    "preBind": both,
                },
            }
        ],
    }


def koordlet_argv(
    binary: Path,
    *,
    kubeconfig: Path,
    var_run: Path,
    hooks_socket: Path,
    hooks_config: Path,
    cgroup_root: Path,
    sys_root: Path,
    addr: str,
    pprof_addr: str,
    gates: dict[str, bool] = KOORDLET_GATES,
) -> list[str]:
    """koordlet on the host (``agent_mode=hostMode`` in its environment): NRI on
    ``<var_run>/nri/nri.sock``, its own runtime-hooks socket ``hooks_socket``, the kubelet
    through its secure port with ``kubeconfig``'s credentials."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items()),
        "--enable-nri-runtime-hook=true",
        f"--var-run-root-dir={var_run}",
        "--runtime-hooks-nri-socket-path=nri/nri.sock",
        f"--runtime-hooks-addr={hooks_socket}",
        f"--runtime-hooks-config-path={hooks_config}",
        f"--cgroup-root-dir={cgroup_root}",
        f"--sys-root-dir={sys_root}",
        f"--addr={addr}",
        f"--pprof-addr={pprof_addr}",
        "--kubelet-preferred-address-type=InternalIP",
        "--v=4",
    ]


def apply_crds(cluster: Any, crd_dir: Path) -> None:
    """``kubectl apply --server-side`` of every CRD in ``crd_dir``, then wait until each is
    Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir))
    names = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names))


@dataclass
class Koordinator:
    """koord-manager, koord-scheduler and koordlet for ``cluster`` and its real ``node``.

    ``driver_lib``: the directory holding the fake driver's ``libnvidia-ml.so.1`` (and its
    ``fakegpu.conf``) koordlet loads as the host driver; ``workdir``: configs, logs, scratch
    directories."""

    cluster: Any
    node: Any
    driver_lib: Path
    workdir: Path
    version: str = KOORD_VERSION
    koordlet_gates: dict[str, bool] = field(default_factory=lambda: dict(KOORDLET_GATES))
    components: dict[str, Component] = field(default_factory=dict, init=False)

    def start(self, manager: bool = True, scheduler: bool = True, koordlet: bool = True) -> Koordinator:
        found = find_koordinator(self.version)
        self.workdir.mkdir(parents=True, exist_ok=True)
        apply_crds(self.cluster, found["crd"])
        kubeconfig = Path(self.cluster.kubeconfig)
        if manager:
            # the namespace its config maps and leases live in
            self.cluster.api(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "koordinator-system"}},
                expect=(200, 201, 409),
            )
            # the noderesource controller resets every extended resource of a node (the
            # GPUDeviceResource plugin's koordinator.sh/gpu* included) while colocation is off,
            # its default: turned on in koord-manager's config map
            self.cluster.api(
                "POST",
                "/api/v1/namespaces/koordinator-system/configmaps",
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "slo-controller-config"},
                    "data": {"colocation-config": '{"enable": true}'},
                },
                expect=(200, 201, 409),
            )
            self._launch(
                "koord-manager",
                [
                    str(found["koord-manager"]),
                    f"--kubeconfig={kubeconfig}",
                    "--enable-leader-election=false",
                    "--feature-gates=WebhookFramework=false,EnableSyncGPUSharedResource=true",
                    "--controllers=noderesource,nodeslo,nodemetric",
                    "--noderesource-plugins=GPUDeviceResource",
                    f"--health-probe-addr=127.0.0.1:{free_port()}",
                    f"--metrics-addr=127.0.0.1:{free_port()}",
                    "--enable-pprof=false",
                    "--v=4",
                ],
            )
        if scheduler:
            config = self.workdir / "koord-scheduler.yaml"
            config.write_text(yaml.safe_dump(scheduler_config(kubeconfig), sort_keys=False))
            self._launch(
                "koord-scheduler",
                [str(found["koord-scheduler"]), f"--config={config}", "--secure-port=0", "--v=3"],
            )
        if koordlet:
            self.start_koordlet(found["koordlet"], kubeconfig)
        return self

    def start_koordlet(self, binary: Path, kubeconfig: Path) -> Component:
        cgroup_root = self._cgroup_root()
        sys_root = self._sys_root()
        argv = koordlet_argv(
            binary,
            kubeconfig=kubeconfig,
            var_run=Path(self.node.nri_socket).parent.parent,
            hooks_socket=self.workdir / "koordlet.sock",
            hooks_config=self._hooks_config(),
            cgroup_root=cgroup_root,
            sys_root=sys_root,
            addr=f"127.0.0.1:{free_port()}",
            pprof_addr=f"127.0.0.1:{free_port()}",
            gates=self.koordlet_gates,
        )
        env = {
            **os.environ,
            "agent_mode": "hostMode",
            "NODE_NAME": self.node.name,
            "LD_LIBRARY_PATH": str(self.driver_lib),
        }
        return self._launch("koordlet", argv, env=env)

    def _hooks_config(self) -> Path:
        """Where koordlet writes ``koordlet.json`` for its proxy-mode hooks (host mode:
        ``/etc/runtime/hookserver.d``, which it does not create, and stops without)."""
        path = self.workdir / "hookserver.d"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _cgroup_root(self) -> Path:
        """koordlet looks for ``<cgroup root>/<controller>/kubepods`` (a fixed name); the real
        node's kubelet puts its pods under ``<controller>/hami-real-node/kubepods`` (its
        ``cgroupRoot``), so koordlet gets a scratch root whose ``<controller>`` entries link to
        the node's directories."""
        root = self.workdir / "cgroup"
        root.mkdir(parents=True, exist_ok=True)
        for controller in sorted(CGROUP_FS.iterdir()):
            link = root / controller.name
            if link.is_symlink() or link.exists():
                continue
            node_dir = controller / CGROUP_ROOT
            link.symlink_to(node_dir if node_dir.is_dir() else controller)
        return root

    def _sys_root(self) -> Path:
        """A scratch ``/sys`` for koordlet's GPU collector: ``bus/pci/devices/<bus id>`` with
        ``numa_node`` for each fake GPU (the fake bus ids have no entry in the real /sys), the
        rest of what koordlet reads there linked from the host."""
        root = self.workdir / "sys"
        root.mkdir(parents=True, exist_ok=True)
        for entry in Path("/sys").iterdir():  # everything but bus/ links to the host's
            link = root / entry.name
            if entry.name != "bus" and not link.is_symlink():
                link.symlink_to(entry)
        devices = root / "bus" / "pci" / "devices"
        devices.mkdir(parents=True, exist_ok=True)
        for entry in Path("/sys/bus").iterdir():  # NUMA nodes (bus/node) and the rest
            link = root / "bus" / entry.name
            if entry.name != "pci" and not link.is_symlink():
                link.symlink_to(entry)
        for bus_id in self.gpu_bus_ids():
            real = root / "fake-pci" / "pci0000:00" / bus_id
            real.mkdir(parents=True, exist_ok=True)
            (real / "numa_node").write_text("0\n")
            link = devices / bus_id
            if not link.is_symlink():
                link.symlink_to(real)
        return root

    def gpu_bus_ids(self) -> list[str]:
        """The fake GPUs' PCI bus ids as the fake NVML reports them (``nvidia-smi`` is not
        there: asked through a one-line ctypes call in a child process)."""
        script = (
            "import ctypes,sys\n"
            "n=ctypes.CDLL('libnvidia-ml.so.1');assert n.nvmlInit_v2()==0\n"
            "c=ctypes.c_uint();n.nvmlDeviceGetCount_v2(ctypes.byref(c))\n"
            "class P(ctypes.Structure):_fields_=[('legacy',ctypes.c_char*16),('domain',ctypes.c_uint),"
            "('bus',ctypes.c_uint),('device',ctypes.c_uint),('pciDeviceId',ctypes.c_uint),"
            "('pciSubSystemId',ctypes.c_uint),('busId',ctypes.c_char*32)]\n"
            "for i in range(c.value):\n"
            " h=ctypes.c_void_p();n.nvmlDeviceGetHandleByIndex_v2(i,ctypes.byref(h));p=P()\n"
            " assert n.nvmlDeviceGetPciInfo_v3(h,ctypes.byref(p))==0\n"
            " print('%04x:%02x:%02x.0'%(p.domain,p.bus,p.device))\n"
        )
        out = subprocess.run(
            ["python3", "-c", script],
            env={**os.environ, "LD_LIBRARY_PATH": str(self.driver_lib)},
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise ClusterError(f"reading the fake GPUs' bus ids failed: {out.stderr.strip()}")
        return [line.strip().lower() for line in out.stdout.splitlines() if line.strip()]

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Component:
        component = Component(name, argv, self.workdir / f"{name}.log", env=env)
        self.components[name] = component
        component.start()
        return component

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(
            f"===== {name} ({c.log_path}) =====\n{c.log_tail(lines)}" for name, c in self.components.items()
        )

    def stop(self) -> None:
        # koord-scheduler ignores SIGTERM while its informers sync: Component.stop kills after the grace
        for component in reversed(list(self.components.values())):
            component.stop(timeout=5.0)
        self.components.clear()


# -- hami-daemon -------------------------------------------------------------------------------

HAMI_DAEMON_NAMESPACE = "koordinator-system"
HAMI_DAEMON = "hami-daemon"
#: the chart's ``daemon.hamiCore.libvgpuSoVersion`` for our image (it carries this name)
LIBVGPU_SO_VERSION = "v2.10.0"
#: where koordlet mounts the library from, and the hami-daemon chart copies it to (host path)
HOOK_DIR = "/usr/local/vgpu"
MONITOR_PORT = 9394


def hami_daemon_objects(
    image: str,
    *,
    node: str,
    libvgpu_version: str = LIBVGPU_SO_VERSION,
    monitor: bool = True,
    driver: tuple[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The ``hami-daemon`` DaemonSet as Koordinator's chart writes it, with ``image`` as
    ``daemon.hamiCore.image`` and ``runAsUser: 0`` (``daemon.hamiCore.containerSecurityContext``;
    HAMi's image runs as root, ours as 65532), plus the service account the monitor reads pods
    with.

    The container copies ``/k8s-vgpu/lib/nvidia/libvgpu.so.<libvgpu_version>`` into the host's
    :data:`HOOK_DIR` and runs ``vGPUmonitor -v=4`` (port 9394, ``HOOK_PATH`` =
    :data:`HOOK_DIR`, whose ``containers`` directory koordlet's ``HamiCoreVGPUMonitor`` fills)
    or sleeps. ``driver``: ``(host dir, container dir)`` of the GPU driver, the part the NVIDIA
    container runtime plays on a real GPU node (``NVIDIA_VISIBLE_DEVICES=all``); the real node
    here has no such runtime, so the fake driver is mounted in its place. ``node``: the pod is
    pinned to it (the chart selects GPU nodes by label)."""
    tail = "vGPUmonitor -v=4" if monitor else "sleep infinity"
    command = f"cp -f /k8s-vgpu/lib/nvidia/libvgpu.so.{libvgpu_version} {HOOK_DIR}/libvgpu.so && {tail}"
    mounts = [{"name": "vgpu", "mountPath": HOOK_DIR}]
    volumes: list[dict[str, Any]] = [{"name": "vgpu", "hostPath": {"path": HOOK_DIR, "type": "DirectoryOrCreate"}}]
    if driver is not None:
        mounts.append({"name": "driver", "mountPath": driver[1], "readOnly": True})
        volumes.append({"name": "driver", "hostPath": {"path": driver[0], "type": "Directory"}})
    labels = {"app.kubernetes.io/name": HAMI_DAEMON}
    container = {
        "name": HAMI_DAEMON,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", command],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "HOOK_PATH", "value": HOOK_DIR},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        ],
        "ports": [{"name": "metrics", "containerPort": MONITOR_PORT}],
        "securityContext": {"runAsUser": 0},
        "volumeMounts": mounts,
    }
    meta = {"name": HAMI_DAEMON, "namespace": HAMI_DAEMON_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": HAMI_DAEMON},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": HAMI_DAEMON},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": HAMI_DAEMON},
            "subjects": [{"kind": "ServiceAccount", "name": HAMI_DAEMON, "namespace": HAMI_DAEMON_NAMESPACE}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {**meta, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": HAMI_DAEMON,
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [container],
                        "volumes": volumes,
                    },
                },
            },
        },
    ]
