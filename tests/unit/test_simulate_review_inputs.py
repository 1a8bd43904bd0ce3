"""``hami simulate`` reading real cluster dumps: fast enough for a large cluster, and the fast
readers never take in what :mod:`hami.safeyaml` refuses nor read anything differently."""

from __future__ import annotations

import json

import pytest
import yaml

from hami import safeyaml

from .test_simulate import node_doc, pod_doc, sim, write

DUMP = [
    {
        **pod_doc(f"p{i}", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}),
        "status": {"phase": "Running", "startTime": "2026-11-21T22:00:00Z"},
    }
    for i in range(3)
]


def _no_pure_reader(monkeypatch):
    """Record every use of safeyaml's pure-Python reader (the slow one)."""
    used = []
    real = safeyaml.load_all

    def load_all(text, source):
        used.append(source)
        return real(text, source)

    monkeypatch.setattr(safeyaml, "load_all", load_all)
    return used


@pytest.mark.parametrize("as_json", [False, True])
def test_a_clean_dump_is_read_without_the_pure_python_reader(tmp_path, capsys, monkeypatch, as_json):
    # kubectl get -o yaml of 10,000 pods took 25 s in the pure-Python reader alone
    nodes = {"apiVersion": "v1", "kind": "List", "items": [node_doc("n1")]}
    pods = {"apiVersion": "v1", "kind": "List", "items": DUMP}
    (tmp_path / "nodes").write_text(json.dumps(nodes) if as_json else yaml.safe_dump(nodes))
    (tmp_path / "pods").write_text(json.dumps(pods) if as_json else yaml.safe_dump(pods))
    used = _no_pure_reader(monkeypatch)
    code, out, err = sim(capsys, "--nodes", str(tmp_path / "nodes"), "--pods", str(tmp_path / "pods"), "-o", "json")
    assert code == 0, err
    assert used == []
    assert [p["status"] for p in json.loads(out)["pods"]] == ["scheduled"] * 3


def test_the_fast_and_the_pure_readers_give_the_same_answer(tmp_path, capsys, monkeypatch):
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1")])
    pods = write(tmp_path, "pods.yaml", DUMP)
    fast = sim(capsys, "--nodes", nodes, "--pods", pods, "-o", "json")
    monkeypatch.setattr(safeyaml, "fast_docs", lambda text: None)
    assert sim(capsys, "--nodes", nodes, "--pods", pods, "-o", "json") == fast


def _nested(depth: int) -> str:
    return "a: " + "[" * (depth - 1) + "x" + "]" * (depth - 1) + "\n"


MAX = safeyaml.MAX_DEPTH


@pytest.mark.parametrize(
    "text",
    [
        "kind: Pod\nmetadata: {name: a, creationTimestamp: 2026-11-21T22:00:00Z}\n",  # a timestamp stays text
        "a: 0x1f\nb: 0o17\nc: 1_000\nd: '007'\ne: 007\nf: yes\ng: ~\nh: 1.5\n",
        "a: " + "9" * 64 + "\n",
        '{"a": [1, 2.5, 1.5e+3, true, null, "\\u00e9"]}',
        '{"a": 1}\n---\n{"b": 2}\n',
        "{a: 1, b: [x, y]}\n",  # YAML in flow style, not JSON
        "a: 1\n---\n---\nb: 2\n",
        _nested(MAX - 1),
        '{"a": ' * (MAX - 1) + "1" + "}" * (MAX - 1),
    ],
)
def test_the_fast_readers_read_as_safeyaml_reads(text):
    got = safeyaml.fast_docs(text)
    assert got is not None
    assert json.dumps(got) == json.dumps(safeyaml.load_all(text, "f"))


@pytest.mark.parametrize("text", ['{"a": 1e3}', '{"a": 1.5e3}', '{"a": NaN}', '{"a": -Infinity}', "a: -.inf\n"])
def test_json_that_yaml_reads_otherwise_is_left_to_safeyaml(text):
    assert safeyaml.fast_docs(text) is None  # YAML 1.1 reads 1e3 and NaN as strings, .inf is refused


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "9" * 65 + "\n",  # past the digit limit
        '{"a": ' + "9" * 65 + "}",
        _nested(MAX),
        _nested(MAX + 1),
        '{"a": ' * MAX + "1" + "}" * MAX,
        '{"a": ' * 3000 + "1" + "}" * 3000,
        "a: " + "[" * 200_000 + "]" * 200_000 + "\n",  # libyaml's composer would overflow the C stack
        "a: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9)}]\n" for p, a in zip("abcdefgh", "bcdefghi")),
        "a: &a [*a]\n",
        "kind: Pod\nmetadata: &m {name: a, labels: *m}\n",
        "a: [1\n",
        "\x00\x01",
    ],
)
def test_what_safeyaml_refuses_is_left_to_it(text):
    with pytest.raises(safeyaml.YamlInputError):
        safeyaml.load_all(text, "f")
    assert safeyaml.fast_docs(text) is None  # the pure reader words the refusal


class _Stdin:
    def __init__(self, data: bytes) -> None:
        import io

        self.buffer = io.BytesIO(data)


def test_pods_from_standard_input(tmp_path, capsys, monkeypatch):
    # kubectl get pods -A -o yaml | hami simulate --nodes nodes.yaml --pods -
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1")])
    monkeypatch.setattr("sys.stdin", _Stdin(yaml.safe_dump({"kind": "List", "items": DUMP}).encode()))
    code, out, err = sim(capsys, "--nodes", nodes, "--pods", "-", "-o", "json")
    assert code == 0, err
    assert [p["status"] for p in json.loads(out)["pods"]] == ["scheduled"] * 3
    monkeypatch.setattr("sys.stdin", _Stdin(b"kind: Pod\n"))
    code, _, err = sim(capsys, "--nodes", nodes, "--pods", "-")
    assert code == 1 and "(stdin): document 1 (Pod): metadata.name is missing" in err


def test_standard_input_goes_to_one_option_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", _Stdin(b""))
    code, _, err = sim(capsys, "--nodes", "-", "--pods", "-")
    assert code == 1 and "only one of --nodes, --pods and --config can be -" in err


def test_a_gzip_file_says_so(tmp_path, capsys):
    import gzip

    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1")])
    (tmp_path / "pods.yaml.gz").write_bytes(gzip.compress(yaml.safe_dump_all(DUMP).encode()))
    code, _, err = sim(capsys, "--nodes", nodes, "--pods", str(tmp_path / "pods.yaml.gz"))
    assert code == 1 and "pods.yaml.gz: gzip-compressed (decompress it first" in err, err
