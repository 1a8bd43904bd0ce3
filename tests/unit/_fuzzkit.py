"""Generators and oracles for the input-surface fuzz tests (tests/unit/test_fuzz_inputs.py) and
the large run (bench/fuzz_inputs.py, ``make fuzz``).

Every surface has one ``check_*`` function taking one generated input. It returns ``None``
when the answer is right, or a string saying why the verdict is wrong; any exception it lets
through is a crash. The oracles are independent of the code under test: quantities are
recomputed with ``decimal``, registrations round-trip through the encoder, a valid pod's
expected webhook verdict is derived from what the generator put in.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import tempfile
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from hami.core.codec import encode_node_devices_json, encode_node_devices_legacy
from hami.core.errors import CodecError
from hami.core.quantity import INT64_MAX, INT64_MIN, QuantityError, parse_int_quantity, parse_quantity
from hami.core.types import DeviceInfo
from hami.vendors import build_vendors
from hami.vendors.base import decode_registration
from hami.webhook.admission import AdmissionSettings, review

VENDORS = build_vendors()
SETTINGS = AdmissionSettings(VENDORS)
REGISTER = "hami.io/node-nvidia-register"

# ------------------------------------------------------------------------------- garbage

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_trees = st.recursive(
    scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=16
)

# ------------------------------------------------------------------------------- quantities

_DEC = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BIN = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


@st.composite
def valid_quantities(draw) -> tuple[str, Fraction]:
    """A quantity string the API server accepts, with its exact value."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.text("0123456789", max_size=22))
    frac = draw(st.none() | st.text("0123456789", max_size=12))
    if not whole and not frac:
        whole = draw(st.text("0123456789", min_size=1, max_size=5))
    number = whole + ("." + frac if frac is not None else "")
    kind = draw(st.sampled_from(["dec", "bin", "exp"]))
    value = Fraction(Decimal(number if number != "." else "0"))
    if kind == "dec":
        suffix = draw(st.sampled_from(sorted(_DEC)))
        value *= Fraction(10) ** _DEC[suffix]
    elif kind == "bin":
        suffix = draw(st.sampled_from(sorted(_BIN)))
        value *= 2 ** _BIN[suffix]
    else:
        exp = draw(st.integers(-40, 40))
        suffix = draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "+"] if exp >= 0 else [""])) + str(exp)
        value *= Fraction(10) ** exp
    pad = draw(st.sampled_from(["", " ", "\t"]))
    return f"{pad}{sign}{number}{suffix}{pad}", (-value if sign == "-" else value)


non_ascii_digit_quantities = st.builds(
    lambda a, d, b: a + d + b,
    st.text("0123456789", max_size=3),
    st.characters(categories=["Nd"]).filter(lambda c: not c.isascii()),
    st.text("0123456789kMGi", max_size=3),
)
quantity_junk = st.text(max_size=16) | st.text("0123456789.+-eEkKMGTPnumi ", max_size=12) | scalars


def check_quantity(item: tuple[str, Fraction | None]) -> str | None:
    """``(text, exact value)`` for a valid quantity, ``(text, None)`` for one that must be refused;
    anything else (``(junk, "any")``) only must not crash."""
    text, want = item
    if want == "any":
        for fn in (parse_quantity, parse_int_quantity):
            try:
                fn(text, "q")
            except QuantityError:
                pass
        return None
    if want is None:
        try:
            got = parse_quantity(text, "q")
        except QuantityError:
            return None
        return f"{text!r} accepted as {got}, must be refused"
    whole = want.denominator == 1 and INT64_MIN <= want <= INT64_MAX
    try:
        got = parse_int_quantity(text, "q")
    except QuantityError as exc:
        return None if not whole else f"{text!r} refused ({exc}), Kubernetes reads {want}"
    return None if whole and got == want else f"{text!r} read as {got}, Kubernetes reads {want}"


# ------------------------------------------------------------------------------- registrations

_ids = st.text("abcdefGPU-0123456789", min_size=1, max_size=12)
devices = st.lists(
    st.builds(
        DeviceInfo,
        id=_ids,
        index=st.integers(0, 64),
        count=st.integers(0, 100),
        devmem=st.integers(0, 200_000),
        devcore=st.integers(0, 100),
        type=st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789", max_size=16),
        numa=st.integers(-1, 8),
        health=st.booleans(),
        mode=st.sampled_from(["hami-core", "mig", "mps"]),
        vendor=st.just("NVIDIA"),
    ),
    max_size=6,
    unique_by=lambda d: d.id,
)


