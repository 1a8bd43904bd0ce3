"""The lockless bind path on the real control plane (docs/scheduler.md, "Bind on a node that
injects at creation"): kube-apiserver, kube-scheduler configured as the chart does, kwok nodes,
``hami scheduler`` as a subprocess; :class:`NriStandIn` plays the NRI node agent (marks each bound
pod ``bind-phase=success`` from its own annotations, never touching a lock), PluginStandIn the
device plugin of the nodes that keep HAMi's lock. Every node write is watched. No timing is
asserted.
"""

from __future__ import annotations

import math
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService
from hami.sim.engine import simulate
from hami_devkit.cluster import ApiError, SchedulerConfig

from ._hami import (
    wait_all_allocated,
    NodeLockWatch,
    NriStandIn,
    PluginStandIn,
    SchedulerProcess,
    device_usage,
    events,
    gpu_pod,
    make_gpu_node,
    placed,
)

pytestmark = pytest.mark.integration


def _create_all(cluster, ns: str, burst: list[dict]) -> None:
    with ThreadPoolExecutor(16) as pool:  # created at once, as a Job or a Deployment would
        list(pool.map(lambda p: cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", p), burst))


def _no_overbooking(done: list[dict], mem: int) -> None:
    for p in done:
        assert p["metadata"]["annotations"]["hami.io/vgpu-node"] == p["spec"]["nodeName"]
    for uuid_, (slots, used, cores) in device_usage(done).items():
        assert slots <= 10 and used <= mem and cores <= 100, (uuid_, slots, used, cores)


def test_a_burst_on_injecting_nodes_takes_no_lock_and_binpack_packs(kube_cluster, kube_namespace):
    """200 pods at once on 20 NRI nodes x 8 GPUs with the default binpack policy: not one node
    lock written, 0 over capacity, 0 FailedScheduling, and the nodes used are the ones placing
    the pods one by one uses (within 10 %), not the spread a per-node queue forces."""
    ns, n_nodes, n_pods, mem = kube_namespace, 20, 200, 81920
    group = f"nri-{uuid.uuid4().hex[:5]}"
    names = [f"{group}-{i:02d}" for i in range(n_nodes)]
    # the nodes exist (and say nri) before the scheduler starts: its first list has them
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: make_gpu_node(kube_cluster, n, mem=mem, labels={"hami-group": group}, injection="nri"),
                names,
            )
        )
    proc = SchedulerProcess(kube_cluster, loopback=True).start()
    try:
        kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=proc.extender()))
        burst = [
            gpu_pod(f"p{i:03d}", ns, mem=4000, cores=5, node_selector={"hami-group": group}) for i in range(n_pods)
        ]
        with NodeLockWatch(kube_cluster, f"hami-group={group}") as watch:
            with NriStandIn(kube_cluster, nodes=set(names), workers=n_nodes // 2) as standin:
                _create_all(kube_cluster, ns, burst)
                done = wait_all_allocated(kube_cluster, ns, n_pods, 600)
                assert not standin.errors, standin.errors[:5]
            watch.check_live(names[0])
            assert watch.seen == [], f"node locks written on NRI nodes: {watch.seen[:5]}"
        _no_overbooking(done, mem)
        failed = [
            f"{e['involvedObject']['name']}: {e.get('message')}" for e in events(kube_cluster, ns, "FailedScheduling")
        ]
        assert failed == [], f"{len(failed)} FailedScheduling events for pods that fit, e.g. {failed[:5]}"
        assert events(kube_cluster, ns, "BindingFailed") == []
        # one by one: the same nodes and pods through the core, each decision final before the next
        nodes_ = [kube_cluster.api("GET", f"/api/v1/nodes/{n}") for n in names]
        sim = simulate(nodes_, burst, SchedulerService(Options(), None).state.config)
        one_by_one = len({o.node for o in sim.pods if o.node})
        used = len({p["spec"]["nodeName"] for p in done})
        assert used <= math.floor(one_by_one * 1.1), (used, one_by_one)
    finally:
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()
        for n in names:
            kube_cluster.delete_node(n)


def test_a_mixed_cluster_keeps_the_lock_on_the_nodes_that_do_not_inject(kube_cluster, kube_namespace):
    ns, mem = kube_namespace, 81920
    group = f"mix-{uuid.uuid4().hex[:5]}"
    injecting = [f"{group}-nri-{i}" for i in range(2)]
    plain = [f"{group}-plain-{i}" for i in range(2)]
    for n in injecting:
        make_gpu_node(kube_cluster, n, mem=mem, labels={"hami-group": group, "kind": "nri"}, injection="nri")
    for n in plain:
        make_gpu_node(kube_cluster, n, mem=mem, labels={"hami-group": group, "kind": "plain"})
    proc = SchedulerProcess(kube_cluster, "--node-scheduler-policy=spread", loopback=True).start()
    try:
        kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=proc.extender()))
        burst = [
            gpu_pod(f"{kind}{i:02d}", ns, mem=4000, cores=5, node_selector={"hami-group": group, "kind": kind})
            for kind in ("nri", "plain")
            for i in range(20)
        ]
        with NodeLockWatch(kube_cluster, f"hami-group={group}") as watch:
            with (
                NriStandIn(kube_cluster, nodes=set(injecting), workers=2) as agent,
                PluginStandIn(kube_cluster, nodes=set(plain), workers=2) as plugin,
            ):
                _create_all(kube_cluster, ns, burst)
                done = wait_all_allocated(kube_cluster, ns, len(burst), 600)
                assert not agent.errors and not plugin.errors, (agent.errors[:5], plugin.errors[:5])
            watch.check_live(plain[0])
        assert watch.nodes_locked() <= set(plain), watch.seen[:5]
        assert watch.nodes_locked() == set(plain)  # spread: both plain nodes got pods, each under its lock
        assert {n for n, _, _ in agent.allocated} <= set(injecting)
        assert len(plugin.allocated) == 20 and len(agent.allocated) == 20
        _no_overbooking(done, mem)
        assert events(kube_cluster, ns, "FailedScheduling") == []
    finally:
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()
        for n in injecting + plain:
            kube_cluster.delete_node(n)


VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAP_BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
REFUSAL = "binding refused by the test policy"


def _refuse_bindings(cluster, name: str, ns: str) -> None:
    """An admission policy that refuses every Binding of a pod named ``refused-*`` in ``ns``."""
    cluster.api(
        "POST",
        VAP,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods/binding"],
                        }
                    ]
                },
                "validations": [{"expression": "!object.metadata.name.startsWith('refused-')", "message": REFUSAL}],
            },
        },
    )
    cluster.api(
        "POST",
        VAP_BINDINGS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                },
            },
        },
    )
    # in force once a Binding of a probe pod (never scheduled) is refused with its message
    probes = iter(range(10_000))

    def refused() -> bool:
        probe = f"refused-probe-{next(probes)}"
        cluster.api(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": probe},
                "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]},
            },
        )
        try:
            cluster.api(
                "POST",
                f"/api/v1/namespaces/{ns}/pods/{probe}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": probe},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "no-such-node"},
                },
            )
        except ApiError as exc:
            return REFUSAL in str(exc)
        finally:
            cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{probe}?gracePeriodSeconds=0")
        return False

    cluster.wait_for(refused, "the binding policy in force", 30, interval=0.5)


def _failed_count(cluster, ns: str, pod: str) -> int:
    return sum(
        e.get("count") or 1
        for e in events(cluster, ns, "FailedScheduling")
        if e["involvedObject"]["name"] == pod and REFUSAL in (e.get("message") or "")
    )


def test_a_binding_the_api_server_refuses_leaves_no_reservation(kube_cluster, kube_namespace):
    """One NRI node with one GPU that holds one of these pods. The first pod's Bindings are all
    refused by an admission policy; after each refusal its GPU must be free again (no reservation
    left behind), so a second pod created right after a refusal is placed there and bound."""
    ns = kube_namespace
    group = f"refuse-{uuid.uuid4().hex[:5]}"
    node_name = f"{group}-0"
    make_gpu_node(kube_cluster, node_name, gpus=1, mem=16384, labels={"hami-group": group}, injection="nri")
    proc = SchedulerProcess(kube_cluster, loopback=True).start()
    policy = f"{group}-policy"
    try:
        _refuse_bindings(kube_cluster, policy, ns)
        kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=proc.extender()))
        whole = {"mem": 16384, "node_selector": {"hami-group": group}}
        with NodeLockWatch(kube_cluster, f"hami-group={group}") as watch:
            with NriStandIn(kube_cluster, nodes={node_name}, workers=1) as agent:
                kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("refused-a", ns, **whole))
                # two refusals: kube-scheduler's back-off before the next try is now >= 2 s
                kube_cluster.wait_for(lambda: _failed_count(kube_cluster, ns, "refused-a") >= 2, "2 refusals", 120)
                kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("b", ns, **whole))
                bound = kube_cluster.wait_for(
                    lambda: (
                        lambda p: p if placed(p) and p["metadata"]["annotations"].get("hami.io/bind-phase") else None
                    )(kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/b")),
                    "pod b bound on the GPU the refused pod had reserved",
                    60,
                )
                assert bound["spec"]["nodeName"] == node_name
                assert not agent.errors, agent.errors
            watch.check_live(node_name)
            assert watch.seen == []
        a = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/refused-a")
        assert not a["spec"].get("nodeName") and "hami.io/vgpu-devices-allocated" not in (
            a["metadata"].get("annotations") or {}
        )
    finally:
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()
        for path in (f"{VAP_BINDINGS}/{policy}", f"{VAP}/{policy}"):
            try:
                kube_cluster.api("DELETE", path)
            except ApiError:
                pass
        kube_cluster.delete_node(node_name)
