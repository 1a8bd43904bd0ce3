"""The DRA front end end to end on the real node: the chart installed with ``frontEnd: dra`` and
the node agent ``hami dra`` (tests/realnode/product.py, ``Product(front_end="dra")``), a pod
written as HAMi's user guide writes it, turned by the webhook into a ResourceClaim, placed by
kube-scheduler, prepared by the agent over the kubelet's DRA API into a CDI device that the
node's containerd (1.7, CDI on) applies: the container sees its share through libvgpu.

The agent's and the kubelet's restarts between prepare and unprepare are covered too: a claim
prepared before either restart is unprepared after it (its CDI spec removed, its checkpoint
entry gone), and a new claim is prepared after it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hami_devkit.cluster import KubeCluster
from hami.core.names import DRA_CDI_KIND
from hami.dra.model import DRIVER

from .product import MONITOR_PORT, NAMESPACE, Product, installed
from .test_chart_e2e import (
    CUDA_ERROR_OUT_OF_MEMORY,
    PROBE,
    probe_container,
    probe_output,
    probe_pod,
    running,
    samples,
    wait_pod,
)


#: ``dra.healthRecovery`` of the installed chart, seconds: long enough for the kubelet to show
#: the Unhealthy device before the agent counts the GPU as recovered
HEALTH_RECOVERY_S = 30


@pytest.fixture(scope="module")
def dra_product(real_node_holder, real_cluster: KubeCluster, tmp_path_factory, request):
    yield from installed(
        real_node_holder,
        real_cluster,
        tmp_path_factory.mktemp("dra-product"),
        request,
        "dra",
        # a GPU a fatal XID marked is healthy again after this long (the health test below)
        {"dra": {"healthRecovery": f"{HEALTH_RECOVERY_S}s"}},
    )


@pytest.fixture
def dra_namespace(real_cluster: KubeCluster, dra_product: Product, real_namespace: str) -> str:
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{real_namespace}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gpu-probe"},
            "data": {"gpu_probe.py": PROBE.read_text()},
        },
    )
    return real_namespace


def claims_of(cluster: KubeCluster, namespace: str) -> list[dict]:
    return cluster.api("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")["items"]


def cdi_specs(product: Product) -> dict[str, dict]:
    """The CDI specs the agent wrote for the node's containerd, by claim UID."""
    out = {}
    for path in Path(product.node.cdi_dir).glob(f"{DRIVER}-*.json"):
        spec = json.loads(path.read_text())
        out[spec["devices"][0]["name"]] = spec
    return out


def agent_pod(product: Product) -> dict:
    (pod,) = [
        p
        for p in product.pods(selector="app.kubernetes.io/component=hami-dra")
        if not p["metadata"].get("deletionTimestamp")
    ]
    return pod


