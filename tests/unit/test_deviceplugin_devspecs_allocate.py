"""``--pass-device-specs`` (HAMi's ``passDeviceSpecsEnabled``): the DeviceSpecs of an Allocate
answer, over a temporary dev root whose files stand for the host's device nodes (only the name
and existence matter here; the real node test, tests/realnode/test_devspecs_e2e.py, uses a real
character device)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hami.core.types import ContainerDevice
from hami.deviceplugin import allocate as A
from hami.deviceplugin import command
from hami.deviceplugin.devices import DeviceState
from hami.deviceplugin.static_mig import StaticMigResource
from hami.node import nvml
from hami.node.layout import HookPaths
from hami.node.nvml import Instance, PhysicalGPU
from hami.node.settings import NodeSettings

U0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
U1 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"
U2 = "GPU-cccccccc-0000-4000-8000-000000000002"  # in MIG mode
MIG_A = "MIG-11111111-0000-4000-8000-00000000000a"
MIG_B = "MIG-22222222-0000-4000-8000-00000000000b"
MINORS = {U0: 0, U1: 3, U2: 5}


def dev_root(tmp_path: Path, *names: str) -> Path:
    """``<tmp>/root/dev/<name>`` for each name: the host root as the plugin sees it."""
    root = tmp_path / "root"
    for name in names:
        (root / "dev" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "dev" / name).touch()
    (root / "dev").mkdir(parents=True, exist_ok=True)
    return root


def pod(*containers: A.ContainerView) -> A.PodView:
    return A.PodView("ns", "p", "uid-1", {}, tuple(containers))


def grant(*uuids: str) -> A.Grant:
    ctr = A.ContainerView("main", {"nvidia.com/gpu": str(len(uuids))})
    return A.Grant(0, ctr, tuple(ContainerDevice(u, "NVIDIA", 3000, 30) for u in uuids))


def paths_of(response: A.ContainerResponse) -> list[tuple[str, str, str]]:
    return [(d.container_path, d.host_path, d.permissions) for d in response.devices]


# ---------------------------------------------------------------------------------------------
# the specs of a grant


def test_a_grant_passes_its_gpus_nodes_then_the_control_nodes_the_host_has(tmp_path):
    root = dev_root(tmp_path, "nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
    specs = A.DeviceSpecs({U0: ("nvidia0",), U1: ("nvidia3",)}, str(root))
    r = A.build_response(pod(grant(U1).container), grant(U1), NodeSettings(), HookPaths(), device_specs=specs)
    assert paths_of(r) == [
        (f"/dev/{n}", f"{root}/dev/{n}", "rw")
        for n in ("nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
    ]
    # the other GPU's node is not given
    assert "/dev/nvidia0" not in [c for c, _, _ in paths_of(r)]


def test_only_nodes_that_exist_are_passed(tmp_path):
    # no nvidia-uvm-tools, no nvidia-modeset (often absent), and GPU 3's node missing too
    root = dev_root(tmp_path, "nvidia0", "nvidiactl", "nvidia-uvm")
    specs = A.DeviceSpecs({U0: ("nvidia0",), U1: ("nvidia3",)}, str(root))
    r = A.build_response(pod(grant(U0, U1).container), grant(U0, U1), NodeSettings(), HookPaths(), device_specs=specs)
    assert [c for c, _, _ in paths_of(r)] == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]


def test_a_node_that_appears_later_is_passed_from_then_on(tmp_path):
    # nvidia-uvm is made on first use (nvidia-modprobe): existence is looked at per Allocate
    root = dev_root(tmp_path, "nvidia0", "nvidiactl")
    specs = A.DeviceSpecs({U0: ("nvidia0",)}, str(root))
    assert [d.container_path for d in specs.specs([U0])] == ["/dev/nvidia0", "/dev/nvidiactl"]
    (root / "dev" / "nvidia-uvm").touch()
    assert [d.container_path for d in specs.specs([U0])] == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]


def test_host_paths_are_under_the_host_root_while_existence_is_looked_up_in_the_plugins_view(tmp_path):
    view = dev_root(tmp_path, "nvidia0", "nvidiactl")
    specs = A.DeviceSpecs({U0: ("nvidia0",)}, "/", str(view))
    assert [(d.container_path, d.host_path) for d in specs.specs([U0])] == [
        ("/dev/nvidia0", "/dev/nvidia0"),
        ("/dev/nvidiactl", "/dev/nvidiactl"),
    ]


def test_without_the_flag_the_response_has_no_device_specs(tmp_path):
    r = A.build_response(pod(grant(U0).container), grant(U0), NodeSettings(), HookPaths())
    assert r.devices == ()


def test_mig_mode_grants_pass_the_gpus_node(tmp_path):
    root = dev_root(tmp_path, "nvidia0", "nvidiactl")
    specs = A.DeviceSpecs({U0: ("nvidia0",)}, str(root))
    r = A.build_response(
        pod(grant(U0).container),
        grant(U0),
        NodeSettings(operating_mode="mig"),
        HookPaths(),
        mig_devices=[MIG_A],
        device_specs=specs,
    )
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == MIG_A
    assert [d.container_path for d in r.devices] == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_a_static_mig_device_passes_its_gpu_and_its_caps_nodes_once_each(tmp_path):
    root = dev_root(tmp_path, "nvidia5", "nvidiactl", "nvidia-caps/nvidia-cap21", "nvidia-caps/nvidia-cap22")
    specs = A.DeviceSpecs(
        {
            MIG_A: ("nvidia5", "nvidia-caps/nvidia-cap21", "nvidia-caps/nvidia-cap22"),
            MIG_B: ("nvidia5", "nvidia-caps/nvidia-cap30", "nvidia-caps/nvidia-cap31"),
        },
        str(root),
    )
    assert [d.container_path for d in specs.specs([MIG_A])] == [
        "/dev/nvidia5",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
        "/dev/nvidiactl",
    ]
    # two instances of one GPU: its node once
    assert [d.container_path for d in specs.specs([MIG_A, MIG_B])].count("/dev/nvidia5") == 1


# ---------------------------------------------------------------------------------------------
# the driver's capability files of MIG instances


def write_access(proc: Path, minor: int, gi: int, ci: int, gi_cap: int, ci_cap: int) -> None:
    base = proc / "driver/nvidia/capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
    (base / f"ci{ci}").mkdir(parents=True)
    (base / "access").write_text(f"DeviceFileMinor: {gi_cap}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (base / f"ci{ci}" / "access").write_text(f"DeviceFileMinor: {ci_cap}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


def test_mig_cap_nodes_read_the_gi_and_ci_access_files(tmp_path):
    write_access(tmp_path, 5, 3, 0, 30, 31)
    assert A.mig_cap_nodes(tmp_path, 5, 3, 0) == ("nvidia-caps/nvidia-cap30", "nvidia-caps/nvidia-cap31")
    assert A.mig_cap_nodes(tmp_path, 5, 4, 0) == ()  # no such instance: nothing to pass


# ---------------------------------------------------------------------------------------------
# the flag and what the plugin builds at start-up


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv,on",
    [((), False), (("--pass-device-specs",), True), (("--pass-device-specs=false",), False)],
)
def test_the_flag_is_off_unless_given(monkeypatch, argv, on):
    monkeypatch.delenv("PASS_DEVICE_SPECS", raising=False)
    args = parse(*argv)
    assert args.pass_device_specs is on
    assert args.dev_root == "/"


def test_device_specs_problems_name_the_flag(tmp_path):
    root = dev_root(tmp_path)
    assert command.device_specs_problem(parse("--pass-device-specs", f"--dev-root={root}")) is None
    assert command.device_specs_problem(parse("--dev-root=/nowhere")) is None  # off: not looked at
    for strategy in ("cdi-annotations", "cdi-cri"):  # as NVIDIA's plugin: test_nodecfg_review_devspecs_cdi.py
        assert (
            command.device_specs_problem(
                parse("--pass-device-specs", f"--dev-root={root}", f"--device-list-strategy={strategy}")
            )
            is None
        )
    assert "absolute" in command.device_specs_problem(parse("--pass-device-specs", "--dev-root=rel"))
    assert f"{tmp_path}/nowhere/dev" in command.device_specs_problem(
        parse("--pass-device-specs", f"--dev-root={tmp_path}/nowhere")
    )


def test_nri_injection_refuses_device_specs():
    args = parse("--pass-device-specs", "--injection=nri")
    assert "--pass-device-specs" in command.injection_problem(args, NodeSettings())


class FakeMig:
    def instances(self, uuid: str) -> list[Instance]:
        assert uuid == U2
        return [
            Instance(gi=3, profile="3g.20gb", start=0, size=4, ci=0, mig_uuid=MIG_A),
            Instance(gi=4, profile="3g.20gb", start=4, size=4, ci=None),  # no compute instance: no device
        ]


def test_start_up_builds_each_gpus_and_each_static_mig_devices_nodes(monkeypatch, tmp_path):
    monkeypatch.setattr(nvml, "minor_number", lambda uuid: MINORS[uuid])
    monkeypatch.setattr(nvml, "MigNvml", FakeMig)
    write_access(tmp_path / "proc", 5, 3, 0, 30, 31)
    gpus = [PhysicalGPU(i, u, "NVIDIA A100", 40960, f"0000:0{i}:00.0", 0) for i, u in enumerate((U0, U1))]
    state = DeviceState(gpus, NodeSettings())
    static = [StaticMigResource("nvidia.com/mig-3g.20gb", [MIG_A], {MIG_A: U2})]
    specs = command.device_specs(
        parse("--pass-device-specs", "--dev-root=/host"), state, static, proc_root=str(tmp_path / "proc")
    )
    assert specs is not None and specs.host_root == "/host"
    assert dict(specs.nodes) == {
        U0: ("nvidia0",),
        U1: ("nvidia3",),
        MIG_A: ("nvidia5", "nvidia-caps/nvidia-cap30", "nvidia-caps/nvidia-cap31"),
    }
    assert command.device_specs(parse(), state, static) is None
