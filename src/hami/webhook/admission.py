"""Admission rules for pods (reference §3.2-§3.3), in order:

1. a pod with no containers is denied;
2. (security, beyond HAMi) an internal allocation annotation or label a pod carries at creation
   (``hami.io/vgpu-devices-*``, ``hami.io/vgpu-node``, ``hami.io/bind-phase``, any backend's
   ``hami.io/*-allocated`` / ``hami.io/*-to-allocate``, ..., and each enabled
   vendor's decision annotations, :attr:`~hami.vendors.base.BaseVendor.decision_annotations`, e.g.
   ``enflame.com/gcu-assigned-index``) is removed by the patch, whatever its scheduler, with a
   warning naming the keys: the scheduler trusts these to rebuild its ledger, the vendors' device
   plugins read them at Allocate, and a copy of a placed pod (``kubectl debug --copy-to``) carries them;
3. (security) ``CUDA_DISABLE_CONTROL`` or ``GPU_CORE_UTILIZATION_POLICY=disable`` in a
   container's env is denied unless the namespace carries the opt-in label
   (``hami.io/allow-disable-control: "true"``), which only someone who may edit namespaces can
   set (the policy is allowed anywhere when it is the node-wide one, which the webhook writes);
4. scheduler-name gate: only pods with no scheduler, ``default-scheduler`` (when
   ``--force-overwrite-default-scheduler``) or ours are mutated; (security, beyond HAMi) a pod
   for another scheduler that asks for a device with ``spec.nodeName`` set is denied;
5. every vendor's admission defaults and validation (the core's :func:`hami.core.admit_pod`);
   (security, beyond HAMi) a device pod may not set the variables its grant sets
   (:func:`reserved_env_error`);
6. a privileged container in a pod with device resources is denied, and so is one adding the
   capability SYS_ADMIN (or ALL), which the NVIDIA runtime counts as privileged;
7. a pod with device resources gets ``spec.schedulerName``; if it already has ``spec.nodeName``
   it is denied (it would bypass the extender);
8. the namespace quota (``limits.<memory|cores resource>``) must have room for the request; on
   the DRA front end, where the pod no longer asks for ``nvidia.com/gpu`` and the API server's
   quota no longer counts it, its claims' devices must fit ``requests.`` / ``limits.nvidia.com/gpu``
   too (``gpu_room``, :func:`gpu_count_room`: unscoped quotas only; kube-scheduler's KEP-5004
   claims count none, :func:`claim_devices`);
9. on the DRA front end (``front_end="dra"``), instead of routing the pod to our scheduler, its
   NVIDIA requests become claims from ResourceClaimTemplates (:func:`hami.dra.translate.translate`);
   the decision lists the templates, which the server creates before answering, and warns of
   what the front end ignores (an isolation opt-out) or does otherwise (an app container enlarged
   by a claim it shares with init containers, or kept from theirs by its priority; a priority
   itself goes into the claim). Rule 8 then counts what those claims will ask.

The answer carries a JSON patch from the original pod to the mutated one.
"""

from __future__ import annotations

import posixpath

import base64
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from hami.core import CoreError, admit_pod, names, pod_request
from hami.core.shape import is_dns1123_label, is_dns1123_subdomain
from hami.core.names import (
    ALLOW_DISABLE_CONTROL,
    BIND_PHASE,
    BIND_TIME,
    DRA_SHARE_CLASS,
    DRA_WHOLE_CLASS,
    VGPU_MIG_ALLOCATIONS,
    VGPU_NODE,
    VGPU_TIME,
)
from hami.core.quantity import parse_int_quantity, parse_quantity
from hami.core.shape import POD, ShapeError, check, check_pod
from hami.core.types import ContainerKind
from hami.vendors.base import lookup
from hami.vendors.common import present
from hami.vendors.nvidia import VGPU_DEVICES_PREFIX

INTERNAL_ANNOTATIONS = frozenset(
    {
        VGPU_NODE,
        VGPU_TIME,
        BIND_PHASE,
        BIND_TIME,
        VGPU_MIG_ALLOCATIONS,
    }
)
INTERNAL_PREFIXES = (VGPU_DEVICES_PREFIX,)
INTERNAL_LABELS = frozenset({VGPU_NODE})
DISABLE_CONTROL_ENV = names.ENV_DISABLE_CONTROL
CORE_POLICY_ENV = names.ENV_CORE_POLICY
FRONT_ENDS = ("extender", "dra")


@dataclass(frozen=True)
class AdmissionSettings:
    vendors: Sequence[Any]
    scheduler_name: str = "hami-scheduler"
    force_overwrite_default_scheduler: bool = True
    disable_control_label: str = ALLOW_DISABLE_CONTROL
    extra_internal: frozenset[str] = field(default_factory=frozenset)
    front_end: str = "extender"  # or "dra": NVIDIA requests become ResourceClaims (docs/dra.md)
    dra_device_class: str = DRA_SHARE_CLASS
    #: the nodes' ``global.gpuHookPath``: libvgpu is mounted at ``<hook_path>/vgpu/libvgpu.so``
    hook_path: str = "/usr/local"

    def __post_init__(self) -> None:
        if self.front_end not in FRONT_ENDS:
            raise ValueError(
                f"AdmissionSettings.front_end must be one of {', '.join(FRONT_ENDS)}, got {self.front_end!r}"
            )

    @property
    def nvidia(self) -> Any:
        """The NVIDIA vendor of :attr:`vendors` (its resource names and config), None without it."""
        return next((v for v in self.vendors if v.name == "NVIDIA"), None)

    def internal_annotation(self, key: str) -> bool:
        """A key only hami writes: the scheduler's own, any backend's allocation pair
        (:func:`hami.core.names.is_allocation_annotation`), or one an enabled vendor's decision
        writes (its :attr:`~hami.vendors.base.BaseVendor.decision_annotations`)."""
        if key in INTERNAL_ANNOTATIONS or key in self.extra_internal or key.startswith(INTERNAL_PREFIXES):
            return True
        if names.is_allocation_annotation(key):
            # enabled here or not: the node lock stays with its owner pod while any such key names
            # a device (hami.kube.nodelock.devices_pending), so a forged one held a node's lock
            # until it expired
            return True
        return any(
            key in (v.allocated_annotation, v.to_allocate_annotation) or key in v.decision_annotations
            for v in self.vendors
        )


@dataclass(frozen=True)
class Decision:
    allowed: bool
    message: str = ""
    pod: dict | None = None  # the mutated pod when allowed
    code: int = 200
    templates: tuple[dict, ...] = ()  # ResourceClaimTemplates the pod needs (DRA front end)
    warnings: tuple[str, ...] = ()  # AdmissionReview warnings (kubectl prints them)


def sys_admin(container: Mapping[str, Any]) -> str | None:
    """The entry of ``securityContext.capabilities.add`` that gives ``container`` CAP_SYS_ADMIN
    (``SYS_ADMIN`` or ``ALL``, any letter case, with or without ``CAP_``, as the container runtime
    reads them), or None."""
    sc = container.get("securityContext")
    caps = sc.get("capabilities") if isinstance(sc, Mapping) else None
    added = caps.get("add") if isinstance(caps, Mapping) else None
    for cap in added if isinstance(added, list) else ():
        if isinstance(cap, str) and (not cap.isascii() or cap.upper().removeprefix("CAP_") in ("SYS_ADMIN", "ALL")):
            return cap  # (a name not ASCII: the runtime upper-cases it by Unicode's rules, as the guard refuses it)
    return None


