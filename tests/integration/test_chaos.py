"""Chaos on kwok nodes: the control plane itself failing under a burst, and two of our
components dying together.

Each scenario starts a burst of 100 GPU pods on 4 kwok nodes (8 GPUs each, the stand-in playing
the device plugin's side of the lock handoff), breaks something once about 20 pods are placed,
brings it back, and then checks what a platform team would check:

- every pod ends placed (``bind-phase=success``, its node the one the annotation names), since
  all 100 fit;
- no GPU is over capacity (slots, memory, cores summed from the pods' own annotations: the test's
  accounting, not the scheduler's) — a double booking would show here;
- no node lock is left behind.

Creations that fail while the API server is down are retried, as a controller would (a 409 on a
retry means the first attempt landed).
"""

from __future__ import annotations

import http.client
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from hami_devkit.cluster import ApiError, SchedulerConfig

from ._hami import (
    PluginStandIn,
    SchedulerProcess,
    delete_webhook,
    device_usage,
    gpu_pod,
    label_namespace,
    make_gpu_node,
    placed,
    pods,
    register_webhook,
    wait_webhook_routes,
)

pytestmark = pytest.mark.integration
WEBHOOK_LABEL = "hami.io/chaos-test"
BURST = 100
TRANSIENT = (OSError, http.client.HTTPException)


@pytest.fixture(scope="module")
def hami(kube_cluster):
    proc = SchedulerProcess(kube_cluster).start()
    webhook = f"hami-chaos-{uuid.uuid4().hex[:6]}"
    kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=proc.extender()))
    register_webhook(kube_cluster, proc.url, webhook, WEBHOOK_LABEL)
    try:
        yield proc
    finally:
        delete_webhook(kube_cluster, webhook)
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()


@pytest.fixture
def ns(kube_cluster, kube_namespace, hami):
    label_namespace(kube_cluster, kube_namespace, WEBHOOK_LABEL)
    probe = gpu_pod("webhook-probe", kube_namespace, mem=1000)
    probe["spec"].pop("schedulerName")
    wait_webhook_routes(kube_cluster, kube_namespace, probe)
    return kube_namespace


def _retrying(call, what: str, timeout: float = 120.0):
    """``call()`` until it answers, through an API server (or etcd) that is down for a while."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except TRANSIENT as exc:
            error = exc
        except ApiError as exc:
            if exc.status not in (500, 503, 504) and "failed calling webhook" not in str(exc):
                raise
            error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still failing after {timeout:.0f}s: {error}")
        time.sleep(0.3)


def _create(cluster, ns: str, pod: dict) -> None:
    def attempt() -> None:
        try:
            cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        except ApiError as exc:
            if exc.status != 409:  # 409: an earlier attempt landed before the connection broke
                raise

    _retrying(attempt, f"create {pod['metadata']['name']}")


def _count_placed(cluster, ns: str) -> int:
    return sum(placed(p) for p in _retrying(lambda: pods(cluster, ns), "list pods"))


def _wait(cluster, what: str, probe, timeout: float = 240.0, diagnose=lambda: ""):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = _retrying(probe, what)
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not after {timeout:.0f}s\n{diagnose()}")


def _diagnosis(cluster, ns: str, nodes: list[str], errors: list[str]) -> str:
    """The node locks, the pods they name, the unplaced pods, and the stand-in's errors."""
    lines = []
    for n in nodes:
        value = (cluster.api("GET", f"/api/v1/nodes/{n}")["metadata"].get("annotations") or {}).get(
            "hami.io/mutex.lock"
        )
        lines.append(f"node {n}: lock {value}")
    for p in pods(cluster, ns):
        ann = p["metadata"].get("annotations") or {}
        if ann.get("hami.io/bind-phase") != "success":
            lines.append(
                f"pod {p['metadata']['name']}: node {p['spec'].get('nodeName')} bind-phase {ann.get('hami.io/bind-phase')}"
                f" vgpu-node {ann.get('hami.io/vgpu-node')} phase {p.get('status', {}).get('phase')}"
            )
    return "\n".join(lines + [f"stand-in: {e}" for e in errors[-20:]])


