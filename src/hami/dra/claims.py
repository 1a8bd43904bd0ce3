"""What a ResourceClaim holds of ``gpu.hami.io``'s GPUs, read in one place (pure, no I/O).

kube-scheduler writes a claim's allocation in ``status.allocation.devices.results``: one result
per device, with ``driver``, ``pool`` (this driver publishes one pool per node, named after the
node), ``device`` (``gpu-<index>``), ``request`` and, for a device with
``allowMultipleAllocations``, ``consumedCapacity`` (``memory`` in bytes, ``cores`` in percent,
``shares``). ``status.reservedFor`` names the consumers (pods) using the claim.

:func:`claim_usage` turns a claim into a :class:`ClaimUsage`; every reader of allocations (the
scheduler's watch cache and through it the webhook's quota and the UI, ``hami dra --explain``)
uses it, so they agree on what a claim takes. A result with ``adminAccess: true`` takes nothing:
kube-scheduler does not count it as allocated (its DynamicResources plugin skips such results),
so it is kept apart, in :attr:`ClaimUsage.admin`, and a claim holding only such results holds
nothing (``None``). A capacity missing from ``consumedCapacity`` is
``None``: the allocation took the whole device (:meth:`DeviceShare.resolved` fills it in from the
device's published capacity when the caller knows it). Consumed ``cores`` may be a fraction (a
share that names no cores consumes a thousandth, :data:`hami.dra.model.IDLE_CORES`): a share
counts, and its container is given, the whole part (:attr:`DeviceShare.cores`); the exact amount
is kept for the simulation of kube-scheduler's arithmetic (:meth:`DeviceShare.consumed`).
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Mapping

from hami.core.quantity import QuantityError, parse_int_quantity, parse_quantity

from .model import CORES, DRIVER, MEMORY, MIB, MIG_CLASS, PROFILE, SHARE_CLASS, SHARES, WHOLE_CLASS

CAPACITIES = (MEMORY, CORES, SHARES)


class ClaimError(ValueError):
    """A claim whose allocation cannot be read; the message names the claim and the field."""


@dataclass(frozen=True, slots=True)
class Consumer:
    """One ``status.reservedFor`` entry (``resource`` is ``pods`` for a pod)."""

    resource: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """One allocation result of this driver: what the claim consumes on one GPU."""

    pool: str  # the node's name
    device: str  # gpu-<index>
    request: str
    memory: int | None  # bytes; None: not recorded, the whole device
    cores: int | None  # percent, the whole part of what was consumed; None: the whole device
    shares: int | None
    share_id: str | None = None
    exact_cores: Fraction | None = None  # what was consumed when it is not a whole number

    def resolved(self, total: Mapping[str, Any]) -> dict[str, int]:
        """``{memory, cores, shares}`` with a missing amount taken as ``total``'s (0 when unknown),
        each a whole number (what quotas, tables and the container count)."""
        own = {MEMORY: self.memory, CORES: self.cores, SHARES: self.shares}
        return {k: amount if (amount := own[k]) is not None else int(total.get(k, 0)) for k in CAPACITIES}

    def consumed(self, total: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`resolved` with the cores exactly as kube-scheduler counts them (a fraction too)."""
        out: dict[str, Any] = dict(self.resolved(total))
        if self.exact_cores is not None:
            out[CORES] = self.exact_cores
        return out


