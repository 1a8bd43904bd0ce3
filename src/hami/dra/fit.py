"""Whether a claim fits the GPUs of the DRA path, and where (pure; used by ``hami dra --explain``,
``hami explain`` on DRA pods and ``hami simulate --front-end dra``).

The objects read are the ones kube-scheduler reads: the driver's ResourceSlices (each device's
capacities and their request policies) and the ResourceClaims (their requests, and for allocated
ones what each result consumes). What one request consumes on a device follows the capacity's
request policy (KEP-5075): a capacity the request does not name takes the policy's ``default``; a
named amount below ``validRange.min`` is raised to it and rounded up to the next ``step``; above
``validRange.max`` (or above every ``validValues``) the device cannot serve the request.

:func:`allocate_claims` restates the search of kube-scheduler's structured allocator
(``k8s.io/dynamic-resource-allocation``) on one node, as far as this driver's devices need: all
of a pod's unallocated claims in one depth-first search, claims in the pod's order, each claim's
requests in order, each request's devices in slice order; the devices of one request are
distinct (the next is looked for after the last one taken), and a claim, request or device that
cannot be placed sends the search back to the choice before it. The first complete placement
wins: kube-scheduler has no scoring between devices. :func:`why_not` and :func:`why_not_claims`
say why a search found nothing, naming the claim. A request's devices must satisfy its DeviceClass's
CEL selectors and its own (:mod:`hami.dra.cel`), evaluated when the search reaches a device, as
the allocator does; a selector that fails on a device ends the search with an error
(:attr:`Search.error`). A ``firstAvailable`` request is a choice point of the same search: its
subrequests are tried in order, each with everything after it, before the search goes back past
it. A request with ``adminAccess: true`` is placed by the same search (its capacity request
must fit what is left, as the allocator checks it for every request on a device that allows
multiple allocations) but, once allocated, consumes nothing: kube-scheduler does not count an
admin-access result as allocated (``foreachAllocatedDevice`` in its DynamicResources plugin), so
:func:`commit` leaves it out, and :func:`hami.dra.claims.claim_usage` does not count it.
This module does not choose the node (:mod:`hami.sim.dra` does) and changes no device's use
unless told to (:func:`commit`, :func:`release`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence, Union

from hami.core.quantity import QuantityError, parse_int_quantity, parse_quantity
from hami.core.shape import META, QTY, ListOf, MapOf

from .cel import CelCompileError, CelRuntimeError, DeviceCel, Selector, compile_selector
from .claims import CAPACITIES, ClaimError as AllocationError, ClaimUsage, claim_usage
from .model import CORES, DRIVER, MEMORY, MIB, MIG_CLASS, SHARE_CLASS, SHARES, WHOLE_CLASS, device_classes

SEARCH_STEPS = 100_000  # placements tried per pod and node before giving up
MAX_RESULTS = 32  # resource.k8s.io's AllocationResultsMaxSize: devices in one claim's allocation
MAX_SUBREQUESTS = 8  # resource.k8s.io's FirstAvailableDeviceRequestMaxSize
#: the DeviceClasses the simulation knows (their selectors: :data:`CLASS_SELECTORS`)
CLASSES = frozenset({SHARE_CLASS, WHOLE_CLASS, MIG_CLASS})
TOO_BIG = "asks for more than the whole GPU"


# Shapes (hami.core.shape schemas) of the resource.k8s.io/v1 fields read here, for input from files.
CLAIM_SPEC = {
    "devices": {
        "requests": ListOf(
            {
                "name": str,
                "firstAvailable": ListOf(
                    {
                        "name": str,
                        "deviceClassName": str,
                        "selectors": ListOf({"cel": {"expression": str}}),
                        "allocationMode": str,
                        "count": int,
                        "capacity": {"requests": MapOf(QTY)},
                        "tolerations": ListOf(
                            {"key": str, "operator": str, "value": str, "effect": str, "tolerationSeconds": int}
                        ),
                    }
                ),
                "exactly": {
                    "deviceClassName": str,
                    "selectors": ListOf({"cel": {"expression": str}}),
                    "allocationMode": str,
                    "count": int,
                    "adminAccess": bool,
                    "capacity": {"requests": MapOf(QTY)},
                    "tolerations": ListOf(
                        {"key": str, "operator": str, "value": str, "effect": str, "tolerationSeconds": int}
                    ),
                },
            }
        ),
        "constraints": ListOf({"requests": ListOf(str), "distinctAttribute": str, "matchAttribute": str}),
    }
}
RESULT = {
    "request": str,
    "driver": str,
    "pool": str,
    "device": str,
    "adminAccess": bool,
    "consumedCapacity": MapOf(QTY),
}
CLAIM = {
    "apiVersion": str,
    "kind": str,
    "metadata": META,
    "spec": CLAIM_SPEC,
    "status": {"allocation": {"devices": {"results": ListOf(RESULT)}}},
}
CLAIM_TEMPLATE = {"apiVersion": str, "kind": str, "metadata": META, "spec": {"spec": CLAIM_SPEC}}
SLICE = {
    "apiVersion": str,
    "kind": str,
    "metadata": META,
    "spec": {
        "driver": str,
        "nodeName": str,
        "pool": {"name": str},
        "sharedCounters": ListOf({"name": str, "counters": MapOf({"value": QTY})}),
        "devices": ListOf(
            {
                "name": str,
                "allowMultipleAllocations": bool,
                "consumesCounters": ListOf({"counterSet": str, "counters": MapOf({"value": QTY})}),
                "attributes": MapOf({"string": str, "int": int, "bool": bool, "version": str}),
                "taints": ListOf({"key": str, "value": str, "effect": str, "timeAdded": str}),
                "capacity": MapOf(
                    {
                        "value": QTY,
                        "requestPolicy": {
                            "default": QTY,
                            "validRange": {"min": QTY, "max": QTY, "step": QTY},
                            "validValues": ListOf(QTY),
                        },
                    }
                ),
            }
        ),
    },
}
_CLAIM_USER = {"resources": {"claims": ListOf({"name": str, "request": str})}}
POD_CLAIMS = {
    "spec": {
        "resourceClaims": ListOf({"name": str, "resourceClaimName": str, "resourceClaimTemplateName": str}),
        "containers": ListOf(_CLAIM_USER),
        "initContainers": ListOf(_CLAIM_USER),
    }
}


#: an amount of a capacity: a whole number, or an exact fraction (the ``cores`` a share that names
#: none consumes is a thousandth, :data:`hami.dra.model.IDLE_CORES`)
Amount = Union[int, Fraction]


def amount(value: Any, where: str) -> Amount:
    """The exact value of a quantity (an int when whole); 0 for what is not a quantity (the API
    server would not have stored it)."""
    if isinstance(value, str):
        return _amount_of_text(value)  # the same few strings, asked for on every device tried
    try:
        q = parse_quantity(value, where)
    except QuantityError:
        return 0
    return int(q) if q.denominator == 1 else q


@lru_cache(maxsize=4096)
def _amount_of_text(text: str) -> Amount:
    try:
        q = parse_quantity(text, "quantity")
    except QuantityError:
        return 0
    return int(q) if q.denominator == 1 else q


def show(value: Amount) -> str:
    """An amount for people: a whole number as it is, a fraction as a decimal (``0.001``)."""
    if isinstance(value, Fraction) and value.denominator != 1:
        return f"{float(value):.3f}".rstrip("0").rstrip(".") or "0"
    return str(int(value))


def whole(value: Amount) -> int:
    """The whole part of an amount: what a container is given (libvgpu's limits are whole) and
    what quotas and tables count."""
    return int(value) if isinstance(value, int) else value.numerator // value.denominator


def quantity_text(value: Amount) -> str:
    """An amount written as a quantity, as kube-scheduler writes ``consumedCapacity`` (``1m``)."""
    if isinstance(value, Fraction) and value.denominator != 1:
        for suffix, scale in (("m", 10**3), ("u", 10**6), ("n", 10**9)):
            scaled = value * scale
            if scaled.denominator == 1:
                return f"{scaled.numerator}{suffix}"
        return show(value)
    return str(int(value))


@dataclass(frozen=True)
class Policy:
    """A capacity's request policy, in the capacity's unit (bytes for memory). ``step`` None: a
    ``validRange`` without a step, which takes an amount at or above ``min`` as it is."""

    default: Amount
    min: Amount = 0
    max: Amount | None = None
    step: Amount | None = 1
    values: tuple[Amount, ...] = ()

    def consume(self, requested: Amount | None) -> Amount | None:
        """What a request consumes; None when the policy forbids the amount. The default is
        taken as it is, as the allocator takes it (``fillEmptyRequest``)."""
        if requested is None:
            return self.default
        if self.values:
            return next((v for v in self.values if v >= requested), None)
        amount = max(requested, self.min)
        if self.step:
            n = -(-(amount - self.min) // self.step)
            amount = self.min + n * self.step
            amount = int(amount) if isinstance(amount, Fraction) and amount.denominator == 1 else amount
        if self.max is not None and amount > self.max:
            return None
        return amount


@dataclass
class Counters:
    """A pool's shared counters (KEP-4815): ``"<counter set>/<counter>"`` -> total and used. The
    devices of a pool that consume counters hold the same object, so an allocation on one device
    counts against all of them."""

    total: dict[str, int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)

    def left(self, key: str) -> int:
        return self.total.get(key, 0) - self.used.get(key, 0)

    def fit(self, need: Mapping[str, int], extra: Mapping[str, int] | None = None) -> bool:
        """Whether ``need`` is left (``extra``: what the search holds besides); a counter the pool
        does not define is never left, as in the allocator."""
        extra = extra or {}
        return all(k in self.total and n <= self.left(k) - extra.get(k, 0) for k, n in need.items())

    def add(self, need: Mapping[str, int], sign: int = 1) -> None:
        for k, n in need.items():
            self.used[k] = self.used.get(k, 0) + sign * n


@dataclass
class DeviceUse:
    pool: str
    device: str
    uuid: str
    total: dict[str, Amount]
    default: dict[str, Amount]
    used: dict[str, Amount] = field(default_factory=lambda: dict.fromkeys(CAPACITIES, 0))
    claims: list[str] = field(default_factory=list)
    policies: dict[str, Policy] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)  # "gpu.hami.io/uuid" -> value
    doc: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)  # the slice device
    _cel: DeviceCel | None = field(default=None, repr=False, compare=False)
    #: False: allocated whole, to one claim at a time (no ``allowMultipleAllocations``); its
    #: ``shares`` total is then 1 and every capacity is consumed whole
    multi: bool = True
    consumes: dict[str, int] = field(default_factory=dict)  # "<set>/<counter>" -> amount (KEP-4815)
    counters: Counters | None = field(default=None, repr=False, compare=False)  # its pool's

    def counters_fit(self, extra: Mapping[str, int] | None = None) -> bool:
        """Whether the shared counters it consumes are left (always, for a device consuming none)."""
        if not self.consumes:
            return True
        return self.counters is not None and self.counters.fit(self.consumes, extra)

    def take(self, sign: int = 1) -> None:
        """Count (or, with -1, uncount) its counters as consumed."""
        if self.consumes and self.counters is not None:
            self.counters.add(self.consumes, sign)

    @property
    def key(self) -> tuple[str, str]:
        return self.pool, self.device

    def left(self, name: str) -> Amount:
        return self.total.get(name, 0) - self.used.get(name, 0)

    @property
    def cel(self) -> DeviceCel:
        """The device as CEL selectors read it (from its slice document, or from what is known)."""
        if self._cel is None:
            doc = self.doc
            if doc is None:  # made by hand: its attributes and capacities are all there is
                kinds = {bool: "bool", int: "int", str: "string"}
                doc = {
                    "attributes": {k: {kinds[type(v)]: v} for k, v in self.attributes.items() if type(v) in kinds},
                    "capacity": {k: {"value": str(v)} for k, v in self.total.items()},
                    "allowMultipleAllocations": True,
                }
            self._cel = DeviceCel(DRIVER, doc)
        return self._cel

    def policy(self, name: str) -> Policy:
        return self.policies.get(name) or Policy(
            self.default.get(name, self.total.get(name, 0)), step=MIB if name == MEMORY else 1
        )


def _int(value: Any, where: str) -> int:
    try:
        return parse_int_quantity(value, where)
    except QuantityError:
        return 0


def _policy(cap: Mapping[str, Any], total: Amount, name: str) -> Policy:
    pol = cap.get("requestPolicy") or {}
    default = amount(pol.get("default", total), name) if pol else total
    rng = pol.get("validRange") or {}
    values = tuple(sorted(amount(v, name) for v in pol.get("validValues") or ()))
    step = amount(rng.get("step"), name) if rng.get("step") is not None else None
    return Policy(
        default,
        min=amount(rng.get("min"), name) if rng.get("min") is not None else 0,
        max=amount(rng["max"], name) if rng.get("max") is not None else None,
        step=step or None,
        values=values,
    )


def _attr_value(attr: Any) -> Any:
    if isinstance(attr, Mapping):
        for kind in ("string", "int", "bool", "version"):
            if kind in attr:
                return attr[kind]
    return None


def pool_counters(slices: Sequence[Mapping[str, Any]]) -> dict[str, Counters]:
    """Each pool's shared counters, from the slices of the driver that define them."""
    out: dict[str, Counters] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = (spec.get("pool") or {}).get("name") or ""
        for cs in spec.get("sharedCounters") or ():
            if not isinstance(cs, Mapping):
                continue
            book = out.setdefault(pool, Counters())
            for name, c in (cs.get("counters") or {}).items():
                book.total[f"{cs.get('name')}/{name}"] = _int((c or {}).get("value"), name)
    return out


def _consumes(d: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in d.get("consumesCounters") or ():
        if not isinstance(c, Mapping):
            continue
        for name, v in (c.get("counters") or {}).items():
            key = f"{c.get('counterSet')}/{name}"
            out[key] = out.get(key, 0) + _int((v or {}).get("value"), name)
    return out


def devices_of(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], DeviceUse]:
    """Every device of the driver in slice order, nothing used yet. A device without
    ``allowMultipleAllocations`` (a MIG device) is exclusive: one allocation takes all of it.
    A device that consumes counters shares its pool's :class:`Counters` with the others."""
    slices = list(slices)
    books = pool_counters(slices)
    out: dict[tuple[str, str], DeviceUse] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = (spec.get("pool") or {}).get("name") or ""
        for d in spec.get("devices") or ():
            caps = d.get("capacity") or {}
            multi = d.get("allowMultipleAllocations") is True
            total = {k: amount((caps.get(k) or {}).get("value"), k) for k in CAPACITIES}
            policies = {k: _policy(caps.get(k) or {}, total[k], k) for k in CAPACITIES}
            if not multi:  # whole or nothing: asked at most its capacity, consumes all of it
                total[SHARES] = 1
                policies = {k: Policy(total[k], values=(total[k],)) for k in CAPACITIES}
            # a qualified name keeps its domain (resource.kubernetes.io/numaNode); a plain one is ours
            attrs = {k if "/" in k else f"{DRIVER}/{k}": _attr_value(v) for k, v in (d.get("attributes") or {}).items()}
            uuid = attrs.get(f"{DRIVER}/uuid") or attrs.get(f"{DRIVER}/parentUUID") or ""
            consumes = _consumes(d)
            out[(pool, d.get("name", ""))] = DeviceUse(
                pool,
                d.get("name", ""),
                uuid,
                total,
                {k: p.default for k, p in policies.items()},
                policies=policies,
                attributes=attrs,
                doc=d,
                multi=multi,
                consumes=consumes,
                counters=books.setdefault(pool, Counters()) if consumes else None,
            )
    return out


def allocation_results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``status.allocation.devices.results`` of a claim that are this driver's ([] if none)."""
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")) or ()
    return [r for r in results if isinstance(r, Mapping) and r.get("driver") == DRIVER]


def add_claims(
    devices: dict[tuple[str, str], DeviceUse], claims: Iterable[ClaimUsage], exact: bool = False
) -> dict[tuple[str, str], DeviceUse]:
    """Add what ``claims`` consume to ``devices`` (a capacity a result does not record takes all
    of it: an exclusive allocation; a result on a device not listed is left out). Whole amounts
    (what tables show), or with ``exact`` the cores as kube-scheduler adds them up (a thousandth
    of a core too: the simulation and the explanation)."""
    for u in claims:
        for r in u.results:
            dev = devices.get((r.pool, r.device))
            if dev is None:
                continue
            for k, v in (r.consumed(dev.total) if exact else r.resolved(dev.total)).items():
                dev.used[k] += v
            dev.take()
            dev.claims.append(u.key)
    return devices


def add_claim(devices: dict[tuple[str, str], DeviceUse], claim: Mapping[str, Any]) -> None:
    """Count an allocated claim's consumed capacity on its devices (read by
    :func:`hami.dra.claims.claim_usage`, the one parser of allocations)."""
    try:
        used = claim_usage(claim)
    except AllocationError:
        return  # an allocation the API server could not have stored: counted as nothing
    if used is not None:
        add_claims(devices, [used], exact=True)


def usage(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], DeviceUse]:
    """Every device of the driver, with what the allocated claims consume on it."""
    out = devices_of(slices)
    for c in claims:
        add_claim(out, c)
    return out