def test_a_user_guide_pod_gets_3000_mib_through_a_claim_and_is_refused_past_it(
    dra_product: Product, real_cluster: KubeCluster, dra_namespace: str
):
    ns, name = dra_namespace, "dra-pod"
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
    real_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        probe_pod(name, [probe_container(dra_product, "main", limits, ["1000", "2500", "1500", "--hold"])]),
    )
    pod = wait_pod(real_cluster, ns, name, running, "Running", dra_product)
    # the webhook turned the limits into a claim; kube-scheduler (not the extender) placed it
    assert pod["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"].get("limits", {})
    (claim,) = claims_of(real_cluster, ns)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == dra_product.node.name
    assert result["consumedCapacity"]["memory"] in ("3000Mi", str(3000 << 20)), result
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]

    out = probe_output(real_cluster, ns, name, "main")
    assert (out["cuInit"], out["cuMemGetInfo"], out["nvmlDeviceGetMemoryInfo"]) == (0, 0, 0), out
    assert out["cuda_total_mib"] == 3000 and out["nvml_total_mib"] == 3000, out
    # 1000 fits, 2500 more does not (CUDA_ERROR_OUT_OF_MEMORY) and the process goes on: 1500 fits
    assert out["allocs"] == [0, CUDA_ERROR_OUT_OF_MEMORY, 0], out
    env = out["env"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and env["CUDA_DEVICE_SM_LIMIT"] == "30", env
    assert claim["metadata"]["uid"] in cdi_specs(dra_product)

    # the monitor in the agent's pod reads the claim's region and names the pod using it
    def monitor_sees():
        text = dra_product.metrics("hami-dra", MONITOR_PORT)
        used = [(lb, v) for lb, v in samples(text, "hami_vgpu_memory_used_bytes") if lb.get("pod") == name]
        limit = [(lb, v) for lb, v in samples(text, "hami_vgpu_memory_limit_bytes") if lb.get("pod") == name]
        return (used, limit) if used and used[0][1] >= 2500 << 20 else None

    try:
        used, limit = real_cluster.wait_for(monitor_sees, "the DRA monitor reporting the claim", timeout=90, interval=1)
    except TimeoutError as exc:
        text = dra_product.metrics("hami-dra", MONITOR_PORT)
        lines = [x for x in text.splitlines() if x.startswith("hami_vgpu")]
        claims_dir = dra_product.workdir / "hook" / "vgpu" / "claims"
        files = sorted(str(p) for p in claims_dir.rglob("*")) if claims_dir.is_dir() else ["(no claims directory)"]
        raise AssertionError(
            f"{exc}\n"
            + "\n".join(lines[:20] or [text[-3000:]])
            + "\n"
            + "\n".join(files)
            + f"\n{dra_product.describe()}"
        ) from None
    ((labels, value),) = used
    assert (labels["namespace"], labels["container"], labels["device_uuid"]) == (
        ns,
        "main",
        env["NVIDIA_VISIBLE_DEVICES"],
    )
    assert value >= 2500 << 20 and [v for _, v in limit] == [float(3000 << 20)]

    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    real_cluster.wait_for(
        lambda: claim["metadata"]["uid"] not in cdi_specs(dra_product),
        "the claim unprepared (its CDI spec removed)",
        timeout=120,
        interval=0.5,
    )


def _hold(cluster: KubeCluster, product: Product, ns: str, name: str, mib: int) -> tuple[dict, str]:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib}
    cluster.api(
        "POST", f"/api/v1/namespaces/{ns}/pods", probe_pod(name, [probe_container(product, "main", limits, ["--hold"])])
    )
    wait_pod(cluster, ns, name, running, "Running", product)
    out = probe_output(cluster, ns, name, "main")
    assert out["cuda_total_mib"] == mib, out
    (claim,) = [
        c
        for c in claims_of(cluster, ns)
        if [r["name"] for r in (c.get("status") or {}).get("reservedFor") or []] == [name]
    ]
    return out, claim["metadata"]["uid"]


