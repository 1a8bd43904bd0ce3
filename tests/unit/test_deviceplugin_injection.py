"""--injection=nri (deviceplugin/injection.py): Allocate's pod-free answer, the NRI hook's
adjustment per container (the same env and mounts as Allocate's answer for that grant), its
refusals, the success write after the last GPU container, eviction after a resync, the node
annotation, and the flag's checks."""

from __future__ import annotations

import argparse
import asyncio
from datetime import datetime

import pytest

from hami.core.names import NODE_INJECTION
from hami.deviceplugin import allocate as A
from hami.deviceplugin.command import injection_problem
from hami.deviceplugin.devices import DeviceState
from hami.deviceplugin.injection import Injector, NriAllocator, env_map
from hami.deviceplugin.register import KEEP, registration_patch
from hami.node import contract
from hami.node.layout import HookPaths
from hami.node.nri import load
from hami.node.nri.plugin import Refusal
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

_, pb = load()

G0, G1 = "GPU-a0", "GPU-a1"
# init container "setup" (no GPU), "train" (two GPUs), "side" (no GPU), "eval" (one GPU)
ALLOCATED = f";{G0},NVIDIA,3000,30:{G1},NVIDIA,3000,30:;;{G1},NVIDIA,1000,10:;"


def pod_obj(uid: str = "uid-p", allocated: str | None = ALLOCATED, eval_env: list | None = None) -> dict:
    ann = {A.BIND_PHASE: "allocating", A.TO_ALLOCATE: ALLOCATED}
    if allocated is not None:
        ann[A.ALLOCATED] = allocated
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": uid, "annotations": ann, "resourceVersion": "5"},
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": "setup"}],
            "containers": [
                {"name": "train", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                {"name": "side"},
                {"name": "eval", "resources": gpu, "env": eval_env or []},
            ],
        },
    }


class FakeKube:
    def __init__(self, pods: list[dict]) -> None:
        self.node_name = "n1"
        self.by_name = {p["metadata"]["name"]: p for p in pods}
        self.pods = A.PodCache()
        self.reads = 0
        self.patches: list[tuple] = []

    async def get_pod(self, namespace, name):
        self.reads += 1
        obj = self.by_name.get(name)
        return A.pod_view_from_object(obj) if obj else None

    async def patch_pod_annotations(self, pod, values, labels=None):
        self.patches.append((pod.name, dict(values), dict(labels or {})))


def sandbox(obj: dict, with_annotations: bool = True):
    meta = obj["metadata"]
    return pb.PodSandbox(
        id="sb",
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        annotations=meta["annotations"] if with_annotations else {},
    )


def ctr(name: str, env: dict | None = None, marked: bool = True):
    env = dict(env or {})
    if marked:
        env.update(contract.deferred_grant())
    return pb.Container(id=f"id-{name}", name=name, env=[f"{k}={v}" for k, v in env.items()], state=3)


