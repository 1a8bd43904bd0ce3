"""The rules of this driver's opaque configuration, a ``GpuConfig`` (``apiVersion
gpu.hami.io/v1alpha1``): one place for the node agent, which refuses a claim that breaks them at
prepare (:func:`hami.draplugin.prepare.plan`), and the webhook, which refuses a ResourceClaim or
ResourceClaimTemplate that breaks them at creation (:func:`claim_spec_error`), so that a rule the
webhook enforces is one every agent of this version enforces too, with the same message.

A ``GpuConfig`` has three optional parameters, each taken from the last entry that names it (class
entries first, then the claim's, :func:`resolve_all`): ``isolation`` (:data:`ISOLATIONS`),
``priority``, libvgpu's task priority (an integer in :data:`PRIORITY_RANGE`, 0 high, 1 low), and
``corePolicy``, libvgpu's compute policy ``GPU_CORE_UTILIZATION_POLICY`` (:data:`CORE_POLICIES`:
``default`` or ``force``, the core limit held even when the GPU is otherwise idle; ``disable``,
which switches the limit off, is refused: the pod's opt-out needs a namespace label a claim
cannot be checked against, and the whole-GPU class is the DRA way to run without limits). Any
other parameter is refused: it is one a newer webhook or a user meant to take effect, and an agent
that ignored it would run the claim without it. A priority or a ``force`` policy where no libvgpu
runs (isolation ``none``, admin access, a MIG device, :func:`without_libvgpu`) is refused too, and
so are requests of one claim that run at different priorities or policies (one claim is one CDI
device, one ``CUDA_TASK_PRIORITY``, one ``GPU_CORE_UTILIZATION_POLICY``). Another driver's configuration is never looked at, nor an entry of this
driver that names only requests kept off its devices (:func:`claim_spec_error`).

The webhook also refuses what the agent refuses of a claim's results together, where the
requests alone decide it (:func:`claim_spec_error`): admin access beside ordinary shares, MIG
devices beside GPU shares, two isolations (the share and the whole-GPU class), admin access to a
MIG device; with the agent's words.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

from hami.dra.model import (
    TASK_PRIORITY,
    CORE_POLICY,
    CONFIG_API_VERSION,
    CONFIG_KIND,
    DEFAULT_PRIORITY,
    DRIVER,
    MIG_CLASS,
    PRIORITY_RANGE,
    device_classes,
)

ISOLATIONS = ("hami-core", "none")
#: the compute policies a ``GpuConfig`` may name (libvgpu's ``GPU_CORE_UTILIZATION_POLICY``; its
#: ``disable`` is refused, module doc); ``default`` is libvgpu's own, as if none were named
CORE_POLICIES = ("default", "force")
#: the parameters of a ``GpuConfig`` (any other is refused, :func:`parameters`)
FIELDS = ("apiVersion", "kind", "isolation", "priority", "corePolicy")
#: how the agent names itself in a refusal of a field it does not know
AGENT = "this agent"


class GpuConfigError(ValueError):
    """A configuration entry of this driver breaks a rule; the message names the field and value."""


def parameters(params: Any, where: str, knower: str = AGENT) -> tuple[str | None, int | None, str | None]:
    """``(isolation, priority, corePolicy)`` one ``GpuConfig`` names (None: left out), or
    GpuConfigError. ``knower`` is who does not know a field (the agent, or the webhook speaking
    for the agents)."""
    params = params or {}
    if not isinstance(params, Mapping):
        raise GpuConfigError(f"{where}: configuration parameters must be an object, got {params!r:.60}")
    if params.get("apiVersion") != CONFIG_API_VERSION or params.get("kind") != CONFIG_KIND:
        raise GpuConfigError(
            f"{where}: configuration parameters must be apiVersion {CONFIG_API_VERSION} "
            f"kind {CONFIG_KIND}, got {params.get('apiVersion')!r} {params.get('kind')!r}"
        )
    # strict, as Kubernetes decodes its own kinds: a field this agent does not know is one a
    # newer webhook or user meant to take effect, and ignoring it would run the claim without
    # it (an agent that predates ``priority`` ran such claims at the default priority, unseen)
    for key in params:
        if key not in FIELDS:
            raise GpuConfigError(
                f"{where}: configuration parameter {str(key)[:40]!r}={params[key]!r:.40} is not a {CONFIG_KIND} "
                f"field {knower} knows ({', '.join(FIELDS[2:])}); remove it, or upgrade the agent"
            )
    isolation = params.get("isolation")
    if isolation is not None and isolation not in ISOLATIONS:
        raise GpuConfigError(
            f"{where}: configuration isolation={isolation!r:.40} is not one of {', '.join(ISOLATIONS)}"
        )
    priority = params.get("priority")
    if priority is not None:
        low, high = PRIORITY_RANGE
        # bool is an int to Python; a float (1.0) or a string is not what libvgpu reads
        if isinstance(priority, bool) or not isinstance(priority, int) or not low <= priority <= high:
            raise GpuConfigError(
                f"{where}: configuration priority={priority!r:.40} must be an integer in {low}..{high} (0 high, 1 low)"
            )
    policy = params.get("corePolicy")
    # exactly one of the values: what the agent writes into GPU_CORE_UTILIZATION_POLICY (and the
    # grant file) is only ever one of them, never a user's string
    if policy is not None and (not isinstance(policy, str) or policy not in CORE_POLICIES):
        raise GpuConfigError(
            f"{where}: configuration corePolicy={policy!r:.40} is not one of {', '.join(CORE_POLICIES)}"
            + (
                " (disable switches the compute limit off: use the whole-GPU class)"
                if isinstance(policy, str) and policy.lower() == "disable"
                else ""
            )
        )
    return isolation, priority, policy


def ours(entry: Any) -> bool:
    """Whether a configuration entry is this driver's (an opaque one naming ``gpu.hami.io``)."""
    opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
    return isinstance(opaque, Mapping) and opaque.get("driver") == DRIVER


