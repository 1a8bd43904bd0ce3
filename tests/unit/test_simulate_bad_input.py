"""``hami simulate`` on hostile files: exit 1 and one line on stderr that names the file, the
object and the field — never a traceback."""

from __future__ import annotations

import json

import pytest
import yaml

from hami.cli import main

from .test_simulate import node_doc, pod_doc, write

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


# ---------------------------------------------------------------- review of hostile input (both front ends)

FRONT_ENDS = pytest.mark.parametrize("front_end", ["extender", "dra"])


def _run(tmp_path, capsys, nodes, pods, *extra):
    n = nodes if isinstance(nodes, str) else write(tmp_path, "nodes.yaml", nodes)
    p = pods if isinstance(pods, str) else write(tmp_path, "pods.yaml", pods)
    code = main(["simulate", "--nodes", n, "--pods", p, *extra])
    got = capsys.readouterr()
    return code, got.out, got.err


def _one_error(code, out, err, *needles):
    assert code == 1 and out == "", (code, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


@FRONT_ENDS
def test_a_node_or_pod_without_a_name_is_refused(tmp_path, capsys, front_end):
    nameless = node_doc("x")
    del nameless["metadata"]["name"]
    fe = ["--front-end", front_end]
    res = _run(tmp_path, capsys, [node_doc("n1"), nameless], [pod_doc("a", {"nvidia.com/gpu": 1})], *fe)
    _one_error(*res, "nodes.yaml: document 2 (Node): metadata.name is missing")
    anonymous = pod_doc("a", {"nvidia.com/gpu": 1})
    anonymous["metadata"] = {"generateName": "job-"}
    res = _run(tmp_path, capsys, [node_doc("n1")], [anonymous], *fe)
    _one_error(*res, "pods.yaml: document 1 (Pod): metadata.name is missing (generateName is not expanded")


@FRONT_ENDS
def test_a_second_node_of_one_name_is_refused(tmp_path, capsys, front_end):
    res = _run(
        tmp_path,
        capsys,
        [node_doc("n1"), node_doc("n1", n=4)],
        [pod_doc("a", {"nvidia.com/gpu": 1})],
        "--front-end",
        front_end,
    )
    _one_error(*res, "nodes.yaml: document 2 (Node n1): node n1 is already given in document 1")


@FRONT_ENDS
def test_a_second_live_pod_of_one_name_is_refused(tmp_path, capsys, front_end):
    gpu = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}
    fe = ["--front-end", front_end]
    res = _run(tmp_path, capsys, [node_doc("n1")], [pod_doc("a", gpu), pod_doc("b", gpu), pod_doc("a", gpu)], *fe)
    _one_error(*res, "pods.yaml: document 3 (Pod default/a): pod default/a is already given in document 1", "delete")
    # deleted, then created again: fine (and a same name in another namespace is another pod)
    pods = [pod_doc("a", gpu), pod_doc("a", deleted=True), pod_doc("a", gpu), pod_doc("a", gpu, ns="other")]
    code, out, err = _run(tmp_path, capsys, [node_doc("n1")], pods, *fe, "-o", "json")
    assert code == 0, err
    assert [(p["namespace"], p["status"]) for p in json.loads(out)["pods"]] == [
        ("default", "scheduled"),
        ("other", "scheduled"),
    ]


@FRONT_ENDS
@pytest.mark.parametrize(
    "resources, needle",
    [
        (
            {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 2}},
            "container 'c': requests.nvidia.com/gpu: 2: must be equal to nvidia.com/gpu limit of 1",
        ),
        (
            {"requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}},
            "requests.nvidia.com/gpu: 1: limits.nvidia.com/gpu is missing (Kubernetes: Limit must be set",
        ),
    ],
)
def test_extended_requests_must_equal_their_limits(tmp_path, capsys, front_end, resources, needle):
    pod = yaml.safe_load(POD) | {"spec": {"containers": [{"name": "c", "resources": resources}]}}
    res = _run(tmp_path, capsys, [node_doc("n1")], [pod], "--front-end", front_end)
    _one_error(*res, "pods.yaml: document 1 (Pod a):", needle)


def test_equal_requests_and_limits_and_cpu_overcommit_are_fine(tmp_path, capsys):
    resources = {
        "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1000", "cpu": "2"},
        "requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1e3", "cpu": "500m"},
    }
    pod = yaml.safe_load(POD) | {"spec": {"containers": [{"name": "c", "resources": resources}]}}
    code, out, err = _run(tmp_path, capsys, [node_doc("n1")], [pod], "-o", "json")
    assert code == 0 and json.loads(out)["pods"][0]["status"] == "scheduled", err


@FRONT_ENDS
def test_device_memory_with_a_unit_suffix_warns(tmp_path, capsys, front_end):
    pods = [
        pod_doc("a", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "8Gi"}),
        pod_doc("b", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}),
    ]
    code, out, err = _run(tmp_path, capsys, [node_doc("n1")], pods, "--front-end", front_end)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1, err
    assert (
        "pods.yaml: document 1 (Pod default/a): container 'main': nvidia.com/gpumem: 8Gi is the plain number "
        "8589934592 to HAMi, which reads this resource as a count of MiB, not bytes; 8Gi is 8192 MiB"
    ) in warnings[0]


@pytest.mark.parametrize("flag", [["--default-cores", "5"], ["--min-memory", "64"]])
def test_dra_only_flags_are_refused_on_the_extender(capsys, flag):
    code = main(["simulate", *flag])
    got = capsys.readouterr()
    _one_error(code, got.out, got.err, f"{flag[0]} applies to --front-end dra only")
    assert main(["simulate", "--front-end", "dra", *flag, "-o", "json"]) == 0
    capsys.readouterr()


def test_a_nodes_file_without_nodes_says_so(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("---\n~\n")
    res = _run(tmp_path, capsys, str(empty), [pod_doc("a", {"nvidia.com/gpu": 1})])
    _one_error(*res, "empty.yaml: no Node object in the file")


def test_a_pod_bound_to_a_node_not_in_the_inputs_says_so(tmp_path, capsys):
    pinned = pod_doc("pinned", {"nvidia.com/gpu": 1})
    pinned["spec"]["nodeName"] = "ghost"
    code, out, err = _run(tmp_path, capsys, [node_doc("n1")], [pinned], "-o", "json")
    assert code == 0, err
    assert json.loads(out)["pods"][0]["reasons"] == {
        "ghost": "spec.nodeName is ghost, which is not a usable node of "
        f"{tmp_path / 'nodes.yaml'} (absent, or skipped: see the warnings)"
    }