@pytest.mark.parametrize("restarted", ["agent", "kubelet"])
def test_a_claim_prepared_before_a_restart_is_unprepared_after_it(
    dra_product: Product, real_cluster: KubeCluster, dra_namespace: str, restarted: str
):
    ns = dra_namespace
    _, before = _hold(real_cluster, dra_product, ns, "before", 1200)
    assert before in cdi_specs(dra_product)
    if restarted == "agent":
        old = agent_pod(dra_product)
        real_cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{old['metadata']['name']}")
        dra_product.wait_ready()
        assert agent_pod(dra_product)["metadata"]["uid"] != old["metadata"]["uid"]
    else:
        process = dra_product.node.components["kubelet"]
        process.stop()
        process.start()
        dra_product.wait_ready()
    # the pod from before still runs with its share; a new claim is prepared by the new process
    assert running(real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/before"))
    _, after = _hold(real_cluster, dra_product, ns, "after", 800)
    assert {before, after} <= set(cdi_specs(dra_product))
    for name, uid in (("before", before), ("after", after)):
        real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
        real_cluster.wait_for(
            lambda uid=uid: uid not in cdi_specs(dra_product),
            f"pod {name}'s claim unprepared (its CDI spec removed)",
            timeout=120,
            interval=0.5,
        )
    state = json.loads((dra_product.workdir / "dra-state" / "checkpoint.json").read_text())
    assert before not in json.dumps(state) and after not in json.dumps(state), state


def test_an_app_container_reuses_the_claim_of_an_init_container_that_asked_the_same(
    dra_product: Product, real_cluster: KubeCluster, dra_namespace: str
):
    ns, name = dra_namespace, "with-init"
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500}
    init = probe_container(dra_product, "setup", limits, ["1400"])  # allocates, prints, exits
    main = probe_container(dra_product, "main", limits, ["1400", "--hold"])
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", probe_pod(name, [main], init=[init]))
    wait_pod(real_cluster, ns, name, running, "Running", dra_product)
    (claim,) = claims_of(real_cluster, ns)  # one claim for the two containers
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]
    setup, held = (probe_output(real_cluster, ns, name, c) for c in ("setup", "main"))
    # the same 1500 MiB budget (one region), and the init container's 1400 MiB went with it
    assert (setup["cuda_total_mib"], held["cuda_total_mib"]) == (1500, 1500), (setup, held)
    assert setup["allocs"] == [0] and held["allocs"] == [0], (setup, held)
    assert setup["env"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == held["env"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    real_cluster.wait_for(
        lambda: claim["metadata"]["uid"] not in cdi_specs(dra_product),
        "the claim unprepared (its CDI spec removed)",
        timeout=120,
        interval=0.5,
    )


def test_the_kubelet_shows_the_claims_gpu_health_in_the_pod_status(
    dra_product: Product, real_cluster: KubeCluster, dra_namespace: str
):
    """KEP-4680: the agent streams device health to the kubelet (``v1alpha1.DRAResourceHealth``),
    which puts it in the container's ``allocatedResourcesStatus`` (``kubectl describe pod``), named
    after the CDI device the claim was prepared into (the kubelet's ResourceID for a DRA device).
    A non-fatal XID that the fake driver raises on the claim's GPU leaves it ``Healthy`` (an
    informational taint only); a fatal one turns it ``Unhealthy`` there (and taints the GPU
    ``NoSchedule``); ``dra.healthRecovery`` later it is ``Healthy`` again, the taints gone."""
    ns, name = dra_namespace, "health"
    out, uid = _hold(real_cluster, dra_product, ns, name, 600)
    device = f"{DRA_CDI_KIND}={uid}"  # the claim's one CDI device (hami.draplugin.prepare)
    gpu = out["env"]["NVIDIA_VISIBLE_DEVICES"]
    (claim,) = [c for c in claims_of(real_cluster, ns) if c["metadata"]["uid"] == uid]
    ((result,),) = [claim["status"]["allocation"]["devices"]["results"]]

    def health() -> list[str]:
        pod = real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        return [
            r.get("health")
            for s in (pod.get("status") or {}).get("containerStatuses") or []
            for st in s.get("allocatedResourcesStatus") or []
            for r in st.get("resources") or []
            if r.get("resourceID") == device
        ]

    def taints() -> list[tuple[str, str]]:
        slices = real_cluster.api(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={dra_product.node.name}"
        )["items"]
        return [
            (t["key"], t["effect"])
            for s in slices
            for d in s["spec"].get("devices") or []
            if d["name"] == result["device"]
            for t in d.get("taints") or []
        ]

    def shows(state: str, what: str) -> None:
        began = time.monotonic()
        try:
            real_cluster.wait_for(lambda: health() == [state], what, timeout=90, interval=0.5)
            print(f"{what}: {time.monotonic() - began:.1f}s")
        except TimeoutError as exc:
            pod = real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            raise AssertionError(
                f"{exc}: {json.dumps(pod.get('status'), indent=1)}\n{dra_product.describe()}"
            ) from None

    shows("Healthy", "the claim's device Healthy in the pod status")
    assert dra_product.state is not None
    # XID 13 (an application error) on the claim's GPU, through the fake NVML's event file: only
    # an informational taint, the device stays Healthy
    (dra_product.state / "xid").write_text(f"{gpu} 13\n")
    noted = [(f"{DRIVER}/xid", "None")]
    assert real_cluster.wait_for(lambda: taints() == noted, "XID 13 recorded on the GPU", timeout=60)
    assert health() == ["Healthy"]
    # XID 79 (the GPU fell off the bus): Unhealthy, and the GPU tainted NoSchedule
    (dra_product.state / "xid").write_text(f"{gpu} 79\n")
    shows("Unhealthy", "the claim's device Unhealthy in the pod status after XID 79")
    unhealthy = (f"{DRIVER}/unhealthy", "NoSchedule")
    assert real_cluster.wait_for(lambda: unhealthy in taints(), "the GPU tainted", timeout=60)
    assert running(real_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}"))  # NoSchedule evicts nothing
    # quiet for dra.healthRecovery and NVML answers: healthy again, both taints gone
    shows("Healthy", "the claim's device Healthy again after recovery")
    assert real_cluster.wait_for(lambda: not taints() and "untainted", "the GPU untainted", timeout=60)
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    real_cluster.wait_for(
        lambda: uid not in cdi_specs(dra_product),
        "the claim unprepared (its CDI spec removed)",
        timeout=120,
        interval=0.5,
    )