def resolve(config: Any, request: str, where: str, knower: str = AGENT) -> tuple[str, int | None]:
    """``(isolation, priority)`` of :func:`resolve_all`."""
    isolation, priority, _ = resolve_all(config, request, where, knower)
    return isolation, priority


def resolve_all(config: Any, request: str, where: str, knower: str = AGENT) -> tuple[str, int | None, str | None]:
    """``(isolation, priority, corePolicy)`` for ``request`` (``gpu``, or ``gpu/sub`` for a
    ``firstAvailable`` subrequest) from class and claim configuration: each parameter from the
    last entry that names it, claim entries after class entries (``source: FromClass`` first,
    claim configuration wins, later wins). An entry that leaves a parameter out keeps what came
    before (a claim naming only a ``priority`` keeps its class's isolation). ``priority`` None:
    not set; ``corePolicy`` None: not set, or ``default`` (libvgpu's own)."""
    chosen = "hami-core"
    priority: int | None = None
    policy: str | None = None
    ordered = sorted(
        (c for c in config if isinstance(c, Mapping)) if isinstance(config, list) else (),
        key=lambda c: 0 if c.get("source") == "FromClass" else 1,
    )
    for c in ordered:
        names = c.get("requests")
        if names and not isinstance(names, list):
            raise GpuConfigError(f"{where}: configuration requests must be a list, got {names!r:.60}")
        if names and request not in names and request.split("/")[0] not in names:
            continue
        if not ours(c):
            continue
        isolation, prio, pol = parameters(c["opaque"].get("parameters"), where, knower)
        if isolation is not None:
            chosen = isolation
        if prio is not None:
            priority = prio
        if pol is not None:
            policy = None if pol == "default" else pol
    return chosen, priority, policy


def without_libvgpu(mig: bool, admin: bool, isolation: str) -> str:
    """What makes a request run without libvgpu ("" when it runs with it)."""
    return "a MIG device" if mig else "admin access" if admin else "isolation none" if isolation == "none" else ""


def unhonoured(request: str, priority: int, without: str) -> str:
    """The refusal of a priority on a request that runs without libvgpu (it would be dropped unseen)."""
    return (
        f"request {request!r}: configuration priority={priority} needs libvgpu (isolation hami-core), "
        f"and {without} runs without it; remove the priority"
    )


def mixed(priorities: Sequence[int]) -> str:
    """The refusal of a claim whose requests run at different priorities."""
    return (
        f"requests mix priority {' and '.join(map(str, sorted(set(priorities))))} (one CDI device, "
        "one CUDA_TASK_PRIORITY per claim); use one claim for each"
    )


def unforced(request: str, policy: str, without: str) -> str:
    """The refusal of a compute policy on a request that runs without libvgpu."""
    return (
        f"request {request!r}: configuration corePolicy={policy} needs libvgpu (isolation hami-core), "
        f"and {without} runs without it; remove the corePolicy"
    )


