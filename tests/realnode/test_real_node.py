"""The real node of the test harness: it goes Ready, runs a pod whose output is readable, lets
``kubectl logs``/``exec`` through, refuses a second real node, and leaves nothing behind."""

from __future__ import annotations

import atexit
import http.client
import ipaddress
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hami_devkit.binaries import KUBE_VERSION
from hami_devkit import realnode as rn
from hami_devkit.cluster import KubeCluster, bin_dir
from hami_devkit.realnode import RealNode

pytestmark = [pytest.mark.integration, pytest.mark.realnode]


def _pod(name: str, image: str, node: str, command: list[str], **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}],
            **spec,
        },
    }


def _wait_phase(
    cluster: KubeCluster, namespace: str, name: str, phases: tuple[str, ...], timeout: float = 90.0
) -> dict:
    def probe():
        pod = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod if pod.get("status", {}).get("phase") in phases else None

    return cluster.wait_for(probe, f"pod {namespace}/{name} in {'/'.join(phases)}", timeout=timeout, interval=0.2)


def test_the_node_is_ready_with_its_labels_and_runtime(real_cluster: KubeCluster, real_node: RealNode):
    node = real_cluster.api("GET", f"/api/v1/nodes/{real_node.name}")
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert node["metadata"]["labels"]["gpu"] == "on"
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == KUBE_VERSION
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == rn.NODE_IP
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == real_node.kubelet_port
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == "node.kubernetes.io/not-ready"]


def test_a_busybox_pod_runs_to_completion_and_its_output_is_readable(
    real_cluster: KubeCluster, real_node: RealNode, busybox: str, real_namespace: str
):
    script = "echo hello from $(hostname) > /dev/termination-log; echo line-one; echo line-two; cat /proc/1/cgroup"
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{real_namespace}/pods",
        _pod("hello", busybox, real_node.name, ["sh", "-c", script]),
    )
    pod = _wait_phase(real_cluster, real_namespace, "hello", ("Succeeded", "Failed"))
    (status,) = pod["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert (pod["status"]["phase"], terminated["exitCode"]) == ("Succeeded", 0), terminated
    assert terminated["message"].strip() == "hello from hello"
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(rn.POD_SUBNET)
    # the log, through the API server and the kubelet (kubectl logs)
    logs = real_cluster.kubectl("logs", "-n", real_namespace, "hello").stdout.splitlines()
    assert logs[:2] == ["line-one", "line-two"]
    assert any(f"/{rn.CGROUP_ROOT}/kubepods" in line for line in logs[2:]), logs  # the node's cgroupRoot
    # and on disk, where the kubelet keeps it
    files = list(real_node.pod_logs_dir.glob(f"{real_namespace}_hello_*/main/*.log"))
    assert files and "line-one" in files[0].read_text()


def test_kubectl_exec_reaches_a_running_container(
    real_cluster: KubeCluster, real_node: RealNode, busybox: str, real_namespace: str
):
    real_cluster.api(
        "POST", f"/api/v1/namespaces/{real_namespace}/pods", _pod("sleeper", busybox, real_node.name, ["sleep", "3600"])
    )
    _wait_phase(real_cluster, real_namespace, "sleeper", ("Running",))
    result = real_cluster.kubectl("exec", "-n", real_namespace, "sleeper", "--", "sh", "-c", "echo $((6 * 7))")
    assert result.stdout.strip() == "42"


def test_in_cluster_clients_reach_the_api_server_at_the_kubernetes_service_address(
    real_cluster: KubeCluster, real_node: RealNode, busybox: str, real_namespace: str
):
    # from the host network (as a hostNetwork pod would), TLS checked against the cluster CA
    context = ssl.create_default_context(cadata=real_cluster.ca_pem.decode())
    connection = http.client.HTTPSConnection(rn.API_SERVICE_IP, 443, context=context, timeout=10)
    connection.request("GET", "/version")
    assert json.loads(connection.getresponse().read())["gitVersion"] == KUBE_VERSION
    connection.close()
    # from a pod on the bridge, with the address the kubelet gives it (busybox's TLS client has
    # no cipher suite in common with the API server: plain HTTP to its TLS port gets Go's answer)
    script = (
        "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; "
        "printf 'GET /version HTTP/1.0\\r\\n\\r\\n' | nc $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT"
    )
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{real_namespace}/pods",
        _pod("incluster", busybox, real_node.name, ["sh", "-c", script]),
    )
    pod = _wait_phase(real_cluster, real_namespace, "incluster", ("Succeeded", "Failed"))
    logs = real_cluster.kubectl("logs", "-n", real_namespace, "incluster").stdout
    assert pod["status"]["phase"] == "Succeeded", logs
    first, rest = logs.split("\n", 1)
    assert first == f"{rn.API_SERVICE_IP}:443"
    assert "Client sent an HTTP request to an HTTPS server" in rest, rest


