import pytest

from hami.config import ConfigError, NvidiaConfig, device_config_from_dict, load_device_config
from hami.core import PERCENT_UNSET, ContainerKind, RequestError, SchedulerConfig, admit_pod, pod_request
from hami.vendors import NvidiaVendor, build_vendors

from ._corekit import CONFIG, ctr, pod


def req_of(container, vendor=None):
    vendor = vendor or NvidiaVendor()
    return vendor.container_request(container, "c")


def limits(p, i=0):
    return p["spec"]["containers"][i]["resources"]["limits"]


@pytest.mark.parametrize(
    "limits_in,expect",
    [
        # (limits, (nums, memreq, pct, cores))
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}, (1, 3000, PERCENT_UNSET, 30)),
        ({"nvidia.com/gpu": 2}, (2, 0, 100, 0)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, (1, 0, 50, 0)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0}, (1, 0, 100, 0)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}, (1, 0, 100, 100)),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2k"}, (1, 2000, PERCENT_UNSET, 0)),
    ],
)
def test_request_parsing(limits_in, expect):
    r = req_of({"name": "c", "resources": {"limits": limits_in}})
    assert (r.nums, r.memreq, r.mem_percentage, r.coresreq) == expect and r.type == "NVIDIA"


def test_no_count_means_no_request():
    assert req_of({"name": "c", "resources": {"limits": {"cpu": "1"}}}) is None
    assert req_of({"name": "c"}) is None


def test_limits_win_over_requests():
    c = {
        "name": "c",
        "resources": {"limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}},
    }
    r = req_of(c)
    assert r.nums == 2 and r.memreq == 100


def test_default_memory_and_cores_and_memory_factor():
    v = NvidiaVendor(NvidiaConfig(defaultMemory=2048, defaultCores=10, memoryFactor=2))
    r = req_of({"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}, v)
    assert (r.memreq, r.mem_percentage, r.coresreq) == (2048, PERCENT_UNSET, 10)
    r = req_of({"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}}}, v)
    assert r.memreq == 200


@pytest.mark.parametrize(
    "limits_in,needle",
    [
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": -5}, "nvidia.com/gpumem"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "lots"}, "nvidia.com/gpumem"),
        ({"nvidia.com/gpu": -1}, "nvidia.com/gpu"),
    ],
)
def test_bad_request_values_name_the_field(limits_in, needle):
    with pytest.raises(RequestError, match=needle):
        req_of({"name": "c", "resources": {"limits": limits_in}})


# ---------------------------------------------------------------- admission (webhook defaults)


def test_bare_gpu_becomes_exclusive():
    assert limits(pod(containers=[ctr(gpu=2)]))["nvidia.com/gpucores"] == 100


def test_memory_without_count_gets_default_gpu_num():
    p = pod(containers=[ctr(gpu=None, mem=3000)])
    assert limits(p)["nvidia.com/gpu"] == 1 and "nvidia.com/gpucores" not in limits(p)


def test_full_percentage_is_exclusive_but_partial_is_not():
    assert limits(pod(containers=[ctr(pct=100)]))["nvidia.com/gpucores"] == 100
    assert "nvidia.com/gpucores" not in limits(pod(containers=[ctr(pct=50)]))


def test_explicit_cores_are_kept():
    assert limits(pod(containers=[ctr(cores=30)]))["nvidia.com/gpucores"] == 30


@pytest.mark.parametrize("pct", [150, -1])
def test_percentage_out_of_range_is_rejected(pct):
    with pytest.raises(RequestError, match=r"default/p: container 'c': nvidia.com/gpumem-percentage"):
        pod(containers=[ctr(pct=pct)])


def test_admission_env_runtime_class_and_overwrite_env():
    cfg = device_config_from_dict(
        {"nvidia": {"runtimeClassName": "nvidia", "overwriteEnv": True, "gpuCorePolicy": "force"}}
    )
    vendors = build_vendors(cfg)
    raw = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "g", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/priority": 0}}},
                {"name": "cpu"},
            ]
        },
    }
    out, uses = admit_pod(raw, vendors)
    assert uses and out["spec"]["runtimeClassName"] == "nvidia"
    env_g = {e["name"]: e["value"] for e in out["spec"]["containers"][0]["env"]}
    assert env_g == {"CUDA_TASK_PRIORITY": "0", "GPU_CORE_UTILIZATION_POLICY": "force"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"} in out["spec"]["containers"][1]["env"]
    assert "env" not in raw["spec"]["containers"][0]  # the input is not mutated


def test_overwrite_env_leaves_one_entry_of_a_name_the_container_repeated():
    """The container gets the last entry of a repeated name: a second ``all`` kept the GPUs."""
    vendors = build_vendors(device_config_from_dict({"nvidia": {"overwriteEnv": True}}))
    visible = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    cpu = {"name": "cpu", "env": [*visible, {"name": "X", "value": "1"}, *visible]}
    raw = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "g", "resources": {"limits": {"nvidia.com/gpu": 1}}}, cpu]},
    }
    out, _ = admit_pod(raw, vendors)
    assert out["spec"]["containers"][1]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
        {"name": "X", "value": "1"},
    ]


