"""Generators and oracles for the DRA surfaces (shared by tests/unit/test_fuzz_dra.py and
bench/fuzz_inputs.py, ``make fuzz``), in the shape of :mod:`tests.unit._fuzzkit`: one ``check_*``
per surface taking one generated input and returning ``None`` (right) or why the verdict is wrong;
an exception escaping it is a crash.

Surfaces: the kubelet plugin's gRPC NodePrepareResources / NodeUnprepareResources on a unix
socket (:class:`PluginSurface`, a fake API server answering the claims), the webhook's DRA
translation, the readers of ResourceClaims and ResourceSlices written by others (the scheduler's
watch cache included), and the DRA and MIG checkpoints and the CDI directory when the file on
disk is damaged.

The oracles are independent of the code under test: a prepared claim's environment is recomputed
from the allocation the generator wrote, a translated pod's claim from the limits it put in.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from hami.core.quantity import QuantityError, parse_int_quantity
from hami.dra.model import DRIVER, MIB, SliceSettings

from ._fuzzkit import _apply, json_trees, non_ascii_digit_quantities, quantity_junk

INT64_MAX = 2**63 - 1  # a Kubernetes quantity is an int64 (hami.core.quantity refuses beyond it)
NODE = "node-a"
GPU_MIB = 15360
N_GPUS = 4
FULL = GPU_MIB * MIB

# ------------------------------------------------------------------------------- claims


def _byte_forms(n: int) -> list[str]:
    """Spellings of ``n`` bytes a quantity parser must read as exactly ``n``."""
    forms = [str(n)]
    if n % MIB == 0:
        forms.append(f"{n // MIB}Mi")
    if n % 1024 == 0:
        forms.append(f"{n // 1024}Ki")
    if n % 1000 == 0 and n:
        forms.append(f"{n // 1000}k")
    return forms


def _not_a_quantity(raw: Any) -> bool:
    """Junk that is junk: the junk strategy also draws real quantities ("1G" is 10^9 bytes), which
    a driver must read, so those are left out of it."""
    if not isinstance(raw, str):
        return True
    try:
        parse_int_quantity(raw, "junk")
    except QuantityError:
        return True
    return False


#: values a driver must refuse as unreadable
unreadable = quantity_junk.filter(_not_a_quantity)


@st.composite
def memory_amounts(draw) -> tuple[Any, int | None]:
    """``(consumedCapacity.memory as written, its value in bytes or None when unreadable)``."""
    kind = draw(st.sampled_from(["mib", "bytes", "edge", "junk"]))
    if kind == "mib":
        n = draw(st.integers(0, GPU_MIB + 10)) * MIB
    elif kind == "bytes":
        n = draw(st.integers(-(2**40), 2**40))
    elif kind == "edge":
        n = draw(st.sampled_from([0, 1, MIB - 1, MIB, FULL - 1, FULL, FULL + 1, FULL + MIB, -MIB, 2**63 - 1]))
    else:
        return draw(unreadable | non_ascii_digit_quantities | st.just("1.5")), None
    return draw(st.sampled_from(_byte_forms(n))), n


@st.composite
def core_amounts(draw) -> tuple[Any, int | None]:
    n = draw(st.sampled_from([-1, 0, 1, 30, 99, 100, 101, 1000]) | st.integers(-5, 120))
    if draw(st.integers(0, 9)) == 0:
        return draw(unreadable), None
    return draw(st.sampled_from([str(n), n])), n


@st.composite
def results(draw) -> dict:
    """One allocation result: of this driver on this node most of the time, else elsewhere."""
    r: dict[str, Any] = {
        "request": draw(st.sampled_from(["gpu", "gpu/a", "other", ""])),
        "driver": draw(st.sampled_from([DRIVER] * 6 + ["gpu.nvidia.com", "example.com/gpu", ""])),
        "pool": draw(st.sampled_from([NODE] * 6 + ["node-b", "", NODE.upper()])),
        "device": draw(st.sampled_from([f"gpu-{i}" for i in range(N_GPUS)] * 3 + ["gpu-9", "gpu--1", "", "gpu-0 "])),
    }
    consumed: dict[str, Any] = {}
    if draw(st.integers(0, 4)):
        consumed["memory"], _ = draw(memory_amounts())
    if draw(st.integers(0, 3)):
        consumed["cores"], _ = draw(core_amounts())
    if draw(st.booleans()):
        consumed["shares"] = "1"
    if consumed or draw(st.booleans()):
        r["consumedCapacity"] = consumed
    if draw(st.booleans()):
        r["shareID"] = draw(st.sampled_from(["s-1", "0b3e9d52-0000-4000-8000-000000000001", 7, ""]))
    return r


def _config(isolation: Any, requests: Any = None, api: str = "gpu.hami.io/v1alpha1") -> dict:
    c: dict[str, Any] = {
        "source": "FromClass",
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": api, "kind": "GpuConfig", "isolation": isolation}},
    }
    if requests is not None:
        c["requests"] = requests
    return c


GOOD_UIDS = [f"0b3e9d52-0000-4000-8000-{i:012d}" for i in range(24)]
UIDS = st.sampled_from(GOOD_UIDS + ["..", ".", "../etc", "a/b", "x" * 300, "uid\n", "-x", ""])


@st.composite
def claims(draw, uid: str | None = None) -> dict:
    """A ResourceClaim as a writer of its status may leave it (kube-scheduler or anyone else)."""
    uid = uid or draw(UIDS)
    rs = draw(st.lists(results(), min_size=0, max_size=4))
    devices: dict[str, Any] = {"results": rs}
    if draw(st.integers(0, 3)) == 0:
        devices["config"] = [
            draw(
                st.sampled_from(
                    [
                        _config("hami-core"),
                        _config("none"),
                        _config("mps"),
                        _config("none", ["gpu"]),
                        _config("none", "gpu"),
                        _config("hami-core", api="v0"),
                        {"opaque": "x"},
                        {"opaque": {"driver": DRIVER, "parameters": []}},
                        {"requests": 5, "opaque": {"driver": DRIVER}},
                    ]
                )
            )
        ]
    claim: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": f"c-{uid[:20]}", "uid": uid},
        "status": {"allocation": {"devices": devices}},
    }
    if draw(st.integers(0, 7)) == 0:
        claim["status"] = draw(st.sampled_from([{}, None, {"allocation": None}, {"allocation": {"devices": []}}]))
    if draw(st.integers(0, 9)) == 0:  # one field anywhere replaced by garbage
        path = draw(
            st.sampled_from([("status",), ("status", "allocation"), ("status", "allocation", "devices"), ("metadata",)])
        )
        target: Any = claim
        for key in path[:-1]:
            target = target.get(key) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[path[-1]] = draw(json_trees)
    return claim


# ------------------------------------------------------------------------------- the oracle


def _cores(raw: Any) -> int | None:
    """Consumed cores as the driver reads them: a whole amount as :func:`_quantity` reads it, or
    the whole part of a fraction (a share that asked for no cores consumed ``1m``); None when it is
    not a quantity. Fractions are read with the product's quantity parser, which
    tests/unit/test_fuzz_inputs.py checks on its own."""
    whole = _quantity(raw)
    if whole is not None:
        return whole
    from hami.core.quantity import QuantityError, parse_quantity

    try:
        q = parse_quantity(raw, "cores")
    except QuantityError:
        return None
    return q.numerator // q.denominator


def _quantity(raw: Any) -> int | None:
    """An independent reading of the byte/percent amounts the generator writes (None: unreadable)."""
    if isinstance(raw, float) and raw.is_integer() and abs(raw) < 2**63:
        return int(raw)
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        return None
    if isinstance(raw, int):
        return raw
    for suffix, factor in (("Mi", MIB), ("Ki", 1024), ("k", 1000), ("", 1)):
        body = raw[: len(raw) - len(suffix)] if suffix else raw
        if raw.endswith(suffix) and body.lstrip("-").isdigit() and body.isascii():
            return int(body) * factor
    return None


def expected_env(claim: Any) -> dict[str, str] | str:
    """The libvgpu env a claim's CDI spec must carry, or "refused" when the plugin must refuse it
    (or "any" when the generator left something this oracle does not model)."""
    if not isinstance(claim, dict):
        return "refused"
    alloc = ((claim.get("status") or {}) if isinstance(claim.get("status"), dict) else {}).get("allocation")
    if not isinstance(alloc, dict) or not isinstance(alloc.get("devices"), dict):
        return "refused"
    rs = alloc["devices"].get("results")
    config = alloc["devices"].get("config")
    if config:
        return "any"  # isolation rules: checked by test_dra_plugin, here only "no crash, no half file"
    if not isinstance(rs, list):
        return "refused"
    mine = [r for r in rs if isinstance(r, dict) and r.get("driver") == DRIVER and r.get("pool") == NODE]
    if not mine:
        return "refused"
    per_gpu: dict[int, list[int]] = {}  # GPU index -> [memory bytes, cores], results on one GPU added
    for r in mine:
        dev = r.get("device")
        if dev not in {f"gpu-{i}" for i in range(N_GPUS)}:
            return "refused"
        consumed = r.get("consumedCapacity") or {}
        if not isinstance(consumed, dict):
            return "refused"
        consumed = {k: v for k, v in consumed.items() if v is not None}
        mem = _quantity(consumed["memory"]) if "memory" in consumed else FULL
        core = _cores(consumed["cores"]) if "cores" in consumed else 0
        if mem is None or core is None:
            return "refused"
        if not (MIB <= mem <= FULL) or not (0 <= core <= 100):
            return "refused"  # outside the device's capacity: no allocator could have written it
        held = per_gpu.setdefault(int(dev.split("-")[1]), [0, 0])
        held[0] += mem
        held[1] += core
    # the container sees the GPUs in the node's index order (docs/dra.md); memory per GPU, the
    # unindexed share is the largest (0 when a GPU has none), and per-GPU shares are added when
    # they differ
    order = sorted(per_gpu)
    if any(per_gpu[i][0] > FULL or per_gpu[i][1] > 100 for i in order):
        return "any"  # two results on one GPU past its size: not modelled here
    shares = [per_gpu[i][1] for i in order]
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(gpu_uuid(i) for i in order),
        "CUDA_DEVICE_SM_LIMIT": str(0 if 0 in shares else max(shares)),
    }
    env.update({f"CUDA_DEVICE_MEMORY_LIMIT_{n}": f"{per_gpu[i][0] // MIB}m" for n, i in enumerate(order)})
    if len(set(shares)) > 1:
        env.update({f"CUDA_DEVICE_SM_LIMIT_{n}": str(c) for n, c in enumerate(shares)})
    return env


def gpu_uuid(i: int) -> str:
    return f"GPU-fuzz0000-0000-0000-0000-{i:012d}"


# ------------------------------------------------------------------------------- the plugin


class PluginSurface:
    """A DRA kubelet plugin served on a unix socket, a fake API server, and a gRPC client; one
    private event loop for sync callers. ``model`` is what the oracle believes is prepared."""

    def __init__(self) -> None:
        from hami.draplugin.api import load
        from hami.draplugin.checkpoint import Checkpoint
        from hami.draplugin.plugin import Driver, PluginServer, socket_paths
        from hami.draplugin.prepare import Paths
        from hami.node.nvml import PhysicalGPU

        self.pb, grpc_mod = load("dra")
        self.root = Path(tempfile.mkdtemp(prefix="hfz", dir="/tmp"))  # unix socket paths are short
        self.paths = Paths(
            hook_path=str(self.root / "usr"), lock_dir=str(self.root / "lock"), cdi_dir=str(self.root / "cdi")
        )
        self.api: dict[tuple[str, str], Any] = {}
        gpus = [PhysicalGPU(i, gpu_uuid(i), "Tesla T4", GPU_MIB, f"0000:0{i}:00.0", 0) for i in range(N_GPUS)]

        async def read(namespace: str, name: str) -> Any:
            if (namespace, name) not in self.api:
                raise LookupError(f"resourceclaims {namespace}/{name} not found")
            return self.api[(namespace, name)]

        self.checkpoint_path = self.root / "state" / "checkpoint.json"
        driver = Driver(NODE, gpus, SliceSettings(), Checkpoint(self.checkpoint_path), read, self.paths)
        reg, dra = socket_paths(self.root / "k")
        self.server = PluginServer(driver, reg, dra)
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.start())

        async def channel() -> Any:
            import grpc

            return grpc.aio.insecure_channel(f"unix://{dra}")

        self.channel = self.loop.run_until_complete(channel())
        self.stub = grpc_mod.DRAPluginStub(self.channel)
        self.prepared: dict[str, list] = {}  # uid -> devices answered when it was prepared
        self.allocated: dict[str, Any] = {}  # uid -> the claim it was prepared from

    def call(self, method: str, refs: list[tuple[str, str, str]]) -> Any:
        claims = [self.pb.Claim(namespace=ns, name=n, uid=u) for ns, n, u in refs]

        async def go() -> Any:  # made on the running loop: grpc.aio looks for it when the call is made
            if method == "prepare":
                return await self.stub.NodePrepareResources(self.pb.NodePrepareResourcesRequest(claims=claims))
            return await self.stub.NodeUnprepareResources(self.pb.NodeUnprepareResourcesRequest(claims=claims))

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.channel.close())
        self.loop.run_until_complete(self.server.stop(0))
        self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)


@st.composite
def plugin_batches(draw) -> list[tuple[str, Any, str]]:
    """Steps ``(op, claim or None, uid)``: prepare a claim (the API server has it, or not, or has
    another uid), or unprepare one (prepared or not)."""
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["prepare"] * 3 + ["unprepare"]))
        uid = draw(UIDS)
        claim = draw(claims(uid)) if op == "prepare" else None
        if claim is not None and isinstance(claim.get("metadata"), dict) and draw(st.integers(0, 15)) == 0:
            claim = {**claim, "metadata": {**claim["metadata"], "uid": "someone-else"}}  # re-created
        if claim is not None and draw(st.integers(0, 15)) == 0:
            claim = None  # the API server has no such claim
        steps.append((op, claim, uid))
    return steps


def _names_claim(error: str, uid: str, name: str) -> bool:
    return uid in error or name in error or "uid is empty" in error


def check_plugin(surface: PluginSurface, steps: list[tuple[str, Any, str]]) -> str | None:
    """Each step's answer is a per-claim error naming the claim or a correct preparation (the CDI
    env as the allocation says); afterwards the CDI directory and the checkpoint agree."""
    wrong = None
    for op, claim, uid in steps:
        name = f"c-{uid[:20]}"
        if op == "unprepare":
            answer = surface.call("unprepare", [("ns", name, uid)]).claims[uid]
            if answer.error:
                return f"unprepare of {uid!r} failed: {answer.error}"
            surface.prepared.pop(uid, None)
            surface.allocated.pop(uid, None)
            continue
        surface.api.pop(("ns", name), None)
        if claim is not None:
            surface.api[("ns", name)] = claim
        got = surface.call("prepare", [("ns", name, uid)]).claims[uid]
        devices = [
            (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids), d.share_id) for d in got.devices
        ]
        if uid in surface.prepared and not _allocated_again(surface.allocated[uid], claim, uid):
            # idempotent: the first answer again (the same allocation, or the claim cannot be read)
            if got.error or devices != surface.prepared[uid]:
                wrong = wrong or f"second prepare of {uid!r} differs: {got.error or devices}"
            continue
        # not prepared, or allocated again under its UID: the old preparation is released first
        surface.prepared.pop(uid, None)
        surface.allocated.pop(uid, None)
        wrong = wrong or _prepare_verdict(surface, claim, uid, name, got.error)
        if not got.error:
            surface.prepared[uid] = devices  # what the plugin holds now, right or wrong
            surface.allocated[uid] = claim
    return wrong or check_plugin_files(surface)


def _allocated_again(first: Any, now: Any, uid: str) -> bool:
    """Whether a prepare of ``uid``, prepared from claim ``first``, finds the API server's claim
    ``now`` (None: no such claim) allocated again: the same UID, another allocation of this node."""
    from hami.draplugin.prepare import fingerprint

    meta = now.get("metadata") if isinstance(now, dict) else None
    if not isinstance(meta, dict) or meta.get("uid") != uid:
        return False  # cannot be read as this claim: answered as prepared
    return fingerprint(now, NODE) != fingerprint(first, NODE)


def _prepare_verdict(surface: PluginSurface, claim: Any, uid: str, name: str, error: str) -> str | None:
    meta = claim.get("metadata") if claim is not None else None
    if uid not in GOOD_UIDS or not isinstance(meta, dict) or meta.get("uid") != uid:
        want: dict[str, str] | str = "refused"
    else:
        want = expected_env(claim)
    if error:
        if not _names_claim(error, uid, name):
            return f"error does not name the claim {uid!r}: {error[:200]}"
        if isinstance(want, dict):
            return f"claim {uid!r} refused ({error[:200]}), must prepare with {want}"
        return None
    if want == "refused":
        return f"claim {uid!r} prepared, must be refused: {json.dumps(claim)[:300]}"
    spec = json.loads(Path(surface.paths.cdi_file(uid)).read_text())
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    if isinstance(want, dict):
        wrong = {k: (env.get(k), v) for k, v in want.items() if env.get(k) != v}
        if wrong:
            return f"claim {uid!r}: env (got, want) {wrong}"
        # every index libvgpu reads is named; one for a GPU not given must be empty (unset)
        extra = [k for k in env if k.startswith("CUDA_DEVICE_MEMORY_LIMIT_") and k not in want and env[k]]
        if extra:
            return f"claim {uid!r}: env has {extra} for GPUs it was not given"
    return None


def check_plugin_files(surface: PluginSurface) -> str | None:
    """Every file in the CDI directory parses and is a prepared claim's; the checkpoint parses and
    names exactly the prepared claims; nothing was written outside the plugin's directories."""
    cdi = Path(surface.paths.cdi_dir)
    files = sorted(p.name for p in cdi.iterdir()) if cdi.exists() else []
    want = sorted(f"{DRIVER}-{u}.json" for u in surface.prepared)
    if files != want:
        return f"CDI directory holds {files}, prepared claims are {want}"
    for f in files:
        doc = json.loads((cdi / f).read_text())
        if doc["devices"][0]["name"] != f[len(DRIVER) + 1 : -5]:
            return f"CDI file {f} names {doc['devices'][0]['name']}"
    ck = json.loads(surface.checkpoint_path.read_text()) if surface.checkpoint_path.exists() else {"claims": {}}
    if sorted(ck["claims"]) != sorted(surface.prepared):
        return f"checkpoint names {sorted(ck['claims'])}, prepared {sorted(surface.prepared)}"
    top = sorted(p.name for p in surface.root.iterdir())
    if not set(top) <= {"usr", "lock", "cdi", "state", "k"}:
        return f"files outside the plugin's directories: {top}"
    claim_dir = Path(surface.paths.vgpu_dir) / "claims"
    if claim_dir.exists():
        stray = {p.name for p in claim_dir.iterdir()} - {n for u in surface.prepared for n in (u, f"{u}.json")}
        if stray:
            return f"claim directories or records of no prepared claim: {sorted(stray)}"
    return None