def wanted(dev: DeviceUse, requests: Mapping[str, Any]) -> dict[str, Amount] | None:
    """What a request with these capacity requests would consume on ``dev`` (the request policy
    applied); None when a requested amount is beyond what the policy allows."""
    out = {}
    for k in CAPACITIES:
        got = dev.policy(k).consume(amount(requests[k], k) if k in requests else None)
        if got is None:
            return None
        out[k] = got
    return out


def shortfall(dev: DeviceUse, requests: Mapping[str, Any]) -> str:
    """'' when the request fits ``dev`` now, else what is short (e.g. ``memory 1200 MiB short``)."""
    need = wanted(dev, requests)
    if need is None or any(need[k] > dev.total[k] for k in CAPACITIES):
        return TOO_BIG
    if not dev.multi and dev.used[SHARES]:
        return "allocated to another claim (a MIG device is allocated whole)"
    if not dev.counters_fit():
        return "a MIG device overlapping its placement is allocated (shared counters used up)"
    short = []
    for k in CAPACITIES:
        gap = need[k] - dev.left(k)
        if gap > 0 and k == CORES and 0 < need[k] < 1:  # a share asking for none: HAMi's exhausted GPU
            short.append("no cores left (a share that asks for none needs a GPU with some cores left)")
        elif gap > 0:
            short.append(f"memory {-(-gap // MIB)} MiB short" if k == MEMORY else f"{k} {show(gap)} short")
    return ", ".join(short)


