"""Services on the real node: ``kube-proxy`` (iptables mode) and the API server's endpoint.

A pod's in-cluster configuration reaches the API server at the ``kubernetes`` Service
(``10.96.0.1:443``), and the API server reaches webhooks through their Services. In a real
cluster kube-proxy on every node turns Service addresses into endpoint addresses; here too:

- the API server of :class:`~hami_devkit.controlplane.KubeCluster` runs with
  ``apiserver_bind_address="0.0.0.0"``, so that it also answers on the node's address
  (:data:`hami_devkit.realnode.NODE_IP`, the pod bridge's gateway), which pods reach;
- the control plane runs ``--endpoint-reconciler-type=none`` (127.0.0.1 is no valid endpoint),
  so :class:`KubeProxy` publishes the ``kubernetes`` Service's endpoint itself: an
  EndpointSlice naming ``<node IP>:<API server port>``, as the API server's own reconciler
  would for an API server advertised on the node's address;
- ``kube-proxy`` runs as the node's proxier (user ``system:kube-proxy``, bound by the
  bootstrap ClusterRoleBinding ``system:node-proxier``), in iptables mode, with the pod subnet
  as its cluster CIDR (traffic from outside it to a Service is masqueraded, so the API
  server's calls to a webhook pod come back), NodePorts only on the node's address, and no
  change to the host's conntrack limits or ``route_localnet``.

:meth:`KubeProxy.stop` stops it, removes its iptables rules (``kube-proxy --cleanup``) and the
EndpointSlice; :meth:`KubeProxy.start` first removes what a killed predecessor left. Only one
real node runs per machine (:class:`hami_devkit.realnode.MachineLock`), so the rules are ours.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami_devkit.controlplane import KubeCluster
from hami_devkit.errors import ClusterError
from hami_devkit.process import Component, free_port, http_get

#: the EndpointSlice of the ``kubernetes`` Service that points at the node's address
ENDPOINT_SLICE = "kubernetes-hami-real-node"
MANAGED_BY = "hami-dev-real-node"
#: chains kube-proxy makes in iptables mode (checked after ``--cleanup``)
PROXY_CHAINS = (
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-PROXY-CANARY",
)


class KubeProxyError(ClusterError):
    """kube-proxy could not be started or stopped."""


def proxy_config(
    *, kubeconfig: Path, node: str, node_ip: str, cluster_cidr: str, healthz_port: int, metrics_port: int
) -> dict[str, Any]:
    """The ``KubeProxyConfiguration`` (see the module docstring)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "nodePortAddresses": [f"{node_ip}/32"],
        # leave the host's conntrack table size and timeouts alone
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        # no NodePorts on 127.0.0.1: kube-proxy would set route_localnet on the host for them
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        "oomScoreAdj": 0,  # lowering it needs CAP_SYS_RESOURCE, which these machines lack
    }


def apiserver_endpoint_slice(node_ip: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": ENDPOINT_SLICE,
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }


def iptables_chains(names: tuple[str, ...] = PROXY_CHAINS) -> list[str]:
    """``table/chain`` of kube-proxy's chains present now (IPv4)."""
    present = []
    for table in ("nat", "filter"):
        listing = subprocess.run(
            ["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
        ).stdout.split()
        present += [f"{table}/{chain}" for chain in names if chain in listing]
    return present


def nat_rules() -> str:
    """The IPv4 nat table as ``iptables -S`` prints it."""
    return subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=False).stdout


@dataclass
class KubeProxy:
    """kube-proxy for the real node ``node`` (a :class:`hami_devkit.realnode.RealNode`) of ``cluster``."""

    cluster: KubeCluster
    node: Any
    component: Component | None = field(default=None, init=False)

    def start(self) -> KubeProxy:
        binaries = self.cluster.binaries or {}
        if "kube-proxy" not in binaries:
            raise KubeProxyError("kube-proxy is not installed (run scripts/install-kube.sh)")
        if self.cluster.apiserver_bind_address == "127.0.0.1":
            raise KubeProxyError(
                "the API server listens on 127.0.0.1 only: pods cannot reach it; start the "
                "cluster with apiserver_bind_address='0.0.0.0'"
            )
        from hami_devkit.realnode import NODE_IP, POD_SUBNET

        workdir = Path(self.node.workdir) / "kube-proxy"
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.cluster.write_kubeconfig(
            workdir / "kubeconfig", pair=self.cluster.issue_client_cert("system:kube-proxy")
        )
        self.cluster.api(
            "POST",
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
            apiserver_endpoint_slice(NODE_IP, self.cluster.ports["kube-apiserver"]),
            expect=(201, 409),
        )
        # rules a killed predecessor left (this machine's real node is ours: MachineLock)
        subprocess.run([str(binaries["kube-proxy"]), "--cleanup"], capture_output=True, check=False, timeout=60)
        healthz = free_port()
        config = workdir / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                proxy_config(
                    kubeconfig=kubeconfig,
                    node=self.node.name,
                    node_ip=NODE_IP,
                    cluster_cidr=POD_SUBNET,
                    healthz_port=healthz,
                    metrics_port=free_port(),
                ),
                sort_keys=False,
            )
        )
        self.component = Component(
            "kube-proxy", [str(binaries["kube-proxy"]), f"--config={config}", "--v=1"], workdir / "kube-proxy.log"
        )
        self.component.start()
        deadline = time.monotonic() + 60
        while http_get(f"http://127.0.0.1:{healthz}/healthz")[0] != 200:
            if not self.component.alive():
                raise KubeProxyError(f"kube-proxy exited during start-up:\n{self.component.log_tail()}")
            if time.monotonic() > deadline:
                raise KubeProxyError(f"kube-proxy not healthy after 60s:\n{self.component.log_tail()}")
            time.sleep(0.2)
        # healthy is not programmed: until the kubernetes Service's DNAT rule is in, a connection
        # to 10.96.0.1:443 leaves the machine (and meets whatever answers there)
        target = f"--to-destination {NODE_IP}:{self.cluster.ports['kube-apiserver']}"
        while target not in nat_rules():
            if not self.component.alive():
                raise KubeProxyError(f"kube-proxy exited during start-up:\n{self.component.log_tail()}")
            if time.monotonic() > deadline:
                raise KubeProxyError(
                    f"kube-proxy made no rule {target!r} for the kubernetes Service in 60s:\n{self.component.log_tail()}"
                )
            time.sleep(0.2)
        return self

    def stop(self) -> list[str]:
        """Stop kube-proxy, remove its rules and the EndpointSlice; returns what was left."""
        problems = []
        if self.component is not None:
            self.component.stop()
            self.component = None
            binary = (self.cluster.binaries or {}).get("kube-proxy")
            if binary:
                subprocess.run([str(binary), "--cleanup"], capture_output=True, check=False, timeout=60)
            left = iptables_chains()
            if left:
                problems.append(f"kube-proxy chains left: {', '.join(left)}")
        try:
            self.cluster.api(
                "DELETE",
                f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/{ENDPOINT_SLICE}",
                expect=(200, 404),
            )
        except Exception as exc:  # the cluster may be gone already
            problems.append(f"EndpointSlice {ENDPOINT_SLICE}: {exc}")
        return problems

    def log_tail(self, lines: int = 40) -> str:
        return self.component.log_tail(lines) if self.component else ""