def mixed_policies(policies: Sequence[str | None]) -> str:
    """The refusal of a claim whose requests run under different compute policies."""
    named = " and ".join(sorted({p or "default" for p in policies}))
    return (
        f"requests mix corePolicy {named} (one CDI device, one GPU_CORE_UTILIZATION_POLICY per claim); "
        "use one claim for each"
    )


def runs_at(priority: int | None) -> int:
    """The priority libvgpu runs a request at (unset: its default)."""
    return DEFAULT_PRIORITY if priority is None else priority


def class_configs() -> dict[str, list[dict[str, Any]]]:
    """This driver's DeviceClasses (as :func:`hami.dra.model.device_classes` publishes them) ->
    their configuration, as an allocation carries it (``source: FromClass``)."""
    return {
        c["metadata"]["name"]: [{"source": "FromClass", **e} for e in c["spec"].get("config") or ()]
        for c in device_classes()
    }


#: who the webhook says does not know a field: the agents its refusal speaks for
AGENTS = "a node agent of this version"
#: the API server's bounds (``DeviceRequestsMaxSize``, ``DeviceConfigMaxSize``,
#: ``FirstAvailableDeviceRequestMaxSize``): the check resolves every subrequest over every entry,
#: and anyone reaching the webhook's port can send a body of 4 MiB; at 256/256/64 one such body
#: held the scheduler's event loop for half a minute. A claim beyond them is refused by the API
#: server's validation anyway (the mutating webhook sees it first), so only the message differs
MAX_REQUESTS, MAX_CONFIG, MAX_SUBREQUESTS = 32, 32, 8