# ------------------------------------------------------------------ one claim on one node


@dataclass(frozen=True)
class Request:
    """One request of a claim, as the allocator sees it: ``exactly`` one, or a ``firstAvailable``
    list of subrequests (``alternatives``, each named ``<request>/<subrequest>`` as its allocation
    results are, tried in order)."""

    name: str
    device_class: str
    count: int  # -1: allocationMode All; 0: firstAvailable (see alternatives)
    capacity: dict[str, Any]
    selectors: tuple[Selector, ...] = ()  # exactly.selectors, compiled
    alternatives: tuple[Request, ...] = ()
    admin: bool = False  # exactly.adminAccess: sees the devices, consumes nothing once allocated
    tolerations: tuple[Mapping[str, Any], ...] = ()  # of device taints (KEP-5055)

    @property
    def most(self) -> int:
        """The most devices it can take by count (All counts none here)."""
        return max((a.most for a in self.alternatives), default=0) if self.alternatives else max(self.count, 0)


#: each DeviceClass's selectors, as the model publishes the classes
CLASS_SELECTORS: dict[str, tuple[Selector, ...]] = {
    c["metadata"]["name"]: tuple(compile_selector(s["cel"]["expression"]) for s in c["spec"].get("selectors") or ())
    for c in device_classes()
}