def injector(kube, tmp_path) -> Injector:
    return Injector(kube, NodeSettings(), HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")), gpus=[G0, G1])


def adjusted_env(adjust) -> dict[str, str]:
    return {e.key: e.value for e in adjust.env}


def adjusted_mounts(adjust) -> list[tuple[str, str, bool]]:
    return [(m.destination, m.source, "ro" in m.options) for m in adjust.mounts]


async def test_allocate_answers_the_same_for_every_pod(tmp_path):
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    answers = await NriAllocator(paths).allocate([1, 2])
    # no NVIDIA_VISIBLE_DEVICES of its own: an image's (CUDA's: all) would be a second entry,
    # and containerd's NRI puts the last entry back over the hook's (the container saw void);
    # libvgpu preloaded, which refuses every GPU while the marker is pending
    preload = [
        (paths.library, paths.library, True),
        ("/etc/ld.so.preload", paths.preload_file, True),
        (f"{paths.vgpu_dir}/grant-pending", f"{paths.vgpu_dir}/nri/grant-pending", True),
    ]
    got = [(r.envs, [(m.container_path, m.host_path, m.read_only) for m in r.mounts]) for r in answers]
    assert got == [({"HAMI_NRI_INJECTION": "pending"}, preload)] * 2
    assert await NriAllocator(paths).find_pod() == (None, None)


async def test_each_gpu_container_gets_its_own_grant_as_allocate_would_give_it(tmp_path):
    obj = pod_obj()
    kube = FakeKube([obj])
    hook = injector(kube, tmp_path)
    train = await hook.create_container(sandbox(obj), ctr("train"))
    evaluation = await hook.create_container(sandbox(obj), ctr("eval"))

    # what Allocate (lock mode) builds for the same grants, from the same pieces
    view = A.pod_view_from_object(obj)
    pending = A.pending_devices(view)
    want = [
        A.build_response(view, A.pop_next(view, pending, n, gpus=[G0, G1]), hook.settings, hook.paths) for n in (2, 1)
    ]
    for adjust, response in zip((train, evaluation), want):
        assert adjusted_env(adjust) == {**response.envs, "HAMI_NRI_INJECTION": "done"}
        # Allocate's pending marker (deferred_mounts) removed: "-" is NRI's removal marker
        removed = [(f"-{hook.paths.pending_marker}", "", False)]
        assert (
            adjusted_mounts(adjust) == [(m.container_path, m.host_path, m.read_only) for m in response.mounts] + removed
        )
    assert adjusted_env(train)["NVIDIA_VISIBLE_DEVICES"] == f"{G0},{G1}"
    assert adjusted_env(train)["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
    assert adjusted_env(evaluation)["NVIDIA_VISIBLE_DEVICES"] == G1
    assert adjusted_env(evaluation)["CUDA_DEVICE_SM_LIMIT"] == "10"
    assert (
        adjusted_env(train)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        != adjusted_env(evaluation)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    )
    assert "/etc/ld.so.preload" in [m.destination for m in evaluation.mounts]
    assert all(m.type == "bind" and "rbind" in m.options for m in train.mounts if not m.destination.startswith("-"))


async def test_success_is_written_once_after_the_last_gpu_container(tmp_path):
    obj = pod_obj()
    kube = FakeKube([obj])
    hook = injector(kube, tmp_path)
    await hook.create_container(sandbox(obj), ctr("train"))
    await hook.drain()
    assert kube.patches == []
    assert await hook.create_container(sandbox(obj), ctr("side", marked=False)) is None
    await hook.create_container(sandbox(obj), ctr("eval"))
    await hook.drain()
    assert kube.patches == [
        ("p", {A.BIND_PHASE: "success", A.TO_ALLOCATE: ";;;;"}, {A.VGPU_NODE: "n1"}),
    ]
    await hook.create_container(sandbox(obj), ctr("eval"))  # a restart of the container
    await hook.drain()
    assert len(kube.patches) == 1


async def test_a_pod_the_binding_completed_takes_no_write(tmp_path):
    """hami scheduler's Binding on an injecting node already says success with to-allocate
    emptied: every container still gets its grant, and the pod takes no write from the node."""
    obj = pod_obj()
    obj["metadata"]["annotations"].update({A.BIND_PHASE: "success", A.TO_ALLOCATE: ";;;;"})
    kube = FakeKube([obj])
    hook = injector(kube, tmp_path)
    train = await hook.create_container(sandbox(obj), ctr("train"))
    evaluation = await hook.create_container(sandbox(obj), ctr("eval"))
    await hook.drain()
    assert adjusted_env(evaluation)["NVIDIA_VISIBLE_DEVICES"] == G1 and adjusted_env(train)["NVIDIA_VISIBLE_DEVICES"]
    assert kube.patches == [] and hook.injected == 2


async def test_a_container_without_the_marker_is_left_alone_without_any_read(tmp_path):
    kube = FakeKube([])
    hook = injector(kube, tmp_path)
    assert await hook.create_container(pb.PodSandbox(name="x", namespace="ns", uid="u"), ctr("c", marked=False)) is None
    assert kube.reads == 0


async def test_the_container_order_comes_from_the_watch_copy_of_the_same_uid(tmp_path):
    obj = pod_obj()
    kube = FakeKube([obj])
    kube.pods.replace([obj])
    hook = injector(kube, tmp_path)
    await hook.create_container(sandbox(obj), ctr("train"))
    assert kube.reads == 0
    other = pod_obj(uid="uid-new")  # re-created under the same name: the copy cannot stand in
    kube.by_name["p"] = other
    await hook.create_container(sandbox(other), ctr("train"))
    assert kube.reads == 1


async def test_the_api_copy_stands_in_when_the_sandbox_has_no_annotations(tmp_path):
    obj = pod_obj()
    kube = FakeKube([obj])
    adjust = await injector(kube, tmp_path).create_container(sandbox(obj, with_annotations=False), ctr("eval"))
    assert adjusted_env(adjust)["NVIDIA_VISIBLE_DEVICES"] == G1
    assert kube.reads == 1


async def test_cuda_disable_control_is_read_from_the_pod_spec_not_the_image_env(tmp_path):
    obj = pod_obj(eval_env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}])
    adjust = await injector(FakeKube([obj]), tmp_path).create_container(sandbox(obj), ctr("eval"))
    # Allocate's preload (deferred_mounts) is removed: "-" is NRI's removal marker
    assert [m.destination for m in adjust.mounts if "ld.so.preload" in m.destination] == ["-/etc/ld.so.preload"]
    # the same switch in the env the runtime composed (an image's ENV) leaves isolation on
    obj = pod_obj()
    adjust = await injector(FakeKube([obj]), tmp_path).create_container(
        sandbox(obj), ctr("eval", {"CUDA_DISABLE_CONTROL": "true"})
    )
    assert [m.destination for m in adjust.mounts if "ld.so.preload" in m.destination] == ["/etc/ld.so.preload"]