def _alternatives(request: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(name, body)`` of what a request may be allocated as: its ``exactly``, or each
    ``firstAvailable`` subrequest as ``request/sub`` (the name a result and a config entry carry)."""
    subs = request.get("firstAvailable")
    if isinstance(subs, list):
        return [(f"{request['name']}/{s.get('name')}", s) for s in subs if isinstance(s, Mapping)]
    exactly = request.get("exactly")
    return [(request["name"], exactly)] if isinstance(exactly, Mapping) else []


def _devices(spec: Any) -> tuple[list[Mapping[str, Any]], list[Any]]:
    """A claim spec's ``devices.config`` entries (objects only) and ``devices.requests``, each []
    where the body has something else there (a body sent to the port by hand)."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    devices = devices if isinstance(devices, Mapping) else {}
    config, requests = devices.get("config"), devices.get("requests")
    config = [c for c in config if isinstance(c, Mapping)] if isinstance(config, list) else []
    return config, requests if isinstance(requests, list) else []


#: a selector that keeps a request off this driver's devices whatever its class selects: its
#: expression is ``device.driver == "<another>"`` (or ``device.driver != "gpu.hami.io"``), alone
#: or as the first operand of ``&&``. Anything with ``||`` or ``?`` (lower than ``&&`` in CEL)
#: is not read, so the comparison is always a conjunct of the whole
_PINNED = re.compile(r"""\s*device\.driver\s*(==|!=)\s*(?:"([a-z0-9.-]+)"|'([a-z0-9.-]+)')\s*(&&.*)?""", re.S)


def _pinned_elsewhere(sub: Mapping[str, Any]) -> bool:
    """Whether one of a request's own selectors allows no device of this driver (module doc)."""
    selectors = sub.get("selectors")
    for s in selectors if isinstance(selectors, list) else ():
        cel = s.get("cel") if isinstance(s, Mapping) else None
        text = cel.get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(text, str) or "||" in text or "?" in text:
            continue
        m = _PINNED.fullmatch(text)
        if m and (m[1] == "==") == ((m[2] or m[3]) != DRIVER):
            return True
    return False


def _reaching(requests: Sequence[Any], classes: Mapping[str, Any]) -> set[str] | None:
    """The names (``gpu``, ``gpu/sub``) of the requests and subrequests that may be given a device
    of this driver: one of its classes, or a class not known here (an administrator's may select
    this driver's devices) unless the request's own selectors keep it off them. None: a request
    that cannot be read (only a body sent to the port by hand), so every entry is read."""
    reach: set[str] = set()
    for r in requests:
        if not isinstance(r, Mapping) or not isinstance(r.get("name"), str):
            return None
        for name, sub in _alternatives(r):
            cls = sub.get("deviceClassName")
            if (isinstance(cls, str) and cls in classes) or not _pinned_elsewhere(sub):
                reach.add(name)
    return reach


def _read(entry: Mapping[str, Any], reach: set[str] | None) -> bool:
    """Whether the agent may read ``entry``: it names (or, naming none, applies to) a request or
    subrequest that may be given this driver's devices; an entry scoped only to requests of
    another driver's devices is never looked at by the agent (:func:`resolve` skips it)."""
    names = entry.get("requests")
    if reach is None or (names and not isinstance(names, list)):
        return True  # read as the agent would read it (a ``requests`` not a list is refused there)
    if not names:  # every request's
        return bool(reach)
    return any(n in names or n.split("/")[0] in names for n in reach)


def _mix_error(requests: Sequence[Any], classes: Mapping[str, Sequence[Mapping[str, Any]]], config: Any) -> str:
    """What :func:`hami.draplugin.prepare.plan` refuses of a claim's results together, where the
    requests alone decide it ("" otherwise): admin access beside ordinary shares, MIG devices
    beside GPU shares, two isolations, admin access to a MIG device. The requests are walked in
    order (kube-scheduler's results follow them) as the agent walks results, so the first refusal
    and its words are the agent's. A request is counted only when whatever it may be given is
    known: each alternative of one of this driver's classes, all of one kind. A class not known
    here may be another driver's (no result here), and ``firstAvailable`` subrequests of
    different kinds may or may not mix depending on which kube-scheduler takes: both are left
    to prepare, which refuses the mix if it comes."""
    admins: dict[bool, str] = {}  # admin access or not -> the first request with it
    isolation: tuple[str, str] | None = None  # (kind, the first request of it)
    for r in requests:
        if not isinstance(r, Mapping) or not isinstance(r.get("name"), str):
            continue
        kinds: set[tuple[bool, str] | None] = set()
        for name, sub in _alternatives(r):
            cls = sub.get("deviceClassName")
            if not isinstance(cls, str) or cls not in classes:
                kinds.add(None)
                continue
            admin = sub.get("adminAccess") is True
            iso = resolve([*classes[cls], *config], name, f"request {name!r}", AGENTS)[0]
            kinds.add((admin, "mig" if cls == MIG_CLASS else "admin" if admin else iso))
        (only,) = kinds if len(kinds) == 1 else (None,)
        if only is None:
            continue
        admin, kind = only
        name = r["name"]
        admins.setdefault(admin, name)
        if len(admins) > 1:
            return (
                f"results mix admin access and ordinary shares (requests {admins[not admin]!r} and {name!r}); "
                "use one claim for each"
            )
        if kind == "mig":
            if admin:
                return f"request {name!r}: a MIG device cannot be given with admin access"
            if isolation is not None and isolation[0] != "mig":
                return (
                    f"results mix MIG devices and GPU shares (requests {isolation[1]!r} and {name!r}); "
                    "use one claim for each"
                )
        elif isolation is not None and isolation[0] != kind:
            return (
                f"requests mix isolation {isolation[0]!r} and {kind!r} (requests {isolation[1]!r} and {name!r}); "
                "use one class per claim"
            )
        isolation = isolation or (kind, name)
    return ""


def claim_spec_error(
    spec: Any, classes: Mapping[str, Sequence[Mapping[str, Any]]] | None = None, path: str = "spec"
) -> str:
    """Why a ResourceClaim's ``spec`` (a template's ``spec.spec``) would be refused at prepare by
    the configuration rules ("" when it would not): every entry of this driver the agent may read
    is checked, then each request of one of ``classes`` (default: this driver's,
    :func:`class_configs`) is resolved as the agent resolves its results. A request of another
    class (another driver's, or a class of the administrator's whose configuration is not known
    here) gets only the entry check, and the entries it names are skipped only when its own
    selectors keep it off this driver's devices (``device.driver == "nic.example.com"``): the
    agent never reads those (:func:`resolve` skips an entry naming none of its results), while
    an unknown class may be an administrator's selecting this driver's devices, whose entries it
    does read. For a ``firstAvailable`` request each subrequest is checked (any of them may be
    allocated); its requests mix priorities only when whichever subrequests are taken would.
    Last, the results' mixing rules (:func:`_mix_error`). ``path``: where ``spec`` is in the
    object (``spec.spec`` in a template), for the message."""
    classes = class_configs() if classes is None else classes
    config, requests = _devices(spec)
    most_subs = max(
        (
            len(r["firstAvailable"])
            for r in requests
            if isinstance(r, Mapping) and isinstance(r.get("firstAvailable"), list)
        ),
        default=0,
    )
    for what, n, most in (
        ("requests", len(requests), MAX_REQUESTS),
        ("config", len(config), MAX_CONFIG),
        ("requests[].firstAvailable", most_subs, MAX_SUBREQUESTS),
    ):
        if n > most:
            return f"{path}.devices.{what}: {n} entries, more than the API server takes"
    try:
        reach = _reaching(requests, classes)
        for i, c in enumerate(config):
            if ours(c) and _read(c, reach):
                parameters(c["opaque"].get("parameters"), f"{path}.devices.config[{i}].opaque.parameters", AGENTS)
        possible: list[set[int]] = []  # per request of ours: the priorities it may run at
        policies: list[set[str | None]] = []  # and the compute policies
        for r in requests:
            if not isinstance(r, Mapping) or not isinstance(r.get("name"), str):
                continue
            runs: set[int] = set()
            under: set[str | None] = set()
            known = True  # every alternative's class known: what it runs at is known
            for name, sub in _alternatives(r):
                cls = sub.get("deviceClassName")
                if not isinstance(cls, str) or cls not in classes:
                    known = False
                    continue
                where = f"request {name!r}"
                isolation, priority, policy = resolve_all([*classes[cls], *config], name, where, AGENTS)
                without = without_libvgpu(cls == MIG_CLASS, sub.get("adminAccess") is True, isolation)
                if priority is not None and without:
                    return unhonoured(name, priority, without)
                if policy is not None and without:
                    return unforced(name, policy, without)
                runs.add(runs_at(priority))
                under.add(policy)
            if known and runs:
                possible.append(runs)
                policies.append(under)
        if possible and all(len(p) == 1 for p in possible) and len(set().union(*possible)) > 1:
            return mixed([next(iter(p)) for p in possible])
        if policies and all(len(p) == 1 for p in policies) and len(set().union(*policies)) > 1:
            return mixed_policies([next(iter(p)) for p in policies])
        return _mix_error(requests, classes, config)
    except GpuConfigError as exc:
        return str(exc)


def unselected_priorities(spec: Any) -> list[str]:
    """The requests (``gpu``, ``gpu/sub``) of this driver's classes whose configuration sets a
    priority but whose selectors never name :data:`hami.dra.model.TASK_PRIORITY`: kube-scheduler
    may then give them a device whose agent predates the field, which runs them at libvgpu's
    default priority (the webhook's own claims select it, :mod:`hami.dra.translate`). Read after
    :func:`claim_spec_error` found nothing."""
    return _unselected(spec, TASK_PRIORITY, lambda entries, name: resolve(entries, name, name, AGENTS)[1] is not None)


def unselected_core_policies(spec: Any) -> list[str]:
    """The requests of this driver's classes whose configuration names a ``corePolicy`` (either
    value) but whose selectors never name :data:`hami.dra.model.CORE_POLICY`: kube-scheduler may
    then give them a device whose agent predates the field, which refuses it at prepare (the pod
    never starts; the webhook's own claims select it, :mod:`hami.dra.translate`). Read after
    :func:`claim_spec_error` found nothing."""

    def names_policy(entries: list[Mapping[str, Any]], name: str) -> bool:
        for c in entries:
            names = c.get("requests")
            if names and (not isinstance(names, list) or (name not in names and name.split("/")[0] not in names)):
                continue
            params = c["opaque"].get("parameters") if ours(c) else None
            if isinstance(params, Mapping) and "corePolicy" in params:
                return True
        return False

    return _unselected(spec, CORE_POLICY, names_policy)


def _unselected(spec: Any, attribute: str, wants: Callable[[list[Mapping[str, Any]], str], bool]) -> list[str]:
    """The requests of this driver's classes (not MIG) for which ``wants(entries, name)`` (their
    class's and the claim's configuration entries) holds and whose selectors never name
    ``attribute``."""
    classes = class_configs()
    config, requests = _devices(spec)
    found = []
    for r in requests:
        if not isinstance(r, Mapping) or not isinstance(r.get("name"), str):
            continue
        for name, sub in _alternatives(r):
            cls = sub.get("deviceClassName")
            if not isinstance(cls, str) or cls not in classes or cls == MIG_CLASS:
                continue
            try:
                wanted = wants([*classes[cls], *config], name)
            except GpuConfigError:
                continue
            selectors = sub.get("selectors")
            # a selector is read as the API server types it; anything else (only a body sent to the
            # port by hand) names nothing, rather than an exception and a 500
            named = any(
                isinstance(s, Mapping)
                and isinstance(s.get("cel"), Mapping)
                and attribute in str(s["cel"].get("expression", ""))
                for s in (selectors if isinstance(selectors, list) else ())
            )
            if wanted and not named:
                found.append(name)
    return found