def test_admission_copies_what_vendors_change_and_shares_status_and_managed_fields():
    vendors = build_vendors(device_config_from_dict({"nvidia": {"runtimeClassName": "nvidia", "overwriteEnv": True}}))
    managed = [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:containers": {}}}}]
    status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
    raw = {
        "metadata": {"name": "p", "annotations": {"a": "1"}, "labels": {"l": "1"}, "managedFields": managed},
        "spec": {"containers": [{"name": "g", "resources": {"limits": {"nvidia.com/gpu": 1}}}, {"name": "cpu"}]},
        "status": status,
    }
    out, _ = admit_pod(raw, vendors)
    assert list(out) == list(raw) and list(out["metadata"]) == list(raw["metadata"])  # key order kept
    assert out["status"] is status and out["metadata"]["managedFields"] is managed  # not copied
    for path in (("spec",), ("spec", "containers"), ("metadata",), ("metadata", "annotations")):
        a, b = out, raw
        for k in path:
            a, b = a[k], b[k]
        assert a is not b, path  # what a vendor may change is a copy
    out["metadata"]["annotations"]["b"] = "2"
    out["metadata"]["labels"]["m"] = "2"
    assert raw["metadata"]["annotations"] == {"a": "1"} and raw["metadata"]["labels"] == {"l": "1"}
    assert "runtimeClassName" not in raw["spec"] and "env" not in raw["spec"]["containers"][1]


def test_pod_without_containers_is_rejected():
    with pytest.raises(RequestError, match="no containers"):
        admit_pod({"metadata": {"name": "p"}, "spec": {}}, CONFIG.vendors)


def test_container_order_and_kinds():
    p = pod(containers=[ctr("app")], init=[ctr("init"), ctr("side", sidecar=True)])
    r = pod_request(p, CONFIG.vendors)
    assert [(c.name, c.kind) for c in r.containers] == [
        ("init", ContainerKind.INIT),
        ("side", ContainerKind.SIDECAR),
        ("app", ContainerKind.APP),
    ]


# ---------------------------------------------------------------- device-config.yaml


def test_config_defaults_and_errors():
    cfg = load_device_config("nvidia:\n  deviceSplitCount: 4\n  defaultMemory: 1000\n")
    assert cfg.nvidia.device_split_count == 4 and cfg.nvidia.default_memory == 1000
    assert cfg.nvidia.resource_count_name == "nvidia.com/gpu"
    with pytest.raises(ConfigError, match=r"nvidia.defaultMemory.*'lots'"):
        load_device_config("nvidia:\n  defaultMemory: lots\n")
    with pytest.raises(ConfigError, match="gpuCorePolicy|gpu_core_policy"):
        load_device_config("nvidia:\n  gpuCorePolicy: sometimes\n")
    with pytest.raises(ConfigError, match="no vendor section"):
        load_device_config("{}")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_device_config("nvidia: [")


def test_scheduler_config_rejects_unknown_policies():
    with pytest.raises(RequestError, match="node-scheduler-policy"):
        SchedulerConfig(build_vendors(), node_policy="random")
    with pytest.raises(RequestError, match="gpu-scheduler-policy"):
        SchedulerConfig(build_vendors(), gpu_policy="best")


def test_a_controller_made_pod_is_named_by_its_generate_name_at_admission():
    """A Deployment's pod has no name when the webhook sees it: a refusal said ``pod t/?``."""
    from hami.core.requests import pod_name

    assert pod_name({"metadata": {"namespace": "t", "generateName": "web-7d9f-"}}) == "t/web-7d9f-*"
    assert pod_name({"metadata": {"namespace": "t", "name": "a", "generateName": "web-"}}) == "t/a"
    assert pod_name({"metadata": {}}) == "default/?"
