"""Migrating in place from HAMi: pods HAMi placed, read as HAMi meant them.

Each test is built from the strings HAMi's releases write; each failed on the code before its fix.
"""

from __future__ import annotations

from hami.core import rebuild
from hami.vendors import build_vendors

VENDORS = build_vendors()
GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def _node(mode: str = "hami-core") -> dict:
    # the JSON registration HAMi's NVIDIA plugin writes (MarshalNodeDevices, pkg/device/devices.go)
    reg = (
        f'[{{"id":"{GPU}","count":10,"devmem":40960,"devcore":100,'
        f'"type":"NVIDIA-A100-PCIE-40GB","mode":"{mode}","health":true}}]'
    )
    return {
        "metadata": {"name": "n1", "annotations": {"hami.io/node-nvidia-register": reg}},
        "status": {"allocatable": {"nvidia.com/gpu": "10"}},
    }


def placed_pod(allocated: str, inits: list[dict], apps: list[dict], inits_done: bool = True) -> dict:
    """A running pod HAMi bound to n1 with these init and app containers, its init containers
    finished (exit 0) when ``inits_done``; ``restartPolicy: Never``, so finished init containers
    cannot run again and their grants end."""
    done = {"terminated": {"exitCode": 0}} if inits_done else {"running": {}}
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "annotations": {
                "hami.io/vgpu-node": "n1",
                "hami.io/bind-phase": "success",
                "hami.io/vgpu-devices-allocated": allocated,
            },
        },
        "spec": {"nodeName": "n1", "restartPolicy": "Never", "initContainers": inits, "containers": apps},
        "status": {
            "phase": "Running",
            "initContainerStatuses": [{"name": c["name"], "state": done} for c in inits],
        },
    }


def _pod(allocated: str, inits: int = 0, apps: int = 1, inits_done: bool = True) -> dict:
    """:func:`placed_pod` with ``inits`` GPU-less init containers and ``apps`` one-GPU containers."""
    return placed_pod(
        allocated,
        [{"name": f"init{i}"} for i in range(inits)],
        [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(apps)],
        inits_done,
    )


def _held(pod: dict, mode: str = "hami-core") -> tuple[tuple[int, int, int, bool], tuple[int, int]]:
    ledger, warnings = rebuild([_node(mode)], [pod], VENDORS)
    assert not warnings
    [(device, used, mem, cores)] = ledger.device_usage("n1")
    return (used, mem, cores, device.health), ledger.namespace_usage("ns", "NVIDIA")


def test_a_pod_placed_before_hami_counted_init_containers_keeps_its_gpu():
    """HAMi's releases before init containers were counted (Project-HAMi/HAMi
    pkg/k8sutil/pod.go at 30c896e5, ``Resourcereqs``: ``make(util.PodDeviceRequests,
    len(pod.Spec.Containers))``) wrote one entry per regular container (EncodePodSingleDevice).
    Read init containers first, the GPU container's 20000 MiB / 30 cores passed for the init
    container's, and once that had finished the pod held 0 MiB and 0 cores of the GPU (and of its
    namespace's quota): another pod could be given the 20000 MiB still in use."""
    old_layout = f"{GPU},NVIDIA,20000,30:;"
    assert _held(_pod(old_layout, inits=1)) == ((1, 20000, 30, True), (20000, 30))
    assert _held(_pod(old_layout, inits=1, inits_done=False)) == ((1, 20000, 30, True), (20000, 30))
    # two regular containers, the second without a GPU (HAMi pads it with an empty entry)
    assert _held(_pod(f"{GPU},NVIDIA,20000,30:;;", inits=2, apps=2)) == ((1, 20000, 30, True), (20000, 30))


def test_todays_layout_with_init_containers_is_read_as_before():
    """One entry per container, init containers first (HAMi v2.10 ``Resourcereqs``, ours): an init
    container's grant is released once it finished; a GPU only it used is free again, its slot
    too (HAMi's ``AppContainersOnlyDeviceUsage``; a phantom slot kept it from exclusive and
    ``mutex`` pods until 1 Dec)."""
    assert _held(_pod(f"{GPU},NVIDIA,5000,0:;{GPU},NVIDIA,2000,10:;", inits=1)) == ((1, 2000, 10, True), (2000, 10))
    assert _held(_pod(f"{GPU},NVIDIA,5000,0:;;", inits=1)) == ((0, 0, 0, True), (0, 0))