@pytest.mark.parametrize(
    "allocated, container, uid, message",
    [
        (None, "eval", "uid-p", "annotation hami.io/vgpu-devices-allocated is missing"),
        (
            "GPU-a0,NVIDIA,notanumber",
            "eval",
            "uid-p",
            "hami.io/vgpu-devices-allocated='GPU-a0,NVIDIA,notanumber' is invalid",
        ),
        (ALLOCATED, "side", "uid-p", "container 'side' was given GPUs by the kubelet but has no entry"),
        (ALLOCATED, "ghost", "uid-p", "container 'ghost' is not in the pod's spec"),
        (";;;;;;;", "eval", "uid-p", "has 7 container entries but the pod has 4 containers"),
        (ALLOCATED, "eval", "uid-other", "pod ns/p (uid uid-other) is not on the API server"),
    ],
)
async def test_a_gpu_container_without_a_usable_grant_is_refused_naming_pod_and_container(
    tmp_path, allocated, container, uid, message
):
    obj = pod_obj(allocated=allocated)
    kube = FakeKube([obj])
    box = sandbox(obj)
    box.uid = uid
    with pytest.raises(Refusal, match="pod ns/p") as err:
        await injector(kube, tmp_path).create_container(box, ctr(container))
    assert message in str(err.value)
    assert kube.patches == []


async def test_an_api_failure_refuses_the_container(tmp_path):
    class Broken(FakeKube):
        async def get_pod(self, namespace, name):
            raise ConnectionError("connection refused")

    obj = pod_obj()
    with pytest.raises(Refusal, match="pod ns/p: container 'eval': cannot read the pod: connection refused"):
        await injector(Broken([obj]), tmp_path).create_container(sandbox(obj, with_annotations=False), ctr("eval"))


async def test_a_resync_evicts_live_containers_still_waiting_for_their_grant(tmp_path):
    hook = injector(FakeKube([]), tmp_path)
    stopped = ctr("old")
    stopped.state = 4
    given = pb.Container(id="id-given", env=["HAMI_NRI_INJECTION=done"], state=3)
    # a pod's envFrom set the variable to done while the hook was away: Allocate's marker mount is still there
    claimed = pb.Container(
        id="id-claimed",
        env=["HAMI_NRI_INJECTION=pending", "HAMI_NRI_INJECTION=done"],
        state=3,
        mounts=[pb.Mount(destination=hook.paths.pending_marker, source="/x", type="bind")],
    )
    evict = await hook.synchronized([], [ctr("waiting"), stopped, given, ctr("plain", marked=False), claimed])
    assert [c for c, _ in evict] == ["id-waiting", "id-claimed"]


