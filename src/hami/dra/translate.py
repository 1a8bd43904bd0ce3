"""HAMi's resource requests turned into DRA claims, so that manifests work unchanged on the DRA
front end (pure: the webhook calls :func:`translate` and creates the templates it returns).

A container asking for ``nvidia.com/gpu: N`` (+ ``gpumem`` / ``gpumem-percentage`` /
``gpucores``), after the same admission defaults as on the extender path, gets its own claim
from a ResourceClaimTemplate whose one request asks the share class for N devices with these
capacity requests:

================================================  ==========================================
HAMi request (after defaults)                     DRA request
================================================  ==========================================
``gpumem: M`` (MiB, times ``memoryFactor``)       ``capacity.requests.memory: <M>Mi``
no memory, or ``gpumem-percentage: 100``          no memory request: the device's default,
                                                  which is all of its memory
``gpumem-percentage: P`` (P < 100)                refused: DRA capacity requests are amounts,
                                                  not fractions of a device of unknown size
``gpucores: C``                                   ``capacity.requests.cores: C``
``gpucores: 100`` (HAMi: the GPU is exclusive)    cores 100 and no memory request (all of it),
                                                  so nothing else fits beside it
N > 1                                             a ``distinctAttribute`` constraint on the
                                                  UUID: N different GPUs, as HAMi gives
================================================  ==========================================

The template name is derived from its content (``hami-gpu-<hash>``), so every pod with the same
request shares one template per namespace and creating it again is a no-op. The container's GPU
resources are removed from ``limits``/``requests`` (nothing advertises them on a DRA node) and a
``resources.claims`` entry names the pod's claim. Each container gets its own claim, except that
an app container whose request is the same as an init container's takes that init container's
claim (HAMi's reuse of an init container's GPU: the init container has exited by then, so the pod
holds one share, not two). Each init claim is reused by one app container at most (app containers
run together and must not share one budget), and never that of a sidecar (an init container with
``restartPolicy: Always`` runs beside the app containers).

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
``nvidia.com/numa-bind: "true"``       N > 1: ``matchAttribute: resource.kubernetes.io/numaNode``
                                       (HAMi keeps one container's GPUs on one NUMA node)
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
from typing import Any, Mapping, Sequence

from hami.core import pod_request
from hami.core.errors import RequestError
from hami.core.names import DEVICE_SCORING_WEIGHTS, ENV_TASK_PRIORITY, GPU_SCHEDULER_POLICY, NODE_SCHEDULER_POLICY
from hami.core.types import PERCENT_UNSET

from .model import CORES, DRIVER, MEMORY, NUMA_NODE, SHARE_CLASS

REQUEST_NAME = "gpu"
CLAIM_PREFIX = "hami-gpu-"


class TranslationError(RequestError):
    """A request that the DRA front end cannot express; names the container and resource, or the
    annotation and its value."""


#: the mode the DRA driver's devices are in (MIG-mode GPUs are not published)
DRA_MODE = "hami-core"
#: resource.k8s.io's CELSelectorExpressionMaxLength (the API server refuses a longer selector)
MAX_SELECTOR = 10 * 1024
_ATTRS = f'device.attributes["{DRIVER}"]'
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
) -> dict[str, Any]:
    requests: dict[str, str] = {CORES: str(cores)}
    if memory_mib is not None:
        requests[MEMORY] = f"{memory_mib}Mi"
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": nums,
        "capacity": {"requests": requests},
    }
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    devices: dict[str, Any] = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
    if nums > 1:
        devices["constraints"] = [{"requests": [REQUEST_NAME], "distinctAttribute": f"{DRIVER}/uuid"}]
        if numa_bind:  # HAMi: all of a container's GPUs on one NUMA node (one GPU: nothing to align)
            devices["constraints"].append({"requests": [REQUEST_NAME], "matchAttribute": NUMA_NODE})
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


def translate(
    pod: Mapping[str, Any],
    vendor: Any,
    device_class: str = SHARE_CLASS,
    namespace: str = "",
    *,
    owned: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(pod using claims, ResourceClaimTemplates it needs). ``pod`` is admitted (defaults applied);
    ``vendor`` is the NVIDIA vendor (its resource names and defaults). A pod with no NVIDIA
    request comes back unchanged with no template. ``owned``: ``pod`` is a dict the caller made
    for this call and gives up (the webhook's copy from :func:`hami.core.admit_pod`): it is
    changed in place instead of copied (a pod's managedFields make the copy a quarter of an
    admission's time)."""
    req = pod_request(pod, [vendor])
    out = pod if owned and isinstance(pod, dict) else copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    names = vendor.resources
    # the priority: as a resource it would keep the pod pending (no DRA node advertises it), and
    # the CUDA_TASK_PRIORITY admission wrote from it has no effect here (a claim's CDI spec sets
    # every libvgpu variable, that one empty: a claim runs at priority 1, as the monitor counts
    # it); both go, so the pod does not carry a priority variable without its resource, which the
    # admission rules refuse (docs/security.md, "The grant's own variables")
    gpu_resources = [n for n in (names.count, names.memory, names.memory_percentage, names.cores, names.priority) if n]
    templates: dict[str, dict[str, Any]] = {}
    claims = list(spec.get("resourceClaims") or [])
    taken = {c.get("name") for c in claims}
    n_init = len(spec.get("initContainers") or [])
    reusable: dict[str, list[str]] = {}  # template name -> init claims an app container may take
    selectors: list[str] | None = None  # the annotations' selectors, read at the first GPU container
    numa_bind = False
    for i, (c, creq) in enumerate(zip(containers, req.containers)):
        r = creq.for_vendor(vendor.name)
        if r is None:
            continue
        where = f"pod {(pod.get('metadata') or {}).get('name') or '?'} container {creq.name!r}"
        pct = r.mem_percentage
        if pct != PERCENT_UNSET and pct != 100:
            raise TranslationError(
                f"{where}: {names.memory_percentage}={pct} cannot be expressed on the DRA front end "
                f"(capacity requests are amounts); ask for {names.memory} in MiB instead"
            )
        if selectors is None:
            selectors, numa_bind = annotation_selectors(pod, vendor)
        exclusive = r.coresreq >= 100 or pct == 100 or r.memreq <= 0
        cspec = _claim_spec(r.nums, None if exclusive else r.memreq, r.coresreq, device_class, selectors, numa_bind)
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
        if i >= n_init and reusable.get(tname):
            claim = reusable[tname].pop(0)  # the init container's, which has exited by now
        else:
            claim = f"{CLAIM_PREFIX}{i}"
            while claim in taken:
                claim += "x"
            taken.add(claim)
            claims.append({"name": claim, "resourceClaimTemplateName": tname})
            if i < n_init and c.get("restartPolicy") != "Always":
                reusable.setdefault(tname, []).append(claim)
        _strip(c, gpu_resources)
        if isinstance(c.get("env"), list):
            c["env"] = [e for e in c["env"] if not (isinstance(e, dict) and e.get("name") == ENV_TASK_PRIORITY)]
            if not c["env"]:
                c.pop("env")
        resources = c.setdefault("resources", {})
        resources["claims"] = [*(resources.get("claims") or []), {"name": claim}]
    if templates:
        spec["resourceClaims"] = claims
    return out, list(templates.values())