@st.composite
def registrations(draw) -> tuple[str, tuple | None]:
    """``(annotation value, expected devices or None when it must be refused)``."""
    devs = tuple(draw(devices))
    form = draw(st.sampled_from(["json", "legacy", "bad-legacy", "junk"]))
    if form == "json":
        return encode_node_devices_json(devs), devs
    if form == "legacy" and devs:
        return encode_node_devices_legacy(devs), devs
    if form in ("legacy", "bad-legacy") and devs:
        text = encode_node_devices_legacy(devs)
        chunks = text.rstrip(":").split(":")
        i = draw(st.integers(0, len(chunks) - 1))
        fields = chunks[i].split(",")
        j = draw(st.sampled_from([1, 2, 3, 7]))  # count, devmem, devcore, index
        fields[j] = draw(st.sampled_from(["-1", "+-1", "1_0", " 1", "١", "x", "", "1.5", "99999999999999999999"]))
        chunks[i] = ",".join(fields)
        return ":".join(chunks) + ":", None
    return draw(st.text(max_size=40) | st.just("[" * 5000) | json_trees.map(json.dumps)), "any"


def check_registration(item: tuple[str, Any]) -> str | None:
    text, want = item
    try:
        got = decode_registration(text, "json", "NVIDIA")
    except CodecError:
        return None if want in (None, "any") else f"valid registration refused: {text[:80]!r}"
    if want is None:
        return f"malformed registration accepted: {text[:80]!r}"
    if want != "any" and got != want:
        return f"registration read wrongly: {text[:80]!r}"
    return None


def check_node_ingest(item: tuple[str, Any]) -> str | None:
    """The scheduler's node watch: a registration either enters the ledger exactly, or the node's
    devices leave it with one MalformedRegistration event."""
    from hami.core import SchedulerConfig
    from hami.scheduler.state import ClusterState

    text, want = item
    state = ClusterState(SchedulerConfig(build_vendors()))
    events: list[str] = []
    state.on_malformed = lambda node, message: events.append(message)
    good = encode_node_devices_json([DeviceInfo(id="old", count=10, devmem=1000, devcore=100, type="T4", health=True)])
    node = {
        "metadata": {"name": "n", "annotations": {REGISTER: good}, "resourceVersion": "1"},
        "status": {"allocatable": {"nvidia.com/gpu": "10"}},
    }
    state.node_handler.replace([node])
    node = {**node, "metadata": {**node["metadata"], "annotations": {REGISTER: text}, "resourceVersion": "2"}}
    state.node_handler.apply("MODIFIED", node)
    try:
        expect = decode_registration(text, "json", "NVIDIA") if text else ()
    except CodecError:
        expect = None
    if expect and len({d.id for d in expect}) != len(expect):
        expect = None  # the same device id twice is malformed too
    listed = [d.id for d in state.ledger.node("n").devices] if "n" in state.ledger.node_names() else []
    if expect is None:
        return None if not listed and len(events) == 1 else f"malformed registration kept {listed}, events {events}"
    if listed != [d.id for d in expect]:
        return f"ledger has {listed}, registration says {[d.id for d in expect]}"
    return None if not events else f"event for a readable registration: {events}"


# ------------------------------------------------------------------------------- pods / webhook

_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=10)


@st.composite
def valid_pods(draw) -> tuple[dict, bool]:
    """``(pod, asks for a device)``: a pod the webhook must allow."""
    containers, uses = [], False
    for i in range(draw(st.integers(1, 3))):
        limits: dict[str, Any] = {}
        if draw(st.booleans()):
            limits["cpu"] = draw(st.sampled_from(["1", "500m", 2]))
        if draw(st.booleans()):
            uses = True
            limits["nvidia.com/gpu"] = draw(st.integers(1, 4) | st.sampled_from(["1", "2", "1e0", "+1"]))
            if draw(st.booleans()):
                limits["nvidia.com/gpumem"] = draw(st.sampled_from(["1000", "1e3", "2k", "1Ki", 3000, "4096"]))
            if draw(st.booleans()):
                limits["nvidia.com/gpucores"] = draw(st.integers(0, 100))
            if draw(st.booleans()):
                limits["nvidia.com/priority"] = draw(st.sampled_from([0, 1]))
        c: dict[str, Any] = {"name": f"c{i}", "image": "busybox"}
        if limits or draw(st.booleans()):
            c["resources"] = {"limits": limits} if limits or draw(st.booleans()) else None
        containers.append(c)
    meta = {"name": draw(_names), "namespace": draw(_names)}
    if draw(st.booleans()):
        meta["labels"] = {"app": draw(_names)}
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "hami-scheduler"]))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, uses


