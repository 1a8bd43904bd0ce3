"""The real node's configuration documents (pure: no I/O): containerd's ``config.toml``, the
CNI network, the ``KubeletConfiguration``. :mod:`hami_devkit.realnode` writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hami_devkit.nodehost import BRIDGE, CGROUP_ROOT, POD_SUBNET


def containerd_config(
    root: Path,
    *,
    socket: Path,
    sandbox_image: str,
    cni_bin: Path,
    restrict_oom_score_adj: bool,
    cdi_dir: Path | None = None,
    nri_socket: Path | None = None,
) -> str:
    """containerd's ``config.toml`` (version 2, containerd 1.6/1.7) for a private instance under
    ``root``, listening on ``socket`` (and ``<socket>.ttrpc``). ``cdi_dir``: where the CRI plugin
    reads CDI specs (``enable_cdi``, containerd >= 1.7): the devices a DRA driver prepares.
    ``nri_socket``: enable NRI (containerd >= 1.7) with its socket there, not the host's
    ``/var/run/nri/nri.sock``, for external plugins only (no plugin directory is scanned):
    the device plugin's ``--injection=nri`` registers on it."""

    def q(value: object) -> str:
        return json.dumps(str(value))  # a TOML basic string is a JSON string

    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return "\n".join(
        [
            "version = 2",
            f"root = {q(root / 'root')}",
            f"state = {q(root / 'state')}",
            # snapshotters that cannot work here (and would only log errors)
            'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
            ' "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]',
            "[grpc]",
            f"  address = {q(socket)}",
            "[ttrpc]",
            '  address = ""',
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {q(root / 'opt')}",
            cri,
            f"  sandbox_image = {q(sandbox_image)}",
            f"  restrict_oom_score_adj = {'true' if restrict_oom_score_adj else 'false'}",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "  enable_selinux = false",
            "  disable_apparmor = true",
            "  netns_mounts_under_state_dir = true",
            *(["  enable_cdi = true", f"  cdi_spec_dirs = [{q(cdi_dir)}]"] if cdi_dir is not None else []),
            f"{cri[:-1]}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"{cri[:-1]}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{cri[:-1]}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            f"{cri[:-1]}.cni]",
            f"  bin_dir = {q(cni_bin)}",
            f"  conf_dir = {q(root.parent / 'cni' / 'net.d')}",
            *(_nri_section(root, nri_socket, q) if nri_socket is not None else []),
            "",
        ]
    )


def _nri_section(root: Path, socket: Path, q: Any) -> list[str]:
    return [
        '[plugins."io.containerd.nri.v1.nri"]',
        "  disable = false",
        "  disable_connections = false",
        f"  socket_path = {q(socket)}",
        f"  plugin_path = {q(root / 'nri' / 'plugins')}",
        f"  plugin_config_path = {q(root / 'nri' / 'conf')}",
    ]


def cni_config(ipam_dir: Path, *, bridge: str = BRIDGE, subnet: str = POD_SUBNET) -> dict[str, Any]:
    """A bridge network with host-local addresses; no masquerading (nothing outside loopback is
    reachable anyway), so no iptables rules are left to clean up."""
    return {
        "cniVersion": "0.4.0",
        "name": "hami-real-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def kubelet_config(
    *,
    address: str,
    port: int,
    healthz_port: int,
    socket: Path,
    ca: Path,
    cert: Path,
    key: Path,
    pod_logs: Path,
    cgroup_root: str = CGROUP_ROOT,
    max_pods: int = 110,
) -> dict[str, Any]:
    """The ``KubeletConfiguration`` of the real node (see the module docstring)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        # who may call the kubelet: clients with a certificate of the cluster CA (the API
        # server), each request authorized by the API server (SubjectAccessReview)
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_root}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "podLogsDir": str(pod_logs),
        "imageGCHighThresholdPercent": 100,  # 100: image garbage collection off
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "maxPods": max_pods,
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "volumePluginDir": str(pod_logs.parent / "volume-plugins"),
    }