class SelectorError(Exception):
    """A selector failed on a device: kube-scheduler's allocator returns an error, which aborts
    the pod's scheduling attempt (not only this node). The message names the selector."""


def refused_by(dev: DeviceUse, r: Request) -> str:
    """'' when ``dev`` satisfies the selectors of ``r``'s class and of ``r`` (in that order, as
    the allocator checks them), else which selector is false. Raises :class:`SelectorError`."""
    for owner, selectors in ((f"class {r.device_class} ", CLASS_SELECTORS.get(r.device_class, ())), ("", r.selectors)):
        for i, sel in enumerate(selectors):
            try:
                if dev.cel.matches(sel):
                    continue
            except CelRuntimeError as exc:
                raise SelectorError(
                    f"{owner}selector #{i} ({sel.expression}): CEL runtime error on {dev.device}: {exc}"
                ) from None
            return f"{owner}selector #{i} ({sel.expression}) is false"
    return ""


def _selected(dev: DeviceUse, r: Request) -> bool:
    return not refused_by(dev, r)


def _selectors(ex: Mapping[str, Any], at: str, name: str) -> tuple[Selector, ...]:
    raw = ex.get("selectors") or []
    if not isinstance(raw, (list, tuple)):
        raise ClaimError(f"{at}.selectors: must be a list")
    out = []
    for j, s in enumerate(raw):
        cel = s.get("cel") if isinstance(s, Mapping) else None
        expr = cel.get("expression") if isinstance(cel, Mapping) else None
        where = f"{at}.selectors[{j}].cel.expression (request {name})"
        if not isinstance(expr, str):
            raise ClaimError(f"{where}: must be a string (only CEL selectors exist)")
        try:
            out.append(compile_selector(expr))
        except CelCompileError as exc:
            raise ClaimError(f"{where}: CEL compile error in {expr!r}: {exc}") from None
    return tuple(out)


class ClaimError(ValueError):
    """A claim spec the simulation cannot read; the message names the field."""


def _exact(ex: Mapping[str, Any], at: str, name: str, sub: bool = False) -> Request:
    """An ``exactly`` request or a ``firstAvailable`` subrequest (``sub``: the same fields, less
    ``adminAccess``, which only an ``exactly`` request has)."""
    admin = ex.get("adminAccess")
    if admin is not None and (sub or not isinstance(admin, bool)):
        raise ClaimError(
            f"{at}.adminAccess: a subrequest has no such field"
            if sub
            else f"{at}.adminAccess: must be true or false, got {admin!r}"
        )
    mode = ex.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ClaimError(f"{at}.allocationMode: {mode!r} is not ExactCount or All")
    count = ex.get("count", 1)
    if mode == "ExactCount" and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ClaimError(f"{at}.count: must be an integer >= 1, got {count!r}")
    caps = ((ex.get("capacity") or {}).get("requests")) or {}
    if not isinstance(caps, Mapping):
        raise ClaimError(f"{at}.capacity.requests: must be an object")
    for k, v in caps.items():  # any quantity (a thousandth of a core too), as the API server takes it
        try:
            parse_quantity(v, f"{at}.capacity.requests.{k}")
        except QuantityError as exc:
            raise ClaimError(str(exc)) from None
    tolerations = ex.get("tolerations") or []
    if not isinstance(tolerations, list) or not all(isinstance(t, Mapping) for t in tolerations):
        raise ClaimError(f"{at}.tolerations: must be a list of objects")
    for j, t in enumerate(tolerations):
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise ClaimError(f"{at}.tolerations[{j}].operator: {op!r} is not Equal or Exists")
    return Request(
        name,
        str(ex.get("deviceClassName") or ""),
        -1 if mode == "All" else count,
        dict(caps),
        _selectors(ex, at, name),
        admin=bool(admin),
        tolerations=tuple(dict(t) for t in tolerations),
    )


