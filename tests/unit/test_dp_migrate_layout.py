"""Allocate for pods HAMi's own scheduler placed before an in-place switch to hami: an
allocation written before HAMi counted init containers, and HAMi's legacy MIG grant names.

The annotation values are the strings HAMi's releases write; each test failed before its fix.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hami.core.codec import MigAllocation, decode_mig_allocations, encode_mig_allocations
from hami.deviceplugin import allocate as A
from hami.deviceplugin.allocator import Allocator
from hami.node.layout import HookPaths
from hami.node.settings import NodeSettings
from hami.vendors.nvidia import MIG_ALLOCATIONS_ANNOTATION

from .test_deviceplugin_allocator import LOCK_P, FakeKube

G1 = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
G2 = "GPU-7c4a1b2e-1d3f-4e5a-9b8c-2f6e0d1a3b4c"


def hami_pod(to_allocate: str, inits: list[dict], apps: list[dict]) -> dict:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "uid-p",
            "annotations": {
                A.BIND_PHASE: "allocating",
                A.TO_ALLOCATE: to_allocate,
                A.ALLOCATED: to_allocate,
                A.VGPU_NODE: "n1",
                A.BIND_TIME: "1",
            },
        },
        "spec": {"nodeName": "n1", "initContainers": inits, "containers": apps},
        "status": {"phase": "Pending"},
    }


def gpu(name: str, n: int = 1) -> dict:
    return {"name": name, "resources": {"limits": {"nvidia.com/gpu": str(n)}}}


def allocator(kube: FakeKube, tmp_path, **kw) -> Allocator:
    settings = NodeSettings(**kw)
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    return Allocator(kube, settings, paths, release_delay=0, gpus=[G1, G2])


def ann(kube: FakeKube) -> dict:
    return kube.pods_by_name["p"]["metadata"]["annotations"]


async def test_an_allocation_written_before_hami_counted_init_containers_goes_to_its_container(tmp_path):
    # HAMi before it counted init containers: one entry per regular container only
    pod = hami_pod(f"{G1},NVIDIA,1000,30:;", [{"name": "istio-init"}], [gpu("main")])
    kube = FakeKube(LOCK_P, [pod])
    (answer,) = await allocator(kube, tmp_path).allocate([1])
    assert answer.cache_dir.endswith("uid-p_main")
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == G1 and answer.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    # the remainder is written back in the layout it was read in
    assert ann(kube)[A.TO_ALLOCATE] == ";" and ann(kube)[A.BIND_PHASE] == "success"


async def test_each_regular_container_of_an_old_layout_gets_its_own_entry(tmp_path):
    pod = hami_pod(
        f"{G1},NVIDIA,1000,30:;;{G2},NVIDIA,2000,40:;",
        [{"name": "init-a"}, {"name": "init-b"}],
        [gpu("first"), {"name": "sidecar"}, gpu("third")],
    )
    kube = FakeKube(LOCK_P, [pod])
    alloc = allocator(kube, tmp_path)
    (first,) = await alloc.allocate([1])
    assert first.cache_dir.endswith("uid-p_first") and first.envs["NVIDIA_VISIBLE_DEVICES"] == G1
    assert ann(kube)[A.TO_ALLOCATE] == f";;{G2},NVIDIA,2000,40:;"
    (third,) = await alloc.allocate([1])
    assert third.cache_dir.endswith("uid-p_third") and third.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert ann(kube)[A.TO_ALLOCATE] == ";;;" and ann(kube)[A.BIND_PHASE] == "success"


async def test_todays_layout_with_init_containers_is_read_as_it_is(tmp_path):
    # one entry per container, init containers first: a GPU init container keeps its own entry
    pod = hami_pod(f"{G1},NVIDIA,1000,30:;{G2},NVIDIA,2000,40:;", [gpu("warm")], [gpu("main")])
    kube = FakeKube(LOCK_P, [pod])
    alloc = allocator(kube, tmp_path)
    (warm,) = await alloc.allocate([1])
    (main,) = await alloc.allocate([1])
    assert warm.cache_dir.endswith("uid-p_warm") and warm.envs["NVIDIA_VISIBLE_DEVICES"] == G1
    assert main.cache_dir.endswith("uid-p_main") and main.envs["NVIDIA_VISIBLE_DEVICES"] == G2


@pytest.mark.parametrize("mode", ["hami-core", "mig"])
async def test_a_legacy_mig_grant_is_refused_by_name(tmp_path, mode):
    # HAMi's MIG grant before hami.io/vgpu-mig-allocations: <GPU UUID>[<template>-<slot>]
    value = f"{G1}[1-0],NVIDIA,10240,100:;"
    kube = FakeKube(LOCK_P, [hami_pod(value, [], [gpu("main")])])
    with pytest.raises(A.AllocationError) as err:
        await allocator(kube, tmp_path, operating_mode=mode).allocate([1])
    msg = str(err.value)
    assert "pod ns/p" in msg and A.TO_ALLOCATE in msg and f"{G1}[1-0]" in msg and "legacy MIG" in msg
    assert "not a GPU of this node" not in msg  # it is one: the instance name is what we cannot serve
    assert ann(kube)[A.BIND_PHASE] == "failed" and A.NODE_LOCK not in kube.annotations


class StubMig:
    """MigManager.prepare as the allocator calls it: each entry gets an instance."""

    def prepare(self, ref, allocs):
        return [
            replace(a, mig_uuid=f"MIG-{a.container}-{a.device}", gpu_instance_id=1, compute_instance_id=0)
            for a in allocs
        ]


async def allocate_mig(pod: dict, tmp_path) -> tuple[A.ContainerResponse, FakeKube]:
    """Allocate one device for ``pod`` on a node in MIG mode, the pod's reservation one 1g.10gb
    instance of G1 for its reservation's container 0; (the answer, the API server)."""
    reservation = [MigAllocation(container=0, device=0, gpu_uuid=G1, profile="1g.10gb", start=0, size=1)]
    pod["metadata"]["annotations"][MIG_ALLOCATIONS_ANNOTATION] = encode_mig_allocations(reservation)
    kube = FakeKube(LOCK_P, [pod])
    alloc = allocator(kube, tmp_path, operating_mode="mig")
    alloc.mig = StubMig()
    (answer,) = await alloc.allocate([1])
    return answer, kube


