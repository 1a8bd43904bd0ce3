"""The short soak of the suite (bench/bench_soak.py is the long one): waves of GPU pods created,
allocated and deleted through the scheduler on kwok nodes. After every wave the scheduler's
ledger (its /metrics) equals the API server's truth, after every deletion it is empty again, no
node lock is left, and the scheduler's open file descriptors do not grow."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import pytest

from hami_devkit.cluster import SchedulerConfig

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