#: the taint effects that keep the allocator off a device (others, "None" among them, do not)
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def _tolerates(t: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule (``resourceclaim.ToleratesTaint``): the effect matches (or is empty), and
    ``Exists`` with the key (an empty key: every key), or ``Equal`` with key and value."""
    if t.get("effect") and t.get("effect") != taint.get("effect"):
        return False
    if (t.get("operator") or "Equal") == "Exists":
        return not t.get("key") or t.get("key") == taint.get("key")
    return t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or "")


def taint_refuses(dev: DeviceUse, r: Request) -> str:
    """'' when no taint of ``dev`` keeps ``r`` off it, else the taint (``key=value:effect``)."""
    for taint in (dev.doc or {}).get("taints") or ():
        if not isinstance(taint, Mapping) or taint.get("effect") not in BLOCKING_EFFECTS:
            continue
        if not any(_tolerates(t, taint) for t in r.tolerations):
            return f"taint {taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')} not tolerated"
    return ""


def claim_spec_requests(spec: Mapping[str, Any], where: str) -> tuple[list[Request], list[dict[str, Any]]]:
    """The requests and constraints of a ResourceClaimSpec. Raises ClaimError naming the field."""
    devices = (spec or {}).get("devices") or {}
    if not isinstance(devices, Mapping):
        raise ClaimError(f"{where}.devices: must be an object")
    out = []
    for i, r in enumerate(devices.get("requests") or ()):
        at = f"{where}.devices.requests[{i}]"
        if not isinstance(r, Mapping) or not r.get("name"):
            raise ClaimError(f"{at}: must be an object with a name")
        ex, alts = r.get("exactly"), r.get("firstAvailable")
        if isinstance(ex, Mapping) == bool(alts):
            raise ClaimError(f"{at} ({r['name']}): needs exactly one of 'exactly' and 'firstAvailable'")
        if isinstance(ex, Mapping):
            out.append(_exact(ex, f"{at}.exactly", str(r["name"])))
            continue
        if not isinstance(alts, list) or len(alts) > MAX_SUBREQUESTS:
            raise ClaimError(f"{at}.firstAvailable: must be a list of 1 to {MAX_SUBREQUESTS} subrequests")
        subs = []
        for j, sub in enumerate(alts):
            if not isinstance(sub, Mapping) or not sub.get("name"):
                raise ClaimError(f"{at}.firstAvailable[{j}]: must be an object with a name")
            subs.append(_exact(sub, f"{at}.firstAvailable[{j}]", f"{r['name']}/{sub['name']}", sub=True))
        if len({a.name for a in subs}) < len(subs):
            raise ClaimError(f"{at}.firstAvailable: subrequest names must be unique")
        out.append(Request(str(r["name"]), "", 0, {}, alternatives=tuple(subs)))
    if not out:
        raise ClaimError(f"{where}.devices.requests: no request")
    if sum(r.most for r in out) > MAX_RESULTS:
        raise ClaimError(
            f"{where}.devices.requests: {sum(r.most for r in out)} devices asked, a claim holds at most {MAX_RESULTS}"
        )
    constraints = [dict(c) for c in devices.get("constraints") or () if isinstance(c, Mapping)]
    return out, constraints


@dataclass(frozen=True)
class Pick:
    request: str
    device: DeviceUse
    consumed: dict[str, Amount]  # what it takes during the search (and, unless admin, once allocated)
    admin: bool = False  # an admin-access result: not counted once allocated

    def result(self) -> dict[str, Any]:
        """The allocation result kube-scheduler writes for this pick."""
        consumed = {
            k: (f"{v // MIB}Mi" if k == MEMORY and v % MIB == 0 else quantity_text(v)) for k, v in self.consumed.items()
        }
        out: dict[str, Any] = {
            "request": self.request,
            "driver": DRIVER,
            "pool": self.device.pool,
            "device": self.device.device,
        }
        if self.admin:
            out["adminAccess"] = True
        if self.device.multi:  # kube-scheduler records consumed capacity only for shared devices
            out["consumedCapacity"] = consumed
        return out


def _constraint_ok(constraints: Sequence[Mapping[str, Any]], picks: Sequence[Pick], new: Pick) -> bool:
    for c in constraints:
        applies = c.get("requests") or None
        if applies is not None and not _named(new.request, applies):
            continue
        peers = [p for p in picks if applies is None or _named(p.request, applies)]
        if c.get("distinctAttribute"):
            a = c["distinctAttribute"]
            if new.device.attributes.get(a) is None or any(
                p.device.attributes.get(a) == new.device.attributes.get(a) for p in peers
            ):
                return False
        if c.get("matchAttribute"):
            a = c["matchAttribute"]
            if new.device.attributes.get(a) is None or any(
                p.device.attributes.get(a) != new.device.attributes.get(a) for p in peers
            ):
                return False
    return True


def _named(request: str, names: Sequence[str]) -> bool:
    """Whether a constraint's ``requests`` take in ``request`` (a subrequest's parent counts)."""
    return request in names or request.partition("/")[0] in names


def _fits(dev: DeviceUse, extra: Mapping[str, Amount], need: Mapping[str, Amount]) -> bool:
    return all(need[k] <= dev.left(k) - extra.get(k, 0) for k in CAPACITIES)


def _has_room(dev: DeviceUse, r: Request) -> bool:
    """Whether ``r`` fits ``dev`` with what is allocated now (nothing of the search counted) and
    the device satisfies its selectors (a selector that fails counts as not satisfied)."""
    need = wanted(dev, r.capacity)
    if need is None or not _fits(dev, {}, need) or not dev.counters_fit() or taint_refuses(dev, r):
        return False
    try:
        return _selected(dev, r)
    except SelectorError:
        return False


def _room(devices: Sequence[DeviceUse], r: Request) -> int:
    """How many distinct devices could take one device of ``r`` each, with what is allocated now."""
    return sum(1 for dev in devices if _has_room(dev, r))


@dataclass(frozen=True)
class ClaimAsk:
    """One unallocated claim of a pod, as the search takes it."""

    name: str
    requests: Sequence[Request]
    constraints: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class _Slot:
    """One device to find: for claim ``claim``, a device of ``request``; ``needs`` is what it
    would consume on each device (by position; None: the policy refuses it there)."""

    claim: int
    request: Request
    needs: tuple[dict[str, Amount] | None, ...]
    fixed: int | None = None  # allocationMode All: the device's position, known in advance
    req: int = 0  # the request's position in its claim
    first: bool = False  # the first device of its request


@dataclass
class Search:
    """What :func:`allocate_claims` found: the picks per claim (in the order given), or which
    claim it could not get past (``stuck``) and the picks of each claim before it the first time
    it got there (``prefix``); ``gave_up`` when the step bound ended the search, ``short`` when
    the claims together ask more of a capacity than the node's GPUs have left."""

    picks: list[list[Pick]] | None
    stuck: int = -1
    prefix: list[list[Pick]] = field(default_factory=list)
    gave_up: bool = False
    short: str = ""
    broken: str = ""  # an allocationMode All device a constraint refuses: the allocator stops there
    error: str = ""  # a selector failed on a device: the allocator returns an error (the pod is not scheduled)


