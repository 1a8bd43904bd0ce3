"""``hami simulate`` given its files the wrong way round, or a pods file with no pod.

Before, ``--nodes pods.yaml`` answered "no Node object in the file (kubectl get nodes -o yaml >
pods.yaml)": the suggested command overwrites the user's pods file. A pods file without a pod
printed an empty ``pods:`` line.
"""

from hami.cli import main

NODE = """apiVersion: v1
kind: Node
metadata:
  name: n1
  annotations:
    hami.io/node-nvidia-register: '[{"id":"GPU-a","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-A100","health":true}]'
"""
POD = """apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  containers:
  - name: c
    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}}
"""


def test_swapped_files_are_named_as_such(tmp_path, capsys):
    (tmp_path / "nodes.yaml").write_text(NODE)
    (tmp_path / "pods.yaml").write_text(POD)
    pods = str(tmp_path / "pods.yaml")
    assert main(["simulate", "--nodes", pods, "--pods", str(tmp_path / "nodes.yaml")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"hami simulate: {pods}: no Node object in the file, only Pod (did you swap --nodes and --pods?)"
    assert f"> {pods}" not in err


def test_a_pods_file_without_pods_says_none(tmp_path, capsys):
    (tmp_path / "nodes.yaml").write_text(NODE)
    (tmp_path / "pods.yaml").write_text("")
    assert main(["simulate", "--nodes", str(tmp_path / "nodes.yaml"), "--pods", str(tmp_path / "pods.yaml")]) == 0
    out = capsys.readouterr().out
    assert "  pods:             none" in out.splitlines()


def test_two_chips_of_one_board_are_told_apart_in_the_table(capsys):
    # the mixed example's trainer holds NPU-7f3c0a1e-0002 and -0003: cut at 12 characters both
    # read NPU-7f3c0a1e, one device granted twice to the eye
    assert main(["simulate", "--example", "mixed"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "ml/npu-train " in x]
    assert "NPU-7f3c0a1e-0002 " in line and "NPU-7f3c0a1e-0003 " in line, line


def test_short_ids_stay_short_where_they_are_unique():
    from hami.sim.report import _short_ids

    ids = {"GPU-7d1c55e0-aaaa-bbbb", "GPU-c4a83f17-aaaa-bbbb", "NPU-7f3c0a1e-0002", "NPU-7f3c0a1e-0003", "x"}
    assert _short_ids(ids) == {
        "GPU-7d1c55e0-aaaa-bbbb": "GPU-7d1c55e0",
        "GPU-c4a83f17-aaaa-bbbb": "GPU-c4a83f17",
        "NPU-7f3c0a1e-0002": "NPU-7f3c0a1e-0002",
        "NPU-7f3c0a1e-0003": "NPU-7f3c0a1e-0003",
        "x": "x",
    }


def test_example_with_one_of_nodes_or_pods_names_the_example_conflict(capsys):
    # it said "--nodes and --pods go together", as if giving the other one would do
    assert main(["simulate", "--example", "mixed", "--pods", "p.yaml"]) == 1
    assert capsys.readouterr().err.strip() == (
        "hami simulate: --example runs a bundled example; it does not go with --nodes/--pods"
    )


def test_the_help_names_every_gpu_policy_the_option_takes(capsys):
    import pytest

    from hami.core.score import GPU_FILTERS

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("binpack", "spread", "numa", *GPU_FILTERS):
        assert name in text, name
