"""The short soaks of the suite (bench/bench_soak.py is the long one): waves of GPU pods created,
allocated and deleted on kwok nodes, through each front end.

- The extender: after every wave the scheduler's ledger (its /metrics) equals the API server's
  truth, after every deletion it is empty again, no node lock is left, and the scheduler's open
  file descriptors do not grow.
- DRA: pods translated by the scheduler's webhook (``--front-end=dra``) into claims from
  ResourceClaimTemplates, placed by kube-scheduler on the GPUs the nodes' ResourceSlices publish;
  after every wave the scheduler's view of the claims (``/api/v1/nodes``) equals their
  allocations, after every deletion no claim is left (allocated, or reserved for a deleted pod)
  and the view is empty again, and the scheduler's open file descriptors do not grow."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import pytest

from hami_devkit.binaries import KUBE_VERSION
from hami_devkit.cluster import KubeCluster, MissingBinaries, SchedulerConfig, free_port
from hami.dra.model import slice_name

from ._hami import PluginStandIn, SchedulerProcess, delete_webhook, label_namespace, make_gpu_node, register_webhook

pytestmark = pytest.mark.integration
BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_soak.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_soak", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_pod_churn_keeps_the_ledger_equal_to_the_api_and_leaks_nothing(kube_cluster, kube_namespace):
    bench = _bench()
    proc = SchedulerProcess(kube_cluster).start()
    webhook = f"hami-soak-{uuid.uuid4().hex[:6]}"
    group = f"soak-{uuid.uuid4().hex[:5]}"
    nodes = [f"{group}-{i}" for i in range(2)]
    try:
        kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=proc.extender()))
        register_webhook(kube_cluster, proc.url, webhook, "hami.io/soak-test")
        label_namespace(kube_cluster, kube_namespace, "hami.io/soak-test")
        for name in nodes:
            make_gpu_node(kube_cluster, name, labels={"hami-group": group})
        with PluginStandIn(kube_cluster):
            report = bench.scheduler_soak(
                kube_cluster, proc, kube_namespace, nodes, {"hami-group": group}, cycles=160, wave=40, log=print
            )
    finally:
        delete_webhook(kube_cluster, webhook)
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()
        for name in nodes:
            kube_cluster.delete_node(name)
    assert report.cycles == 160 and report.waves == 4
    assert not report.mismatches, report.mismatches
    assert not report.phantoms, report.phantoms
    assert not report.leaked_locks, report.leaked_locks
    fds = [s[2] for s in report.samples]
    assert max(fds[1:]) <= fds[0] + 2, f"the scheduler's open fds grew: {fds}"


@pytest.fixture
def dra_cluster(request):
    """The session's cluster where DRA needs no feature gate (v1.36 on), else one of its own."""
    from .test_dra import gates_for

    gates = gates_for(KUBE_VERSION)
    if not gates:
        yield request.getfixturevalue("kube_cluster")
        return
    cluster = KubeCluster(hami_scheduler=None, feature_gates=gates)
    try:
        cluster.start()
    except MissingBinaries as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


def test_dra_pod_churn_keeps_the_claims_view_equal_to_the_api_and_leaks_no_claim(dra_cluster):
    bench = _bench()
    ui_port = free_port()
    proc = SchedulerProcess(dra_cluster, "--front-end=dra", f"--ui-bind=127.0.0.1:{ui_port}", "--ui-auth=none").start()
    webhook = f"hami-drasoak-{uuid.uuid4().hex[:6]}"
    group = f"drasoak-{uuid.uuid4().hex[:5]}"
    ns, label = group, f"hami.io/{group}"
    nodes = [f"{group}-{i}" for i in range(2)]
    dra_cluster.create_namespace(ns)
    try:
        register_webhook(dra_cluster, proc.url, webhook, label)
        label_namespace(dra_cluster, ns, label)
        for name in nodes:
            dra_cluster.create_node(name, labels={"hami-group": group})
        bench.publish_kwok_slices(dra_cluster, nodes, split=10, gpus=4)
        bench.wait_dra_webhook(dra_cluster, ns)
        report = bench.dra_frontend_soak(
            dra_cluster, proc, ui_port, ns, nodes, {"hami-group": group}, cycles=120, wave=40, log=print
        )
    finally:
        delete_webhook(dra_cluster, webhook)
        proc.stop()
        dra_cluster.delete_namespace(ns)
        for name in nodes:
            dra_cluster.api("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{slice_name(name)}", expect=(200, 404))
            dra_cluster.delete_node(name)
    assert report.cycles == 120 and report.waves == 3
    assert not report.mismatches, report.mismatches
    assert not report.phantoms, report.phantoms
    assert not report.leaked, report.leaked
    fds = [s[2] for s in report.samples]
    assert max(fds[1:]) <= fds[0] + 2, f"the scheduler's open fds grew: {fds}"