def test_env_map_keeps_the_last_value_and_values_with_equals():
    assert env_map(["A=1", "B=x=y", "A=2", "junk"]) == {"A": "2", "B": "x=y"}


@pytest.mark.parametrize(
    "before, want, patch",
    [
        ({}, "nri", {NODE_INJECTION: "nri"}),
        ({NODE_INJECTION: "nri"}, None, {NODE_INJECTION: None}),  # a merge patch's None removes the key
        ({NODE_INJECTION: "nri"}, "nri", None),
        ({}, None, None),
        ({NODE_INJECTION: "bogus"}, None, {NODE_INJECTION: None}),  # a stale value of an earlier run
        # a starting plugin whose hook has not registered yet leaves the node as it is
        ({NODE_INJECTION: "nri"}, KEEP, None),
        ({}, KEEP, None),
    ],
)
def test_the_node_says_nri_exactly_while_the_hook_is_ready(before, want, patch):
    gpu = PhysicalGPU(index=0, uuid=G0, model="A100", memory_mib=40960, bus_id="0", numa=0)
    state, now = DeviceState([gpu], NodeSettings()), datetime(2026, 1, 1)
    registered = {**registration_patch(state, {}, now, False), **before}  # the devices already said
    assert registration_patch(state, registered, now, False, want) == patch


@pytest.mark.parametrize(
    "overrides, settings, problem",
    [
        ({}, {}, None),
        ({"injection": "allocate", "nri_plugin_index": "x"}, {}, None),
        ({"nri_plugin_index": "7"}, {}, "--nri-plugin-index: NRI plugin index must be two digits, got '7'"),
        ({}, {"operating_mode": "mig"}, "operatingmode hami-core only (got 'mig')"),
        ({"device_list_strategy": "cdi-cri"}, {}, "--device-list-strategy envvar only (got 'cdi-cri')"),
        ({}, {"mig_strategy": "mixed"}, "does not serve migstrategy mixed"),
        ({"pass_device_specs": True}, {}, "cannot go with --pass-device-specs"),
    ],
)
def test_nri_injection_refuses_what_allocate_alone_can_make(overrides, settings, problem):
    from dataclasses import replace

    args = argparse.Namespace(
        **{
            "injection": "nri",
            "nri_plugin_index": "50",
            "device_list_strategy": "envvar",
            "pass_device_specs": False,
            **overrides,
        }
    )
    got = injection_problem(args, replace(NodeSettings(), **settings))
    assert got == problem if problem is None else problem in got


