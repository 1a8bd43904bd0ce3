"""The node side's own check of a grant (defense in depth behind the webhook and the chart's
allocation guard): Allocate and the NRI hook hand a container only GPUs of this node, whatever a
pod's ``vgpu-devices-to-allocate`` / ``vgpu-devices-allocated`` annotation says (``all``,
``void``, another node's GPU), and the NRI hook serves only a grant the scheduler made for this
node (``hami.io/vgpu-node``)."""

from __future__ import annotations

import pytest

from hami.deviceplugin import allocate as A
from hami.deviceplugin.agent import NodeAgent
from hami.deviceplugin.allocator import Allocator
from hami.deviceplugin.injection import Injector
from hami.node import contract
from hami.node.layout import HookPaths
from hami.node.nri import load
from hami.node.nri.plugin import Refusal
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

from .test_deviceplugin_allocator import LOCK_P, FakeKube, pod_obj
from .test_deviceplugin_injection import FakeKube as NriKube

_, pb = load()

HERE, ELSEWHERE = "GPU-1", "GPU-9"
FORGED = ["all", "void", "none", ELSEWHERE, f"{HERE},{ELSEWHERE}", "MIG-1"]


def paths(tmp_path) -> HookPaths:
    return HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))


def grant_text(uuid: str) -> str:
    """One container's entry naming ``uuid`` (or, with a comma in it, the first of two GPUs)."""
    if "," in uuid:
        a, b = uuid.split(",")
        return f"{a},NVIDIA,1000,10:{b},NVIDIA,1000,10:;"
    return f"{uuid},NVIDIA,1000,10:;"


def view(annotation: str) -> A.PodView:
    return A.PodView("ns", "p", "uid1", {A.TO_ALLOCATE: annotation}, (A.ContainerView("c"),), "n1", "Pending")


# ------------------------------------------------------------------------------- Allocate


def test_the_reviewers_repro_is_refused():
    pod = view("all,NVIDIA,1000,10:;")
    with pytest.raises(A.AllocationError) as err:
        A.pop_next(pod, A.pending_devices(pod), 1, gpus=[HERE])
    msg = str(err.value)
    assert "ns/p" in msg and A.TO_ALLOCATE in msg and "'all'" in msg and "'c'" in msg


@pytest.mark.parametrize("uuid", [u for u in FORGED if "," not in u])
def test_pop_next_refuses_a_device_that_is_not_a_gpu_of_this_node(uuid):
    pod = view(grant_text(uuid))
    with pytest.raises(A.AllocationError, match=f"pod ns/p: .*{A.TO_ALLOCATE}.*{uuid!r}"):
        A.pop_next(pod, A.pending_devices(pod), 1, gpus=[HERE, "GPU-2"])


def test_pop_next_refuses_a_grant_with_one_foreign_gpu_among_its_own():
    pod = view(grant_text(f"{HERE},{ELSEWHERE}"))
    with pytest.raises(A.AllocationError, match=repr(ELSEWHERE)):
        A.pop_next(pod, A.pending_devices(pod), 2, gpus=[HERE])


def test_pop_next_grants_this_nodes_gpus():
    pod = view(f"{HERE},NVIDIA,1000,10:GPU-2,NVIDIA,2000,10:;")
    g = A.pop_next(pod, A.pending_devices(pod), 2, gpus=[HERE, "GPU-2", "GPU-3"])
    assert [d.uuid for d in g.devices] == [HERE, "GPU-2"]


@pytest.mark.parametrize("uuid", FORGED)
async def test_allocate_fails_the_pod_and_releases_the_lock_on_a_forged_grant(uuid, tmp_path):
    text = grant_text(uuid)
    kube = FakeKube(LOCK_P, [pod_obj("p", to_allocate=text)])
    alloc = Allocator(kube, NodeSettings(), paths(tmp_path), release_delay=0, gpus=[HERE])
    n = 2 if "," in uuid else 1
    with pytest.raises(A.AllocationError, match=f"pod ns/p: .*{A.TO_ALLOCATE}"):
        await alloc.allocate([n])
    ann = kube.pods_by_name["p"]["metadata"]["annotations"]
    assert ann[A.BIND_PHASE] == "failed"
    assert ann[A.TO_ALLOCATE] == text  # nothing popped, nothing granted
    assert A.NODE_LOCK not in kube.annotations  # the lock is released
    assert not (tmp_path / "hook").exists() or not any((tmp_path / "hook").rglob("*.cache"))


async def test_allocate_still_grants_this_nodes_gpu(tmp_path):
    kube = FakeKube(LOCK_P, [pod_obj("p", to_allocate=grant_text(HERE))])
    alloc = Allocator(kube, NodeSettings(), paths(tmp_path), release_delay=0, gpus=[HERE, "GPU-2"])
    [resp] = await alloc.allocate([1])
    assert resp.envs[contract.VISIBLE_DEVICES] == HERE
    assert kube.pods_by_name["p"]["metadata"]["annotations"][A.BIND_PHASE] == "success"


# ------------------------------------------------------------------------------- the NRI hook