async def test_an_old_layout_mig_pod_finds_its_reservation_past_the_init_containers(tmp_path):
    # hami.io/vgpu-mig-allocations counts containers as the grant it goes with does (the ledger's rule)
    pod = hami_pod(f"{G1},NVIDIA,10240,100:;", [{"name": "istio-init"}], [gpu("main")])
    answer, kube = await allocate_mig(pod, tmp_path)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-0-0" and answer.cache_dir.endswith("uid-p_main")
    (made,) = decode_mig_allocations(ann(kube)[MIG_ALLOCATIONS_ANNOTATION])
    assert made.container == 0 and made.mig_uuid == "MIG-0-0"


async def test_todays_layout_cut_short_after_a_gpu_init_container_stays_on_it(tmp_path):
    # HAMi may stop short of the GPU-less containers: one entry, on the init container that asks
    pod = hami_pod(f"{G1},NVIDIA,1000,30:;", [gpu("warm")], [{"name": "main"}])
    kube = FakeKube(LOCK_P, [pod])
    (warm,) = await allocator(kube, tmp_path).allocate([1])
    assert warm.cache_dir.endswith("uid-p_warm") and ann(kube)[A.TO_ALLOCATE] == ";"


async def test_a_pod_read_from_the_api_server_knows_its_init_containers():
    """The plugin's own reads (kube.pod_view, from the API client's objects) count the init
    containers too: without them an old layout read there went to the init container again."""
    from kubernetes_asyncio import client

    from hami.deviceplugin.kube import pod_view

    raw = hami_pod(f"{G1},NVIDIA,1000,30:;", [{"name": "istio-init"}], [gpu("main")])
    async with client.ApiClient() as api:
        view = pod_view(api._ApiClient__deserialize(raw, "V1Pod"))
    assert view.inits == 1 and [c.name for c in view.containers] == ["istio-init", "main"]
    assert A.pending_devices(view)[0] == [] and A.pending_devices(view)[1][0].uuid == G1


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/vgpu"])
def test_the_nri_path_reads_an_old_layout_by_the_resource_the_node_serves(resource):
    """NRI nodes read the grant at container creation: with a renamed GPU resource the old layout
    was told by nvidia.com/gpu, its entry stayed on the init container and the GPU container was
    refused ("has no entry")."""
    from hami.deviceplugin.injection import container_grant, gpu_entries

    obj = hami_pod(
        f"{G1},NVIDIA,1000,10:;", [{"name": "init"}], [{"name": "app", "resources": {"limits": {resource: "1"}}}]
    )
    view, ann = A.pod_view_from_object(obj), obj["metadata"]["annotations"]
    assert [[d.uuid for d in e] for e in gpu_entries(view, ann, resource)] == [[], [G1]]
    grant = container_grant(view, ann, "app", gpus=[G1, G2], node="n1", resource=resource)
    assert [d.uuid for d in grant.devices] == [G1]
