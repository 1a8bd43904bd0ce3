"""Dynamic MIG on the node against the fake NVML's MIG model: discovery of the geometry, the
instances Allocate creates, reuse on a retried Allocate, clean-up of gone pods, and restart
safety — the plugin process is killed between every two steps of a creation and the next
start must leave no orphan instance and no instance claimed twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import BUILD, FAKE, FAKE_NVML, ROOT

pytestmark = pytest.mark.native

A100 = "GPU-f00dfeed-0000-4000-8000-000000000000"
H100 = "GPU-f00dfeed-0000-4000-8000-000000000001"
DEVICES = "name=NVIDIA A100-SXM4-40GB,memory=40Gi,sms=108;name=NVIDIA H100 80GB HBM3,memory=80Gi,mig_mode=1"
POD_A = {"uid": "uid-a", "namespace": "ns", "name": "a"}
POD_B = {"uid": "uid-b", "namespace": "ns", "name": "b"}
STEPS = ["intent", "gi-created", "gi-recorded", "ci-created", "ready"]


def alloc(gpu=A100, profile="3g.20gb", start=4, size=4, container=0, device=0, **kw) -> dict:
    return {
        "container": container,
        "device": device,
        "gpu_uuid": gpu,
        "profile": profile,
        "start": start,
        "size": size,
        **kw,
    }


class Node:
    """One fake machine (state dir) and one checkpoint file; each call is a new plugin process."""

    def __init__(self, tmp: Path) -> None:
        self.env = {
            **os.environ,
            "FAKEGPU_DEVICES": DEVICES,
            "FAKEGPU_STATE_DIR": str(tmp / "fg"),
            "FAKE_NVML": str(FAKE_NVML),
            "PYTHONPATH": str(ROOT / "src"),
        }
        self.checkpoint = tmp / "mig" / "checkpoint.json"

    def run(self, expect_rc: int = 0, **cmd) -> dict:
        cmd.setdefault("gpus", [A100, H100])
        out = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("mig_probe.py")), str(self.checkpoint), json.dumps(cmd)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == expect_rc, out.stderr
        return json.loads(out.stdout) if expect_rc == 0 else {}


@pytest.fixture
def node(native_build, tmp_path) -> Node:
    return Node(tmp_path)


def test_discovery_registers_the_mig_geometry(native_build, tmp_path):
    env = {
        **os.environ,
        "FAKEGPU_DEVICES": DEVICES,
        "FAKEGPU_STATE_DIR": str(tmp_path / "fg"),
        "PYTHONPATH": str(ROOT / "src"),
    }
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "operatingmode": "mig"}]}))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami",
            "device-plugin",
            "--dry-run",
            "--node-name",
            "n1",
            "--node-config",
            str(cfg),
            "--nvml-library",
            str(FAKE_NVML),
            "--topology-score",
            "false",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    reg = {d["id"]: d for d in json.loads(json.loads(out.stdout)["annotations"]["hami.io/node-nvidia-register"])}
    a100 = reg[A100]
    assert (a100["mode"], a100["count"], a100["devcore"], a100["devmem"]) == ("mig", 7, 100, 40960)
    assert [(p["name"], p["memoryMB"], p["core"], p["sliceCount"]) for p in a100["migProfiles"]] == [
        ("1g.5gb", 4864, 15, 1),
        ("1g.10gb", 9856, 15, 1),
        ("2g.10gb", 9856, 29, 2),
        ("3g.20gb", 19968, 43, 3),
        ("4g.20gb", 19968, 58, 4),
        ("7g.40gb", 40192, 100, 7),
    ]
    assert a100["migProfiles"][3]["placements"] == [{"start": 0, "size": 4}, {"start": 4, "size": 4}]
    assert [p["name"] for p in reg[H100]["migProfiles"]] == [
        "1g.10gb",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]


def test_prepare_creates_reuses_and_collect_destroys(node):
    first = node.run(prepare={"pod": POD_A, "allocs": [alloc(), alloc(profile="1g.5gb", start=0, size=1, device=1)]})
    assert "error" not in first, first
    assert [p["gi"] for p in first["prepare"]] == [1, 2] and all(p["mig"].startswith("MIG-") for p in first["prepare"])
    assert first["instances"][A100] == [
        [1, "3g.20gb", 4, 4, 0, first["prepare"][0]["mig"]],
        [2, "1g.5gb", 0, 1, 0, first["prepare"][1]["mig"]],
    ]
    # the kubelet retries the Allocate after a plugin restart: the same instances, nothing new
    again = node.run(prepare={"pod": POD_A, "allocs": [alloc(), alloc(profile="1g.5gb", start=0, size=1, device=1)]})
    assert again["prepare"] == first["prepare"] and again["recover"] == []
    assert again["instances"] == first["instances"]
    # another pod wants an overlapping placement while a's instances live: refused, not shared
    held = node.run(prepare={"pod": POD_B, "allocs": [alloc(profile="4g.20gb", start=0, size=4)]})
    assert held["error"].startswith("PlacementHeld") and "still held by pod ns/a" in held["error"]
    # a is gone: its instances go, and b gets its placement
    gone = node.run(collect=["uid-b"])
    assert len(gone["collect"]) == 2 and gone["instances"][A100] == [] and gone["entries"] == {}
    b = node.run(prepare={"pod": POD_B, "allocs": [alloc(profile="4g.20gb", start=0, size=4)]})
    assert b["instances"][A100][0][1:4] == ["4g.20gb", 0, 4]


def test_recover_enables_mig_mode_and_destroys_unclaimed_instances(node):
    node.run(prepare={"pod": POD_A, "allocs": [alloc(gpu=H100, profile="2g.20gb", start=2, size=2)]})
    node.checkpoint.unlink()  # a lost checkpoint: the instance is claimed by nobody...
    out = node.run()
    assert out["instances"][H100] == [] and "claimed by no pod" in out["recover"][0]


def test_recover_adopts_instances_named_by_a_live_pods_annotation(node):
    made = node.run(prepare={"pod": POD_A, "allocs": [alloc(gpu=H100, profile="2g.20gb", start=2, size=2)]})
    p = made["prepare"][0]
    node.checkpoint.unlink()
    claim = alloc(
        gpu=H100,
        profile="2g.20gb",
        start=2,
        size=2,
        mig_uuid=p["mig"],
        gpu_instance_id=p["gi"],
        compute_instance_id=p["ci"],
    )
    out = node.run(recover=[[POD_A, claim]])
    assert out["instances"][H100] == made["instances"][H100]
    assert out["entries"] == {"uid-a/0/0": ["ready", p["gi"], p["mig"]]}


@pytest.mark.parametrize("step", STEPS)
def test_killed_between_steps_leaves_no_orphan_and_no_double_use(node, step):
    want = {"pod": POD_A, "allocs": [alloc()]}
    node.run(expect_rc=9, prepare=want, kill_at=step)
    restarted = node.run()
    if step == "ready":  # finished before the kill: kept for the pod (the kubelet's retry reuses it)
        assert [e[0] for e in restarted["entries"].values()] == ["ready"]
        assert len(restarted["instances"][A100]) == 1
    else:
        assert restarted["instances"][A100] == [] and restarted["entries"] == {}
        assert "interrupted creation" in restarted["recover"][0]
    retry = node.run(prepare=want)
    assert len(retry["instances"][A100]) == 1 and retry["instances"][A100][0][1:5] == ["3g.20gb", 4, 4, 0]
    assert list(retry["entries"].values()) == [["ready", retry["prepare"][0]["gi"], retry["prepare"][0]["mig"]]]
    # the other pod cannot get that instance
    other = node.run(prepare={"pod": POD_B, "allocs": [alloc()]})
    assert "still held by pod ns/a" in other["error"]


# ------------------------------------------------------------------ static MIG (migstrategy mixed)

MAKE = """
import ctypes, json, os, sys
from hami.node.nvml import open_nvml
from hami.node.nvml import MigNvml
open_nvml(os.environ["FAKE_NVML"])
n = MigNvml()
out = []
for gpu, profile, start in json.loads(sys.argv[1]):
    n.enable(gpu)
    p = {x.name: x for x in n.profiles(gpu)}[profile]
    gi = n.create_gi(gpu, p, start)
    out.append(n.create_ci(gpu, gi, p)[1])