# ------------------------------------------------------------------------------- translation


@st.composite
def dra_pods(draw) -> tuple[dict, list[dict | None]]:
    """``(pod, per container (init first) what it asks: {count, memory, cores, percent} or None)``."""
    asks: list[dict | None] = []

    def container(i: int, prefix: str) -> dict:
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": "busybox"}
        if not draw(st.booleans()):
            asks.append(None)
            if draw(st.booleans()):
                c["resources"] = {"limits": {"cpu": "1"}}
            return c
        n = draw(st.integers(1, 4))
        ask: dict[str, Any] = {"count": n, "memory": None, "cores": None, "percent": None}
        limits: dict[str, Any] = {"nvidia.com/gpu": draw(st.sampled_from([n, str(n)]))}
        if draw(st.booleans()):
            mem = draw(st.integers(1, 40000))
            ask["memory"] = mem
            limits["nvidia.com/gpumem"] = draw(st.sampled_from([mem, str(mem)]))
        elif draw(st.integers(0, 3)) == 0:
            ask["percent"] = draw(st.sampled_from([10, 50, 100]))
            limits["nvidia.com/gpumem-percentage"] = ask["percent"]
        if draw(st.booleans()):
            ask["cores"] = draw(st.sampled_from([0, 1, 30, 99, 100]))
            limits["nvidia.com/gpucores"] = ask["cores"]
        c["resources"] = {"limits": limits}
        if prefix == "i" and draw(st.integers(0, 3)) == 0:
            c["restartPolicy"] = "Always"
        asks.append(ask)
        return c

    inits = [container(i, "i") for i in range(draw(st.integers(0, 2)))]
    apps = [container(i, "c") for i in range(draw(st.integers(1, 3)))]
    spec: dict[str, Any] = {"containers": apps}
    if inits:
        spec["initContainers"] = inits
    if draw(st.integers(0, 3)) == 0:
        spec["resourceClaims"] = [{"name": "hami-gpu-0", "resourceClaimName": "mine"}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": draw(st.sampled_from(["p", "q-1"]))}, "spec": spec}
    annotations = draw(selection_annotations())
    if annotations:
        pod["metadata"]["annotations"] = annotations
    return pod, asks


#: what a user may write in a type or UUID list: quotes, backslashes, CEL syntax, unicode, commas
_VALUE_TEXT = st.lists(
    st.sampled_from(list("aA1-_ \"\\'()[]|&!$.,\n\té中😀") + ["T4", "A100", "GPU-0", '") || true || ("']),
    max_size=8,
).map("".join)


@st.composite
def selection_annotations(draw) -> dict[str, str]:
    """HAMi's GPU choice annotations, now and then one DRA cannot express."""
    out = {}
    for key in (
        "nvidia.com/use-gputype",
        "nvidia.com/nouse-gputype",
        "nvidia.com/use-gpuuuid",
        "nvidia.com/nouse-gpuuuid",
    ):
        if draw(st.integers(0, 2)) == 0:
            out[key] = draw(_VALUE_TEXT)
    if draw(st.integers(0, 4)) == 0:
        out["nvidia.com/numa-bind"] = draw(st.sampled_from(["true", "True", "1", "T", "tRUE", " true", "false", "yes"]))
    if draw(st.integers(0, 6)) == 0:
        out[draw(st.sampled_from(["hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy"]))] = draw(
            st.sampled_from(["binpack", "spread", " ", ""])
        )
    return out


def _items(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _ascii_lower(text: str) -> str:
    return "".join(c.lower() if "A" <= c <= "Z" else c for c in text)


def _ascii_upper(text: str) -> str:
    return "".join(c.upper() if "a" <= c <= "z" else c for c in text)


def _selection_verdict(annotations: dict[str, str], type_: str, uuid: str) -> bool:
    """The extender's rules, restated: a type list matches case-insensitively as a substring, a
    UUID list exactly, an empty list is no rule."""
    use_t = [v.lower() for v in _items(annotations.get("nvidia.com/use-gputype", ""))]
    nouse_t = [v.lower() for v in _items(annotations.get("nvidia.com/nouse-gputype", ""))]
    use_u = _items(annotations.get("nvidia.com/use-gpuuuid", ""))
    nouse_u = _items(annotations.get("nvidia.com/nouse-gpuuuid", ""))
    t = type_.lower()
    if use_t and not any(v in t for v in use_t):
        return False
    if any(v in t for v in nouse_t):
        return False
    if use_u and uuid not in use_u:
        return False
    return uuid not in nouse_u


def _check_selectors(annotations: dict[str, str], exactly: dict) -> str | None:
    """Each template's selectors, run by the simulator's CEL library on devices made from the
    annotations' own values, give the extender's verdict: no value widens or breaks a selector."""
    from hami.dra.cel import DeviceCel, compile_selector

    values = [v for k in annotations if k.startswith("nvidia.com/") for v in _items(annotations[k])]
    if any(v.lower() != _ascii_lower(v) for v in values):
        return None  # a non-ASCII capital: CEL lowers ASCII only (documented), the extender all letters
    exprs = [sel["cel"]["expression"] for sel in exactly.get("selectors") or ()]
    try:
        compiled = [compile_selector(e) for e in exprs]
    except Exception as exc:
        return f"a selector does not compile: {exc} ({exprs})"
    for v in values + ["zz", "GPU-0"]:
        for type_, uuid in ((f"NVIDIA-{v}", v), (f"NVIDIA-{_ascii_upper(v)}x", "GPU-other"), ("NVIDIA-L4", v)):
            device = DeviceCel(DRIVER, {"attributes": {"type": {"string": type_}, "uuid": {"string": uuid}}})
            try:
                got = all(device.matches(c) for c in compiled)
            except Exception as exc:
                return f"selectors {exprs} fail on type {type_!r} uuid {uuid!r}: {exc}"
            want = _selection_verdict(annotations, type_, uuid)
            if got != want:
                return f"selectors {exprs} say {got} for type {type_!r} uuid {uuid!r}, the extender's rule {want}"
    return None


def _dra_settings() -> Any:
    from hami.webhook.admission import AdmissionSettings

    from ._fuzzkit import VENDORS

    return AdmissionSettings(VENDORS, front_end="dra")


DRA_SETTINGS = None


def check_translation(item: tuple[dict, list[dict | None]]) -> str | None:
    """The webhook on the DRA front end: each GPU container's claim asks what the container asked;
    no GPU resource is left in limits; a fraction of memory is refused naming the resource."""
    from hami.webhook.admission import review_with_templates

    global DRA_SETTINGS
    DRA_SETTINGS = DRA_SETTINGS or _dra_settings()
    pod, asks = item
    body = {"request": {"uid": "u", "operation": "CREATE", "namespace": "ns", "kind": {"kind": "Pod"}, "object": pod}}
    answer, templates = review_with_templates(body, DRA_SETTINGS)
    r = answer["response"]
    annotations = pod["metadata"].get("annotations") or {}
    fraction = [a for a in asks if a and a["percent"] not in (None, 100)]
    policy = [
        k for k in ("hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy") if annotations.get(k, "").strip()
    ]
    if policy and any(asks):  # refused by name (or, as well, for a fraction of memory)
        msg = (r.get("status") or {}).get("message") or ""
        if r["allowed"] or not (f"annotation {policy[0]}=" in msg or (fraction and "gpumem-percentage" in msg)):
            return f"{policy[0]} was not refused by name: {r}"
        return None
    if fraction:
        msg = (r.get("status") or {}).get("message") or ""
        if r["allowed"] or "gpumem-percentage" not in msg:
            return f"a fraction of memory was not refused by name: {r}"
        return None
    if not r["allowed"]:
        return f"DRA pod denied: {r.get('status')}"
    if not any(asks):
        return None if not templates else f"templates for a pod without GPUs: {templates}"
    out = _apply(pod, json.loads(base64.b64decode(r["patch"])) if "patch" in r else [])
    spec = out["spec"]
    by_claim = {c["name"]: c.get("resourceClaimTemplateName") for c in spec.get("resourceClaims") or ()}
    by_template = {t["metadata"]["name"]: t for t in templates}
    containers = list(spec.get("initContainers") or []) + list(spec["containers"])
    wants = _translation_wants(containers, asks, len(spec.get("initContainers") or []))
    for c, ask, want in zip(containers, asks, wants):
        res = c.get("resources") or {}
        left = [k for s in ("limits", "requests") for k in res.get(s) or {} if k.startswith("nvidia.com/")]
        if left:
            return f"container {c['name']}: GPU resources left in its resources: {left}"
        mine = [x["name"] for x in res.get("claims") or ()]
        if ask is None:
            if mine:
                return f"container {c['name']} asked for no GPU and got claims {mine}"
            continue
        if len(mine) != 1 or by_template.get(by_claim.get(mine[0])) is None:
            return f"container {c['name']}: claims {mine} do not name one template ({by_claim})"
        t = by_template[by_claim[mine[0]]]
        if t["metadata"].get("namespace") != "ns":
            return f"template in namespace {t['metadata'].get('namespace')!r}"
        [req] = t["spec"]["spec"]["devices"]["requests"]
        ex = req["exactly"]
        bad = _check_selectors(annotations, ex)
        if bad:
            return f"container {c['name']}: {bad}"
        # (of the claim's count: an init container sharing the app container's claim gets its constraint)
        numa = annotations.get("nvidia.com/numa-bind", "") in {"1", "t", "T", "TRUE", "true", "True"} and want[0] > 1
        constraint = {"requests": ["gpu"], "matchAttribute": "gpu.hami.io/numa"}
        if numa != (constraint in t["spec"]["spec"]["devices"].get("constraints", [])):
            return f"container {c['name']}: numa-bind {annotations.get('nvidia.com/numa-bind')!r} with {want[0]} GPUs"
        caps = (ex.get("capacity") or {}).get("requests") or {}
        got = (ex["count"], caps.get("memory"), caps.get("cores"))
        if got != want:
            return f"container {c['name']} asked {ask}, its claim asks (count, memory, cores) {got}, want {want}"
    return None


def _shape(ask: dict) -> tuple[int, int | None, int]:
    """(GPUs, MiB per GPU or None for all of it, cores) a container's claim asks: the memory asked
    is kept whatever the cores; no gpumem (or gpumem-percentage: 100 alone) is the whole GPU and
    then 100 cores unless cores are asked (HAMi's admission rule)."""
    whole = ask["memory"] is None
    cores = ask["cores"] if ask["cores"] is not None else (100 if whole else 0)
    return ask["count"], None if whole else ask["memory"], cores


def _translation_wants(containers: list[dict], asks: list, n_init: int) -> list:
    """Per container, the (count, memory, cores) its claim asks: init containers that run to
    completion share one claim with the app container it enlarges least, when one request of the
    group holds all the others (the claim is that one); requests that cross keep their own
    claims, as sidecars and the other app containers do. Cores 0 are named as a thousandth, 1m."""
    shapes = [_shape(a) if a else None for a in asks]
    inits = [i for i in range(n_init) if shapes[i] and containers[i].get("restartPolicy") != "Always"]
    apps = [i for i in range(n_init, len(containers)) if shapes[i]]

    def join(a, b):
        mem = None if None in (a[1], b[1]) else max(a[1], b[1])
        return max(a[0], b[0]), mem, max(a[2], b[2])

    def total(s):
        return (float("inf") if s[1] is None else s[1]) * s[0]

    def growth(i, merged):
        to, me = join(shapes[i], merged), shapes[i]
        extra = 0.0 if total(to) == total(me) else total(to) - total(me)
        return (float(to[0] - me[0]), extra, float(to[2] * to[0] - me[2] * me[0])), i

    def covering(group):
        merged = group[0]
        for s in group[1:]:
            merged = join(merged, s)
        return merged if merged in group else None

    group_shape = {i: shapes[i] for i in range(len(containers)) if shapes[i]}
    merged = covering([shapes[i] for i in inits]) if inits else None
    if merged is not None:
        members = list(inits)
        fits = [i for i in apps if covering([merged, shapes[i]]) is not None]
        if fits:
            partner = min(fits, key=lambda i: growth(i, merged))
            merged = join(merged, shapes[partner])
            members.append(partner)
        for i in members:
            group_shape[i] = merged
    out = []
    for i in range(len(containers)):
        s = group_shape.get(i)
        out.append(None if s is None else (s[0], None if s[1] is None else f"{s[1]}Mi", str(s[2]) if s[2] else "1m"))
    return out


# ------------------------------------------------------------------------------- claims and slices read


@st.composite
def slices(draw) -> dict:
    """A ResourceSlice, this driver's or another's, with odd capacities now and then."""
    devices = []
    for i in range(draw(st.integers(0, 4))):
        d: dict[str, Any] = {
            "name": f"gpu-{i}",
            "attributes": {"uuid": {"string": gpu_uuid(i)}, "index": {"int": i}, "type": {"string": "NVIDIA-T4"}},
            "capacity": {
                "memory": {"value": draw(memory_amounts())[0]},
                "cores": {"value": draw(st.sampled_from(["100", "0", "x", 100]))},
                "shares": {"value": "10"},
            },
        }
        if draw(st.integers(0, 7)) == 0:
            d["attributes"]["uuid"] = draw(json_trees)
        if draw(st.integers(0, 5)) == 0:
            key = draw(st.sampled_from(["attributes", "capacity", "name"]))
            d[key] = draw(json_trees)
        devices.append(d if draw(st.integers(0, 15)) else draw(json_trees))
    spec: dict[str, Any] = {
        "driver": draw(st.sampled_from([DRIVER] * 3 + ["gpu.nvidia.com"])),
        "nodeName": draw(st.sampled_from([NODE, "node-b"])),
        "pool": {"name": draw(st.sampled_from([NODE, "node-b"])), "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    if draw(st.integers(0, 7)) == 0:
        spec[draw(st.sampled_from(["pool", "devices", "nodeName"]))] = draw(json_trees)
    obj: dict[str, Any] = {"metadata": {"name": draw(st.sampled_from(["s1", "s2", "s3"]))}, "spec": spec}
    if draw(st.integers(0, 15)) == 0:
        obj["spec"] = draw(json_trees)
    return obj


@st.composite
def watch_events(draw) -> list[tuple[str, str, Any]]:
    """Events of the claim and slice watches: ``(watch, kind, object)``."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        watch = draw(st.sampled_from(["claim", "claim", "slice"]))
        kind = draw(st.sampled_from(["ADDED", "MODIFIED", "MODIFIED", "DELETED"]))
        obj = draw(claims()) if watch == "claim" else draw(slices())
        out.append((watch, kind, obj))
    return out


def _claim_reading(claim: Any) -> tuple[str, list[tuple[str, str, int | None, int | None]]] | None:
    """The independent reading: ``(ns/name, [(pool, device, memory, cores)])`` of this driver's
    results, None when it holds none, "bad" when an amount cannot be read."""
    status = claim.get("status") if isinstance(claim.get("status"), dict) else {}
    alloc = status.get("allocation")
    if not isinstance(alloc, dict):
        return None
    devices = alloc.get("devices") if isinstance(alloc.get("devices"), dict) else {}
    rs = devices.get("results") or []
    if not isinstance(rs, list):
        return "bad"  # type: ignore[return-value]
    out = []
    for r in rs:
        if not isinstance(r, dict):
            return "bad"  # type: ignore[return-value]
        if r.get("driver") != DRIVER:
            continue
        consumed = r.get("consumedCapacity") or {}
        consumed = {k: v for k, v in consumed.items() if v is not None} if isinstance(consumed, dict) else consumed
        if not isinstance(consumed, dict):
            return "bad"  # type: ignore[return-value]
        if any(isinstance(v, str) and (_cores if k == "cores" else _quantity)(v) is None for k, v in consumed.items()):
            return "any"  # type: ignore[return-value]  # junk text: the quantity tests judge its reading
        mem = _quantity(consumed["memory"]) if "memory" in consumed else None
        core = _cores(consumed["cores"]) if "cores" in consumed else None
        if any(k in consumed and (v is None or not 0 <= v <= INT64_MAX) for k, v in (("memory", mem), ("cores", core))):
            return "bad"  # type: ignore[return-value]  # negative, or beyond a Kubernetes quantity's int64
        out.append((str(r.get("pool") or ""), str(r.get("device") or ""), mem, core))
    meta = claim.get("metadata") if isinstance(claim.get("metadata"), dict) else {}
    return (f"{meta.get('namespace') or ''}/{meta.get('name') or ''}", out) if out else None


def check_watch(events: list[tuple[str, str, Any]]) -> str | None:
    """The scheduler's claim and slice watches take anything the API server sends without an
    exception; the claims it keeps are exactly the readable allocations of this driver, and the
    ledger counts each as :func:`claim_usage` reads it."""
    from hami.core import SchedulerConfig
    from hami.dra import fit
    from hami.dra.claims import ClaimError, claim_usage
    from hami.scheduler.state import ClusterState
    from hami.vendors import build_vendors

    state = ClusterState(SchedulerConfig(build_vendors()))
    want: dict[str, Any] = {}
    kept_slices: list[Any] = []
    for watch, kind, obj in events:
        if watch == "slice":
            state.slice_handler.apply(kind, obj)
            kept_slices.append(obj)
            continue
        state.claim_handler.apply(kind, obj)
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        ref = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        reading = None if kind == "DELETED" else _claim_reading(obj)
        try:
            usage = claim_usage(obj)
        except ClaimError:
            usage = "bad"
        if reading == "any":  # take the reader's word for it
            reading = "bad" if usage == "bad" else None if usage is None else ("", [])
        if kind != "DELETED" and (reading == "bad") != (usage == "bad"):
            return f"claim_usage says {usage!r}, the allocation reads {reading!r}: {json.dumps(obj)[:300]}"
        if kind != "DELETED" and usage not in (None, "bad") and reading[1]:
            got = [(r.pool, r.device, r.memory, r.cores) for r in usage.results]
            if got != reading[1]:
                return f"claim_usage read {got}, the allocation says {reading[1]}"
        if reading in (None, "bad") or kind == "DELETED":
            want.pop(ref, None)
        else:
            want[ref] = reading
    if sorted(state.claims) != sorted(want):
        return f"watch cache holds claims {sorted(state.claims)}, readable allocations are {sorted(want)}"
    if state.ledger.claim_keys() != sorted(state.claims):
        return f"ledger counts claims {state.ledger.claim_keys()}, the cache holds {sorted(state.claims)}"
    # the simulation's readers of the same objects, given what passes their shape check
    fit.usage([s for s in kept_slices if _shaped(s, fit.SLICE)], [obj for w, _, obj in events if w == "claim"])
    for w, _, obj in events:
        if w == "claim" and _shaped(obj, fit.CLAIM):
            try:
                fit.claim_spec_requests(obj.get("spec") or {}, "spec")
            except fit.ClaimError:
                pass
    return None


def _shaped(obj: Any, shape: Any) -> bool:
    from hami.core.shape import ShapeError, check

    try:
        check(obj, shape, "obj")
    except ShapeError:
        return False
    return True


# ------------------------------------------------------------------------------- checkpoints on disk

DAMAGE = [
    "valid",
    "truncated",
    "garbage",
    "not-utf8",
    "empty",
    "foreign-json",
    "wrong-types",
    "directory",
    "unreadable",
]


def _valid_dra_checkpoint() -> dict:
    uid = "0b3e9d52-0000-4000-8000-000000000001"
    return {
        "version": 1,
        "claims": {
            uid: {
                "namespace": "ns",
                "name": "c",
                "devices": [
                    {"request_names": ["gpu"], "pool_name": NODE, "device_name": "gpu-0", "cdi_device_ids": ["x"]}
                ],
                "cdi_file": f"/nonexistent/{uid}.json",
                "cdi_spec": {"cdiVersion": "0.6.0", "kind": "gpu.hami.io/claim", "devices": []},
                "claim_dir": f"/nonexistent/claims/{uid}",
            }
        },
    }


def _valid_mig_checkpoint() -> dict:
    from hami.node.mig import Entry

    e = Entry("pod-uid", "ns/p", 0, 0, "GPU-x", "1g.10gb", 0, 1, "ready", 1, 0, "MIG-x")
    return {"version": 1, "entries": [asdict(e)]}


@st.composite
def damaged_files(draw) -> tuple[str, str, bytes]:
    """``(which checkpoint, damage, bytes)``."""
    which = draw(st.sampled_from(["dra", "mig"]))
    damage = draw(st.sampled_from(DAMAGE))
    valid = json.dumps(_valid_dra_checkpoint() if which == "dra" else _valid_mig_checkpoint()).encode()
    if damage == "valid":
        data = valid
    elif damage == "truncated":
        data = valid[: draw(st.integers(0, len(valid) - 1))]
    elif damage == "garbage":
        data = draw(st.binary(max_size=64))
    elif damage == "not-utf8":
        data = b'{"version": 1, "claims": {"\xff\xfe": 1}}'
    elif damage == "empty":
        data = b""
    elif damage == "foreign-json":
        data = json.dumps(draw(json_trees)).encode()
    else:  # wrong-types: the right envelope, an entry of the wrong shape
        doc = json.loads(valid)
        entries = doc["claims"] if which == "dra" else doc["entries"]
        if which == "dra":
            (uid,) = entries
            if draw(st.booleans()):
                entries[uid] = draw(json_trees)
            else:
                entries[uid][draw(st.sampled_from(sorted(entries[uid])))] = draw(json_trees)
        elif draw(st.booleans()):
            entries[0] = draw(json_trees)
        else:
            entries[0][draw(st.sampled_from(sorted(entries[0])))] = draw(json_trees)
        data = json.dumps(doc).encode()
    return which, damage, data


def _lay(path: Path, damage: str, data: bytes) -> None:
    if path.is_symlink():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if damage == "directory":
        path.mkdir()
    elif damage == "unreadable":  # a link to itself: every open fails (ELOOP), even for root
        path.symlink_to(path.name)
    else:
        path.write_bytes(data)


def _entry_ok(which: str, entry: Any) -> bool:
    """Whether a loaded entry has the shape its users read (the oracle of "wrong-types")."""
    if which == "mig":
        types = {
            "pod_uid": str,
            "pod": str,
            "container": int,
            "device": int,
            "gpu_uuid": str,
            "profile": str,
            "start": int,
            "size": int,
            "state": str,
            "mig_uuid": str,
        }
        return all(
            isinstance(getattr(entry, k), t) and not isinstance(getattr(entry, k), bool) for k, t in types.items()
        ) and all(
            v is None or (isinstance(v, int) and not isinstance(v, bool))
            for v in (entry.gpu_instance_id, entry.compute_instance_id)
        )
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("devices"), list)
        and all(isinstance(d, dict) for d in entry["devices"])
        and isinstance(entry.get("cdi_file"), str)
        and isinstance(entry.get("cdi_spec"), dict)
    )


class CheckpointSurface:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hami-fuzz-ck-"))

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def check_checkpoint(surface: CheckpointSurface, item: tuple[str, str, bytes]) -> str | None:
    """Loading a damaged checkpoint gives the module's own error naming the file, or entries of
    the right shape; the file is left as it was (what was prepared is not lost)."""
    from hami.node.mig import Checkpoint as MigCheckpoint
    from hami.draplugin.checkpoint import Checkpoint, CheckpointError
    from hami.node.nvml import MigError

    which, damage, data = item
    path = surface.dir / "checkpoint.json"
    _lay(path, damage, data)
    before = path.read_bytes() if path.is_file() else None
    error_type = CheckpointError if which == "dra" else MigError
    try:
        if which == "dra":
            entries = list(Checkpoint(path)._claims.values())  # noqa: SLF001 - what the driver will read
        else:
            entries = list(MigCheckpoint(path).load().values())
    except error_type as exc:
        if str(path) not in str(exc):
            return f"{which} checkpoint ({damage}): error does not name the file: {exc}"
        loaded = None
    else:
        loaded = entries
    after = path.read_bytes() if path.is_file() else None
    if before != after or (damage in ("directory", "unreadable")) != (not path.is_file()):
        return f"{which} checkpoint ({damage}): the file was changed by loading it"
    if damage == "valid" and loaded is None:
        return f"{which} checkpoint: a valid file was refused"
    if loaded is not None and not all(_entry_ok(which, e) for e in loaded):
        return f"{which} checkpoint ({damage}): an entry of the wrong shape was accepted: {data[:200]!r}"
    return None


@st.composite
def cdi_damage(draw) -> tuple[str, bytes, bool]:
    """``(damage to a prepared claim's CDI file, bytes, foreign files beside it)``."""
    damage = draw(st.sampled_from(["truncated", "garbage", "empty", "directory", "deleted", "foreign-json"]))
    data = draw(st.binary(max_size=40)) if damage == "garbage" else json.dumps(draw(json_trees)).encode()
    return damage, data, draw(st.booleans())


def check_cdi_damage(surface: PluginSurface, item: tuple[str, bytes, bool]) -> str | None:
    """A prepared claim whose CDI file was damaged: the kubelet's next prepare rewrites it from
    the checkpoint (or answers an error naming the file); foreign files are left alone."""
    damage, data, foreign = item
    uid = "0b3e9d52-0000-4000-8000-00000000cd10"
    name = "cdi-victim"
    surface.api[("ns", name)] = {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": "gpu-1",
                            "consumedCapacity": {"memory": "2000Mi", "cores": "20"},
                        }
                    ]
                }
            }
        },
    }
    first = surface.call("prepare", [("ns", name, uid)]).claims[uid]
    if first.error:
        return f"a valid claim was refused: {first.error}"
    path = Path(surface.paths.cdi_file(uid))
    good = path.read_bytes()
    cdi = Path(surface.paths.cdi_dir)
    others = {"nvidia.yaml": b"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n", "junk.json": data}
    if foreign:
        for f, b in others.items():
            (cdi / f).write_bytes(b)
    if damage == "deleted":
        path.unlink()
    else:
        _lay(
            path,
            "directory" if damage == "directory" else "file",
            good[: len(good) // 2] if damage == "truncated" else data,
        )
    again = surface.call("prepare", [("ns", name, uid)]).claims[uid]
    try:
        if again.error:
            if str(path) not in again.error and uid not in again.error:
                return f"CDI file {damage}: error does not name it: {again.error}"
        elif not path.is_file() or path.read_bytes() != good:
            return f"CDI file {damage}: prepare answered success and left the file {damage}"
        if foreign and any((cdi / f).read_bytes() != b for f, b in others.items()):
            return "a foreign file in the CDI directory was changed"
        return None
    finally:
        for f in others:
            (cdi / f).unlink(missing_ok=True)
        if path.is_dir():
            shutil.rmtree(path)
        surface.call("unprepare", [("ns", name, uid)])
        surface.api.pop(("ns", name), None)


__all__ = [
    "CheckpointSurface",
    "PluginSurface",
    "check_cdi_damage",
    "check_checkpoint",
    "check_plugin",
    "check_translation",
    "check_watch",
    "cdi_damage",
    "claims",
    "damaged_files",
    "dra_pods",
    "plugin_batches",
    "slices",
    "watch_events",
]