def nri_pod(allocated: str, node: str | None = "n1") -> dict:
    ann = {A.BIND_PHASE: "success", A.ALLOCATED: allocated, A.TO_ALLOCATE: ";"}
    if node is not None:
        ann[A.VGPU_NODE] = node
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "annotations": ann, "resourceVersion": "5"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


def sandbox(obj: dict):
    meta = obj["metadata"]
    return pb.PodSandbox(
        id="sb", name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], annotations=meta["annotations"]
    )


def ctr():
    env = contract.deferred_grant()
    return pb.Container(id="id-c", name="c", env=[f"{k}={v}" for k, v in env.items()], state=3)


def injector(kube, tmp_path) -> Injector:
    return Injector(kube, NodeSettings(), paths(tmp_path), gpus=[HERE, "GPU-2"])


@pytest.mark.parametrize("uuid", FORGED)
async def test_the_hook_refuses_a_device_that_is_not_a_gpu_of_this_node(uuid, tmp_path):
    obj = nri_pod(grant_text(uuid))
    hook = injector(NriKube([obj]), tmp_path)
    with pytest.raises(Refusal, match=f"pod ns/p: .*{A.ALLOCATED}.*not a GPU of this node"):
        await hook.create_container(sandbox(obj), ctr())
    assert hook.injected == 0


async def test_the_hook_refuses_a_grant_made_for_another_node(tmp_path):
    obj = nri_pod(grant_text(HERE), node="n2")
    hook = injector(NriKube([obj]), tmp_path)
    with pytest.raises(Refusal, match=f"pod ns/p: .*{A.VGPU_NODE}='n2'.*n1"):
        await hook.create_container(sandbox(obj), ctr())


@pytest.mark.parametrize("node", ["n1", None])
async def test_the_hook_gives_this_nodes_gpu(node, tmp_path):
    obj = nri_pod(grant_text(HERE), node=node)
    hook = injector(NriKube([obj]), tmp_path)
    adjust = await hook.create_container(sandbox(obj), ctr())
    env = {e.key: e.value for e in adjust.env}
    assert env[contract.VISIBLE_DEVICES] == HERE and env[contract.NRI_INJECTION] == contract.NRI_DONE


# ------------------------------------------------------------------------------- wiring


@pytest.mark.parametrize("injection", ["allocate", "nri"])
def test_the_agent_gives_allocate_and_the_hook_its_discovered_gpus(injection, tmp_path):
    gpus = [
        PhysicalGPU(index=i, uuid=u, model="A100", memory_mib=40960, bus_id=str(i), numa=0)
        for i, u in enumerate((HERE, "GPU-2"))
    ]
    agent = NodeAgent(NriKube([]), NodeSettings(), gpus, tmp_path / "plugins", paths(tmp_path), injection=injection)
    served = agent.injector if injection == "nri" else agent.allocator
    assert set(served.gpus) == {HERE, "GPU-2"}


# ------------------------------------------------------- a grant on a container that asks for no GPU


def _asks_for_nothing(obj: dict) -> dict:
    for c in obj["spec"]["containers"]:
        c["resources"] = {}
    return obj


async def test_allocate_without_a_lock_refuses_a_candidate_whose_container_asks_for_no_gpu(tmp_path):
    """A pod that asks for no device never meets the webhook (devicePodsOnly), so annotations it
    forged at creation stay; without a node lock, Allocate's fallback found it "waiting for
    allocation" and handed its forged grant to the pod being admitted. Found by an adversarial
    review."""
    forged = _asks_for_nothing(pod_obj("forged", to_allocate=grant_text(HERE)))
    kube = FakeKube(None, [forged])
    alloc = Allocator(kube, NodeSettings(), paths(tmp_path), release_delay=0, gpus=[HERE])
    with pytest.raises(A.AllocationError, match="container 'main' .* asks for nvidia.com/gpu=nothing; grant refused"):
        await alloc.allocate([1])
    assert kube.pods_by_name["forged"]["metadata"]["annotations"][A.TO_ALLOCATE] == grant_text(HERE)  # nothing popped


def test_pop_next_wants_the_count_the_container_asks_for():
    pod = A.PodView(
        "ns", "p", "uid1", {A.TO_ALLOCATE: grant_text(HERE)}, (A.ContainerView("c", {"nvidia.com/gpu": "2"}),)
    )
    with pytest.raises(A.AllocationError, match="asks for nvidia.com/gpu=2"):
        A.pop_next(pod, A.pending_devices(pod), 1, gpus=[HERE], resource="nvidia.com/gpu")


async def test_the_hook_refuses_a_container_that_asks_for_no_gpu_but_carries_the_marker(tmp_path):
    """The injection marker is an env variable any pod can set on itself."""
    obj = _asks_for_nothing(nri_pod(grant_text(HERE)))
    hook = injector(NriKube([obj]), tmp_path)
    with pytest.raises(Refusal, match="container 'c' .* asks for nvidia.com/gpu=nothing; grant refused"):
        await hook.create_container(sandbox(obj), ctr())
    assert hook.injected == 0