def _containers(pod: Mapping[str, Any]) -> list[dict]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def isolation_switches(pod: Any) -> list[tuple[str, str]]:
    """``(container, variable)`` for each container whose env switches libvgpu's isolation off:
    ``CUDA_DISABLE_CONTROL`` (any value) or ``GPU_CORE_UTILIZATION_POLICY=disable`` (compute
    shares not enforced; any letter case, as libvgpu reads it; a value from ``valueFrom``, which
    admission cannot read, counts as disable). Reads what it can of a pod of the
    wrong shape (:func:`decide` denies that pod anyway) without checking its shape, which costs
    more than the rest of an admission."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return []
    found: list[tuple[str, str]] = []
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        for c in containers if isinstance(containers, list) else ():
            env = c.get("env") if isinstance(c, Mapping) else None
            for e in env if isinstance(env, list) else ():
                if not isinstance(e, Mapping):
                    continue
                if e.get("name") == DISABLE_CONTROL_ENV or (
                    e.get("name") == CORE_POLICY_ENV
                    and ("valueFrom" in e or str(e.get("value", "")).lower() == "disable")
                ):
                    name = c.get("name")
                    found.append((name if isinstance(name, str) and name else "?", str(e["name"])))
                    break
    return found


def uses_disable_control(pod: Any) -> list[str]:
    """Names of containers whose env switches isolation off (:func:`isolation_switches`): the
    pods whose namespace's labels the server reads before :func:`decide`."""
    return [c for c, _ in isolation_switches(pod)]


#: values of ``NVIDIA_VISIBLE_DEVICES`` a pod may set itself: they show fewer GPUs, never more
#: (``none`` is what the webhook writes into containers without a GPU, with overwriteEnv)
VISIBLE_DEVICES_OK = frozenset({"none", "void"})


#: the longest literal ``GPU_CORE_UTILIZATION_POLICY`` admitted: what the grant file takes of a
#: pod's value (:data:`hami.node.contract.SPEC_VALUE_MAX`, refused at Allocate past it). Any
#: shorter value is admitted as HAMi's webhook admits it: libvgpu and HAMi-core read ``force`` and
#: ``disable`` and take anything else as the default
CORE_POLICY_MAX = 256


def core_policy_ok(value: Any) -> bool:
    """Whether a literal ``GPU_CORE_UTILIZATION_POLICY`` value fits the grant file."""
    return len(("" if value is None else str(value)).encode()) <= CORE_POLICY_MAX


def reserved_env_error(pod: Mapping[str, Any], s: AdmissionSettings) -> str:
    """Why a device pod's env may not be admitted ("" when it may): a variable the grant sets
    (:func:`hami.core.names.grant_env`: a pod's env comes after the device plugin's in the
    runtime's list, so ``CUDA_DEVICE_MEMORY_LIMIT_0=0`` would lift the memory limit),
    ``NVIDIA_VISIBLE_DEVICES`` other than none/void (``all``: every GPU of the node), or
    ``CUDA_TASK_PRIORITY`` in a container that does not ask for that priority with the priority
    resource (the webhook then writes the resource's value over it, as HAMi's does), or a
    literal ``GPU_CORE_UTILIZATION_POLICY`` longer than :data:`CORE_POLICY_MAX` (review, 1 Dec: a
    66,000-character one, copied into the grant file, pushed the device list out of what libvgpu
    read). A value from ``valueFrom`` counts as set; the policy's cannot be read here (the grant
    file takes only a literal one). (``envFrom`` cannot be read here: docs/security.md.)"""
    nvidia = s.nvidia
    priority = nvidia.resources.priority if nvidia is not None else None
    for c in _containers(pod):
        env = c.get("env") or ()
        limits = (c.get("resources") or {}).get("limits") or {}
        for e in env:
            name, value = e.get("name") or "", e.get("value")
            why = ""
            if names.grant_env(name):
                why = "it is set by the device plugin from the pod's grant"
            elif name == names.ENV_VISIBLE_DEVICES and (value not in VISIBLE_DEVICES_OK or "valueFrom" in e):
                why = "it would show the container GPUs other than those granted (only none or void may be set)"
            elif name == names.ENV_TASK_PRIORITY and not (priority and priority in limits):
                why = f"ask for a priority with the resource {priority} instead" if priority else "it is the grant's"
            elif name in (names.ENV_TASK_PRIORITY, names.ENV_CORE_POLICY) and any(
                ord(ch) < 32 for ch in str(value or "")
            ):
                why = (
                    f"its value {_shown(str(value))} holds a control character (the grant file is one line per setting)"
                )
            elif name == names.ENV_CORE_POLICY and "valueFrom" not in e and not core_policy_ok(value):
                return (
                    f"container {c.get('name')!r}: env {name}={_shown(str(value))} is "
                    f"{len(str(value).encode())} bytes, longer than the {CORE_POLICY_MAX} the grant file takes "
                    "(the policies are default, force and disable; docs/security.md)"
                )
            if why:
                return (
                    f"container {c.get('name')!r}: env {name} may not be set in a pod that asks for a device: "
                    f"{why} (docs/security.md)"
                )
    return ""


def priority_error(pod: Mapping[str, Any], s: AdmissionSettings) -> str:
    """Why a device pod's priority resource may not be admitted ("" when it may): a value libvgpu
    refuses to run with (the webhook and the grant pass it on as ``CUDA_TASK_PRIORITY``), so every
    CUDA process of the container would exit (78) at its first call, long after admission."""
    nvidia = s.nvidia
    priority = nvidia.resources.priority if nvidia is not None else None
    if not priority:
        return ""
    low, high = names.PRIORITY_RANGE
    for c in _containers(pod):
        limits = (c.get("resources") or {}).get("limits") or {}
        if priority not in limits:
            continue
        try:
            value = lookup(c, f"container {c.get('name')!r}")(priority)
        except CoreError as exc:  # in a container without a GPU, admit_pod did not read it
            return str(exc)
        if not low <= value <= high:
            return (
                f"container {c.get('name')!r}: {priority} must be an integer in {low}..{high} "
                f"(0 high, 1 low), got {value}"
            )
    return ""


#: where every GPU container gets ``/etc/ld.so.preload`` naming libvgpu (hami.node.contract)
PRELOAD_PATH = "/etc/ld.so.preload"
#: mounts libvgpu finds by name in its mount table, wherever they are (hami.node.layout)
LIBVGPU_MOUNT_NAMES = frozenset({names.GRANT_FILE, names.PENDING_MARKER})