def test_the_api_server_answers_this_machine_and_the_node_s_pods_only(real_cluster: KubeCluster, real_node: RealNode):
    """The API server listens on every address (pods reach it through kube-proxy); another
    machine must not reach it. "Another machine" is a network namespace on a veth link: it
    reaches a listener on the host's address there, but not the API server's port."""
    port = real_cluster.ports["kube-apiserver"]
    # Short, per-run names (an interface name is at most 15 bytes) so a run killed before its
    # cleanup leaves nothing this one trips over.
    tag = f"{os.getpid() % 100000}"
    outer, inner = f"hmo{tag}a", f"hmo{tag}b"
    host_ip, peer_ip = "10.251.0.1", "10.251.0.2"

    def sh(*argv: str) -> str:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}"
        return done.stdout

    # The namespace is held by a process, not mounted under /run/netns: "ip netns add" needs a
    # bind mount that some CI sandboxes refuse, and leaves a name behind when a run is killed.
    holder = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", "echo ready; exec sleep 600"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready", "unshare --net did not start"
    enter = ["nsenter", f"--net=/proc/{holder.pid}/ns/net"]

    def connect(target_port: int) -> str:
        code = (
            "import socket,sys\n"
            "try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); print('connected')\n"
            "except OSError as e: print(type(e).__name__)"
        )
        return sh(*enter, sys.executable, "-c", code, host_ip, str(target_port)).strip()

    import socket as socket_module

    listener = socket_module.create_server(("0.0.0.0", 0))
    try:
        for stale in re.findall(r"^\d+: (hmo\d+a)[@:]", sh("ip", "-o", "link", "show"), re.M):
            subprocess.run(["ip", "link", "delete", stale], capture_output=True, check=False)
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", str(holder.pid))
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", outer)
        sh("ip", "link", "set", outer, "up")
        sh(*enter, "ip", "addr", "add", f"{peer_ip}/30", "dev", inner)
        sh(*enter, "ip", "link", "set", inner, "up")
        assert connect(listener.getsockname()[1]) == "connected"  # the path works
        assert connect(port) in ("TimeoutError", "timeout")  # dropped by the node's HAMI-APISERVER chain
    finally:
        listener.close()
        subprocess.run(["ip", "link", "delete", outer], capture_output=True, check=False)
        holder.kill()
        holder.wait()
    # and the node's pods still reach it (test_in_cluster_clients_reach_the_api_server_...)


def test_a_second_real_node_is_refused_and_touches_nothing(real_cluster: KubeCluster, real_node: RealNode):
    second = RealNode(real_cluster, name="hami-real-node-2")
    with pytest.raises(rn.RealNodeBusy, match=rf"held by pid {os.getpid()}, work directory {real_node.workdir}"):
        second.start()
    assert second.workdir is None and not second.components
    real_cluster.api("GET", f"/api/v1/nodes/{second.name}", expect=(404,))
    # the first one is unharmed
    assert real_cluster._ready_node(real_node.name)


def test_teardown_leaves_no_process_mount_link_or_cgroup(
    real_cluster: KubeCluster, real_node_holder, busybox: str, real_namespace: str
):
    node = real_node_holder.get()
    real_cluster.api(
        "POST", f"/api/v1/namespaces/{real_namespace}/pods", _pod("running", busybox, node.name, ["sleep", "3600"])
    )
    _wait_phase(real_cluster, real_namespace, "running", ("Running",))
    workdir = node.workdir
    # what a running pod puts on the host, so the checks below are not vacuous
    assert rn.processes_mentioning(f"{workdir}/"), "no kubelet/containerd/shim process seen"
    assert rn.mounts_under(workdir), "no mount under the work directory"
    assert rn.BRIDGE in rn.links_of() and len(rn.links_of()) >= 2, rn.links_of()
    assert any(p.name.startswith("pod") for p in rn.pod_cgroups()), "no pod cgroup"
    assert (rn.DEVICE_PLUGINS_DIR / "kubelet.sock").exists()
    sockets = rn.shim_sockets(workdir)
    assert sockets and all(socket.is_socket() for socket in sockets)
    assert rn.kubelet_chains()

    assert real_node_holder.stop() == []

    assert rn.processes_mentioning(f"{workdir}/") == []
    assert rn.processes_mentioning(str(rn.CONTAINERD_SOCKET)) == []
    assert rn.mounts_under(workdir) == []
    assert rn.links_of() == []
    assert rn.pod_cgroups() == []
    assert not (rn.DEVICE_PLUGINS_DIR / "kubelet.sock").exists()
    assert not [socket for socket in sockets if socket.exists()]
    assert rn.kubelet_chains() == []
    assert not Path(workdir).exists()
    real_cluster.api("GET", f"/api/v1/nodes/{node.name}", expect=(404,))
    lock = rn.MachineLock()
    lock.acquire()  # free again
    lock.release()