@dataclass(frozen=True, slots=True)
class ClaimUsage:
    namespace: str
    name: str
    uid: str
    results: tuple[DeviceShare, ...]
    reserved_for: tuple[Consumer, ...] = ()
    admin: tuple[DeviceShare, ...] = ()  # admin-access results: the GPUs it sees, consuming nothing

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({r.pool for r in self.results}))

    @property
    def pods(self) -> tuple[Consumer, ...]:
        return tuple(c for c in self.reserved_for if c.resource == "pods")

    def totals(self, device_totals: Mapping[tuple[str, str], Mapping[str, int]] | None = None) -> tuple[int, int]:
        """``(memory MiB, cores)`` over every GPU of the claim; memory rounded up to whole MiB. A
        missing amount is the device's total from ``device_totals`` ((pool, device) -> capacity
        values), 0 when the device is not known."""
        mem = cores = 0
        for r in self.results:
            got = r.resolved((device_totals or {}).get((r.pool, r.device), {}))
            mem += -(-got[MEMORY] // MIB)
            cores += got[CORES]
        return mem, cores


def _quantity(raw: Any, where: str, parse: Any) -> Any:
    """``raw`` parsed by ``parse``, as a :class:`ClaimError` when it is not a quantity or is
    negative; None when there is none."""
    if raw is None:
        return None
    try:
        value = parse(raw, where)
    except QuantityError as exc:
        raise ClaimError(str(exc)) from None
    if value < 0:
        raise ClaimError(f"{where}: must not be negative, got {raw!r}")
    return value


def _amount(raw: Any, where: str) -> int | None:
    value: int | None = _quantity(raw, where, parse_int_quantity)
    return value


def _cores(raw: Any, where: str) -> tuple[int | None, Fraction | None]:
    """(whole cores, the exact amount when it is not whole) of a cores quantity; (None, None)
    when there is none. Raises :class:`ClaimError` for what is not a quantity, or a negative one."""
    value: Fraction | None = _quantity(raw, where, parse_quantity)
    if value is None:
        return None, None
    whole = value.numerator // value.denominator
    return whole, (value if value.denominator != 1 else None)


def _object(value: Any) -> Mapping[str, Any]:
    """``value`` when it is an object, else an empty one (a missing or malformed optional field)."""
    return value if isinstance(value, Mapping) else {}


def claim_usage(claim: Mapping[str, Any]) -> ClaimUsage | None:
    """What ``claim`` holds of this driver's GPUs; None when it is not allocated or holds none of
    them. Raises :class:`ClaimError` for an allocation that is not the API's shape."""
    if not isinstance(claim, Mapping):
        raise ClaimError(f"a ResourceClaim must be an object, got {type(claim).__name__}")
    meta = _object(claim.get("metadata"))
    ref = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    status = _object(claim.get("status"))
    allocation = status.get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    devices = _object(allocation.get("devices"))
    results = devices.get("results")
    results = [] if results is None else results
    if not isinstance(results, list):
        raise ClaimError(f"{ref}: status.allocation.devices.results must be a list, got {type(results).__name__}")
    shares: list[DeviceShare] = []
    admin: list[DeviceShare] = []
    for i, r in enumerate(results):
        where = f"{ref}: status.allocation.devices.results[{i}]"
        if not isinstance(r, Mapping):
            raise ClaimError(f"{where} must be an object, got {type(r).__name__}")
        if r.get("driver") != DRIVER:
            continue
        consumed = r.get("consumedCapacity") or {}
        if not isinstance(consumed, Mapping):
            raise ClaimError(f"{where}.consumedCapacity must be an object, got {type(consumed).__name__}")
        amounts = {k: _amount(consumed.get(k), f"{where}.consumedCapacity.{k}") for k in (MEMORY, SHARES)}
        amounts[CORES], exact = _cores(consumed.get(CORES), f"{where}.consumedCapacity.{CORES}")
        flag = r.get("adminAccess")
        if flag is not None and not isinstance(flag, bool):
            raise ClaimError(f"{where}.adminAccess must be true or false, got {flag!r:.40}")
        (admin if flag else shares).append(
            DeviceShare(
                str(r.get("pool") or ""),
                str(r.get("device") or ""),
                str(r.get("request") or ""),
                amounts[MEMORY],
                amounts[CORES],
                amounts[SHARES],
                str(r["shareID"]) if r.get("shareID") else None,
                exact,
            )
        )
    if not shares:
        return None
    consumers = []
    for c in status.get("reservedFor") or ():
        if isinstance(c, Mapping):
            consumers.append(Consumer(str(c.get("resource") or ""), str(c.get("name") or ""), str(c.get("uid") or "")))
    return ClaimUsage(
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
        tuple(shares),
        tuple(consumers),
        tuple(admin),
    )


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(pool, device) -> {uuid, index, model, numa, parent, total: {memory, cores, shares}}`` for
    every device of this driver's ResourceSlices (values the API could not have stored are 0, or
    empty; a field of the wrong type is read as missing, a device that is not an object is
    skipped). ``parent``: a MIG device's GPU UUID (it has a ``profile``), "" for a whole GPU.
    ``index``: the GPU's ``index`` attribute; without one, the GPU index every device name of
    the kubelet plugin starts with (``gpu-N``, ``gpu-N-mig-G``, ``gpu-N-<profile>-S``); -1 when
    neither says."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in slices:
        spec = _object(_object(s).get("spec"))
        if spec.get("driver") != DRIVER:
            continue
        pool = _text(_object(spec.get("pool")).get("name")) or _text(spec.get("nodeName"))
        devices = spec.get("devices")
        for d in devices if isinstance(devices, list) else ():
            if not isinstance(d, Mapping):
                continue
            attrs = _object(d.get("attributes"))
            caps = _object(d.get("capacity"))
            total = {}
            for k in CAPACITIES:
                try:
                    total[k] = parse_int_quantity(_object(caps.get(k)).get("value", 0), k)
                except QuantityError:
                    total[k] = 0

            def attr(name: str, kind: type, default: Any) -> Any:
                value = _object(attrs.get(name)).get(kind.__name__ if kind is not str else "string", default)
                return value if isinstance(value, kind) and not isinstance(value, bool) else default

            name = _text(d.get("name"))
            out[(pool, name)] = {
                "uuid": attr("uuid", str, ""),
                "index": gpu_index(name, attr("index", int, None)),
                "model": attr("type", str, "") or attr("model", str, ""),
                "numa": attr("numa", int, 0),
                "parent": attr("parentUUID", str, "") if attr(PROFILE, str, "") else "",
                "total": total,
            }
    return out


#: the GPU index a kubelet-plugin device name starts with (:func:`hami.dra.model.device_name`)
_GPU_NAME = re.compile(r"gpu-(\d+)(?:-|$)")