POD_PATHS = [
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "annotations"),
    ("metadata", "labels"),
    ("spec",),
    ("spec", "containers"),
    ("spec", "initContainers"),
    ("spec", "schedulerName"),
    ("spec", "nodeName"),
    ("spec", "containers", 0),
    ("spec", "containers", 0, "resources"),
    ("spec", "containers", 0, "resources", "limits"),
    ("spec", "containers", 0, "env"),
    ("spec", "containers", 0, "securityContext"),
    ("spec", "containers", 0, "name"),
    ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
    ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpumem"),
    ("status",),
    ("status", "phase"),
]


@st.composite
def broken_pods(draw) -> dict:
    """A valid pod with one field replaced by garbage of any type."""
    pod, _ = draw(valid_pods())
    path = draw(st.sampled_from(POD_PATHS))
    target: Any = pod
    for key in path[:-1]:
        if isinstance(target, dict):
            target = target.setdefault(key, {})
        elif isinstance(target, list) and target:
            target = target[0]
        else:
            return pod
    value = draw(json_trees | quantity_junk | non_ascii_digit_quantities)
    if isinstance(target, dict):
        target[path[-1]] = value
    return pod


def _patch(answer: dict) -> list | None:
    r = answer["response"]
    return json.loads(base64.b64decode(r["patch"])) if "patch" in r else None


def check_webhook_valid(item: tuple[dict, bool]) -> str | None:
    pod, uses = item
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": pod},
    }
    answer = review(body, SETTINGS)
    r = answer["response"]
    if r.get("allowed") is not True:
        return f"valid pod denied: {r.get('status')}"
    patch = _patch(answer)
    if not uses:
        return None if patch is None else f"a pod asking for no device was patched: {patch}"
    sched = [op for op in patch or () if op["path"] == "/spec/schedulerName"]
    if pod["spec"].get("schedulerName") != "hami-scheduler" and not sched:
        return "a GPU pod was not routed to hami-scheduler"
    return None


def _apply(doc: Any, ops: list) -> Any:
    """RFC 6902 add/replace/remove on plain JSON (enough for our patches)."""
    import copy

    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        if not parts:
            doc = op.get("value")
            continue
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if isinstance(parent, list):
            last = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(last, op["value"])
            elif op["op"] == "replace":
                parent[last] = op["value"]
            else:
                del parent[last]
        elif op["op"] == "remove":
            del parent[last]
        else:
            parent[last] = op["value"]
    return doc


def check_webhook_reinvocation(item: tuple[dict, bool]) -> str | None:
    pod, _ = item
    body = {"request": {"uid": "u", "operation": "CREATE", "object": pod}}
    first = review(body, SETTINGS)
    if first["response"].get("allowed") is not True:
        return f"valid pod denied: {first['response'].get('status')}"
    once = _apply(pod, _patch(first) or [])
    again = review({"request": {"uid": "u", "operation": "CREATE", "object": once}}, SETTINGS)
    return None if _patch(again) is None else f"reinvocation patches again: {_patch(again)}"


def check_webhook_garbage(pod: Any) -> str | None:
    answer = review({"request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": pod}}, SETTINGS)
    r = answer["response"]
    if not isinstance(r.get("allowed"), bool):
        return f"no verdict: {r}"
    if r["allowed"] is False and not (r.get("status") or {}).get("message"):
        return "denied without a reason"
    json.dumps(answer)  # the answer must be serialisable
    return None


# ------------------------------------------------------------------------------- HTTP


def _filter_args(pod: Any) -> dict:
    return {"Pod": pod, "NodeNames": ["n1"]}


http_bodies = st.one_of(
    st.binary(max_size=64),
    json_trees.map(lambda t: json.dumps(t).encode()),
    broken_pods().map(lambda p: json.dumps(_filter_args(p)).encode()),
    broken_pods().map(lambda p: json.dumps({"request": {"uid": "u", "object": p}}).encode()),
    json_trees.map(lambda t: json.dumps({"PodName": t, "Node": "n1"}).encode()),
    st.sampled_from(
        [
            b'{"a": NaN}',
            b'{"a": Infinity}',
            b"[" * 20000,
            b'{"a": ' + b"1" * 5000 + b"}",
            b'{"Pod": ' + b'{"a": ' * 100 + b"1" + b"}" * 101,
        ]
    ),
)