async def test_the_agent_writes_the_node_annotation_with_the_hooks_sessions_and_a_grace(tmp_path, monkeypatch):
    from hami.deviceplugin import agent as agent_module
    from hami.deviceplugin.agent import NodeAgent

    class NodeKube(FakeKube):
        def __init__(self) -> None:
            super().__init__([])
            self.node = {}

        async def node_annotations(self):
            return dict(self.node), "1"

        async def patch_node_annotations(self, values, resource_version=None):
            for k, v in values.items():
                if v is None:
                    self.node.pop(k, None)
                else:
                    self.node[k] = v

    kube = NodeKube()
    agent = NodeAgent(
        kube,
        NodeSettings(),
        [],
        tmp_path,
        HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")),
        injection="nri",
        nri_socket=str(tmp_path / "nri.sock"),
    )
    assert isinstance(agent.allocator, NriAllocator) and agent.nri is not None
    assert agent.nri.socket == str(tmp_path / "nri.sock")
    # a restarted plugin keeps its predecessor's nri while its hook registers (withdrawing it at
    # start had the scheduler bind with the node lock for the second until the hook was back)
    kube.node[NODE_INJECTION] = "nri"
    await agent.registrar.sync_once()
    assert kube.node[NODE_INJECTION] == "nri"
    await agent._injection_ready(True)
    assert kube.node[NODE_INJECTION] == "nri"
    # the hook's session ends (a containerd restart): kept for the grace, the hook back within it
    monkeypatch.setattr(agent_module, "NRI_START_GRACE_S", 0.05)
    await agent._injection_ready(False)
    assert kube.node[NODE_INJECTION] == "nri"
    await agent._injection_ready(True)
    await asyncio.sleep(0.1)
    assert kube.node[NODE_INJECTION] == "nri"  # the grace was called off
    # not back within the grace: the node stops saying nri
    await agent._injection_ready(False)
    await asyncio.sleep(0.1)
    assert NODE_INJECTION not in kube.node
    # a starting plugin whose hook never registers: withdrawn when its grace ends
    late = NodeAgent(
        kube,
        NodeSettings(),
        [],
        tmp_path,
        HookPaths(str(tmp_path / "h3"), str(tmp_path / "l3")),
        injection="nri",
        nri_socket=str(tmp_path / "nri.sock"),
    )
    kube.node[NODE_INJECTION] = "nri"
    await late._injection_grace()
    assert NODE_INJECTION not in kube.node
    plain = NodeAgent(kube, NodeSettings(), [], tmp_path, HookPaths(str(tmp_path / "h2"), str(tmp_path / "l2")))
    assert plain.nri is None and not isinstance(plain.allocator, NriAllocator)


def composed(name: str, tenant: dict) -> object:
    """A container as the runtime composes it: the device plugin's deferred grant first, the
    pod's own env (env, envFrom) after it, the later value of a key winning (env_map)."""
    env = {**contract.deferred_grant(), **tenant}
    return pb.Container(id=f"id-{name}", name=name, env=[f"{k}={v}" for k, v in env.items()], state=3)


@pytest.mark.parametrize("marker", ["done", "", "no"])
async def test_a_marker_the_pods_env_replaced_is_refused(tmp_path, marker):
    """The pod's env comes after Allocate's, so an envFrom (which no admission rule reads) could
    set HAMI_NRI_INJECTION=done: the hook then gave nothing and the container ran with the
    NVIDIA_VISIBLE_DEVICES of its choice (all), unlimited. Found by review; fails before."""
    obj = pod_obj()
    kube = FakeKube([obj])
    tenant = {"HAMI_NRI_INJECTION": marker, "NVIDIA_VISIBLE_DEVICES": "all"}
    with pytest.raises(Refusal, match=f"HAMI_NRI_INJECTION={marker!r} comes from the pod's env"):
        await injector(kube, tmp_path).create_container(sandbox(obj), composed("eval", tenant))


def raw(name: str, env: list[str]):
    """A container whose env list is ``env`` as the runtime composed it (image first, then the
    kubelet's: Allocate's, then the pod's), names not merged."""
    return pb.Container(id=f"id-{name}", name=name, env=env, state=3)


async def test_an_image_that_sets_the_gpu_list_itself_gets_the_grants(tmp_path):
    """CUDA's base images say NVIDIA_VISIBLE_DEVICES=all: one entry, which the hook's replaces."""
    obj = pod_obj()
    image = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    adjust = await injector(FakeKube([obj]), tmp_path).create_container(
        sandbox(obj), raw("eval", [*image, "HAMI_NRI_INJECTION=pending"])
    )
    assert adjusted_env(adjust)["NVIDIA_VISIBLE_DEVICES"] == G1


