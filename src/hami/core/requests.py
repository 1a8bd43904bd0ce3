"""Pods (plain dicts) -> :class:`PodRequest`: admission defaults, request parsing, container kinds.

* :func:`admit_pod` applies every vendor's admission defaults/validation to a deep copy of the
  pod (what the mutating webhook does) and returns it.
* :func:`pod_request` reads an admitted pod into a :class:`PodRequest` (init containers first,
  native sidecars recognised by ``restartPolicy: Always``).
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping, Sequence

from .errors import CoreError, RequestError
from .types import ContainerKind, ContainerRequest, PodRequest


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def pod_name(pod: Mapping[str, Any]) -> str:
    """``namespace/name``; a pod a controller makes has no name at admission yet, only its
    ``generateName`` (``web-7d9f-``), shown as ``web-7d9f-*`` so a refusal says which workload."""
    m = _meta(pod)
    name = m.get("name") or (f"{m['generateName']}*" if isinstance(m.get("generateName"), str) else "?")
    return f"{m.get('namespace') or 'default'}/{name}"


def ordered_containers(pod: Mapping[str, Any]) -> list[tuple[dict, ContainerKind]]:
    """Containers in allocation-annotation order: init containers, then regular ones.

    The kinds decide how the pod's demand adds up: a classic init container counts alone with
    the sidecars declared before it, sidecars and regular containers count together
    (:func:`hami.core.usage.collapse_picks` states the rule, with a worked example)."""
    spec = pod.get("spec") or {}
    out: list[tuple[dict, ContainerKind]] = []
    for c in spec.get("initContainers") or ():
        kind = ContainerKind.SIDECAR if c.get("restartPolicy") == "Always" else ContainerKind.INIT
        out.append((c, kind))
    out.extend((c, ContainerKind.APP) for c in spec.get("containers") or ())
    return out


def _copy_for_admission(pod: Mapping[str, Any]) -> dict:
    """A deep copy of ``pod`` except ``status`` and ``metadata.managedFields``, which are the
    input's own objects (the vendors change containers, annotations and labels only)."""
    out = {}
    for key, value in pod.items():
        if key == "status":  # (admission never changes these two; a pod's managedFields are often
            out[key] = value  # most of its size, and this runs on every Filter)
        elif key == "metadata" and isinstance(value, Mapping):
            out[key] = {k: v if k == "managedFields" else copy.deepcopy(v) for k, v in value.items()}
        else:
            out[key] = copy.deepcopy(value)
    return out


#: containers of one pod (init ones included) that may ask for devices
MAX_DEVICE_CONTAINERS = 64


def _too_many(pod: Mapping[str, Any]) -> RequestError:
    return RequestError(
        f"pod {pod_name(pod)}: more than {MAX_DEVICE_CONTAINERS} containers ask for devices (each is "
        "fitted against every earlier one's picks: the check would cost the scheduler minutes); split "
        "the work into pods"
    )


def admit_pod(pod: Mapping[str, Any], vendors: Sequence[Any], check_selection: bool = False) -> tuple[dict, bool]:
    """Return ``(mutated copy, uses_any_vendor)``: a deep copy but for ``status`` and
    ``metadata.managedFields``, shared with ``pod`` (treat them as read-only). Raises
    :class:`RequestError`; with ``check_selection`` (the webhook) also for a device selection of
    a vendor the pod asks for that the scheduler would refuse."""
    out = _copy_for_admission(pod)
    spec = out.get("spec") or {}
    if not spec.get("containers"):
        raise RequestError(f"pod {pod_name(pod)}: spec.containers: pod has no containers")
    asking = 0
    used: dict[int, Any] = {}  # the vendors some container asks for, by identity
    for container, _ in ordered_containers(out):
        mine = False
        for vendor in vendors:
            try:
                if vendor.admit_container(container, out):
                    mine = True
                    used.setdefault(id(vendor), vendor)
            except RequestError as exc:
                raise RequestError(f"pod {pod_name(pod)}: {exc}") from None
        asking += mine
        if asking > MAX_DEVICE_CONTAINERS:
            raise _too_many(pod)
    # The pod's device selection (use/nouse type and UUID lists) is read at every Filter: one the
    # scheduler would refuse (e.g. over MAX_TYPE_ENTRIES types) is refused at creation. (Not for
    # other callers: the scheduler and `hami simulate` report such a pod with its reason.)
    annotations = (out.get("metadata") or {}).get("annotations") or {}
    for vendor in used.values() if check_selection else ():
        try:
            vendor.selection(annotations)
        except CoreError as exc:
            raise RequestError(f"pod {pod_name(pod)}: {exc}") from None
    return out, bool(used)


def pod_request(pod: Mapping[str, Any], vendors: Iterable[Any]) -> PodRequest:
    """Per-container, per-vendor device requests of an (admitted) pod. Raises :class:`RequestError`."""
    vendors = tuple(vendors)
    meta = _meta(pod)
    containers = []
    asking = 0
    for i, (c, kind) in enumerate(ordered_containers(pod)):
        where = f"pod {pod_name(pod)} container {c.get('name') or i!r}"
        reqs = tuple(r for r in (v.container_request(c, where) for v in vendors) if r is not None)
        asking += bool(reqs)
        if asking > MAX_DEVICE_CONTAINERS:
            raise _too_many(pod)
        containers.append(ContainerRequest(name=str(c.get("name") or i), kind=kind, requests=reqs))
    return PodRequest(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        containers=tuple(containers),
        annotations=dict(meta.get("annotations") or {}),
    )