def _clean(path: str) -> str:
    """``path`` as an absolute path without ``//``, ``.`` or ``..`` segments (``normpath`` keeps a
    leading ``//``)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def reserved_mount_error(pod: Mapping[str, Any], s: AdmissionSettings) -> str:
    """Why a device pod's mounts may not be admitted ("" when they may): a volume mount or a
    ``terminationMessagePath`` (the kubelet mounts a file there) at ``/etc/ld.so.preload`` or at
    or under ``<hook_path>/vgpu``. The kubelet lists a pod's mounts after the device plugin's and
    the runtime orders mounts by depth only, so a pod's mount at the same path (a ConfigMap's key
    with ``subPath``) is mounted over the grant's: libvgpu is then not loaded, or the pod's own
    library is, and the container runs without its limits (found by review); and a path naming
    one of the files libvgpu looks up in its mount table (the grant file, the NRI pending
    marker), wherever it is. The path is compared as the runtime will use it (``//`` and ``.``
    segments cleaned)."""
    vgpu = posixpath.join(_clean(s.hook_path), "vgpu")
    for c in _containers(pod):
        if not isinstance(c, Mapping):
            continue
        mounts = c.get("volumeMounts")
        paths = [
            ("volumeMounts mountPath", m.get("mountPath"))
            for m in (mounts if isinstance(mounts, list) else ())
            if isinstance(m, Mapping)
        ]
        paths.append(("terminationMessagePath", c.get("terminationMessagePath")))
        for what, value in paths:
            if not value:
                continue
            raw = str(value)
            path = _clean(raw)
            if (
                path == PRELOAD_PATH
                or path == vgpu
                or path.startswith(vgpu + "/")
                or any(name in raw for name in LIBVGPU_MOUNT_NAMES)
            ):
                return (
                    f"container {c.get('name')!r}: {what} {raw!r} may not be used in a pod that asks "
                    f"for a device: the device plugin mounts {PRELOAD_PATH} and {vgpu} (libvgpu and its grant) "
                    "there, and a mount of the pod's would replace them (docs/security.md)"
                )
    return ""


def ignored_asks(pod: Mapping[str, Any], mutated: Mapping[str, Any], s: AdmissionSettings) -> list[str]:
    """Warnings for NVIDIA asks a pod writes that are read otherwise than written (HAMi admits
    them as they are; refusing would break its manifests, e.g. a chart's ``gpu: 0`` that turns its
    GPU off): memory or cores beside ``nvidia.com/gpu: 0`` (no GPU is given), cores over 100 (per
    GPU, read as 100), a percentage beside ``gpumem`` (gpumem wins). ``pod`` as written (what the
    user asked), ``mutated`` its admitted copy (the count defaulted), container for container;
    their quantities were read once already."""
    nvidia = s.nvidia
    if nvidia is None:
        return []
    r = nvidia.resources
    notes: list[str] = []
    for written, c in zip(_containers(pod), _containers(mutated)):
        name = str(c.get("name") or "?")[:30]
        has = present(written)
        try:
            res = lookup(c, f"container {name!r}")
            count, mem, cores, pct = res(r.count), res(r.memory), res(r.cores), res(r.memory_percentage)
        except CoreError:  # admit_pod read them: left to its message
            continue
        if r.count not in present(c):
            continue
        asks = [n for n in (r.memory, r.memory_percentage, r.cores) if n and n in has]
        if count == 0:
            if asks:
                ignored = ", ".join(n.rsplit("/", 1)[-1] for n in asks)  # short: a warning is one line
                notes.append(f"container {name!r}: {r.count} 0 gives no GPU ({ignored} ignored)")
            continue
        if r.cores and r.cores in has and cores > 100:
            notes.append(f"container {name!r}: {r.cores} {cores} is read as 100 (per GPU: 100 is a whole GPU)")
        if r.memory_percentage in has and r.memory and r.memory in has and mem > 0:
            notes.append(f"container {name!r}: {r.memory_percentage} {pct} is ignored, {r.memory} {mem} is given")
    return [f"hami: {n}" for n in notes]


def _deny(message: str, code: int = 403) -> Decision:
    return Decision(False, message, None, code)


def _gate_passes(pod: Mapping[str, Any], s: AdmissionSettings) -> bool:
    name = (pod.get("spec") or {}).get("schedulerName") or ""
    if not name:
        return True
    if name == "default-scheduler" and s.force_overwrite_default_scheduler:
        return True
    return bool(s.scheduler_name) and name == s.scheduler_name


def _policy_is_disable(s: AdmissionSettings) -> bool:
    """The node-wide compute policy is ``disable`` (the webhook writes it into every GPU container)."""
    nvidia = s.nvidia
    return nvidia is not None and str(getattr(nvidia.config, "gpu_core_policy", "")).lower() == "disable"


def _other_scheduler(pod: Mapping[str, Any], s: AdmissionSettings) -> Decision:
    """A pod for another scheduler is admitted as it is (HAMi's rule 4), except one that asks for
    our devices with ``spec.nodeName`` already set: the kubelet would then call our device
    plugin's Allocate for a pod no scheduler of ours placed, and on a node in HAMi's lock mode
    Allocate hands out the grant of the pod the node lock names (it cannot tell the pods apart),
    another tenant's GPU. (HAMi admits it: its gate comes first.)"""
    if not (pod.get("spec") or {}).get("nodeName"):
        return Decision(True, "", dict(pod))
    try:
        _, uses = admit_pod(pod, s.vendors, check_selection=True)
    except CoreError as exc:  # it names a resource of ours the vendors cannot read: the kubelet
        # would still call the device plugin for the count it can read
        return _deny(f"pod has node assigned (spec.nodeName={pod['spec']['nodeName']}): {exc}", 400)
    if uses:
        return _deny(
            f"pod has node assigned (spec.nodeName={pod['spec']['nodeName']}) and asks for a device: "
            "a pod asking for a device must be placed by the scheduler, whatever its schedulerName"
        )
    return Decision(True, "", dict(pod))


def _in_unit(mib: int, factor: int) -> str:
    """MiB in the unit of the memory resource (``memoryFactor`` MiB): ``20`` for 20480 with 1024,
    ``2.93`` for 3000; with a factor of 1 the MiB themselves."""
    if factor <= 1 or mib % factor == 0:
        return str(mib // max(factor, 1))
    return f"{mib / factor:.2f}".rstrip("0").rstrip(".")


def quota_message(res: str, need: int, left: int, ns: str, factor: int = 1) -> str:
    """The quota refusal, in the unit the namespace's quota and the pod are written in: the memory
    resource counts ``memoryFactor`` MiB a unit, so with a factor other than 1 the MiB follow in
    parentheses (``nvidia.com/gpumem requests 20 (20480 MiB), namespace NS has 16 (16384 MiB)
    left``); cores, and memory with a factor of 1, are said as they are."""
    left = max(left, 0)
    if factor <= 1:
        return f"exceeding resource quota: {res} requests {need}, namespace {ns} has {left} left"
    return (
        f"exceeding resource quota: {res} requests {_in_unit(need, factor)} ({need} MiB), "
        f"namespace {ns} has {_in_unit(left, factor)} ({left} MiB) left"
    )


def _quota_excess(
    pod: Mapping[str, Any],
    s: AdmissionSettings,
    room: Callable[[str, Sequence[Any]], Any],
    claims: Mapping[str, tuple[int, int]] | None = None,
) -> str:
    """Admission-time quota (§10.1): max(sum over apps, max over inits) of memreq*nums and cores*nums,
    where a classic init container runs beside the sidecars (``restartPolicy: Always`` init
    containers) declared before it, as the scheduler's quota check counts the pod
    (:func:`hami.core.usage.collapse_picks`): counted alone, a pod the scheduler can never place
    within the quota was admitted and stayed Pending.
    ``claims``: vendor name -> (MiB, cores) the pod's translated claims ask (the DRA front end:
    what the claims will be counted as, :func:`hami.dra.claims.claim_ask`), used for that vendor
    instead of its container requests."""
    ns = (pod.get("metadata") or {}).get("namespace") or "default"
    quota = room(ns, s.vendors)
    if quota is None:
        return ""
    req = pod_request(pod, s.vendors)
    for v in s.vendors:
        app, init, sidecars = [0, 0], [0, 0], [0, 0]
        for c in req.containers:
            r = c.for_vendor(v.name)
            if r is None:
                continue
            amounts = (r.memreq * r.nums, r.coresreq * r.nums)
            if c.kind is ContainerKind.INIT:
                init = [max(a, b + side) for a, b, side in zip(init, amounts, sidecars)]
            else:
                app = [a + b for a, b in zip(app, amounts)]
                if c.kind is ContainerKind.SIDECAR:
                    sidecars = [a + b for a, b in zip(sidecars, amounts)]
        need = [max(a, b) for a, b in zip(app, init)]
        if claims is not None and v.name in claims:
            need = [a + b for a, b in zip(need, claims[v.name])]
        mem_room, core_room = quota.room.get(v.name, (None, None))
        if not getattr(v, "admission_quota_cores", True):
            core_room = None  # counted in the device's unit: the scheduler checks it at placement
        for n, left, res, factor in (
            (need[0], mem_room, v.resources.memory, v.resources.quota_unit),
            (need[1], core_room, v.resources.cores, 1),
        ):
            if left is not None and n > left:
                return quota_message(res, n, left, ns, factor)
    return ""


def _claims_ask(
    pod: Mapping[str, Any], templates: Sequence[Mapping[str, Any]], sizes: Mapping[str, int]
) -> tuple[int, int]:
    """(MiB, cores) the claims the pod's translated entries make will ask, each counted as the claim
    check counts it (:func:`hami.dra.claims.claim_ask`, a GPU without a memory amount at
    ``sizes``): one claim per ``resourceClaims`` entry naming one of ``templates``."""
    from hami.dra.claims import claim_ask  # the DRA model, only on that front end

    specs = {(t.get("metadata") or {}).get("name"): (t.get("spec") or {}).get("spec") or {} for t in templates}
    mem = cores = 0
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        spec = specs.get(entry.get("resourceClaimTemplateName"))
        ask = claim_ask({"spec": spec}, sizes=sizes) if spec is not None else None
        if ask is not None:
            mem, cores = mem + ask.memory_mib, cores + ask.cores
    return mem, cores


#: ``gpu_room(namespace)``: the GPUs (devices) the namespace may still be given under its GPU
#: count quota (:func:`gpu_count_room`), None when it has none
GpuRoom = Callable[[str], int | None]


def count_quota_keys(resource: str) -> tuple[str, str]:
    """The ResourceQuota keys that cap a namespace's GPU count (``requests.nvidia.com/gpu``, and
    ``limits.nvidia.com/gpu`` as the review wrote it)."""
    return f"requests.{resource}", f"limits.{resource}"


def scoped_quota(quota: Mapping[str, Any]) -> bool:
    """Whether a ResourceQuota is scoped (a non-empty ``spec.scopes`` or
    ``spec.scopeSelector.matchExpressions``): the API server applies it only to the pods its scopes
    match, and never to a ResourceClaim (its claim evaluator matches no scope)."""
    spec = quota.get("spec") if isinstance(quota, Mapping) else None
    if not isinstance(spec, Mapping):
        return False
    selector = spec.get("scopeSelector")
    expressions = selector.get("matchExpressions") if isinstance(selector, Mapping) else None
    return bool(spec.get("scopes")) or bool(expressions)


def gpu_count_room(quotas: Iterable[Any], namespace: str, resource: str, held: int) -> int | None:
    """The GPUs ``namespace`` may still be given under its ResourceQuotas' GPU count limits
    (:func:`count_quota_keys` of ``resource``, the vendor's count resource); None when none of its
    quotas sets one. For each such limit: ``spec.hard`` less what the API server counted against
    it (``status.used``: the pods that ask for the resource itself, the extender's) less ``held``,
    the devices the namespace's claims of this driver ask or hold (:func:`claim_devices`), which
    the API server counts only under ``<class>.deviceclass.resource.k8s.io/devices``: the
    smallest. ``quotas`` may hold other namespaces' (left out). A value that cannot be read is
    left out, as the ledger leaves out a memory limit it cannot read (the quota's other limits
    apply). Only the DRA front end needs it: a pod it translates asks for no ``nvidia.com/gpu``,
    so before this its 8 GPUs passed a quota of 1 (review, 1 Dec).

    A scoped quota (:func:`scoped_quota`: ``PriorityClass In [gpu-high]``, ``Terminating``, ...)
    is left out, for pods and claims alike: the API server never counts a claim against one, and
    the devices ``held`` cannot be told apart by the scope of the pod that uses them (a claim
    carries no priority class), so the same limit applied to every pod refused the pods it was
    written for (a ``NotIn [gpu-high]`` quota of 0 refused the gpu-high pods; review, 1 Dec).
    Only unscoped quotas count the DRA front end's GPUs (docs/dra.md)."""
    rooms: list[int] = []
    for q in quotas:
        meta = q.get("metadata") if isinstance(q, Mapping) else None
        if not isinstance(meta, Mapping) or (meta.get("namespace") or "default") != namespace:
            continue
        if scoped_quota(q):
            continue
        spec, status = q.get("spec"), q.get("status")
        hard = spec.get("hard") if isinstance(spec, Mapping) else None
        used = status.get("used") if isinstance(status, Mapping) else None
        for key in count_quota_keys(resource):
            if not isinstance(hard, Mapping) or key not in hard:
                continue
            try:
                limit = math.floor(parse_quantity(hard[key], f"spec.hard.{key}"))
                counted = used.get(key) if isinstance(used, Mapping) else None
                taken = 0 if counted is None else math.ceil(parse_quantity(counted, f"status.used.{key}"))
            except CoreError:
                continue
            rooms.append(limit - taken - held)
    return min(rooms) if rooms else None


#: the annotation kube-scheduler puts on the claim it makes for a pod's extended resources
#: (KEP-5004, ``resource.k8s.io/v1`` ``ExtendedResourceClaimAnnotation``; its one value is "true")
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def extended_resource_claim(claim: Mapping[str, Any]) -> bool:
    """Whether ``claim`` is kube-scheduler's special claim for a pod's extended resources
    (:data:`EXTENDED_RESOURCE_CLAIM` is "true"): its devices are the pod's ``nvidia.com/gpu``,
    which the API server counts on the pod. Trusted as Kubernetes' own quota trusts it: a claim
    a user writes with it escapes the webhook's count, not the per-class
    ``<class>.deviceclass.resource.k8s.io/devices`` limit (docs/dra.md)."""
    meta = claim.get("metadata") if isinstance(claim, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and annotations.get(EXTENDED_RESOURCE_CLAIM) == "true"


def claim_devices(claim: Mapping[str, Any]) -> tuple[int, str | None]:
    """``(devices, unbounded)``: the devices ``claim`` holds of this driver (its allocation's
    results that are not admin access) once allocated, else the devices its requests of this
    driver's classes ask (``count``, a ``firstAvailable`` request at its largest alternative;
    admin access asks none, as for memory: :func:`hami.dra.claims.claim_ask`). ``unbounded``
    names a request of ``allocationMode: All`` (not counted). What GPU count quotas count of a
    claim (:func:`gpu_count_room`); raises CoreError naming a count that is not a quantity.

    kube-scheduler's special claim for a pod's extended resources (KEP-5004: a plain
    ``nvidia.com/gpu: 1`` served by the share class, :func:`extended_resource_claim`) counts
    nothing: the pod asks for ``nvidia.com/gpu`` itself, which the API server has already counted
    in ``status.used`` (before 1 Dec it counted twice, and the special claim of a pod that used
    the last GPU of the quota was refused: the pod never started; review). Its memory and cores
    still count against ``limits.nvidia.com/gpumem`` / ``gpucores``, which the pod does not ask."""
    from hami.dra.claims import WHOLE_CORES  # the DRA model, only for claims
    from hami.dra.model import DRIVER

    def obj(value: Any) -> Mapping[str, Any]:
        return value if isinstance(value, Mapping) else {}

    if extended_resource_claim(claim):
        return 0, None
    allocation = obj(obj(claim.get("status")).get("allocation"))
    results = obj(allocation.get("devices")).get("results")
    if allocation:
        return (
            sum(
                1
                for r in (results if isinstance(results, list) else ())
                if isinstance(r, Mapping) and r.get("driver") == DRIVER and r.get("adminAccess") is not True
            ),
            None,
        )
    requests = obj(obj(claim.get("spec")).get("devices")).get("requests")
    total, unbounded = 0, None
    for i, request in enumerate(requests if isinstance(requests, list) else ()):
        request = obj(request)
        name = request.get("name") if isinstance(request.get("name"), str) else str(i)
        first = request.get("firstAvailable")
        subs = [("exactly", obj(request.get("exactly")))] if request.get("exactly") is not None else []
        subs += [(f"firstAvailable[{j}]", obj(x)) for j, x in enumerate(first if isinstance(first, list) else ())]
        most = 0
        for where, sub in subs:
            if sub.get("deviceClassName") not in WHOLE_CORES or sub.get("adminAccess") is True:
                continue
            at = f"spec.devices.requests[{name}].{where}"
            if (sub.get("allocationMode") or "ExactCount") == "All":
                unbounded = unbounded or f"{at}.allocationMode=All"
                continue
            most = max(most, parse_int_quantity(sub.get("count", 1), f"{at}.count"))
        total += most
    return total, unbounded


def _count_excess(need: int, unbounded: str | None, ns: str, s: AdmissionSettings, gpu_room: GpuRoom | None) -> str:
    """Why ``need`` devices (and a request of them not bounded) do not fit ``ns``'s GPU count
    quota ("" when they do, or there is none): the memory quota's message, for the count."""
    nvidia = s.nvidia
    if gpu_room is None or nvidia is None or not nvidia.resources.count or not (need or unbounded):
        return ""
    left = gpu_room(ns)
    if left is None:
        return ""
    if unbounded:
        return f"{unbounded} cannot be counted against namespace {ns}'s {nvidia.resources.count} quota; ask for a count"
    return quota_message(nvidia.resources.count, need, left, ns) if need > left else ""


def decide(
    pod: Mapping[str, Any],
    s: AdmissionSettings,
    namespace_labels: Mapping[str, str] | None = None,
    quota_room: Callable[[str, Sequence[Any]], Any] | None = None,
    *,
    gpu_room: GpuRoom | None = None,
) -> Decision:
    """Apply the rules to a pod being created. ``namespace_labels`` is needed only when
    :func:`uses_disable_control` is non-empty; ``quota_room(ns, vendors)`` gives the quota room;
    ``gpu_room(ns)`` the GPU count quota's (:data:`GpuRoom`; the DRA front end's pods only).
    A pod that asks for no device is allowed as it is (no defaults, no patch)."""
    try:
        check_pod(pod, "pod")
    except ShapeError as exc:
        return _deny(str(exc), 400)
    return _decide_checked(pod, s, namespace_labels, quota_room, gpu_room)


def _decide_checked(
    pod: Mapping[str, Any],
    s: AdmissionSettings,
    namespace_labels: Mapping[str, str] | None,
    quota_room: Callable[[str, Sequence[Any]], Any] | None,
    gpu_room: GpuRoom | None = None,
) -> Decision:
    """:func:`decide` for a pod whose shape was checked (the shape check is the costliest step
    of an admission: one per admission, in :func:`review_with_templates`)."""
    meta = pod.get("metadata") or {}
    if not (pod.get("spec") or {}).get("containers"):
        return _deny("pod has no containers", 400)
    keys = sorted(k for k in (meta.get("annotations") or {}) if s.internal_annotation(k))
    labels = sorted(k for k in (meta.get("labels") or {}) if k in INTERNAL_LABELS)
    if not keys and not labels:
        return _decide_clean(pod, s, namespace_labels, quota_room, gpu_room)
    # A copy of a placed pod (kubectl debug --copy-to, a re-applied `get -o yaml`, a restore)
    # carries the decision of another pod: it is removed, never trusted, and the pod is placed
    # afresh (HAMi admits such a pod and overwrites the decision at Filter). The allocation guard
    # refuses the keys on any pod this webhook does not see.
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in keys}
    lab = {k: v for k, v in (meta.get("labels") or {}).items() if k not in labels}
    clean = {**pod, "metadata": {**meta, "annotations": ann, "labels": lab}}
    for part, value in (("annotations", meta.get("annotations")), ("labels", meta.get("labels"))):
        if value is None:
            clean["metadata"].pop(part)
    d = _decide_clean(clean, s, namespace_labels, quota_room, gpu_room)
    removed = ", ".join(keys + [f"label {k}" for k in labels])
    note = f"hami: removed the internal annotations only hami scheduler writes (the pod is placed afresh): {removed}"
    return replace(d, warnings=d.warnings + (note,))


def _decide_clean(
    pod: Mapping[str, Any],
    s: AdmissionSettings,
    namespace_labels: Mapping[str, str] | None,
    quota_room: Callable[[str, Sequence[Any]], Any] | None,
    gpu_room: GpuRoom | None = None,
) -> Decision:
    """:func:`_decide_checked` for a pod without internal annotations."""
    switches = [(c, v) for c, v in isolation_switches(pod) if v == DISABLE_CONTROL_ENV or not _policy_is_disable(s)]
    if switches and (namespace_labels or {}).get(s.disable_control_label) != "true":
        container, variable = switches[0]
        what = variable if variable == DISABLE_CONTROL_ENV else f"{variable}=disable"
        return _deny(
            f"container {container!r} sets {what}, which switches GPU isolation off; "
            f"allowed only in namespaces labelled {s.disable_control_label}=true"
        )
    if not _gate_passes(pod, s):
        return _other_scheduler(pod, s)
    try:
        mutated, uses = admit_pod(pod, s.vendors, check_selection=True)
    except CoreError as exc:
        return _deny(str(exc), 400)
    if not uses:  # nothing to route or default (overwriteEnv's NVIDIA_VISIBLE_DEVICES=none aside)
        return Decision(True, "", mutated)
    if uses:
        if bad := priority_error(mutated, s):
            return _deny(bad, 400)
        if bad := reserved_env_error(pod, s) or reserved_mount_error(pod, s):
            return _deny(bad)
        for c in _containers(mutated):
            if ((c.get("securityContext") or {}).get("privileged")) is True:
                return _deny(
                    f"container {c.get('name')!r} is privileged: a privileged container sees every GPU, "
                    "so it cannot be given a GPU share"
                )
            if (cap := sys_admin(c)) is not None:
                return _deny(
                    f"container {c.get('name')!r} adds capability {cap!r}: the NVIDIA container runtime counts "
                    "a container holding CAP_SYS_ADMIN as privileged (its NVIDIA_VISIBLE_DEVICES, from the image "
                    "or an envFrom, is then honoured: every GPU), and it could unmount the GPU share's files, so "
                    "it cannot be given a GPU share"
                )
        spec = mutated.setdefault("spec", {})
        if spec.get("nodeName"):  # either front end: no scheduler of ours would have placed it
            return _deny(
                f"pod has node assigned (spec.nodeName={spec['nodeName']}): a GPU pod must be placed by the scheduler"
            )
        if s.scheduler_name and s.front_end == "extender":
            spec["schedulerName"] = s.scheduler_name
        notes = tuple(ignored_asks(pod, mutated, s))
        if s.front_end == "dra":
            d = _dra_quota(_to_dra(mutated, s, switches), s, quota_room, gpu_room)
            return replace(d, warnings=notes + d.warnings) if d.allowed else d
        if quota_room is not None:
            try:
                excess = _quota_excess(mutated, s, quota_room)
            except CoreError as exc:
                return _deny(str(exc), 400)
            if excess:
                return _deny(excess)
        return Decision(True, "", mutated, warnings=notes)
    return Decision(True, "", mutated)


def _dra_quota(
    d: Decision,
    s: AdmissionSettings,
    quota_room: Callable[[str, Sequence[Any]], Any] | None,
    gpu_room: GpuRoom | None = None,
) -> Decision:
    """The quota check of a pod the DRA front end translated (:func:`_to_dra`): its NVIDIA share is
    what its claims will ask when kube-controller-manager makes them (each claim is checked
    again then, :func:`decide_claim`), its other vendors' devices as on the extender path; and
    the GPU count quota (``requests.nvidia.com/gpu``), which the API server no longer counts for
    the pod, counts its claims' devices (:func:`gpu_count_room`)."""
    if not d.allowed or d.pod is None:
        return d
    ns = (d.pod.get("metadata") or {}).get("namespace") or "default"
    if gpu_room is not None:
        try:
            need, unbounded = _claims_devices(d.pod, d.templates)
        except CoreError as exc:
            return _deny(str(exc), 400)
        if excess := _count_excess(need, unbounded, ns, s, gpu_room):
            return _deny(excess)
    if quota_room is None:
        return d
    quota = quota_room(ns, s.vendors)
    if quota is None:
        return d
    nvidia = s.nvidia
    claims = {nvidia.name: _claims_ask(d.pod, d.templates, quota.claim_sizes)} if nvidia is not None else None
    try:
        excess = _quota_excess(d.pod, s, quota_room, claims)
    except CoreError as exc:
        return _deny(str(exc), 400)
    return _deny(excess) if excess else d


def _claims_devices(pod: Mapping[str, Any], templates: Sequence[Mapping[str, Any]]) -> tuple[int, str | None]:
    """The devices the claims the pod's translated entries make will ask (:func:`claim_devices`),
    one claim per ``resourceClaims`` entry naming one of ``templates``: the sum, an init
    container's own claim included (not Kubernetes' max of init and app containers): a claim is
    held for the pod's whole life, and each is checked again at its creation (:func:`decide_claim`),
    so the larger alone would admit a pod whose second claim is refused (review, 1 Dec; docs/dra.md)."""
    specs = {(t.get("metadata") or {}).get("name"): (t.get("spec") or {}).get("spec") or {} for t in templates}
    total, unbounded = 0, None
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        spec = specs.get(entry.get("resourceClaimTemplateName"))
        if spec is not None:
            n, bad = claim_devices({"spec": spec})
            total, unbounded = total + n, unbounded or bad
    return total, unbounded


def _to_dra(pod: dict, s: AdmissionSettings, switches: Sequence[tuple[str, str]] = ()) -> Decision:
    from hami.dra.translate import translate  # the DRA front end only

    nvidia = s.nvidia
    # other vendors' devices have no DRA driver here: only the extender places them, so a pod that
    # is not routed to it explicitly would sit with kube-scheduler and never get them
    scheduler = (pod.get("spec") or {}).get("schedulerName") or ""
    if not s.scheduler_name or scheduler != s.scheduler_name:
        try:
            req = pod_request(pod, s.vendors)
        except CoreError as exc:
            return _deny(str(exc), 400)
        for c in req.containers:
            for r in c.requests:
                if r.vendor != "NVIDIA":
                    name = next((v.resources.count for v in s.vendors if v.name == r.vendor), r.vendor)
                    return _deny(
                        f"container {c.name!r}: {name} cannot be expressed on the DRA front end (its DRA driver "
                        f"serves NVIDIA GPUs only); set spec.schedulerName: {s.scheduler_name or 'hami-scheduler'} "
                        "to have the extender place it, or use the extender front end",
                        400,
                    )
    if nvidia is None:
        return Decision(True, "", pod)
    ns = (pod.get("metadata") or {}).get("namespace") or ""
    notes: list[str] = []
    try:
        # the pod is admit_pod's copy, made for this admission: translated in place
        out, templates = translate(pod, nvidia, s.dra_device_class, ns, owned=True, notes=notes)
    except CoreError as exc:
        return _deny(str(exc), 400)
    notes += _isolation_notes(out, switches)
    return Decision(True, "", out, templates=tuple(templates), warnings=tuple(f"hami: {n}" for n in notes))


def _isolation_notes(pod: Mapping[str, Any], switches: Sequence[tuple[str, str]]) -> list[str]:
    """A note for each GPU container (one the translation gave a claim) whose env switches isolation
    off (admitted in a namespace that allows it): the claim's CDI spec sets libvgpu's variables and
    mounts its preload whatever the container's env says, so the switch has no effect on DRA."""
    from hami.dra.translate import CLAIM_PREFIX  # the DRA front end only

    with_claims = {
        c.get("name")
        for c in _containers(pod)
        if any(
            str(ref.get("name", "")).startswith(CLAIM_PREFIX) for ref in (c.get("resources") or {}).get("claims") or ()
        )
    }
    ignored = [str(c)[:30] for c, _ in switches if c in with_claims]
    if not ignored:
        return []
    # one line (warnings: under 120 characters each, few): the class to use instead, the containers
    return [_listed(f"isolation opt-out ignored on DRA, use class {DRA_WHOLE_CLASS}: ", ignored)]


def _listed(head: str, names: Sequence[str], width: int = 119 - len("hami: ")) -> str:
    """``head`` and as many of ``names`` as fit in ``width`` characters, then ``+N`` for the rest
    (at least the first name: a warning that names no container says too little)."""
    for shown in range(len(names), 0, -1):
        more = f" +{len(names) - shown}" if shown < len(names) else ""
        line = f"{head}{', '.join(names[:shown])}{more}"
        if len(line) <= width or shown == 1:
            return line
    return head.rstrip(": ")


# ---------------------------------------------------------------------- JSON patch (RFC 6902)


def _ptr(token: Any) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def json_patch(old: Any, new: Any, path: str = "") -> list[dict]:
    """A patch turning ``old`` into ``new``: recursive on objects, whole-value on lists that
    differ in length, element-wise on lists of equal length."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict] = []
        for k in old:
            if k not in new:
                ops.append({"op": "remove", "path": f"{path}/{_ptr(k)}"})
        for k, v in new.items():
            if k not in old:
                ops.append({"op": "add", "path": f"{path}/{_ptr(k)}", "value": v})
            else:
                ops.extend(json_patch(old[k], v, f"{path}/{_ptr(k)}"))
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [op for i, (a, b) in enumerate(zip(old, new)) for op in json_patch(a, b, f"{path}/{i}")]
    return [{"op": "replace", "path": path or "", "value": new}]


def review(
    body: Mapping[str, Any],
    s: AdmissionSettings,
    namespace_labels: Mapping[str, str] | None = None,
    quota_room: Callable[[str, Sequence[Any]], Any] | None = None,
    *,
    gpu_room: GpuRoom | None = None,
) -> dict:
    """AdmissionReview request -> AdmissionReview response (same apiVersion as the request)."""
    return review_with_templates(body, s, namespace_labels, quota_room, gpu_room=gpu_room)[0]


def review_with_templates(
    body: Mapping[str, Any],
    s: AdmissionSettings,
    namespace_labels: Mapping[str, str] | None = None,
    quota_room: Callable[[str, Sequence[Any]], Any] | None = None,
    *,
    tree_checked: bool = False,
    gpu_room: GpuRoom | None = None,
) -> tuple[dict, tuple[dict, ...]]:
    """:func:`review` plus the ResourceClaimTemplates an allowed pod needs (DRA front end); the
    caller must create them (in the request's namespace) before sending the answer, unless the
    request is a dry run (:func:`is_dry_run`: the patch names them all the same, nothing is written).
    The server refuses a namespace or pod name that could not be the API server's before it
    calls this (:func:`name_error`); this pure function does not look at them (``hami simulate``).
    ``tree_checked``: the caller ran :func:`hami.core.shape.check_tree` over the whole ``body``
    with the default limits or tighter (the server does, on every request body), so the pod's
    subtree is not walked again (only its fields are checked). ``gpu_room``: the GPU count
    quota's room (:data:`GpuRoom`), for pods of the DRA front end and claims."""
    templates: tuple[dict, ...] = ()
    request = body.get("request") if isinstance(body, Mapping) else None
    try:
        check(body, REVIEW, "")
    except ShapeError as exc:
        request = request if isinstance(request, Mapping) else {}
        uid = request.get("uid") if isinstance(request.get("uid"), str) else ""
        return _answer(
            body,
            {
                "uid": uid,
                "allowed": False,
                "status": {"code": 400, "message": f"not an AdmissionReview: {exc}", "reason": "BadRequest"},
            },
        ), ()
    request = request or {}
    uid = request.get("uid") or ""
    pod = request.get("object")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if is_claim_create(request) or is_template_create(request):
        if isinstance(pod, dict):
            # metadata that is not an object (only in a body sent to the port by hand: the API
            # server sends typed objects) is read as empty, not an exception and a 500
            meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
            claim = {**pod, "metadata": meta}
            if not meta.get("namespace") and request.get("namespace"):
                claim = {**claim, "metadata": {**meta, "namespace": request["namespace"]}}
            verdict = (
                decide_claim(claim, s, quota_room, gpu_room=gpu_room)
                if is_claim_create(request)
                else decide_template(claim)
            )
            if not verdict.allowed:
                reason = "Forbidden" if verdict.code == 403 else "BadRequest"
                status = {"code": verdict.code, "message": verdict.message, "reason": reason}
                response = {"uid": uid, "allowed": False, "status": status}
            elif verdict.warnings:
                response["warnings"] = list(verdict.warnings)
    elif not is_pod_create(request):
        pass
    elif not isinstance(pod, dict):
        response = {"uid": uid, "allowed": False, "status": {"code": 400, "message": "request.object is not a Pod"}}
    elif (bad := _shape_error(pod, tree_checked)) is not None:
        response = {"uid": uid, "allowed": False, "status": {"code": 400, "message": bad, "reason": "BadRequest"}}
    else:
        if not (pod.get("metadata") or {}).get("namespace") and request.get("namespace"):
            pod = {**pod, "metadata": {**(pod.get("metadata") or {}), "namespace": request["namespace"]}}
        d = _decide_checked(pod, s, namespace_labels, quota_room, gpu_room)
        templates = d.templates
        if not d.allowed:
            response = {
                "uid": uid,
                "allowed": False,
                "status": {
                    "code": d.code,
                    "message": d.message,
                    "reason": "Forbidden" if d.code == 403 else "BadRequest",
                },
            }
        else:
            ops = json_patch(request.get("object"), _strip_ns(d.pod, request.get("object")))
            if ops:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        if d.warnings:
            response["warnings"] = list(d.warnings)
    return _answer(body, response), templates


_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 429: "TooManyRequests"}


def deny_answer(answer: dict, message: str, code: int = 500) -> dict:
    """``answer`` turned into a denial (e.g. the templates it needs could not be created)."""
    uid = (answer.get("response") or {}).get("uid") or ""
    return {
        **answer,
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {"code": code, "message": message, "reason": _REASONS.get(code, "InternalError")},
        },
    }


#: the fields of an AdmissionReview that :func:`review` reads (``request.object`` is checked as a Pod)
REVIEW = {
    "apiVersion": str,
    "request": {"uid": str, "operation": str, "namespace": str, "dryRun": bool, "kind": {"kind": str}},
}


def _shape_error(pod: Any, tree_checked: bool = False) -> str | None:
    try:
        if tree_checked:  # a subtree of a checked tree: within the same depth and size limits
            check(pod, POD, "request.object")
        else:
            check_pod(pod, "request.object")
    except ShapeError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------- names from the body
#
# Anyone who reaches the webhook's port can send an AdmissionReview (the API server does not
# authenticate itself to webhooks), and the namespace it names goes into the scheduler's own API
# URLs (the namespace read, the DRA front end's template create). The API server only ever sends
# names it validated (a namespace is a DNS-1123 label; a pod's name a DNS-1123 subdomain, or
# empty before generateName is applied), so refusing anything else costs a real request nothing.

_LABEL_RULE = (
    "a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
)
_SUBDOMAIN_RULE = "a DNS-1123 subdomain: at most 253 characters, DNS-1123 labels joined by '.'"


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def name_error(request: Mapping[str, Any], pod: Any) -> str | None:
    """Why the namespace or pod name an AdmissionReview names cannot be used (in an API URL), or
    None. Values of the wrong type are left to the shape check (:data:`REVIEW`, ``POD``)."""
    ns = request.get("namespace")
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    pod_ns, pod_name = meta.get("namespace"), meta.get("name")
    for where, value in (("request.namespace", ns), ("request.object.metadata.namespace", pod_ns)):
        if isinstance(value, str) and value and not is_dns1123_label(value):
            return f"{where}: {_shown(value)} is not a namespace name ({_LABEL_RULE})"
    if isinstance(ns, str) and ns and isinstance(pod_ns, str) and pod_ns and ns != pod_ns:
        return f"request.object.metadata.namespace {_shown(pod_ns)} is not the request's namespace {_shown(ns)}"
    if isinstance(pod_name, str) and pod_name and not is_dns1123_subdomain(pod_name):
        kind = "ResourceClaim" if is_claim_create(request) else "pod"
        return f"request.object.metadata.name: {_shown(pod_name)} is not a {kind} name ({_SUBDOMAIN_RULE})"
    return None


def request_namespace(request: Mapping[str, Any], pod: Any) -> str:
    """The namespace the pod is created in (the request's, else the pod's, else ``default``);
    valid only where :func:`name_error` found nothing."""
    ns = request.get("namespace")
    if isinstance(ns, str) and ns:
        return ns
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    pod_ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    return pod_ns if isinstance(pod_ns, str) and pod_ns else "default"


def is_pod_create(request: Mapping[str, Any]) -> bool:
    """The only requests the rules look at (everything else is allowed as it is)."""
    kind = request.get("kind")
    kind_name = kind.get("kind") if isinstance(kind, Mapping) else None
    return (request.get("operation") or "CREATE") == "CREATE" and (kind_name or "Pod") == "Pod"


def _creates(request: Mapping[str, Any], kind_name: str) -> bool:
    """Whether the review is of a CREATE of an object of kind ``kind_name``."""
    kind = request.get("kind")
    return request.get("operation") == "CREATE" and isinstance(kind, Mapping) and kind.get("kind") == kind_name


def is_claim_create(request: Mapping[str, Any]) -> bool:
    """A ResourceClaim being created (the DRA driver's claims: :func:`decide_claim`)."""
    return _creates(request, "ResourceClaim")


def is_template_create(request: Mapping[str, Any]) -> bool:
    """A ResourceClaimTemplate being created (its claim spec is checked: :func:`decide_template`)."""
    return _creates(request, "ResourceClaimTemplate")


def _where(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    return f"{kind} {meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('generateName') or ''}"


def decide_template(template: Mapping[str, Any]) -> Decision:
    """A ResourceClaimTemplate whose claim spec breaks this driver's configuration rules
    (:func:`hami.dra.gpuconfig.claim_spec_error`) is refused (400) at its creation: every claim
    made from it would be refused, and before this check each was, at prepare, after its pod was
    scheduled. Nothing else of a template is looked at (it consumes nothing: its claims are
    checked against the quota, :func:`decide_claim`)."""
    from hami.dra.gpuconfig import claim_spec_error  # the DRA model, only for claims

    spec = template.get("spec")
    claim_spec = spec.get("spec") if isinstance(spec, Mapping) else None
    if bad := claim_spec_error(claim_spec, path="spec.spec"):
        return _deny(f"{_where('ResourceClaimTemplate', template)}: {bad}", 400)
    return Decision(True, warnings=_priority_notes(claim_spec))


def _priority_notes(spec: Any) -> tuple[str, ...]:
    """A warning for requests with a priority that do not select devices whose agent honours it
    (:func:`hami.dra.gpuconfig.unselected_priorities`): on a node whose agent predates the field
    the claim would run at the default priority, unseen. A warning, not a refusal: every agent of
    this version honours the priority, and the selector is the user's to choose. The same for a
    ``corePolicy`` without a ``corePolicy`` selector (:func:`hami.dra.gpuconfig.unselected_core_policies`):
    an older agent refuses it at prepare, and the pod placed there never starts."""
    from hami.dra.gpuconfig import unselected_core_policies, unselected_priorities
    from hami.dra.model import CORE_POLICY, TASK_PRIORITY

    notes = []
    if names := unselected_priorities(spec):
        notes.append(
            "hami: " + _listed(f"priority without a {TASK_PRIORITY} selector (older agents ignore it): ", names)
        )
    if names := unselected_core_policies(spec):
        notes.append(
            "hami: " + _listed(f"corePolicy without a {CORE_POLICY} selector (older agents refuse it): ", names)
        )
    return tuple(notes)


def decide_claim(
    claim: Mapping[str, Any],
    s: AdmissionSettings,
    quota_room: Callable[[str, Sequence[Any]], Any] | None,
    *,
    gpu_room: GpuRoom | None = None,
) -> Decision:
    """(security, beyond HAMi) A ResourceClaim asking for this driver's GPUs must fit its
    namespace's quota (``limits.nvidia.com/gpumem`` / ``gpucores``), as a pod asking for them
    must: a pod naming a claim of its own (written by hand, or from a template of its own)
    asks for no extended resource, so the pod's quota check never sees it, and kube-scheduler
    allocates it without looking at the quota. Claims the controller makes from the webhook's
    templates come here too. What the claim asks is :func:`hami.dra.claims.claim_ask` (a
    request without a memory amount counts the largest device of its class published, the
    room's ``claim_sizes``; under a memory quota it is refused while none is); the room is what
    allocated claims and placed pods leave (the same ledger).

    First (400), a configuration of this driver the node agent would refuse at prepare
    (:func:`hami.dra.gpuconfig.claim_spec_error`: a ``GpuConfig`` field it does not know, an
    isolation or priority out of its values, a priority where no libvgpu runs, requests at two
    priorities), the same rules and message: refused here, the claim's pod never gets scheduled
    only to fail to start.

    Its devices must also fit the namespace's GPU count quota (``requests.nvidia.com/gpu``,
    ``gpu_room``: :func:`gpu_count_room`): the API server counts a claim's devices only under
    ``<class>.deviceclass.resource.k8s.io/devices``, so a claim asking 8 GPUs passed a quota of 1
    that a pod asking ``nvidia.com/gpu: 8`` on the extender would not (review, 1 Dec)."""
    from hami.dra.claims import ClaimError, claim_ask  # the DRA model, only for claims
    from hami.dra.gpuconfig import claim_spec_error

    meta = claim.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    where = _where("ResourceClaim", claim)
    if bad := claim_spec_error(claim.get("spec")):
        return _deny(f"{where}: {bad}", 400)
    notes = _priority_notes(claim.get("spec"))
    try:
        ask = claim_ask(claim)
        devices, unbounded = claim_devices(claim) if gpu_room is not None else (0, None)
    except (ClaimError, CoreError) as exc:
        return _deny(f"{where}: {exc}", 400)
    if excess := _count_excess(devices, unbounded, ns, s, gpu_room):
        return _deny(f"{where}: {excess}")
    nvidia = s.nvidia
    if ask is None or quota_room is None or nvidia is None:
        return Decision(True, warnings=notes)
    quota = quota_room(ns, s.vendors)
    mem_room, core_room = quota.room.get(nvidia.name, (None, None)) if quota is not None else (None, None)
    if quota is None or (mem_room is None and core_room is None):
        return Decision(True, warnings=notes)
    if ask.unbounded:
        return _deny(f"{where}: {ask.unbounded} cannot be counted against namespace {ns}'s GPU quota; ask for a count")
    ask = claim_ask(claim, sizes=quota.claim_sizes) or ask
    if ask.sizeless and mem_room is not None:
        return _deny(
            f"{where}: {ask.sizeless} asks for a whole device's memory and no device of its class is published "
            f"yet, so it cannot be counted against namespace {ns}'s GPU memory quota; ask for "
            "capacity.requests.memory, or create it once the driver's ResourceSlices are published"
        )
    for n, left, res, factor in (
        (ask.memory_mib, mem_room, nvidia.resources.memory, nvidia.resources.memory_factor),
        (ask.cores, core_room, nvidia.resources.cores, 1),
    ):
        if left is not None and n > left:
            return _deny(f"{where}: {quota_message(res, n, left, ns, factor)}")
    return Decision(True, warnings=notes)


def is_dry_run(request: Mapping[str, Any]) -> bool:
    """``request.dryRun``: the API server persists nothing, so the webhook must write nothing."""
    return request.get("dryRun") is True


def deny_review(body: Any, message: str, code: int = 500) -> dict:
    """A denial answering ``body`` before its pod was looked at (e.g. its namespace is unreadable)."""
    request = body.get("request") if isinstance(body, Mapping) else None
    uid = request.get("uid") if isinstance(request, Mapping) else None
    return deny_answer(_answer(body, {"uid": uid if isinstance(uid, str) else ""}), message, code)


def _answer(body: Any, response: dict) -> dict:
    version = body.get("apiVersion") if isinstance(body, Mapping) else None
    return {
        "apiVersion": version if isinstance(version, str) and version else "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


def _strip_ns(mutated: dict, original: Any) -> dict:
    """Undo the namespace we filled in for decisions (the API server sets it itself)."""
    if isinstance(original, dict) and not (original.get("metadata") or {}).get("namespace"):
        meta = dict(mutated.get("metadata") or {})
        meta.pop("namespace", None)
        if "metadata" in original or meta:
            return {**mutated, "metadata": meta}
    return mutated