class _Failed(Exception):
    """A selector failed while the search was set up: (claim position, message)."""

    def __init__(self, claim: int, message: str) -> None:
        super().__init__(message)
        self.claim, self.message = claim, message


def all_members(
    devices: Sequence[DeviceUse], r: Request, needs: Sequence[dict[str, Amount] | None] | None = None
) -> list[int]:
    """The positions of the devices an ``allocationMode: All`` request takes: those its selectors
    pick whose capacity, empty, could hold the request (the request policy allows the amounts and
    each is within the device's total). The allocator settles this list before its search, with
    consumable capacity on (``dynamic-resource-allocation`` v0.37.2 compares the request with an
    unused device): a selected GPU too small for the request is left out, not a failure; what
    other claims use is checked in the search. Raises :class:`SelectorError`."""
    if needs is None:
        needs = [wanted(d, r.capacity) for d in devices]
    out = []
    for i, dev in enumerate(devices):
        if not _selected(dev, r):
            continue
        need = needs[i]
        if need is not None and all(need[k] <= dev.total.get(k, 0) for k in CAPACITIES):
            out.append(i)
    return out


def _request_slots(devices: Sequence[DeviceUse], ci: int, ri: int, r: Request) -> list[_Slot] | None:
    """The slots of one ``exactly`` request (or subrequest); None when it cannot be had here."""
    if r.device_class not in CLASSES:
        return None
    needs = tuple(wanted(d, r.capacity) for d in devices)
    room = [
        i
        for i, (d, need) in enumerate(zip(devices, needs))
        if need is not None and _fits(d, {}, need) and d.counters_fit()
    ]
    if r.count < 0:
        # All: the devices of :func:`all_members`, fixed before the search starts; one without
        # room for the request now (what others use) fails the request in the search, as in the
        # allocator (kube-scheduler v1.37.2 leaves such a pod pending)
        try:
            every = all_members(devices, r, needs)
        except SelectorError as exc:
            raise _Failed(ci, f"request {r.name}: {exc}") from None
        return [_Slot(ci, r, needs, i, ri, n == 0) for n, i in enumerate(every)] or None
    room = [i for i in room if not taint_refuses(devices[i], r)]  # a taint is static: never a place
    if len(room) < r.count:  # the devices of one request are distinct
        return None
    return [_Slot(ci, r, needs, None, ri, n == 0) for n in range(r.count)]


def _slots(
    devices: Sequence[DeviceUse],
    claims: Sequence[ClaimAsk],
    choices: dict[tuple[int, int], int] | None = None,
    start: tuple[int, int] = (0, 0),
) -> list[_Slot] | None:
    """The devices to find, in the allocator's order, from request ``start`` (claim, request) on;
    None when a claim cannot be had on these devices whatever the others do (see :func:`why_not`).
    A ``firstAvailable`` request takes the first of its subrequests, from the one in ``choices``
    on, that can be had (recorded there); the requests after ``start`` begin at their first. The
    room of an ``exactly`` request is counted by capacity alone: its selectors run when the search
    reaches a device, as in the allocator (whose error on a failing selector must not come from a
    device it never reaches). Raises :class:`_Failed` when a selector of an ``allocationMode:
    All`` request fails."""
    choices = {} if choices is None else choices
    slots: list[_Slot] = []
    for ci in range(start[0], len(claims)):
        mine = 0
        for ri, r in enumerate(claims[ci].requests):
            if (ci, ri) < start:
                continue
            got = None
            if r.alternatives:
                at = choices.get((ci, ri), 0) if (ci, ri) == start else 0
                while got is None and at < len(r.alternatives):
                    got = _request_slots(devices, ci, ri, r.alternatives[at])
                    choices[(ci, ri)] = at
                    at += 1
            else:
                got = _request_slots(devices, ci, ri, r)
            if got is None:
                return None
            slots += got
            mine += len(got)
        if mine > MAX_RESULTS:
            return None
    return slots


def _too_much(
    devices: Sequence[DeviceUse], claims: Sequence[ClaimAsk], slots: Sequence[_Slot]
) -> tuple[int, str] | None:
    """A bound that ends hopeless searches at once: each device of a claim consumes at least its
    request's least amount over the devices, and all of them together cannot pass what the GPUs
    have left. The first claim where they would, and what is asked; None when within."""
    for k in CAPACITIES:
        left = sum(max(d.left(k), 0) for d in devices)
        asked: Amount = 0
        for slot in slots:
            where = slot.needs if slot.fixed is None else slot.needs[slot.fixed : slot.fixed + 1]
            asked += min((n[k] for n in where if n is not None), default=0)
            if asked > left:
                what = (
                    (f"memory {-(-asked // MIB)} MiB" if k == MEMORY else f"{k} {show(asked)}")
                    + ", the GPUs have "
                    + (f"{left // MIB} MiB" if k == MEMORY else show(left))
                    + " left"
                )
                return slot.claim, what
    return None


def allocate_claims(devices: Sequence[DeviceUse], claims: Sequence[ClaimAsk], steps: int = SEARCH_STEPS) -> Search:
    """All of a pod's unallocated claims on one node's devices in one search, as kube-scheduler's
    structured allocator does it: depth first over the claims in the pod's order, each claim's
    requests in order, each request's devices in slice order. The devices of one request are
    distinct and taken in slice order (the next one is looked for after the last one taken), so
    a request is given a set of devices, never one device twice; another request, of the same
    claim or of another, may take a device again while its capacity lasts. When a device cannot
    be found the search goes back to the previous choice (of this request, an earlier request or
    an earlier claim) and takes the next device there. The first complete placement wins; there
    is no scoring. At most ``steps`` placements are tried. Nothing is changed: commit the picks
    with :func:`commit`."""
    try:
        slots = _slots(devices, claims)
        if slots is None:
            return Search(None, stuck=next((i for i, c in enumerate(claims) if _slots(devices, [c]) is None), 0))
        alternatives = any(r.alternatives for c in claims for r in c.requests)
        over = None if alternatives else _too_much(devices, claims, slots)  # a bound for fixed slots only
        if over is not None:
            return Search(None, stuck=over[0], short=over[1])
        return _walk(devices, claims, slots, steps)
    except _Failed as exc:  # a selector failed: the allocator returns an error
        return Search(None, stuck=exc.claim, error=f"claim {claims[exc.claim].name} {exc.message}")