def gpu_index(name: str, attribute: Any) -> int:
    """A published device's GPU index: its ``index`` attribute (an int), else the ``gpu-N`` its
    name starts with, else -1."""
    if isinstance(attribute, int) and not isinstance(attribute, bool):
        return attribute
    named = _GPU_NAME.match(name)
    return int(named.group(1)) if named else -1


def _text(value: Any) -> str:
    """A name field: the string, or "" for anything else."""
    return value if isinstance(value, str) else ""


# ------------------------------------------------------------------------- what a claim asks for


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """What a claim's spec asks of this driver's classes, before any allocation: memory (MiB,
    rounded up) and cores summed over its requests, each request at its largest alternative
    (``firstAvailable``). A request without a memory amount asks for the whole device, which
    one is not known before allocation: it counts the largest device of its class the driver
    publishes (``sizes``), and its own size once allocated (:func:`claim_usage`); with no size
    known it counts 0 and ``sizeless`` names it. Without cores a request asks for the class's
    default per device (:data:`WHOLE_CORES`). ``unbounded`` names a request the spec does not
    bound (``allocationMode: All``)."""

    memory_mib: int
    cores: int
    unbounded: str | None = None
    sizeless: str | None = None


#: this driver's DeviceClasses -> the cores a device of the class counts when a request names none:
#: a share takes the slice's default (``defaultCores``, 0 unless a node configures more; the same
#: 0 a pod asking for ``gpumem`` without ``gpucores`` counts), a whole GPU all of it, a MIG
#: instance's are known once allocated
WHOLE_CORES = {SHARE_CLASS: 0, WHOLE_CLASS: 100, MIG_CLASS: 0}


def claim_ask(
    claim: Mapping[str, Any], classes: Mapping[str, int] = WHOLE_CORES, sizes: Mapping[str, int] | None = None
) -> ClaimAsk | None:
    """What ``claim`` asks of ``classes`` (this driver's DeviceClasses, each with the cores a
    device counts when a request names none); None when it asks nothing of them. Requests with
    ``adminAccess`` ask nothing (they consume nothing: :func:`claim_usage`). ``sizes``: class ->
    the MiB a device of it counts when a request names no memory (:func:`class_sizes`). Raises
    :class:`ClaimError` naming the field for an amount that is not a quantity."""
    ours = classes
    requests = _object(_object(claim.get("spec")).get("devices")).get("requests")
    mem = cores = 0
    unbounded = sizeless = None
    asked = False
    for i, request in enumerate(requests if isinstance(requests, list) else ()):
        request = _object(request)
        name = _text(request.get("name")) or str(i)
        exactly = request.get("exactly")
        subs = [("exactly", _object(exactly))] if exactly is not None else []
        first = request.get("firstAvailable")
        subs += [(f"firstAvailable[{j}]", _object(s)) for j, s in enumerate(first if isinstance(first, list) else ())]
        best: tuple[int, int] | None = None
        for where, sub in subs:
            if _text(sub.get("deviceClassName")) not in ours or sub.get("adminAccess") is True:
                continue
            at = f"spec.devices.requests[{name}].{where}"
            asked = True
            if (sub.get("allocationMode") or "ExactCount") == "All":
                unbounded = unbounded or f"{at}.allocationMode=All"
                continue
            count = _amount(sub.get("count", 1), f"{at}.count") or 0
            capacity = _object(_object(sub.get("capacity")).get("requests"))
            memory = _amount(capacity.get(MEMORY), f"{at}.capacity.requests.memory")
            core = _cores(capacity.get(CORES), f"{at}.capacity.requests.cores")[0]  # a thousandth counts 0
            cls = _text(sub.get("deviceClassName"))
            if memory is None:
                whole = (sizes or {}).get(cls)
                if whole is None:
                    sizeless = sizeless or at
                each = (whole or 0, ours[cls] if core is None else core)
            else:
                each = (-(-memory // MIB), ours[cls] if core is None else core)
            take = (each[0] * count, each[1] * count)
            best = take if best is None else (max(best[0], take[0]), max(best[1], take[1]))
        if best is not None:
            mem += best[0]
            cores += best[1]
    return ClaimAsk(mem, cores, unbounded, sizeless) if asked else None


def class_sizes(devices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Class -> the memory (MiB, rounded up) of the largest device of it among ``devices``
    (:func:`slice_devices` values): what a request without a memory amount counts against a
    quota before it is allocated. A share and a whole GPU count the largest GPU, a MIG instance
    the largest instance; a class none of ``devices`` can serve is absent."""
    gpu = mig = None
    for d in devices:
        size = -(-int(_object(d.get("total")).get(MEMORY) or 0) // MIB)
        if d.get("parent"):
            mig = size if mig is None else max(mig, size)
        else:
            gpu = size if gpu is None else max(gpu, size)
    out = {}
    if gpu is not None:
        out[SHARE_CLASS] = out[WHOLE_CLASS] = gpu
    if mig is not None:
        out[MIG_CLASS] = mig
    return out
