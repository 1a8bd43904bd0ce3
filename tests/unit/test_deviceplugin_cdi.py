"""CDI device-list strategies (cdi.py): the spec the plugin writes, validated against a JSON schema
written from the CDI specification (fixtures/cdi-spec.schema.json), and Allocate's answers with
CDI device names (the annotation of cdi-annotations, the cdi_devices field of cdi-cri)."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import jsonschema
import pytest

from hami.cli import main
from hami.deviceplugin import allocate as A
from hami.node.layout import HookPaths, MountSpec
from hami.deviceplugin import command
from hami.deviceplugin.allocator import Allocator
from hami.node.cdi import CdiConfig, CdiConfigError, CdiGpu, annotation_key, apply, spec, write_spec
from hami.deviceplugin.devices import DeviceState
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings
from hami.deviceplugin.server import container_response

from .test_deviceplugin_allocator import FakeKube, pod_obj

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "cdi-spec.schema.json").read_text())
U0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
U1 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"
#: a Kubernetes annotation key: optional DNS prefix, then a name of at most 63 characters
K8S_KEY = re.compile(r"^([a-z0-9]([a-z0-9.-]*[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def validate(document: dict) -> None:
    jsonschema.validate(document, SCHEMA, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("gpus", [[CdiGpu(U0, 0)], [CdiGpu(U1, 3), CdiGpu(U0, 0)]])
@pytest.mark.parametrize("kind", ["hami.io/gpu", "k8s.device-plugin.nvidia.com/gpu"])
def test_the_spec_is_valid_cdi(gpus, kind):
    document = spec(gpus, CdiConfig("cdi-annotations", kind))
    validate(document)
    assert document["cdiVersion"] == "0.5.0" and document["kind"] == kind
    assert [d["name"] for d in document["devices"]] == [g.uuid for g in sorted(gpus, key=lambda g: g.minor)]
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in document["devices"]}
    assert by_name[U0] == [{"path": "/dev/nvidia0"}]
    assert {n["path"] for n in document["containerEdits"]["deviceNodes"]} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }


@pytest.mark.parametrize(
    "broken",
    [
        lambda d: d.pop("kind"),
        lambda d: d.update(kind="no-class"),
        lambda d: d.update(cdiVersion="0.5"),
        lambda d: d["devices"][0].update(name="-bad-"),
        lambda d: d["devices"][0]["containerEdits"]["deviceNodes"][0].update(path="dev/nvidia0"),
        lambda d: d["devices"][0].update(extra=1),
        lambda d: d.update(devices=[]),
    ],
)
def test_the_schema_refuses_what_the_cdi_spec_refuses(broken):
    document = spec([CdiGpu(U0, 0)], CdiConfig("cdi-cri"))
    broken(document)
    with pytest.raises(jsonschema.ValidationError):
        validate(document)


def test_spec_file_is_written_whole_and_world_readable(tmp_path):
    document = spec([CdiGpu(U0, 0)], CdiConfig("cdi-cri"))
    path = write_spec(document, tmp_path / "cdi")
    assert path == tmp_path / "cdi" / "hami-gpu.json"
    assert json.loads(path.read_text()) == document and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["hami-gpu.json"]  # no temporary left behind
    validate(json.loads(path.read_text()))


def _response():
    return A.ContainerResponse(
        {"NVIDIA_VISIBLE_DEVICES": f"{U0},{U1}", "CUDA_DEVICE_SM_LIMIT": "30"},
        (MountSpec("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),),
        "/c",
    )


def test_envvar_leaves_the_response_alone():
    assert apply(_response(), CdiConfig("envvar"), "uid", "main") == _response()


def test_cdi_annotations_name_the_devices_in_one_annotation():
    out = apply(_response(), CdiConfig("cdi-annotations"), "uid-1", "main")
    assert "NVIDIA_VISIBLE_DEVICES" not in out.envs and out.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert out.mounts == _response().mounts and out.cdi_devices == ()
    [(key, value)] = out.annotations.items()
    assert key.startswith("cdi.k8s.io/hami-device-plugin_") and K8S_KEY.match(key)
    assert value == f"hami.io/gpu={U0},hami.io/gpu={U1}"
    assert key == annotation_key(CdiConfig("cdi-annotations"), "uid-1", "main")  # stable per pod and container
    assert key != annotation_key(CdiConfig("cdi-annotations"), "uid-1", "sidecar")


def test_cdi_cri_fills_the_cdi_devices_field_of_the_grpc_answer():
    out = apply(_response(), CdiConfig("cdi-cri", "k8s.device-plugin.nvidia.com/gpu"), "uid-1", "main")
    assert out.annotations == {} and "NVIDIA_VISIBLE_DEVICES" not in out.envs
    wire = container_response(out)
    assert [d.name for d in wire.cdi_devices] == [
        f"k8s.device-plugin.nvidia.com/gpu={U0}",
        f"k8s.device-plugin.nvidia.com/gpu={U1}",
    ]
    wire = container_response(apply(_response(), CdiConfig("cdi-annotations"), "uid-1", "main"))
    assert dict(wire.annotations) and not wire.cdi_devices and "NVIDIA_VISIBLE_DEVICES" not in wire.envs


async def test_allocate_answers_with_cdi_names(tmp_path):
    kube = FakeKube("2026-11-22T03:00:00Z,ns,p", [pod_obj("p", to_allocate=f"{U0},NVIDIA,1000,10:;")])
    alloc = Allocator(
        kube,
        NodeSettings(),
        HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")),
        release_delay=0,
        cdi=CdiConfig("cdi-cri"),
        gpus=[U0, U1],
    )
    [resp] = await alloc.allocate([1])
    assert resp.cdi_devices == (f"hami.io/gpu={U0}",) and "NVIDIA_VISIBLE_DEVICES" not in resp.envs
    assert resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"  # libvgpu's limits are still there


@pytest.mark.parametrize(
    "kw,flag",
    [
        ({"strategy": "cdi"}, "--device-list-strategy"),
        ({"strategy": "cdi-cri", "kind": "nvidia.com"}, "--cdi-kind"),
        ({"strategy": "cdi-cri", "annotation_prefix": "cdi.k8s.io"}, "--cdi-annotation-prefix"),
    ],
)
def test_bad_cdi_options_name_the_flag(kw, flag):
    with pytest.raises(CdiConfigError, match=rf"^{flag}: .*got"):
        CdiConfig(**kw)


def _start(capsys, tmp_path, *extra: str, node_entry: dict | None = None) -> tuple[int, str]:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", **(node_entry or {})}]}))
    code = main(
        [
            "device-plugin",
            "--node-name",
            "n1",
            "--node-config",
            str(cfg),
            "--nvml-library",
            str(tmp_path / "no-nvml.so"),
            *extra,
        ]
    )
    return code, capsys.readouterr().err


def test_the_plugin_refuses_an_unknown_strategy_in_one_line(capsys, tmp_path):
    code, err = _start(capsys, tmp_path, "--device-list-strategy=volume-mounts")
    assert code == 2 and err.strip() == (
        "hami device-plugin: --device-list-strategy: expected one of envvar, "
        "cdi-annotations, cdi-cri, got 'volume-mounts'"
    )


def test_cdi_goes_with_hami_core_mode_only(capsys, tmp_path):
    code, err = _start(capsys, tmp_path, "--device-list-strategy=cdi-cri", node_entry={"operatingmode": "mig"})
    assert code == 2 and "goes with operatingmode hami-core only (got 'mig'" in err


def test_dry_run_shows_the_spec_with_each_gpus_minor(monkeypatch):
    import pynvml

    minors = {U0: 4, U1: 0}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", lambda u: u.decode() if isinstance(u, bytes) else u)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMinorNumber", lambda h: minors[h])
    state = DeviceState(
        [
            PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0),
            PhysicalGPU(1, U1, "Tesla T4", 15360, "0000:5e:00.0", 0),
        ],
        NodeSettings(),
    )
    shown = command.describe(NodeSettings(), state, CdiConfig("cdi-annotations"))
    validate(shown["cdiSpec"])
    assert [(d["name"], d["containerEdits"]["deviceNodes"][0]["path"]) for d in shown["cdiSpec"]["devices"]] == [
        (U1, "/dev/nvidia0"),
        (U0, "/dev/nvidia4"),
    ]
    assert "cdiSpec" not in command.describe(NodeSettings(), state, CdiConfig("envvar"))