def _accepts(dev: DeviceUse, slot: _Slot) -> bool:
    """Whether ``dev`` satisfies the selectors of ``slot``'s request; raises :class:`_Failed`."""
    try:
        return _selected(dev, slot.request)
    except SelectorError as exc:
        raise _Failed(slot.claim, f"request {slot.request.name}: {exc}") from None


def _walk(devices: Sequence[DeviceUse], claims: Sequence[ClaimAsk], slots: list[_Slot], steps: int) -> Search:
    """The depth-first search of :func:`allocate_claims` over ``slots``. A ``firstAvailable``
    request is a choice point: when its first device cannot be found the search takes its next
    subrequest there (the slots from it on made again) before going back, and a search that comes
    to it afresh starts again at its first subrequest, as the allocator's recursion does."""
    choices: dict[tuple[int, int], int] = {}
    _slots(devices, claims, choices)  # the subrequests the slots were made with
    initial = dict(choices)  # where a search that comes to a firstAvailable request begins
    extra: list[dict[str, Amount]] = [dict.fromkeys(CAPACITIES, 0) for _ in devices]
    held: dict[str, int] = {}  # the shared counters the search's picks consume (KEP-4815)
    picks: list[tuple[int, Pick]] = []  # (device position, pick) per slot placed
    mine: list[list[Pick]] = [[] for _ in claims]  # the picks of each claim, for its constraints
    cursor = [0] * len(slots)  # per slot: the position where its next candidate is looked for
    found = Search(None)
    level, budget = 0, steps
    while level < len(slots):
        slot = slots[level]
        if slot.claim > found.stuck:
            found.stuck, found.prefix = slot.claim, [list(m) for m in mine[: slot.claim]]
        constraints = claims[slot.claim].constraints
        pick = None
        at = cursor[level]
        end = len(devices) if slot.fixed is None else slot.fixed + 1
        while pick is None and at < end:
            i = at if slot.fixed is None else slot.fixed
            at = i + 1
            # the selectors first (All: checked when the slots were made), then capacity and constraints
            if slot.fixed is None and not _accepts(devices[i], slot):
                continue
            need = slot.needs[i]
            if need is None or taint_refuses(devices[i], slot.request):
                continue  # (All: a tainted device of the request ends the search, as in the allocator)
            p = Pick(slot.request.name, devices[i], need, slot.request.admin)
            if slot.fixed is not None and constraints and not _constraint_ok(constraints, mine[slot.claim], p):
                # All: a device the claim's constraints refuse is an error that ends the whole
                # search in the allocator, not a dead end to back out of
                found.stuck, found.broken = (
                    slot.claim,
                    f"request {slot.request.name} (allocationMode All): "
                    f"{devices[i].device} breaks a constraint of the claim, which ends kube-scheduler's search",
                )
                return found
            if not all(need[k] <= devices[i].left(k) - extra[i][k] for k in CAPACITIES):
                continue
            if not devices[i].counters_fit(held):
                continue
            if not constraints or _constraint_ok(constraints, mine[slot.claim], p):
                pick = (i, p)
        cursor[level] = at  # All: past its one device once tried
        if pick is None:
            if _switch(devices, claims, slots, cursor, level, choices, +1):
                continue  # the request's next subrequest, here
            level -= 1
            if level < 0:
                return found
            i, undo = picks.pop()
            mine[slots[level].claim].pop()
            for k in CAPACITIES:
                extra[i][k] -= undo.consumed[k]
            for c, n in devices[i].consumes.items():
                held[c] -= n
            continue
        budget -= 1
        if budget < 0:  # kube-scheduler bounds its search in time instead (DRASchedulerFilterTimeout)
            found.gave_up = True
            return found
        i, p = pick
        picks.append(pick)
        mine[slot.claim].append(p)
        for k in CAPACITIES:
            extra[i][k] += p.consumed[k]
        for c, n in devices[i].consumes.items():
            held[c] = held.get(c, 0) + n
        level += 1
        if level < len(slots):
            _switch(devices, claims, slots, cursor, level, choices, initial)
            nxt = slots[level]
            # the next device of the same request is looked for after this one; anything else from the start
            cursor[level] = i + 1 if nxt.claim == slot.claim and nxt.request is slot.request else 0
    out: list[list[Pick]] = [[] for _ in claims]
    for (_, p), s in zip(picks, slots):
        out[s.claim].append(p)
    return Search(out)


def _switch(
    devices: Sequence[DeviceUse],
    claims: Sequence[ClaimAsk],
    slots: list[_Slot],
    cursor: list[int],
    level: int,
    choices: dict[tuple[int, int], int],
    to: int | dict[tuple[int, int], int],
) -> bool:
    """At the first device of a ``firstAvailable`` request, move it to another subrequest and
    make the slots from ``level`` on again: ``to`` +1 (its next one, when the current one found
    nothing) or ``initial`` (its first one, for a search that comes to it afresh). False when
    there is nothing to change (not such a slot, no further subrequest, already the first)."""
    slot = slots[level]
    key = (slot.claim, slot.req)
    if not slot.first or not claims[slot.claim].requests[slot.req].alternatives:
        return False
    if isinstance(to, dict):
        if choices.get(key) == to.get(key):
            return False
        choices[key] = to.get(key, 0)
    else:
        choices[key] = choices.get(key, 0) + to
        if choices[key] >= len(claims[slot.claim].requests[slot.req].alternatives):
            return False
    tail = _slots(devices, claims, choices, key)
    if tail is None:
        return False
    slots[level:] = tail
    cursor[level:] = [0] * len(tail)
    return True


def allocate(
    devices: Sequence[DeviceUse], requests: Sequence[Request], constraints: Sequence[Mapping[str, Any]] = ()
) -> list[Pick] | None:
    """The first allocation of one claim's requests on one node's devices (slice order), or None.
    Nothing is changed: commit the picks with :func:`commit`."""
    found = allocate_claims(devices, [ClaimAsk("", requests, constraints)])
    return found.picks[0] if found.picks is not None else None


