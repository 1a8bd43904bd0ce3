"""The pure parts of the real node: its configuration documents, the lock, mount and
capability parsing, and what it reports missing. The node itself is tested in tests/realnode/."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hami_devkit import realnode as rn


def test_containerd_config_is_private_and_uses_the_local_pause_image(tmp_path):
    doc = tomllib.loads(
        rn.containerd_config(
            tmp_path / "containerd",
            socket=tmp_path / "c.sock",
            sandbox_image="localhost/hami/pause:3.10",
            cni_bin=Path("/usr/lib/cni"),
            restrict_oom_score_adj=True,
        )
    )
    assert doc["version"] == 2
    assert doc["root"] == str(tmp_path / "containerd" / "root")
    assert doc["state"] == str(tmp_path / "containerd" / "state")
    assert doc["grpc"]["address"] == str(tmp_path / "c.sock")
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "localhost/hami/pause:3.10"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["netns_mounts_under_state_dir"] is True  # pod netns mounts stay in the work dir
    assert cri["stream_server_port"] == "0"  # no fixed port to collide on
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": str(tmp_path / "cni" / "net.d")}
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2" and runc["options"]["SystemdCgroup"] is False
    assert doc["plugins"]["io.containerd.internal.v1.opt"]["path"] == str(tmp_path / "containerd" / "opt")


def test_oom_score_restriction_follows_the_flag(tmp_path):
    doc = tomllib.loads(
        rn.containerd_config(
            tmp_path, socket=tmp_path / "s", sandbox_image="p", cni_bin=tmp_path, restrict_oom_score_adj=False
        )
    )
    assert doc["plugins"]["io.containerd.grpc.v1.cri"]["restrict_oom_score_adj"] is False
    assert "enable_cdi" not in doc["plugins"]["io.containerd.grpc.v1.cri"]


def test_containerd_config_reads_cdi_specs_from_the_nodes_directory(tmp_path):
    doc = tomllib.loads(
        rn.containerd_config(
            tmp_path,
            socket=tmp_path / "s",
            sandbox_image="p",
            cni_bin=tmp_path,
            restrict_oom_score_adj=True,
            cdi_dir=tmp_path / "cdi",
        )
    )
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == [str(tmp_path / "cdi")]


def test_containerd_config_quotes_paths(tmp_path):
    odd = tmp_path / 'a "quoted" dir'
    doc = tomllib.loads(
        rn.containerd_config(odd, socket=odd / "s", sandbox_image="p", cni_bin=odd, restrict_oom_score_adj=True)
    )
    assert doc["root"] == str(odd / "root")


def test_has_capability_reads_the_effective_set():
    status = "Name:\tx\nCapEff:\t000001fffeffffff\n"
    assert rn.has_capability(21, status) is True  # CAP_SYS_ADMIN
    assert rn.has_capability(rn.CAP_SYS_RESOURCE, status) is False
    assert rn.has_capability(rn.CAP_SYS_RESOURCE, "CapEff:\t000001ffffffffff\n") is True
    assert rn.has_capability(0, "Name:\tx\n") is False


def test_cni_config_is_a_bridge_without_masquerade(tmp_path):
    doc = rn.cni_config(tmp_path / "ipam")
    (plugin,) = doc["plugins"]
    assert plugin["type"] == "bridge" and plugin["bridge"] == rn.BRIDGE and plugin["ipMasq"] is False
    assert plugin["ipam"]["dataDir"] == str(tmp_path / "ipam")
    assert plugin["ipam"]["ranges"] == [[{"subnet": rn.POD_SUBNET}]]


def test_kubelet_config_serves_on_the_node_address_with_authentication(tmp_path):
    doc = rn.kubelet_config(
        address="10.88.64.1",
        port=10250,
        healthz_port=10248,
        socket=tmp_path / "c.sock",
        ca=tmp_path / "ca.crt",
        cert=tmp_path / "k.crt",
        key=tmp_path / "k.key",
        pod_logs=tmp_path / "logs",
    )
    assert (doc["address"], doc["port"], doc["readOnlyPort"]) == ("10.88.64.1", 10250, 0)
    assert doc["healthzBindAddress"] == "127.0.0.1"
    assert doc["authentication"]["anonymous"]["enabled"] is False
    assert doc["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca.crt")
    assert doc["authorization"]["mode"] == "Webhook"
    assert doc["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'c.sock'}"
    assert (doc["cgroupDriver"], doc["failSwapOn"], doc["failCgroupV1"]) == ("cgroupfs", False, False)
    assert doc["cgroupRoot"] == "/" + rn.CGROUP_ROOT
    assert doc["imageGCHighThresholdPercent"] == 100
    assert doc["podLogsDir"] == str(tmp_path / "logs")


def test_mounts_under_lists_deepest_first_and_only_below_root():
    mountinfo = "\n".join(
        [
            "1 0 8:1 / / rw - ext4 /dev/vda rw",
            "2 1 0:5 / /tmp/w rw - tmpfs tmpfs rw",
            "3 2 0:6 / /tmp/w/kubelet/pods/x/volumes/a rw - tmpfs tmpfs rw",
            "4 2 0:7 / /tmp/w/containerd/state/netns/cni-1 rw - nsfs nsfs rw",
            "5 1 0:8 / /tmp/wx rw - tmpfs tmpfs rw",
            r"6 2 0:9 / /tmp/w/with\040space rw - tmpfs tmpfs rw",
        ]
    )
    found = rn.mounts_under(Path("/tmp/w"), mountinfo)
    assert found[-1] == Path("/tmp/w")
    assert Path("/tmp/wx") not in found
    assert Path("/tmp/w/with space") in found
    assert found.index(Path("/tmp/w/kubelet/pods/x/volumes/a")) < found.index(Path("/tmp/w/with space"))
    assert len(found) == 4


def test_the_lock_refuses_a_second_holder_and_names_the_first(tmp_path):
    path = tmp_path / "node.lock"
    first, second = rn.MachineLock(path), rn.MachineLock(path)
    assert first.acquire() == {}
    first.record(workdir="/tmp/first")
    with pytest.raises(rn.RealNodeBusy, match=r"held by pid \d+, work directory /tmp/first"):
        second.acquire()
    first.release()
    assert second.acquire() == {}  # a clean release leaves no record behind
    second.release()


def test_a_dead_holders_record_is_handed_to_the_next(tmp_path):
    path = tmp_path / "node.lock"
    path.write_text('{"pid": 1, "workdir": "/tmp/crashed"}')  # the holder died without releasing
    lock = rn.MachineLock(path)
    assert lock.acquire()["workdir"] == "/tmp/crashed"
    lock.release()


def test_missing_requirements_name_each_gap(monkeypatch):
    monkeypatch.setattr(rn.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(rn.shutil, "which", lambda name: None if name == "runc" else f"/usr/bin/{name}")
    monkeypatch.setattr(rn, "CNI_BIN_DIRS", (Path("/nonexistent/cni"),))
    missing = rn.missing_requirements({})
    assert any(item.startswith("root") for item in missing)
    assert any(item.startswith("kubelet (run scripts/install-kube.sh") for item in missing)
    assert any(item.startswith("containerd (run scripts/install-kube.sh") for item in missing)
    assert any(item.startswith("ctr (run scripts/install-kube.sh") for item in missing)
    built = {"kubelet": Path("k"), "containerd": Path("c"), "ctr": Path("t"), "containerd-shim-runc-v2": Path("s")}
    assert not [item for item in rn.missing_requirements(built) if "install-kube.sh" in item]
    assert any(item.startswith("runc (run scripts/install-node.sh") for item in missing)
    assert any("CNI plugins" in item and "/nonexistent/cni" in item for item in missing)
    assert "root" in str(rn.RealNodeUnavailable(missing)) and "\n" not in str(rn.RealNodeUnavailable(missing))


def test_the_lock_waits_for_a_holder_that_lets_go(tmp_path):
    import threading

    path = tmp_path / "node.lock"
    first, second = rn.MachineLock(path), rn.MachineLock(path)
    first.acquire()
    releaser = threading.Timer(0.3, first.release)
    releaser.start()
    second.acquire(wait=30)  # returns once the first lets go
    assert second.held
    second.release()
    releaser.join()


def test_alive_treats_gone_and_zombie_processes_as_dead():
    import os
    import subprocess
    import time

    assert rn.alive(os.getpid())
    child = subprocess.Popen(["true"])
    while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.01)  # exited, not yet reaped: a zombie
    assert not rn.alive(child.pid)
    child.wait()
    assert not rn.alive(child.pid)


def test_containerd_config_enables_nri_on_the_nodes_own_socket(tmp_path):
    doc = tomllib.loads(
        rn.containerd_config(
            tmp_path,
            socket=tmp_path / "s",
            sandbox_image="p",
            cni_bin=tmp_path,
            restrict_oom_score_adj=True,
            nri_socket=tmp_path / "nri" / "nri.sock",
        )
    )
    nri = doc["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["disable_connections"] is False
    assert nri["socket_path"] == str(tmp_path / "nri" / "nri.sock")
    assert nri["plugin_path"].startswith(str(tmp_path))  # never the host's /opt/nri/plugins


def test_containerd_config_leaves_nri_off_unless_asked(tmp_path):
    doc = tomllib.loads(
        rn.containerd_config(
            tmp_path, socket=tmp_path / "s", sandbox_image="p", cni_bin=tmp_path, restrict_oom_score_adj=True
        )
    )
    assert "io.containerd.nri.v1.nri" not in doc["plugins"]