def test_what_a_dead_holder_left_is_cleaned_by_the_next_node(
    real_cluster: KubeCluster, real_node_holder, busybox: str, real_namespace: str
):
    node = real_node_holder.get()
    real_cluster.api(
        "POST", f"/api/v1/namespaces/{real_namespace}/pods", _pod("orphan", busybox, node.name, ["sleep", "3600"])
    )
    _wait_phase(real_cluster, real_namespace, "orphan", ("Running",))
    workdir = node.workdir
    shims = rn.processes_mentioning(str(rn.CONTAINERD_SOCKET))
    sockets = rn.shim_sockets(workdir)
    assert shims and sockets
    # the holder dies: kubelet and containerd are killed, the lock goes with the process, its
    # record stays; containerd's shims and the pod's processes live on
    for component in node.components.values():
        os.killpg(component.process.pid, signal.SIGKILL)
        component.process.wait()
    os.close(node._lock._fd)
    node._lock._fd = None
    atexit.unregister(node.stop)
    real_node_holder.node = None
    assert [pid for pid in shims if rn.alive(pid)] and rn.mounts_under(workdir)

    fresh = real_node_holder.get()
    assert "clean previous" in fresh.timings
    assert rn.processes_mentioning(f"{workdir}/") == []
    assert not [pid for pid in shims if rn.alive(pid)]
    assert not [socket for socket in sockets if socket.exists()]
    assert rn.mounts_under(workdir) == []
    assert not workdir.exists()
    assert real_cluster._ready_node(fresh.name)


def test_cli_up_with_real_node_and_down(real_node_holder, tmp_path):
    """``hami-dev cluster up --real-node`` then ``down``: the node is Ready in between, nothing
    is left after."""
    real_node_holder.stop()  # one real node per machine: hand the lock to the CLI's
    env = {**os.environ, "HAMI_CACHE": str(tmp_path), "HAMI_KUBE_BIN": str(bin_dir())}
    hami_dev = [sys.executable, "-m", "hami_devkit", "cluster"]
    # another checkout's tests may hold this machine's real node: wait for it as the fixture does
    up = subprocess.run(
        [*hami_dev, "up", "--real-node", "--nodes", "1", "--wait-for-real-node", str(real_node_holder.lock_wait)],
        env=env,
        capture_output=True,
        text=True,
        timeout=real_node_holder.lock_wait + 400,
    )
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        assert "real node hami-real-node Ready in" in up.stdout
        state = json.loads((tmp_path / "dev-cluster" / "state.json").read_text())
        kubeconfig = state["env"]["KUBECONFIG"]
        kubectl = Path(state["bin"]) / "kubectl"
        nodes = subprocess.run(
            [str(kubectl), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        ready = {
            n["metadata"]["name"]: any(
                c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]
            )
            for n in json.loads(nodes)["items"]
        }
        assert ready == {"kwok-node-0": True, "hami-real-node": True}
        assert Path(state["real_node"]["containerd_socket"]).is_socket()
        workdir = Path(state["real_node"]["workdir"])
        assert f"work directory {workdir}" in up.stdout
    finally:
        down = subprocess.run([*hami_dev, "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr + down.stdout
    deadline = time.monotonic() + 30
    while rn.processes_mentioning(f"{workdir}/") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rn.processes_mentioning(f"{workdir}/") == []
    assert rn.mounts_under(workdir) == [] and rn.links_of() == [] and rn.pod_cgroups() == []
    assert rn.kubelet_chains() == [] and not workdir.exists()
