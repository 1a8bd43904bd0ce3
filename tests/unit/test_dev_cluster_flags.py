"""KubeCluster's feature gates and extra flags reach the components' command lines."""

from hami_devkit import controlplane
from hami_devkit.controlplane import KubeCluster, _Paths
from hami_devkit.schedconfig import SchedulerConfig


def launched(tmp_path, monkeypatch, **kw):
    names = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    c = KubeCluster(workdir=tmp_path, binaries={n: tmp_path / n for n in names}, **kw)
    c._paths = _Paths(tmp_path)
    argvs = {}

    class Done:
        def __init__(self, name):
            self.name = name

    monkeypatch.setattr(c, "_launch", lambda name, argv: argvs.setdefault(name, argv) and Done(name))
    monkeypatch.setattr(c, "_wait_ready", lambda *a: None)
    monkeypatch.setattr(c, "_write_kubeconfig", lambda: None)
    monkeypatch.setattr(controlplane, "free_port", lambda: 1)
    c.ports["etcd"] = 2
    c._start_apiserver()
    c._launch_controller_manager()
    c._launch_scheduler("default-scheduler", SchedulerConfig())
    return argvs


def test_gates_go_to_apiserver_scheduler_and_controller_manager_and_extra_args_to_their_component(
    tmp_path, monkeypatch
):
    argvs = launched(
        tmp_path,
        monkeypatch,
        feature_gates={"DRAExtendedResource": True, "DRAConsumableCapacity": False},
        extra_args={"kube-controller-manager": ["--kube-api-qps=500"]},
    )
    gate = "--feature-gates=DRAConsumableCapacity=false,DRAExtendedResource=true"
    for name in ("kube-apiserver", "kube-controller-manager", "default-scheduler"):
        assert gate in argvs[name], name
    assert "--kube-api-qps=500" in argvs["kube-controller-manager"]
    assert "--kube-api-qps=500" not in argvs["kube-apiserver"]


def test_no_gates_no_flag(tmp_path, monkeypatch):
    argvs = launched(tmp_path, monkeypatch)
    assert not [a for argv in argvs.values() for a in argv if a.startswith("--feature-gates")]