def test_a_mig_grant_in_hamis_legacy_form_counts_on_its_gpu():
    """HAMi's MIG grants before ``hami.io/vgpu-mig-allocations`` name the instance
    ``<GPU UUID>[<template>-<slot>]`` (Project-HAMi/HAMi pkg/device/nvidia/device.go at 024910e1,
    AddResourceUsage: ``ctr.UUID = ctr.UUID + "[" + fmt.Sprint(tidx) + "-0]"``), and HAMi's usage
    pass counts it on the GPU before the ``[`` (pkg/scheduler/scheduler.go at 024910e1,
    getNodesUsage: ``deviceID = strings.Split(deviceID, "[")[0]``). Kept whole, the ID matched no
    device: the GPU showed 0 slots and 0 MiB used under a running MIG instance."""
    grant = f"{GPU}[1-0],NVIDIA,9984,0:;"
    assert _held(_pod(grant)) == ((1, 9984, 0, True), (9984, 0))
    # on a GPU registered in MIG mode, a grant without a placement cannot be told apart from a
    # free slice: the GPU takes no new pod until it ends (the ledger's rule for a MIG pod without
    # a reservation)
    assert _held(_pod(grant), mode="mig") == ((1, 9984, 0, False), (9984, 0))


def _asking(pod: dict, *asks: bool) -> dict:
    """``pod`` with the GPU asked only by the containers whose flag is set (init containers first)."""
    spec = pod["spec"]
    for container, ask in zip(spec["initContainers"] + spec["containers"], asks):
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}} if ask else {}
    return pod


def test_hamis_short_layout_with_init_containers_is_not_taken_for_the_old_one():
    """HAMi v2.10 pads a container without a GPU under the node's device types, not under
    ``NVIDIA`` (pkg/scheduler/score.go, calcScore), so its ``NVIDIA`` entries can stop short:
    an init container with a GPU, a GPU container and a GPU-less one get two entries. Taken for
    the old layout by their count, they were shifted past the init container and the finished
    init container's 5000 MiB stayed held (7000 MiB and 2 slots instead of 2000 and 1)."""
    pod = _asking(_pod(f"{GPU},NVIDIA,5000,0:;{GPU},NVIDIA,2000,10:;", inits=1, apps=2), True, True, False)
    assert _held(pod) == ((1, 2000, 10, True), (2000, 10))
    # the init container alone asks: its memory, cores and slot end with it
    pod = _asking(_pod(f"{GPU},NVIDIA,5000,0:;", inits=1, apps=1), True, False)
    assert _held(pod) == ((0, 0, 0, True), (0, 0))


def test_a_vendor_without_resource_names_reads_the_old_layout_by_the_count_alone():
    """With no resource names to tell by (a vendor configured without them), an allocation with
    one entry per regular container is read past the init containers, as before the rule took
    each container's ask (the refactor first read it in today's order)."""
    from hami.core.types import ContainerDevice
    from hami.core.ledger import container_asks, init_offset

    pod = {"spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "a"}, {"name": "b"}]}}
    asks, inits = container_asks(pod, frozenset())
    grant = ((ContainerDevice("GPU-1", "NVIDIA", 1000, 30),), ())
    assert (asks, inits) == ((None, None, None), 1)
    assert init_offset(grant, inits, asks) == 1
    named, _ = container_asks(pod, frozenset({"nvidia.com/gpu"}))
    assert named == (False, False, False) and init_offset(grant, inits, named) == 0


def test_a_finished_init_containers_mig_instance_without_a_reservation_keeps_its_gpu_quarantined():
    """Regression review, 1 Dec: HAMi's old MIG grant form (``GPU[1-0]``) names no placement, so
    the GPU is quarantined (unhealthy: an instance the scheduler cannot see). Once the init
    container that held it finished, the pod no longer held the GPU and it came back healthy and
    free: a new instance could be placed over the unseen one."""
    running = _pod(f"{GPU}[1-0],NVIDIA,9984,0:;;", inits=1, inits_done=False)
    assert _held(running, "mig")[0][3] is False
    finished = _pod(f"{GPU}[1-0],NVIDIA,9984,0:;;", inits=1)
    assert _held(finished, "mig") == ((0, 0, 0, False), (0, 0))