def commit(picks: Iterable[Pick], claim: str) -> None:
    """Count ``picks`` as allocated to ``claim`` (admin-access picks are not: module doc)."""
    for p in picks:
        if p.admin:
            continue
        for k in CAPACITIES:
            p.device.used[k] += p.consumed[k]
        p.device.take()
        if claim not in p.device.claims:
            p.device.claims.append(claim)


def release(picks: Iterable[Pick], claim: str) -> None:
    for p in picks:
        if p.admin:
            continue
        for k in CAPACITIES:
            p.device.used[k] -= p.consumed[k]
        p.device.take(-1)
        if claim in p.device.claims:
            p.device.claims.remove(claim)


def device_why(dev: DeviceUse, r: Request) -> str:
    """'' when ``dev`` could take one device of ``r`` now, else why not: the selector that is false
    or fails (checked first, as the allocator does), or what is short (:func:`shortfall`)."""
    try:
        refused = refused_by(dev, r)
    except SelectorError as exc:
        return str(exc)
    return refused or taint_refuses(dev, r) or shortfall(dev, r.capacity)


def _possible(devices: Sequence[DeviceUse], r: Request) -> bool:
    """Whether ``r`` (a subrequest) could be had on these devices alone (a failing selector: no)."""
    try:
        return _request_slots(devices, 0, 0, r) is not None
    except _Failed:
        return False


def why_not(
    devices: Sequence[DeviceUse], requests: Sequence[Request], claim: str, constraints: Sequence[Mapping[str, Any]] = ()
) -> str:
    """Why one claim cannot be allocated on these devices: per request, GPU by GPU, what is short
    (the wording of :func:`shortfall`); a request of ``count`` N needs N distinct GPUs."""
    if not devices:
        return "no gpu.hami.io GPU"
    parts = []
    asked = 0
    for r in requests:
        if r.alternatives:
            if any(_possible(devices, a) for a in r.alternatives):
                asked += min(a.most for a in r.alternatives)
                continue
            parts.append(
                f"claim {claim} request {r.name}: no subrequest can be had ("
                + "; ".join(why_not(devices, [a], claim) for a in r.alternatives)
                + ")"
            )
            continue
        if r.device_class not in CLASSES:
            parts.append(
                f"claim {claim} request {r.name}: device class {r.device_class or '(none)'!r} is not "
                f"{' or '.join(sorted(CLASSES))}"
            )
            continue
        room = _room(devices, r)
        if r.count < 0:
            # All takes every device its selectors pick that could hold it: one without room fails it;
            # none that could: each selected one says why
            try:
                picked = [devices[i] for i in all_members(devices, r)]
                selected = [d for d in devices if _selected(d, r)]
            except SelectorError:
                picked = selected = list(devices)
            asked += len(picked)
            if picked and all(_has_room(d, r) for d in picked):
                continue
            gpus = "; ".join(
                f"{d.device}: {why}" for d, why in ((d, device_why(d, r)) for d in picked or selected) if why
            )
            parts.append(
                f"claim {claim} request {r.name} (allocationMode All): " + (gpus if selected else "no GPU is selected")
            )
            continue
        asked += r.count
        need = r.count
        if room >= need:
            continue
        gpus = "; ".join(f"{d.device}: {why}" for d, why in ((d, device_why(d, r)) for d in devices) if why)
        if need > len(devices):
            parts.append(f"claim {claim} request {r.name} needs {need} GPUs, the node publishes {len(devices)}")
        elif need > 1:
            parts.append(
                f"claim {claim} request {r.name} needs {need} GPUs, {room} fit" + (f" ({gpus})" if gpus else "")
            )
        else:
            parts.append(f"claim {claim} request {r.name}{' (allocationMode All)' if r.count < 0 else ''}: {gpus}")
    if not parts and asked > MAX_RESULTS:
        return (
            f"claim {claim}: {asked} GPUs to allocate (allocationMode All takes every selected GPU), "
            f"a claim holds at most {MAX_RESULTS}"
        )
    if not parts:
        return f"claim {claim}: every request fits on its own, but not together (constraints or shared GPUs)"
    return "; ".join(parts)


def why_not_claims(
    devices: Sequence[DeviceUse], claims: Sequence[ClaimAsk], found: Search, steps: int = SEARCH_STEPS
) -> str:
    """Why :func:`allocate_claims` found nothing, naming the claim it could not get past: what
    that claim is short of on its own (:func:`why_not`), or with the claims before it placed
    where the search put them first, or what the claims up to it ask together beyond what the
    GPUs have left, or that the search gave up."""
    if not claims:
        return ""
    stuck = claims[max(found.stuck, 0)]
    if found.error:
        return f"{found.error} (kube-scheduler's allocator stops with this error)"
    if found.gave_up:
        return (
            f"claim {stuck.name}: the search gave up after {steps:,} placements tried (kube-scheduler "
            "bounds it by time instead)"
        )
    before = claims[: max(found.stuck, 0)]
    if found.broken:
        return f"claim {stuck.name} {found.broken}"
    if found.short:
        return (
            f"claim {stuck.name}: the pod's claims up to it ask at least {found.short}"
            if before
            else f"claim {stuck.name}: asks at least {found.short}"
        )
    if not before or allocate_claims(devices, [stuck], steps).picks is None:  # it cannot be had even alone
        return why_not(devices, stuck.requests, stuck.name, stuck.constraints)
    held = [p for picks in found.prefix for p in picks]
    commit(held, "(search)")  # what is short once the claims before it hold what the search gave them first
    try:
        why = why_not(devices, stuck.requests, stuck.name, stuck.constraints)
    finally:
        release(held, "(search)")
    if why.endswith("but not together (constraints or shared GPUs)"):
        return (
            f"claim {stuck.name}: fits on its own, but not beside the pod's claim{'s' if len(before) > 1 else ''} "
            f"{', '.join(c.name for c in before)} (every placement of them tried)"
        )
    where = ", ".join(
        f"{c.name} on {'+'.join(p.device.device for p in picks)}" for c, picks in zip(before, found.prefix)
    )
    return f"{why} (after the pod's claim{'s' if len(before) > 1 else ''} {where}; no other placement of them leaves room either)"
