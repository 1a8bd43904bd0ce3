"""``hami simulate --example mixed``: NVIDIA + Ascend + Cambricon + Hygon nodes, each pod on its kind."""

from __future__ import annotations

import json

from hami.cli import main

#: pod -> (node, device type of every device it got)
EXPECTED = {
    "cuda-infer": ("gpu-a100-01", {"NVIDIA"}),
    "npu-vnpu-infer": ("npu-910b3-01", {"Ascend910B3"}),
    "npu-train": ("npu-910b3-01", {"Ascend910B3"}),
    "mlu-infer": ("mlu-370-01", {"MLU"}),
    "dcu-train": ("dcu-k100-01", {"DCU"}),
}


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_each_pod_lands_on_its_kind_of_device(capsys):
    code, out, err = run(capsys, "--example", "mixed", "--output", "json")
    assert code == 0 and err == ""
    pods = {p["name"]: p for p in json.loads(out)["pods"]}
    for name, (node, types) in EXPECTED.items():
        p = pods[name]
        assert (p["status"], p["node"]) == ("scheduled", node), name
        assert {d["type"] for c in p["containers"] for d in c["devices"]} == types, name
    # the vNPU was snapped to a template; training took a whole NetworkID group (NPUs 2 and 3)
    vnpu = pods["npu-vnpu-infer"]["containers"][0]["devices"]
    assert [d["usedmem"] for d in vnpu] == [16384]
    train = pods["npu-train"]["containers"][0]["devices"]
    assert [d["uuid"] for d in train] == ["NPU-7f3c0a1e-0002", "NPU-7f3c0a1e-0003"]
    assert pods["mlu-infer"]["containers"][0]["devices"][0]["usedmem"] == 16 * 256
    assert pods["dcu-too-big"]["status"] == "pending"
    assert pods["dcu-too-big"]["reasons"]["dcu-k100-01"] == "4/4 CardInsufficientMemory"


def test_default_example_is_unchanged(capsys):
    code, plain, _ = run(capsys, "--output", "json")
    code2, named, _ = run(capsys, "--example", "default", "--output", "json")
    assert code == code2 == 0 and plain == named


def test_example_does_not_go_with_files(capsys, tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("{}")
    code, _, err = run(capsys, "--example", "mixed", "--nodes", str(f), "--pods", str(f))
    assert code == 1
    assert err.strip() == "hami simulate: --example runs a bundled example; it does not go with --nodes/--pods"
