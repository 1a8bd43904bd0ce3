"""``hami simulate`` on hostile files: exit 1 and one line on stderr that names the file, the
object and the field — never a traceback."""

from __future__ import annotations

import pytest

from hami.cli import main

from .test_simulate import node_doc, write

POD = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n"
GPU_POD = POD + "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1}}}]}\n"
BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9)}]\n" for p, a in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\xff\xfe\x00garbage", "pods.yaml: not UTF-8 text (byte 0"),
        (b"kind: Pod\nmetadata: {name: caf\xc3", "pods.yaml: not UTF-8 text (byte 30"),
        (b"\x00\x01", "pods.yaml: not valid YAML"),
        (
            (
                POD + "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: " + "9" * 5000 + "}}}]}\n"
            ).encode(),
            "pods.yaml: not valid YAML at line 4 (an integer of 5000 digits",
        ),
        (
            (
                POD + "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: '" + "9" * 5000 + "'}}}]}\n"
            ).encode(),
            "nvidia.com/gpu: '999",
        ),
        (("a: " + "[" * 5000 + "]" * 5000).encode(), "nested more than 64 levels deep"),
        (('{"a": ' + '{"b": ' * 3000 + "1" + "}" * 3001).encode(), "nested more than 64 levels deep"),
        (("a: &a [x, x, x, x, x, x, x, x, x]\n" + BOMB + "kind: Pod\n").encode(), "with aliases expanded"),
        (b"kind: Pod\nmetadata: &m {name: a, labels: *m}\n", "metadata.labels: contains itself"),
        (b"kind: Pod\nmetadata: []\n", "document 1: metadata: must be a map"),
        (b"kind: [Pod]\n", "document 1: kind must be a string"),
        (b"- 1\n- 2\n", "document 1 is not a Kubernetes object"),
        ((POD + "spec: {containers: {name: c}}\n").encode(), "(Pod a): spec.containers: must be a list"),
        (
            (POD + "spec: {containers: [{name: c, resources: {limits: [1]}}]}\n").encode(),
            "(Pod a): spec.containers[0].resources.limits: must be a map",
        ),
        (
            (POD + "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: true}}}]}\n").encode(),
            "resources.limits[nvidia.com/gpu]: must be a quantity",
        ),
        ((POD + "spec: {containers: [{name: c, env: [{name: 5}]}]}\n").encode(), "env[0].name: must be a string"),
        (
            (
                POD
                + "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpumem: '١٠٠٠', nvidia.com/gpu: 1}}}]}\n"
            ).encode(),
            "nvidia.com/gpumem: '١٠٠٠' is not a quantity",
        ),
        (
            (POD + "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: .nan}}}]}\n").encode(),
            "nan is not a number JSON can carry",
        ),
        (
            b"kind: ResourceQuota\nmetadata: {name: q}\nspec: {hard: []}\n",
            "(ResourceQuota q): spec.hard: must be a map",
        ),
    ],
)
def test_bad_pod_files_exit_1_with_one_line(tmp_path, capsys, content, needle):
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1")])
    pods = tmp_path / "pods.yaml"
    pods.write_bytes(content)
    code = main(["simulate", "--nodes", nodes, "--pods", str(pods)])
    err = capsys.readouterr().err
    assert code == 1 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_empty_resources_field_is_no_request(tmp_path, capsys):
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1")])
    pods = tmp_path / "pods.yaml"
    pods.write_text(POD + "spec:\n  containers:\n  - name: c\n    resources:\n")
    assert main(["simulate", "--nodes", nodes, "--pods", str(pods), "-o", "json"]) == 0
    assert '"status": "no-devices"' in capsys.readouterr().out


@pytest.mark.parametrize(
    "annotation, needle",
    [
        ("g0,-1,1000,100,T4,0,true:", "field 'count' must not be negative, got '-1'"),
        ("[" * 50_000, "not valid JSON (nested too deeply)"),
        ('[{"id": "g0", "count": ' + "9" * 5000 + "}]", "not valid JSON"),
        ('[{"id": "g0", "count": NaN}]', "NaN is not JSON"),
        ('[{"id": "g0", "count": "ten"}]', "field 'count' must be an integer"),
    ],
)
def test_garbage_registrations_name_the_node_and_field(tmp_path, capsys, annotation, needle):
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1", annotation=annotation)])
    pods = tmp_path / "pods.yaml"
    pods.write_text(GPU_POD)
    code = main(["simulate", "--nodes", nodes, "--pods", str(pods)])
    err = capsys.readouterr().err
    assert code == 1 and "node n1" in err and needle in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "config, needle",
    [
        ("nvidia: [1, 2]\n", "config.yaml: nvidia: Input should be a valid dictionary"),
        ("nvidia: {defaultMemory: lots}\n", "nvidia.defaultMemory"),
        ("\x00", "config.yaml: not valid YAML"),
        ("nvidia: {defaultMemory: " + "9" * 400 + "}\n", "an integer of 400 digits"),
        ("- 1\n", "top level must be a mapping"),
        ("a: 1\n---\nb: 2\n", "expected one YAML document"),
    ],
)
def test_garbage_device_config_exits_1_with_one_line(tmp_path, capsys, config, needle):
    path = tmp_path / "config.yaml"
    path.write_text(config)
    code = main(["simulate", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 1 and needle in err, err
    assert len(err.strip().splitlines()) == 1
