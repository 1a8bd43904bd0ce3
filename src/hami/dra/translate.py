"""HAMi's resource requests turned into DRA claims, so that manifests work unchanged on the DRA
front end (pure: the webhook calls :func:`translate` and creates the templates it returns).

A container asking for ``nvidia.com/gpu: N`` (+ ``gpumem`` / ``gpumem-percentage`` /
``gpucores``), after the same admission defaults as on the extender path, gets a claim (its own,
or one shared with the pod's init containers, below) from a ResourceClaimTemplate whose one request asks the share class for N devices with these
capacity requests:

================================================  ==========================================
HAMi request (after defaults)                     DRA request
================================================  ==========================================
``gpumem: M`` (MiB, times ``memoryFactor``), or   ``capacity.requests.memory: <M>Mi``, whatever
``defaultMemory`` when none is asked              the cores: it is the container's hard limit,
                                                  on the extender as here
no memory, or ``gpumem-percentage: 100`` alone    no memory request: the device's default,
                                                  which is all of its memory
``gpumem-percentage: P`` (P < 100) without        refused: DRA capacity requests are amounts,
``gpumem``                                        not fractions of a device of unknown size
                                                  (beside ``gpumem`` it is ignored, as the
                                                  extender ignores it: ``gpumem`` is asked)
``gpucores: C`` (C > 0)                           ``capacity.requests.cores: C``
no cores (0)                                      no cores request: the device's default, a
                                                  thousandth of a core
                                                  (:data:`hami.dra.model.IDLE_CORES`), which
                                                  keeps the share off a GPU whose cores are
                                                  all taken, as HAMi does; written out as
                                                  ``1m`` when the webhook's ``defaultCores``
                                                  is set (the node's default would be that)
``gpucores: 100`` (HAMi: the GPU is exclusive)    cores 100: no other share fits beside it
N > 1                                             a ``distinctAttribute`` constraint on the
                                                  UUID: N different GPUs, as HAMi gives
``nvidia.com/priority: P`` (0..1000, 0 high)     the claim's configuration for its request:
                                                  a ``GpuConfig`` with ``priority: P``, which
                                                  the kubelet plugin gives libvgpu as
                                                  ``CUDA_TASK_PRIORITY`` (as the device plugin
                                                  does from the resource), and a selector of
                                                  devices whose agent publishes
                                                  ``taskPriority`` (an older one ignored the
                                                  field); any other value is refused. On the
                                                  whole-GPU class (no libvgpu, whose plugin
                                                  refuses a priority) it is left out, noted,
                                                  as the extender ignores it without libvgpu
``GPU_CORE_UTILIZATION_POLICY=force`` in the      ``corePolicy: force`` in the same
container's env (any letter case)                 ``GpuConfig``, which the kubelet plugin
                                                  writes into the CDI spec and grant (the
                                                  extender's grant file copies the env's
                                                  value), and a selector of devices whose
                                                  agent publishes ``corePolicy`` (an older
                                                  one refuses the field at prepare);
                                                  containers of different policies
                                                  never share a claim. Left out, noted, on the
                                                  whole-GPU class
``nvidia.com/gpu: 0``                             no claim, and the container's other NVIDIA
                                                  resources are removed (the extender ignores
                                                  them; the admission warns): left, no DRA
                                                  node advertises them
================================================  ==========================================

The template name is derived from its content (``hami-gpu-<hash>``), so every pod with the same
request shares one template per namespace and creating it again is a no-op. The container's GPU
resources are removed from ``limits``/``requests`` (nothing advertises them on a DRA node) and a
``resources.claims`` entry names the pod's claim. A claim is held for the pod's whole life, so
the init containers that run to completion (they run one at a time, and have exited before the
app containers start) share one claim with one app container, the one whose request it enlarges
least; the claim is sized to the larger of their requests in each dimension (GPU count, memory
and cores per GPU): HAMi counts the larger of a pod's init and app containers. Every other app
container (app containers run together and must not share one budget) and every sidecar (an init
container with ``restartPolicy: Always``, which runs beside them) has a claim of its own. An app
container given more than it asked, through such a shared claim, is noted. A claim has one task
priority, so only containers running at one priority (no priority is libvgpu's, 1) and one compute
policy share a claim: the init containers of each share one, with an app container of the same,
and each container runs at its own priority and policy, as on the extender. Init containers of several priorities
therefore hold several claims for the pod's life where the extender counts the largest once, and
an app container kept apart from the init containers by its priority holds one more: both are
noted.

HAMi's pod annotations that choose GPUs become part of every GPU claim of the pod, read by the
vendor's own parser (:meth:`hami.vendors.base.BaseVendor.selection`, the extender's):

=====================================  =====================================================
annotation                             claim
=====================================  =====================================================
``nvidia.com/use-gputype: A,B``        selector: the ``type`` attribute, lower-cased, contains
                                       ``a`` or ``b`` (HAMi: case-insensitive substring)
``nvidia.com/nouse-gputype: A,B``      selector: it contains neither
``nvidia.com/use-gpuuuid: U,V``        selector: the ``uuid`` attribute is one of them
``nvidia.com/nouse-gpuuuid: U,V``      selector: it is none of them
``nvidia.com/numa-bind: "true"``       N > 1: ``matchAttribute: gpu.hami.io/numa`` (HAMi keeps
                                       one container's GPUs on one NUMA node: the registration's,
                                       0 when unknown, which every device of the driver carries)
``nvidia.com/vgpu-mode``               accepted when it contains ``hami-core`` (the only mode
                                       the DRA driver publishes), refused otherwise
``hami.io/gpu-scheduler-policy``,      refused: kube-scheduler's allocator takes the first
``node-scheduler-policy``,             device that fits and scores nodes its own way
``device-scoring-weights``
=====================================  =====================================================

User values are written into CEL as string literals by :func:`cel_string`, which escapes every
quote, backslash and non-printable character, so a value cannot end the literal and add CEL of
its own. A refusal (:class:`TranslationError`) names the annotation and its value.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hami.core import pod_request
from hami.core.errors import RequestError
from hami.core.quantity import parse_int_quantity
from hami.core.names import (
    DEVICE_SCORING_WEIGHTS,
    ENV_CORE_POLICY,
    ENV_TASK_PRIORITY,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
)
from hami.core.types import PERCENT_UNSET

from .model import (
    CORE_POLICY,
    CORES,
    DEFAULT_PRIORITY,
    DRIVER,
    IDLE_CORES,
    MEMORY,
    PRIORITY_RANGE,
    SHARE_CLASS,
    TASK_PRIORITY,
    WHOLE_CLASS,
    gpu_config,
)

REQUEST_NAME = "gpu"
CLAIM_PREFIX = "hami-gpu-"
#: the driver's own NUMA attribute, published on every device (the registration's NUMA node, 0
#: when the kernel does not know it, as the extender reads it); the standard
#: ``resource.kubernetes.io/numaNode`` is left out there, so a constraint on it never held on
#: such a node (review, 1 Dec)
NUMA_ATTRIBUTE = f"{DRIVER}/numa"
#: the compute policy a container's ``GPU_CORE_UTILIZATION_POLICY`` may carry into its claim
#: (libvgpu reads ``force`` in any letter case; ``disable`` is the isolation opt-out, which the
#: DRA front end ignores with a warning, and anything else is libvgpu's default)
FORCE_POLICY = "force"


class TranslationError(RequestError):
    """A request that the DRA front end cannot express; names the container and resource, or the
    annotation and its value."""


#: the mode the DRA driver's devices are in (MIG-mode GPUs are not published)
DRA_MODE = "hami-core"
#: resource.k8s.io's CELSelectorExpressionMaxLength (the API server refuses a longer selector)
MAX_SELECTOR = 10 * 1024
_ATTRS = f'device.attributes["{DRIVER}"]'
#: what a claim carrying a priority asks of its devices: an agent that publishes
#: :data:`hami.dra.model.TASK_PRIORITY` (one that predates it ignored the field; an absent
#: attribute is tested with ``in``, as reading it would stop kube-scheduler's allocation)
PRIORITY_SELECTOR = f'"{TASK_PRIORITY}" in {_ATTRS}'
#: what a claim carrying a compute policy asks of its devices: an agent that publishes
#: :data:`hami.dra.model.CORE_POLICY` (one that predates it refuses the field at prepare, and the
#: pod placed there during an upgrade never started; review, 1 Dec)
CORE_POLICY_SELECTOR = f'"{CORE_POLICY}" in {_ATTRS}'
#: pod annotations the extender honours and the DRA front end cannot express, and why
UNEXPRESSIBLE = {
    GPU_SCHEDULER_POLICY: "kube-scheduler's allocator takes the first GPU that fits and has no GPU policy",
    NODE_SCHEDULER_POLICY: "kube-scheduler scores nodes with its own plugins, not HAMi's node policy",
    DEVICE_SCORING_WEIGHTS: "kube-scheduler's allocator does not score GPUs",
}


def cel_string(value: str) -> str:
    """``value`` as a CEL string literal: double quotes, with ``"`` and ``\\`` escaped and every
    character outside printable ASCII written as ``\\uXXXX`` / ``\\UXXXXXXXX``, so whatever the
    value holds it stays one literal. A lone surrogate (no Unicode character) is refused."""
    out = ['"']
    for ch in value:
        n = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0x20 <= n < 0x7F:
            out.append(ch)
        elif 0xD800 <= n <= 0xDFFF:
            raise ValueError(f"{value!r} holds a lone surrogate U+{n:04X}, which is not a character")
        elif n <= 0xFFFF:
            out.append(f"\\u{n:04x}")
        else:
            out.append(f"\\U{n:08x}")
    out.append('"')
    return "".join(out)


def _literals(values: Sequence[str], annotation: str, raw: str) -> list[str]:
    try:
        return [cel_string(v) for v in values]
    except ValueError as exc:
        raise TranslationError(f"annotation {annotation}={raw!r}: {exc}") from None


def annotation_selectors(pod: Mapping[str, Any], vendor: Any) -> tuple[list[str], bool]:
    """(CEL selectors, numa-bind) that HAMi's selection annotations of ``pod`` ask of every GPU
    claim of it; raises :class:`TranslationError` for an annotation the DRA front end cannot
    express. Parsed by ``vendor.selection`` (the extender's parser), so both paths read the
    annotations alike."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    where = f"pod {(pod.get('metadata') or {}).get('name') or '?'}"
    for key, why in UNEXPRESSIBLE.items():
        value = annotations.get(key)
        if isinstance(value, str) and value.strip():
            raise TranslationError(
                f"{where}: annotation {key}={value!r} cannot be expressed on the DRA front end ({why}); "
                "remove it, or use the extender front end"
            )
    sel = vendor.selection(annotations)
    mode_key = getattr(vendor, "mode_annotation", None)
    if sel.modes is not None and DRA_MODE not in sel.modes:
        raise TranslationError(
            f"{where}: annotation {mode_key}={sel.modes!r} cannot be expressed on the DRA front end "
            f"(its driver publishes {DRA_MODE} GPUs only, no MIG or MPS); remove it, or use the extender front end"
        )
    raw = {k: annotations.get(k) or "" for k in (vendor.use_type_annotation, vendor.nouse_type_annotation)}
    raw.update({k: annotations.get(k) or "" for k in (vendor.use_uuid_annotation, vendor.nouse_uuid_annotation)})
    selectors: list[str] = []
    typ = f"{_ATTRS}.type.lowerAscii()"
    if sel.use_types:
        key = vendor.use_type_annotation
        lits = _literals(sel.use_types, key, raw[key])
        selectors.append(" || ".join(f"{typ}.contains({lit})" for lit in lits))
    if sel.nouse_types:
        key = vendor.nouse_type_annotation
        lits = _literals(sel.nouse_types, key, raw[key])
        selectors.append(" && ".join(f"!{typ}.contains({lit})" for lit in lits))
    if sel.use_uuids:
        key = vendor.use_uuid_annotation
        lits = _literals(sorted(sel.use_uuids), key, raw[key])
        selectors.append(f"{_ATTRS}.uuid in [{', '.join(lits)}]")
    if sel.nouse_uuids:
        key = vendor.nouse_uuid_annotation
        lits = _literals(sorted(sel.nouse_uuids), key, raw[key])
        selectors.append(f"!({_ATTRS}.uuid in [{', '.join(lits)}])")
    for expr in selectors:
        if len(expr) > MAX_SELECTOR:
            raise TranslationError(
                f"{where}: the GPU type/UUID annotations make a CEL selector of {len(expr)} characters, "
                f"more than the API server's {MAX_SELECTOR}; list fewer values"
            )
    return selectors, sel.numa_bind


def _claim_spec(
    nums: int,
    memory_mib: int | None,
    cores: int,
    device_class: str,
    selectors: Sequence[str] = (),
    numa_bind: bool = False,
    idle: str | None = None,
    priority: int | None = None,
    core_policy: str | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if cores > 0:
        requests[CORES] = str(cores)
    elif idle is not None:  # no cores: the device's default (a thousandth), or ``idle`` said explicitly
        requests[CORES] = idle
    if memory_mib is not None:
        requests[MEMORY] = f"{memory_mib}Mi"
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": nums}
    if requests:
        exactly["capacity"] = {"requests": requests}
    if priority is not None:  # only devices whose agent honours it: an older one dropped it unseen
        selectors = [*selectors, PRIORITY_SELECTOR]
    if core_policy is not None:  # only devices whose agent takes it: an older one refused it at prepare
        selectors = [*selectors, CORE_POLICY_SELECTOR]
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    devices: dict[str, Any] = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
    if nums > 1:
        devices["constraints"] = [{"requests": [REQUEST_NAME], "distinctAttribute": f"{DRIVER}/uuid"}]
        if numa_bind:  # HAMi: all of a container's GPUs on one NUMA node (one GPU: nothing to align)
            devices["constraints"].append({"requests": [REQUEST_NAME], "matchAttribute": NUMA_ATTRIBUTE})
    params: dict[str, Any] = {}
    if priority is not None:  # the kubelet plugin's CUDA_TASK_PRIORITY (no priority: no entry, as before)
        params["priority"] = priority
    if core_policy is not None:  # its GPU_CORE_UTILIZATION_POLICY (none: no entry, as before)
        params["corePolicy"] = core_policy
    if params:
        devices["config"] = [{"requests": [REQUEST_NAME], **gpu_config(**params)}]
    return {"devices": devices}  # a ResourceClaimSpec


def template_name(spec: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return f"{CLAIM_PREFIX}{digest}"


def _strip(container: dict, names: Sequence[str]) -> None:
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict):
            for n in names:
                values.pop(n, None)
            if not values:
                resources.pop(section)


@dataclass(frozen=True)
class _Shape:
    """What one claim asks per GPU: ``nums`` GPUs, ``memory`` MiB each (None: all of it), ``cores``."""

    nums: int
    memory: int | None
    cores: int

    def join(self, other: "_Shape") -> "_Shape":
        """The larger of each dimension (all of the memory is larger than any amount)."""
        memory = None if None in (self.memory, other.memory) else max(self.memory or 0, other.memory or 0)
        return _Shape(max(self.nums, other.nums), memory, max(self.cores, other.cores))

    def growth(self, to: "_Shape") -> tuple[float, float, float]:
        """How much more ``to`` holds than this (GPUs, memory, cores over all GPUs): an app
        container is chosen to share an init container's claim where this is least."""
        mine = (self.memory if self.memory is not None else float("inf")) * self.nums
        theirs = (to.memory if to.memory is not None else float("inf")) * to.nums
        extra = 0.0 if mine == theirs else theirs - mine
        return float(to.nums - self.nums), extra, float(to.cores * to.nums - self.cores * self.nums)

    def brief(self) -> str:
        """For a warning line: ``2x3000MiB/30c``."""
        memory = "all" if self.memory is None else f"{self.memory}MiB"
        return f"{self.nums}x{memory}/{self.cores}c"


@dataclass
class _Gpu:
    """One container asking for NVIDIA GPUs, in the pod's order (init containers first)."""

    index: int
    container: dict
    name: str
    shape: _Shape
    init: bool  # an init container that runs to completion (not a sidecar)
    sidecar: bool  # an init container with restartPolicy: Always (runs beside the app containers)
    priority: int | None = None  # its nvidia.com/priority; None: not asked
    policy: str | None = None  # its GPU_CORE_UTILIZATION_POLICY when force (:func:`_core_policy`)

    @property
    def runs_at(self) -> int:
        """The priority libvgpu runs it at (unset: libvgpu's default)."""
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    @property
    def mode(self) -> tuple[int, str | None]:
        """How libvgpu runs it: its priority and compute policy (one claim has one of each)."""
        return self.runs_at, self.policy


def _said(mode: tuple[int, str | None]) -> str:
    """A mode for a warning line: ``priority 1``, or ``priority 1 (force)``."""
    runs_at, policy = mode
    return f"priority {runs_at}" + (f" ({policy})" if policy else "")


def _groups(gpus: Sequence[_Gpu], notes: list[str] | None = None) -> list[list[_Gpu]]:
    """The containers that share one claim, in the order their first member comes. Init
    containers run one at a time and have exited before the app containers start, so those of one
    mode (priority and compute policy: a claim has one of each) share one claim, with the app
    container of that mode whose own request it enlarges least (ties: the first), as long as one
    request of the group holds every other (it is then the claim's size, the larger of the two as
    HAMi counts it). Requests that cross (2 GPUs x 1000 MiB and 1 x 15000 MiB) are not joined: a
    claim of the larger of each (2 x 15000) is more than either and may fit nowhere; each keeps
    its own claim, as every other container does (app containers run together; a sidecar runs
    beside them). ``notes``: init containers held in a claim per mode (the extender counts the
    largest of them once), and an app container that only its mode keeps from the init
    containers' claim (it holds a claim more than the extender counts), are noted."""
    inits = [g for g in gpus if g.init]
    apps = [g for g in gpus if not g.init and not g.sidecar]
    by_mode: dict[tuple[int, str | None], list[_Gpu]] = {}
    for g in inits:
        by_mode.setdefault(g.mode, []).append(g)
    joined_groups: list[list[_Gpu]] = []
    taken: list[_Gpu] = []  # app containers that joined a group (each holds one claim)
    for mode, members in by_mode.items():
        joined = _covering([g.shape for g in members])
        if joined is None:
            continue  # each keeps its own claim
        group = list(members)
        by_shape = [a for a in apps if a not in taken and _covering([joined, a.shape]) is not None]
        fits = [a for a in by_shape if a.mode == mode]
        if fits:
            best = min(fits, key=lambda a: (a.shape.growth(a.shape.join(joined)), a.index))
            group.append(best)
            taken.append(best)
        elif by_shape and notes is not None and len(by_mode) == 1:
            notes.append(
                f"{_names([a.name for a in by_shape])} not sharing the init containers' claim: "
                f"{_said(by_shape[0].mode)}, theirs {_said(mode).removeprefix('priority ')}"
            )
        joined_groups.append(group)
    if len(by_mode) > 1 and notes is not None:
        # each runs at its own priority, as on the extender, but every claim is held for the
        # pod's whole life where the extender counts the largest init container once
        values = [f"={g.runs_at}" + (f"/{g.policy}" if g.policy else "") for g in inits]
        named = _names([g.name for g in inits], room=44, values=values)
        notes.append(f"a claim per init priority, held for the pod's life: {named}")
    in_groups = [g for group in joined_groups for g in group]
    groups = joined_groups + [[g] for g in gpus if g not in in_groups]
    return sorted(groups, key=lambda members: members[0].index)


def _covering(shapes: Sequence[_Shape]) -> _Shape | None:
    """The one of ``shapes`` that holds all the others (their join is it); None when none does
    (or there are none)."""
    if not shapes:
        return None
    joined = shapes[0]
    for s in shapes[1:]:
        joined = joined.join(s)
    return joined if joined in shapes else None


def translate(
    pod: Mapping[str, Any],
    vendor: Any,
    device_class: str = SHARE_CLASS,
    namespace: str = "",
    *,
    owned: bool = False,
    notes: list[str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(pod using claims, ResourceClaimTemplates it needs). ``pod`` is admitted (defaults applied);
    ``vendor`` is the NVIDIA vendor (its resource names and defaults). A pod with no NVIDIA
    request comes back unchanged with no template. ``owned``: ``pod`` is a dict the caller made
    for this call and gives up (the webhook's copy from :func:`hami.core.admit_pod`): it is
    changed in place instead of copied (a pod's managedFields make the copy a quarter of an
    admission's time). ``notes``: a list the translation appends to, one line per thing it does
    differently from the extender for this pod (the webhook returns them as warnings)."""
    req = pod_request(pod, [vendor])
    out = pod if owned and isinstance(pod, dict) else copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    names = vendor.resources
    # the priority goes into the claim's configuration (the kubelet plugin sets CUDA_TASK_PRIORITY
    # from it in the claim's CDI spec); as a resource it would keep the pod pending (no DRA node
    # advertises it), and the CUDA_TASK_PRIORITY admission wrote from it is the CDI spec's to set:
    # both leave the container, so it does not carry a priority variable without its resource,
    # which the admission rules refuse (docs/security.md, "The grant's own variables")
    gpu_resources = [n for n in (names.count, names.memory, names.memory_percentage, names.cores, names.priority) if n]
    n_init = len(spec.get("initContainers") or [])
    podname = (pod.get("metadata") or {}).get("name") or "?"
    gpus: list[_Gpu] = []
    unhonoured: list[tuple[str, int]] = []  # (container, priority) on the whole-GPU class
    unforced: list[str] = []  # containers whose forced compute policy the whole-GPU class drops
    for i, (c, creq) in enumerate(zip(containers, req.containers)):
        r = creq.for_vendor(vendor.name)
        if r is None:
            # no GPU (``nvidia.com/gpu: 0``): the extender ignores its other NVIDIA resources
            # (the admission warns of them), which left here would keep the pod pending for ever,
            # as no DRA node advertises them (review, 1 Dec); the priority variable admission
            # wrote from the resource goes with it, as in a GPU container
            if _asks_any(c, gpu_resources):
                _strip(c, gpu_resources)
                _drop_env(c, ENV_TASK_PRIORITY)
            continue
        pct = r.mem_percentage
        # beside gpumem the extender ignores the percentage (the admission warns): only a
        # percentage standing for the memory cannot be said as an amount (review, 1 Dec)
        if pct != PERCENT_UNSET and pct != 100 and r.memreq <= 0:
            raise TranslationError(
                f"pod {podname} container {creq.name!r}: {names.memory_percentage}={pct} cannot be expressed on "
                f"the DRA front end (capacity requests are amounts); ask for {names.memory} in MiB instead"
            )
        # the memory asked is the hard limit, on the extender as here: gpucores: 100 keeps other
        # shares off the GPU through its cores, not by taking all of its memory
        shape = _Shape(r.nums, r.memreq if r.memreq > 0 else None, r.coresreq)
        sidecar = i < n_init and c.get("restartPolicy") == "Always"
        priority = _priority(c, creq.name, names.priority, podname)
        policy = _core_policy(c)
        if device_class == WHOLE_CLASS:
            # no libvgpu runs there to honour either, and the kubelet plugin refuses them on
            # such a claim: written, the pod would be admitted and never start
            if priority is not None:
                unhonoured.append((creq.name, priority))
            if policy is not None:
                unforced.append(creq.name)
            priority = policy = None
        gpus.append(_Gpu(i, c, creq.name, shape, i < n_init and not sidecar, sidecar, priority, policy))
    if unhonoured and notes is not None:
        named = _names([n for n, _ in unhonoured], room=40, values=[f"={v}" for _, v in unhonoured])
        notes.append(f"priority ignored, class {WHOLE_CLASS} has no libvgpu: {named}")
    if unforced and notes is not None:
        notes.append(f"{ENV_CORE_POLICY}=force ignored, class {WHOLE_CLASS} has no libvgpu: {_names(unforced)}")
    if not gpus:
        return out, []
    selectors, numa_bind = annotation_selectors(pod, vendor)
    idle = _idle_cores(vendor)
    templates: dict[str, dict[str, Any]] = {}
    claims = list(spec.get("resourceClaims") or [])
    taken = {c.get("name") for c in claims}
    for members in _groups(gpus, notes):
        shape = members[0].shape
        for g in members[1:]:
            shape = shape.join(g.shape)
        # one priority per group (_groups); written when a member asked for it, so a pod asking
        # for none keeps the template it had
        asked = [g.priority for g in members if g.priority is not None]
        priority = members[0].runs_at if asked else None
        cspec = _claim_spec(
            shape.nums,
            shape.memory,
            shape.cores,
            device_class,
            selectors,
            numa_bind,
            idle,
            priority,
            members[0].policy,  # one per group (_groups)
        )
        tname = template_name(cspec)
        templates[tname] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": tname,
                "labels": {"app.kubernetes.io/managed-by": "hami-webhook"},
                **({"namespace": namespace} if namespace else {}),
            },
            "spec": {"spec": cspec},
        }
        claim = f"{CLAIM_PREFIX}{members[0].index}"
        while claim in taken:
            claim += "x"
        taken.add(claim)
        claims.append({"name": claim, "resourceClaimTemplateName": tname})
        if notes is not None:
            notes += _sharing_notes(members, shape, claim)
        for g in members:
            _strip(g.container, gpu_resources)
            _drop_env(g.container, ENV_TASK_PRIORITY)
            resources = g.container.setdefault("resources", {})
            resources["claims"] = [*(resources.get("claims") or []), {"name": claim}]
    spec["resourceClaims"] = claims
    return out, list(templates.values())


def _asks_any(container: Mapping[str, Any], names: Sequence[str]) -> bool:
    """Whether ``container``'s limits or requests name one of ``names``."""
    resources = container.get("resources") or {}
    return any(
        isinstance(values, Mapping) and any(n in values for n in names)
        for values in (resources.get("limits"), resources.get("requests"))
    )


def _drop_env(container: dict, name: str) -> None:
    """``container``'s env without the entries named ``name`` (no env left: none)."""
    if isinstance(container.get("env"), list):
        env = [e for e in container["env"] if not (isinstance(e, dict) and e.get("name") == name)]
        container["env"] = env
        if not env:
            container.pop("env")


def _core_policy(container: Mapping[str, Any]) -> str | None:
    """``force`` when ``container`` runs under libvgpu's forced compute policy: its literal
    ``GPU_CORE_UTILIZATION_POLICY`` (the last entry of that name, as the runtime applies them)
    is ``force`` in any letter case, as libvgpu reads it; None otherwise (the default, which
    libvgpu takes for any other value; ``disable`` and a ``valueFrom`` are the isolation opt-out,
    which the DRA front end ignores with a warning). The extender's grant file copies the
    container's value; here it rides in the claim's configuration (``corePolicy``), since the
    claim's CDI spec sets libvgpu's variables over the container's (review, 1 Dec)."""
    value = None
    env = container.get("env")
    for e in env if isinstance(env, list) else ():
        if isinstance(e, Mapping) and e.get("name") == ENV_CORE_POLICY:
            value = e.get("value") if "valueFrom" not in e else None
    return FORCE_POLICY if isinstance(value, str) and value.isascii() and value.lower() == FORCE_POLICY else None


def _priority(container: Mapping[str, Any], cname: str, resource: str, podname: str) -> int | None:
    """The task priority ``container`` asks with ``resource`` (limits first), None without it;
    a value the webhook refuses (``hami.webhook.admission.priority_error``, which libvgpu would
    stop on) is refused here too, for the callers that do not run the admission rules first
    (``hami simulate --front-end dra``)."""
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):  # limits first, as the extender reads it
        values = resources.get(section)
        if resource and isinstance(values, Mapping) and resource in values:
            break
    else:
        return None
    where = f"pod {podname} container {cname!r}"
    # a QuantityError naming the field when it is not an integer quantity
    value = parse_int_quantity(values[resource], f"{where} {section}.{resource}")
    low, high = PRIORITY_RANGE
    if not low <= value <= high:
        raise TranslationError(f"{where}: {resource} must be an integer in {low}..{high} (0 high, 1 low), got {value}")
    return value


def _idle_cores(vendor: Any) -> str:
    """The cores a claim asking for none names: the thousandth of a core
    (:data:`hami.dra.model.IDLE_CORES`), said explicitly, so that the node agent's own default for
    claims naming no cores (``dra.defaultCores``, for claims users write) never applies to a
    translated pod: the webhook counted it against the quota as 0 cores, and it would have run
    under that default's compute limit (found by the regression review)."""
    return IDLE_CORES


def _sharing_notes(members: Sequence[_Gpu], shape: _Shape, claim: str) -> list[str]:
    """A note for each app container given more than it asked because it shares its claim with
    init containers (an init container given more is not noted: it has exited before the app
    containers start)."""
    if len(members) < 2:
        return []
    return [
        f"{g.name[:30]!r} shares claim {claim} with init containers: {shape.brief()} (asked {g.shape.brief()})"
        for g in members
        if not g.init and g.shape != shape
    ]


def _names(names: Sequence[str], room: int = 40, values: Sequence[str] = ()) -> str:
    """Container names for a warning line: as many as fit in about ``room`` characters (one at
    least, cut to 30; ``values``: what to write after each, ``=1``), then how many more."""
    shown: list[str] = []
    for i, n in enumerate(names):
        text = repr(n[:30]) + (values[i] if i < len(values) else "")
        if shown and len(", ".join([*shown, text])) > room:
            break
        shown.append(text)
    left = len(names) - len(shown)
    return ", ".join(shown) + (f" and {left} more" if left else "")
