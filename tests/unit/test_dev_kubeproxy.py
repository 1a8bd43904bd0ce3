"""kube-proxy for the real node: its configuration and the API server's EndpointSlice (pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_devkit import kubeproxy as kp
from hami_devkit.controlplane import KubeCluster


def test_proxy_config_keeps_to_the_node_and_leaves_the_host_alone():
    config = kp.proxy_config(
        kubeconfig=Path("/k"),
        node="n",
        node_ip="10.88.64.1",
        cluster_cidr="10.88.64.0/24",
        healthz_port=1,
        metrics_port=2,
    )
    assert (config["kind"], config["mode"], config["hostnameOverride"]) == ("KubeProxyConfiguration", "iptables", "n")
    assert config["nodePortAddresses"] == ["10.88.64.1/32"]  # NodePorts on the node's address only
    assert config["iptables"]["localhostNodePorts"] is False  # no route_localnet on the host
    assert config["conntrack"]["maxPerCore"] == 0 and config["conntrack"]["min"] == 0  # host limits untouched
    assert config["healthzBindAddress"] == "127.0.0.1:1" and config["metricsBindAddress"] == "127.0.0.1:2"
    assert config["clusterCIDR"] == "10.88.64.0/24" and config["clientConnection"]["kubeconfig"] == "/k"


def test_the_endpoint_slice_serves_the_kubernetes_service():
    eps = kp.apiserver_endpoint_slice("10.88.64.1", 6443)
    labels = eps["metadata"]["labels"]
    assert labels["kubernetes.io/service-name"] == "kubernetes" and eps["metadata"]["namespace"] == "default"
    assert labels["endpointslice.kubernetes.io/managed-by"] == kp.MANAGED_BY  # not the mirroring controller's
    assert eps["endpoints"] == [{"addresses": ["10.88.64.1"], "conditions": {"ready": True}}]
    assert eps["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]


def test_a_loopback_only_api_server_is_refused_with_the_fix():
    cluster = KubeCluster(binaries={"kube-proxy": Path("/bin/true")})
    with pytest.raises(kp.KubeProxyError, match="apiserver_bind_address='0.0.0.0'"):
        kp.KubeProxy(cluster, node=None).start()
    with pytest.raises(kp.KubeProxyError, match="kube-proxy is not installed"):
        kp.KubeProxy(KubeCluster(binaries={}), node=None).start()