print(json.dumps(out))
"""


def make_instances(env: dict, wanted: list) -> list[str]:
    """Instances made by MAKE on the fake machine of ``env``: their MIG UUIDs."""
    out = subprocess.run(
        [sys.executable, "-c", MAKE, json.dumps(wanted)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def dry_run(node: Node, *args: str, node_config: dict | None = None) -> subprocess.CompletedProcess:
    cfg = node.checkpoint.parent.parent / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", **(node_config or {})}]}))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hami",
            "device-plugin",
            "--dry-run",
            "--node-name",
            "n1",
            "--node-config",
            str(cfg),
            "--nvml-library",
            str(FAKE_NVML),
            "--topology-score",
            "false",
            *args,
        ],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_mixed_strategy_advertises_existing_instances_per_profile(node):
    a, b, c = make_instances(node.env, [[H100, "1g.10gb", 6], [H100, "1g.10gb", 5], [H100, "3g.40gb", 0]])
    out = dry_run(node, "--mig-strategy", "mixed")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["migResources"] == {"nvidia.com/mig-1g.10gb": [a, b], "nvidia.com/mig-3g.40gb": [c]}
    assert doc["migGpus"] == {a: H100, b: H100, c: H100}  # an XID on the H100 marks all three unhealthy
    # the GPU in MIG mode is served as MIG devices only; the other one stays a shared nvidia.com/gpu
    assert [g["uuid"] for g in doc["gpus"]] == [A100]
    # config.json says the same through its key
    same = json.loads(dry_run(node, node_config={"migstrategy": "mixed"}).stdout)
    assert same["migResources"] == doc["migResources"]
    # the default (none) leaves MIG instances alone
    assert json.loads(dry_run(node).stdout)["migResources"] == {}
    # filterdevices leaves the GPU out of static MIG too (its instances were served, its XIDs watched)
    gone = json.loads(dry_run(node, node_config={"migstrategy": "mixed", "filterdevices": {"uuid": [H100]}}).stdout)
    assert gone["migResources"] == {} and [g["uuid"] for g in gone["gpus"]] == [A100]
    gone = json.loads(dry_run(node, node_config={"migstrategy": "mixed", "filterdevices": {"index": [1]}}).stdout)
    assert gone["migResources"] == {}


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        (("--mig-strategy", "single"), None, "migstrategy 'single' is not supported"),
        ((), {"migstrategy": "mixed", "operatingmode": "mig"}, "cannot be combined with operatingmode 'mig'"),
        ((), {"migstrategy": "half"}, "migstrategy: expected one of none, single, mixed, got 'half'"),
    ],
)
def test_unworkable_mig_strategy_is_refused_at_start_up(node, args, config, message):
    out = dry_run(node, *args, node_config=config)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


# ------------------------------------------------------------------ a container given a MIG device


def test_container_sees_its_mig_device_and_libvgpu_limits_it(native_build, tmp_path):
    """What Allocate hands a MIG container (NVIDIA_VISIBLE_DEVICES=<MIG UUID>, libvgpu with the
    memory limit): the fake runtime shows the instance (its UUID, name, the profile's memory),
    and libvgpu caps it at the limit."""
    cfg = tmp_path / "fakegpu.conf"
    cfg.write_text(
        f"state_dir={tmp_path / 'fg'}\nvisible_devices_env=NVIDIA_VISIBLE_DEVICES\n"
        "device name=NVIDIA A100-SXM4-40GB,memory=40Gi,mig_mode=1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKEGPU_", "CUDA_", "LD_PRELOAD", "NVIDIA_"))}
    env.update(
        FAKEGPU_CONFIG=str(cfg),
        LD_LIBRARY_PATH=str(FAKE),
        FAKE_NVML=str(FAKE_NVML),
        PYTHONPATH=f"{Path(__file__).parent}:{ROOT / 'src'}",
    )
    [mig] = make_instances(env, [[A100, "3g.20gb", 4]])
    probe = """
import cuda_probe as c, pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
print(n.nvmlDeviceGetCount(), n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetName(h))
c.init(); print(c.mem_info()[1] >> 20, c.alloc(5000 << 20)[0])
"""
    ctr = {**env, "NVIDIA_VISIBLE_DEVICES": mig}
    out = subprocess.run([sys.executable, "-c", probe], env=ctr, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"1 {mig} NVIDIA A100-SXM4-40GB MIG 3g.20gb", "19968 0"]
    limited = {
        **ctr,
        "LD_PRELOAD": str(BUILD / "libvgpu.so"),
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4000m",
        "CUDA_DEVICE_SM_LIMIT": "100",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "c.cache"),
        "LIBCUDA_LOG_LEVEL": "0",
    }
    out = subprocess.run([sys.executable, "-c", probe], env=limited, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == "4000 2"  # the limit, and 5000 MiB refused (CUDA_ERROR_OUT_OF_MEMORY)
    gone = subprocess.run(
        [sys.executable, "-c", probe],
        env={**ctr, "NVIDIA_VISIBLE_DEVICES": "MIG-" + mig[4:-4] + "ffff"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode == 2 and "invalid configuration: NVIDIA_VISIBLE_DEVICES" in gone.stderr


def test_mig_mode_on_a_gpu_without_mig_is_refused_in_one_line(native_build, tmp_path):
    env = {
        **os.environ,
        "FAKEGPU_DEVICES": "name=Tesla T4,memory=16Gi",
        "FAKEGPU_STATE_DIR": str(tmp_path / "fg"),
        "PYTHONPATH": str(ROOT / "src"),
    }
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "operatingmode": "mig"}]}))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami",
            "device-plugin",
            "--dry-run",
            "--node-name",
            "n1",
            "--node-config",
            str(cfg),
            "--nvml-library",
            str(FAKE_NVML),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "refusing to start: GPU GPU-f00dfeed-0000-4000-8000-000000000000 does not support MIG" in out.stderr


def test_mig_mode_cannot_be_turned_on_under_a_running_process(native_build, tmp_path):
    """operatingmode mig on a GPU a process still uses: refused in one line naming the GPU."""
    env = {
        **os.environ,
        "FAKEGPU_DEVICES": "name=NVIDIA A100-SXM4-40GB,memory=40Gi",
        "FAKEGPU_STATE_DIR": str(tmp_path / "fg"),
        "PYTHONPATH": f"{Path(__file__).parent}:{ROOT / 'src'}",
        "LD_LIBRARY_PATH": str(FAKE),
    }
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import cuda_probe as c, sys, time; c.init(); c.alloc(1 << 30); "
            "print('ready', flush=True); sys.stdin.read()",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "operatingmode": "mig"}]}))
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "hami",
                "device-plugin",
                "--dry-run",
                "--node-name",
                "n1",
                "--node-config",
                str(cfg),
                "--nvml-library",
                str(FAKE_NVML),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.communicate("")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cannot enable MIG mode" in out.stderr and A100 in out.stderr