@pytest.mark.parametrize(
    "env, name, value",
    [
        # the image's and the pod's (envFrom): containerd's NRI would give the container 'all'
        (
            ["NVIDIA_VISIBLE_DEVICES=all", "HAMI_NRI_INJECTION=pending", "NVIDIA_VISIBLE_DEVICES=all"],
            "NVIDIA_VISIBLE_DEVICES",
            "all",
        ),
        (
            ["CUDA_DEVICE_SM_LIMIT_0=100", "HAMI_NRI_INJECTION=pending", "CUDA_DEVICE_SM_LIMIT_0=100"],
            "CUDA_DEVICE_SM_LIMIT_0",
            "100",
        ),
    ],
)
async def test_a_name_the_grant_sets_twice_in_the_env_is_refused(tmp_path, env, name, value):
    obj = pod_obj()
    with pytest.raises(Refusal, match=f"{name} is set more than once in its env .* would keep {value!r}"):
        await injector(FakeKube([obj]), tmp_path).create_container(sandbox(obj), raw("eval", env))


async def test_twice_with_the_grants_own_value_last_is_fine(tmp_path):
    """The image's policy and the webhook's (the node-wide one) in the pod spec: the last is the
    spec's, which the adjustment sets too."""
    obj = pod_obj(eval_env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}])
    env = ["GPU_CORE_UTILIZATION_POLICY=default", "HAMI_NRI_INJECTION=pending", "GPU_CORE_UTILIZATION_POLICY=force"]
    adjust = await injector(FakeKube([obj]), tmp_path).create_container(sandbox(obj), raw("eval", env))
    assert adjusted_env(adjust)["GPU_CORE_UTILIZATION_POLICY"] == "force"


async def test_libvgpu_settings_the_grant_does_not_give_are_emptied_and_the_grants_win(tmp_path):
    """An envFrom or the image can give libvgpu settings of their own: a per-device share over
    the grant's unindexed one, oversubscription, the policy off, a priority, a context size.
    The adjustment sets them empty (libvgpu reads that as unset; containerd 1.7's NRI drops
    removals) and sets the grant's over the rest."""
    obj = pod_obj(eval_env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}])
    tenant = {
        "CUDA_DEVICE_SM_LIMIT_0": "100",
        "CUDA_DEVICE_MEMORY_LIMIT": "80g",
        "CUDA_OVERSUBSCRIBE": "true",
        "LIBVGPU_CONTEXT_SIZE": "0",
        "CUDA_TASK_PRIORITY": "0",
        "GPU_CORE_UTILIZATION_POLICY": "disable",
        "CUDA_DEVICE_SM_LIMIT": "100",
        "NVIDIA_VISIBLE_DEVICES": "all",  # once: the hook's replaces it
        "MY_APP_SETTING": "kept",
    }
    adjust = await injector(FakeKube([obj]), tmp_path).create_container(sandbox(obj), composed("eval", tenant))
    env = adjusted_env(adjust)
    emptied = sorted(k for k, v in env.items() if v == "")
    assert emptied == [
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT_0",
        "CUDA_OVERSUBSCRIBE",
        "CUDA_TASK_PRIORITY",
        "LIBVGPU_CONTEXT_SIZE",
    ]
    assert not any(k.startswith("-") for k in env)  # no removal: containerd 1.7's NRI would drop it
    assert env["NVIDIA_VISIBLE_DEVICES"] == G1 and env["CUDA_DEVICE_SM_LIMIT"] == "10"
    assert env["GPU_CORE_UTILIZATION_POLICY"] == "force"  # the pod spec's literal value, which admission checked
    assert "MY_APP_SETTING" not in env


def test_the_pending_marker_is_the_file_libvgpu_looks_for(tmp_path):
    from pathlib import Path

    from hami.node.layout import PENDING_MARKER, prepare_hook_dir

    from hami.node.layout import GRANT_FILE

    native = Path(__file__).resolve().parents[2] / "native" / "libvgpu"
    assert f'#define PENDING_MARKER "{PENDING_MARKER}"' in (native / "vgpu.h").read_text()
    assert f'#define GRANT_FILE "{GRANT_FILE}"' in (native / "config.c").read_text()
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    prepare_hook_dir(paths)
    # the host's file is not beside the host's library (libvgpu there would refuse every device)
    assert Path(paths.pending_marker_source).is_file() and not Path(paths.pending_marker).exists()
    assert Path(paths.pending_marker).parent == Path(paths.library).parent
