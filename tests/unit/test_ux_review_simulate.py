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