def _burst_with_fault(cluster, ns: str, fault, errors: list[str]) -> tuple[list[str], int]:
    """Create the burst on 4 fresh nodes; call ``fault()`` once 20 pods are placed; wait until
    all are placed and check capacity and locks. Returns the nodes and the count placed before
    the fault."""
    group = f"chaos-{uuid.uuid4().hex[:5]}"
    nodes = [f"{group}-{i}" for i in range(4)]
    for name in nodes:
        make_gpu_node(cluster, name, labels={"hami-group": group})
    burst = [
        gpu_pod(f"p{i:03d}", ns, mem=1500 + 100 * (i % 7), cores=5 + i % 4, node_selector={"hami-group": group})
        for i in range(BURST)
    ]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_create, cluster, ns, p) for p in burst]
        _wait(cluster, "20 placed", lambda: _count_placed(cluster, ns) >= 20, 120)
        before = _count_placed(cluster, ns)
        fault()
        for f in futures:
            f.result()
    assert before < BURST, "the fault came after the burst was over"

    def all_placed():
        current = pods(cluster, ns)
        ready = [
            p
            for p in current
            if placed(p) and (p["metadata"].get("annotations") or {}).get("hami.io/bind-phase") == "success"
        ]
        return current if len(ready) == BURST else None

    done = _wait(
        cluster,
        f"{BURST} pods placed after the fault",
        all_placed,
        diagnose=lambda: _diagnosis(cluster, ns, nodes, errors),
    )
    for p in done:
        assert p["metadata"]["annotations"]["hami.io/vgpu-node"] == p["spec"]["nodeName"], p["metadata"]["name"]
    for gpu, (slots, mem, cores) in device_usage(done).items():
        assert slots <= 10 and mem <= 16384 and cores <= 100, f"over capacity: {gpu} {slots} {mem} {cores}"
    _wait(
        cluster,
        "no node lock left",
        lambda: (
            not [
                n
                for n in nodes
                if "hami.io/mutex.lock"
                in (cluster.api("GET", f"/api/v1/nodes/{n}")["metadata"].get("annotations") or {})
            ]
        ),
        60,
    )
    return nodes, before


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_the_control_plane_restarts_mid_burst(kube_cluster, hami, ns, component):
    """kube-apiserver (or etcd under it) is killed mid-burst and back after 3 s: the scheduler's
    watches, the extender's binds and the plugin's handoff all recover; nothing is lost or booked
    twice."""
    downtime: list[float] = []
    with PluginStandIn(kube_cluster) as standin:
        nodes, before = _burst_with_fault(
            kube_cluster, ns, lambda: downtime.append(kube_cluster.restart(component, down_for=3.0)), standin.errors
        )
        try:
            assert downtime and downtime[0] >= 3.0
            assert not hami._died(), hami.logs()[-3000:]
            print(f"{component} restarted after {before} of {BURST} pods placed, API back after {downtime[0]:.1f}s")
        finally:
            for n in nodes:
                _retrying(lambda n=n: kube_cluster.delete_node(n), f"delete node {n}")
    assert standin.allocated, "the stand-in served nothing"


def test_the_scheduler_and_the_device_plugin_die_together(kube_cluster, hami, ns):
    """Both of our components are killed at the same moment (SIGKILL of the scheduler, the
    plugin stand-in abandoned without flushing its delayed lock removals), then started again."""
    standins = [PluginStandIn(kube_cluster).__enter__()]

    def both_die() -> None:
        hami.kill()
        standins[0].kill()
        time.sleep(1.0)
        hami.start()
        standins.append(PluginStandIn(kube_cluster).__enter__())

    try:
        errors: list[str] = []
        nodes, before = _burst_with_fault(kube_cluster, ns, both_die, errors)
        print(f"scheduler and plugin killed after {before} of {BURST} pods placed")
        for n in nodes:
            kube_cluster.delete_node(n)
    finally:
        standins[-1].__exit__(None, None, None)