class HttpSurface:
    """One scheduler service and aiohttp test client on a private event loop, for sync callers."""

    def __init__(self) -> None:
        from aiohttp.test_utils import TestClient, TestServer

        from hami.scheduler.options import Options
        from hami.scheduler.server import SchedulerService

        self.loop = asyncio.new_event_loop()
        self.svc = SchedulerService(Options(), None)
        self.svc.extender.record = False
        good = encode_node_devices_json(
            [
                DeviceInfo(id=f"g{i}", index=i, count=1000, devmem=10**9, devcore=100, type="NVIDIA-T4", health=True)
                for i in range(16)
            ]
        )
        self.svc.state.node_handler.replace(
            [
                {
                    "metadata": {"name": "n1", "annotations": {REGISTER: good}},
                    "status": {"allocatable": {"nvidia.com/gpu": "16000"}},
                }
            ]
        )
        self.client = TestClient(TestServer(self.svc.app()), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        async def go() -> tuple[int, bytes]:
            r = await self.client.post(path, data=body, headers={"Content-Type": "application/json"})
            return r.status, await r.read()

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


def check_http(surface: HttpSurface, path: str, body: bytes) -> str | None:
    """Returns "500" for a server error (counted apart), a reason for a wrong answer, else None."""
    status, text = surface.post(path, body)
    if status >= 500:
        return "500"
    if status in (400, 408, 413):
        return None if text.strip() else f"{status} without a reason"
    if status != 200:
        return f"unexpected status {status}"
    answer = json.loads(text)
    if path == "/webhook":
        return None if isinstance((answer.get("response") or {}).get("allowed"), bool) else f"no verdict: {answer}"
    return None if isinstance(answer.get("Error"), str) else f"no Error field: {answer}"


def check_http_valid_filter(surface: HttpSurface, item: tuple[dict, bool]) -> str | None:
    pod, uses = item
    pod = {
        **pod,
        "metadata": {**pod["metadata"], "name": "fuzz", "namespace": "fuzz", "uid": "fuzz-uid"},
        "spec": {**pod["spec"], "schedulerName": surface.svc.state.scheduler_name},
    }
    surface.svc.state.put_pod(pod)  # as the pod watch would: a Filter is only for a pod the API server has
    status, text = surface.post("/filter", json.dumps(_filter_args(pod)).encode())
    if status != 200:
        return "500" if status >= 500 else f"valid Filter answered {status}: {text[:200]!r}"
    answer = json.loads(text)
    if answer.get("NodeNames") == ["n1"] and not answer.get("Error"):
        return None
    held = [(a.key, len(a.usage)) for a in surface.svc.state.ledger.pods()]
    return f"valid Filter: {answer} (ledger holds {held})"


# ------------------------------------------------------------------------------- simulate

_NODES = yaml.safe_dump(
    {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "annotations": {
                REGISTER: encode_node_devices_json(
                    [
                        DeviceInfo(
                            id=f"g{i}", index=i, count=10, devmem=80000, devcore=100, type="NVIDIA-A100", health=True
                        )
                        for i in range(8)
                    ]
                )
            },
        },
    }
)


@st.composite
def sim_inputs(draw) -> tuple[bytes, bytes, bool]:
    """``(nodes file, pods file, must succeed)``."""
    pods = [draw(valid_pods())[0] for _ in range(draw(st.integers(1, 3)))]
    for i, p in enumerate(pods):  # distinct names: the API server holds one pod per name
        p["metadata"]["name"] += f"-{i}"
    mode = draw(st.sampled_from(["valid", "broken-pod", "broken-node", "bytes", "junk-yaml"]))
    nodes = _NODES.encode()
    if mode == "broken-pod":
        pods[0] = draw(broken_pods())
    text = yaml.safe_dump_all(pods).encode()
    if mode == "broken-node":
        reg, _ = draw(registrations())
        nodes = yaml.safe_dump({"kind": "Node", "metadata": {"name": "n1", "annotations": {REGISTER: reg}}}).encode()
    elif mode == "bytes":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.binary(min_size=1, max_size=8)) + text[at:]
    elif mode == "junk-yaml":
        text = draw(st.text(max_size=60)).encode("utf-8", "surrogatepass")
    return nodes, text, mode == "valid"


class SimSurface:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hami-fuzz-"))

    def run(self, nodes: bytes, pods: bytes) -> tuple[int, str]:
        from hami.cli import main

        (self.dir / "nodes.yaml").write_bytes(nodes)
        (self.dir / "pods.yaml").write_bytes(pods)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(
                [
                    "simulate",
                    "--nodes",
                    str(self.dir / "nodes.yaml"),
                    "--pods",
                    str(self.dir / "pods.yaml"),
                    "-o",
                    "json",
                ]
            )
        return code, err.getvalue()


def check_simulate(surface: SimSurface, item: tuple[bytes, bytes, bool]) -> str | None:
    nodes, pods, must_succeed = item
    code, err = surface.run(nodes, pods)
    errors = [line for line in err.splitlines() if "warning:" not in line]
    if code not in (0, 1):
        return f"exit status {code}"
    if code == 1 and len(errors) != 1:
        return f"exit 1 with {len(errors)} error lines: {err[:300]!r}"
    if must_succeed and code != 0:
        return f"valid input refused: {err[:300]!r}"
    return None
