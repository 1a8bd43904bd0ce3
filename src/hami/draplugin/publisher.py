"""The controller side of the DRA driver: writes the node's ResourceSlice and the DeviceClasses.

Both are written with server-side apply (field manager ``hami-dra``), so a second publish of the
same content changes nothing and a restart never needs to read first. The pool generation goes up
only when the devices change, in anything the slice says of them (attributes too), or the counter
sets (kube-scheduler uses it to tell a newer pool from an older one).
The slice is owned by its Node when the Node's UID is known, so deleting the Node removes it
(the agent follows the UID of the Node it watches: a Node deleted and made again gets a slice
owned by the new one).
An unhealthy GPU is published with a device taint (:func:`hami.dra.model.unhealthy_taint`); when
the API server drops the taints (a cluster without device taints: ``DRADeviceTaints`` off before
Kubernetes 1.37) the slice is published again without the unhealthy GPUs, so that they cannot be
allocated as if healthy; until a publish has shown that the taints are kept (an agent's start), a
slice with taints is applied as a dry run first, so that such a cluster never stores it. A GPU's last non-fatal XID is published as an informational taint
(:func:`hami.dra.model.xid_taint`, effect ``None``); a cluster that drops it gets the same
fallback, and one that refuses the effect (a server older than 1.35 with device taints on) gets
the slice without the informational taints. A GPU the operator cordoned (the Node's
``hami.io/device-cordon``) carries :func:`hami.dra.model.cordon_taint`, or is left out where
device taints are dropped.

Who writes what (RBAC in the chart): the node agent may apply ``resourceslices`` (cluster-scoped;
RBAC cannot narrow it to one node's slice, so docs/dra.md names this), the installer applies
``deviceclasses``. The API path and the object come from :mod:`hami.dra.model`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

import aiohttp
import orjson

from hami.core.quantity import QuantityError, parse_quantity
from hami.kube.client import KubeClient, KubeError

from hami.dra.model import (
    GpuLike,
    GpuMig,
    SliceSettings,
    device_classes,
    resource_slices,
    slice_name,
)

log = logging.getLogger(__name__)

FIELD_MANAGER = "hami-dra"
APPLY = "application/apply-patch+yaml"
API = "/apis/resource.k8s.io/v1"


class GarbledAnswer(aiohttp.ClientError):
    """A 200 answer that is not the API server's (a proxy's or load balancer's own page while the
    server restarts, an object of another kind). An ``aiohttp.ClientError``: the start-up's wait
    (:func:`hami.kube.client.until_answered`) waits it out as no answer, where a JSON or key error
    ended the agent; nothing is applied on what it said."""


async def _answer(kube: KubeClient, method: str, path: str, *args: Any) -> Any:
    try:
        return await (kube.get(path) if method == "GET" else kube.request(method, path, *args))
    except orjson.JSONDecodeError as exc:
        raise GarbledAnswer(f"{method} {path}: the answer is not JSON ({exc})") from None


async def _apply(kube: KubeClient, path: str, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    """Server-side apply ``obj``; with ``dry_run`` the API server answers what it would store (its
    admission and its dropping of fields a disabled feature owns included) and stores nothing."""
    query = [("fieldManager", FIELD_MANAGER), ("force", "true"), ("fieldValidation", "Strict")]
    if dry_run:
        query.append(("dryRun", "All"))
    stored = await _answer(kube, "PATCH", path, query, obj, APPLY)
    if not isinstance(stored, dict):
        raise GarbledAnswer(f"PATCH {path}: the answer is no object ({type(stored).__name__})")
    return stored


async def apply_device_classes(kube: KubeClient, extended_resource_name: str | None = None) -> list[str]:
    """Create or update the share and whole-GPU classes; their names."""
    names = []
    for cls in device_classes(extended_resource_name):
        name = cls["metadata"]["name"]
        await _apply(kube, f"{API}/deviceclasses/{name}", cls)
        names.append(name)
    return names


async def _get(kube: KubeClient, path: str) -> dict[str, Any] | None:
    """The stored slice (None: there is none); a slice whose pool generation cannot be read is
    a :class:`GarbledAnswer` (the next generation would be a guess)."""
    try:
        got = await _answer(kube, "GET", path)
    except KubeError as exc:
        if exc.status != 404:
            raise
        return None
    pool = ((got.get("spec") if isinstance(got, dict) else None) or {}).get("pool")
    if not isinstance(pool, dict) or not isinstance(pool.get("generation"), int):
        raise GarbledAnswer(f"GET {path}: the answer is no ResourceSlice (no spec.pool.generation)")
    return got


async def publish_slice(
    kube: KubeClient,
    node: str,
    gpus: Iterable[GpuLike],
    settings: SliceSettings,
    unhealthy: frozenset[str] = frozenset(),
    node_uid: str = "",
    taint: str | None = None,
    mig: Mapping[str, GpuMig] | None = None,
    notes: Mapping[str, int] | None = None,
    fell_back: Callable[[str], None] | None = None,
    cordoned: frozenset[str] = frozenset(),
    device_taints: bool | None = True,
    taints_kept: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Apply the node's slices (one, or more with MIG: :func:`hami.dra.model.resource_slices`)
    and delete the parts a previous publish had beyond them; returns the first as the API server
    stored it. ``taint``: the effect of the unhealthy GPUs' device taint (None: they are left out);
    ``notes``: UUID -> the GPU's last non-fatal XID (an informational taint); ``cordoned``: the
    UUIDs the operator cordoned (tainted ``NoSchedule``; left out when ``device_taints`` is False).
    A cluster that refuses the XID taints or drops device taints gets the slice again without
    them (the unhealthy and cordoned GPUs left out), and ``fell_back`` is told (``"notes"``,
    ``"taints"``), so that the caller's next publishes leave them out from the start: a slice
    naming an unhealthy or cordoned GPU untainted, even for a moment, lets kube-scheduler place a
    claim on it.

    ``device_taints`` None: not known yet whether this cluster keeps device taints (an agent's
    start). A slice with taints is then applied first as a dry run (``dryRun=All``: the API server
    answers what it would store, and stores nothing); where the answer lacks the taints, only the
    fallback slice is ever stored. Before, every start applied the tainted slice for real and
    only then saw the taints dropped: for a moment the unhealthy and cordoned GPUs were
    allocatable (found by review, 1 Dec). ``taints_kept`` is told when the API server kept the
    taints of a slice that had some, so that the caller passes True from then on."""
    gpus = list(gpus)
    wanted = resource_slices(
        node, gpus, settings, 1, unhealthy, taint, mig, notes, cordoned, device_taints is not False
    )
    current = [await _get(kube, f"{API}/resourceslices/{slice_name(node)}")]
    before = int(((current[0] or {}).get("spec") or {}).get("pool", {}).get("resourceSliceCount") or 1)
    for part in range(1, max(before, len(wanted))):
        current.append(await _get(kube, f"{API}/resourceslices/{slice_name(node, part)}"))
    if current[0] is not None:
        generation = current[0]["spec"]["pool"]["generation"]
        same = len(wanted) == before and all(
            c is not None and _content(c) == _content(w) for c, w in zip(current, wanted)
        )
        for w in wanted:
            w["spec"]["pool"]["generation"] = generation if same else generation + 1
    tainted = set().union(*(_taints_of(w) for w in wanted))
    # taints not known to be kept: a dry run first, which stores nothing
    for dry in (True, False) if device_taints is None and tainted else (False,):
        stored = []
        for part, w in enumerate(_owned(wanted, node, node_uid)):
            try:
                stored.append(await _apply(kube, f"{API}/resourceslices/{slice_name(node, part)}", w, dry))
            except KubeError as exc:
                if exc.status != 422 or not notes:
                    raise
                _refused_notes(node, exc, fell_back)
                return await publish_slice(
                    kube,
                    node,
                    gpus,
                    settings,
                    unhealthy,
                    node_uid,
                    taint,
                    mig,
                    None,
                    cordoned=cordoned,
                    device_taints=device_taints,
                    fell_back=fell_back,
                    taints_kept=taints_kept,
                )
        if not dry:
            for part in range(len(wanted), len(current)):
                if current[part] is not None:
                    await delete_slice(kube, node, part)
        if not tainted <= set().union(*(_taints_of(s) for s in stored)):
            return await _without_taints(
                kube, node, gpus, settings, unhealthy, node_uid, mig, tainted, fell_back, cordoned
            )
    if tainted and taints_kept is not None:
        taints_kept()
    log.info(
        "ResourceSlice %s: %d device(s) in %d slice(s), pool generation %d",
        slice_name(node),
        sum(len(w["spec"].get("devices") or ()) for w in wanted),
        len(wanted),
        wanted[0]["spec"]["pool"]["generation"],
    )
    return stored[0]


def _owned(wanted: list[dict[str, Any]], node: str, node_uid: str) -> list[dict[str, Any]]:
    """``wanted`` owned by the Node (when its UID is known): deleting the Node deletes them."""
    if node_uid:
        for w in wanted:
            w["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return wanted


def _refused_notes(node: str, exc: KubeError, fell_back: Callable[[str], None] | None) -> None:
    log.warning(
        "ResourceSlice %s: the API server refused it (%s); publishing it without the "
        "informational XID taints (effect None needs Kubernetes 1.35 or later)",
        slice_name(node),
        exc,
    )
    if fell_back is not None:
        fell_back("notes")


async def _without_taints(
    kube: KubeClient,
    node: str,
    gpus: list[GpuLike],
    settings: SliceSettings,
    unhealthy: frozenset[str],
    node_uid: str,
    mig: Mapping[str, GpuMig] | None,
    tainted: set[tuple[str, str]],
    fell_back: Callable[[str], None] | None,
    cordoned: frozenset[str],
) -> dict[str, Any]:
    """The API server did not keep the device taints: the slice without the unhealthy and
    cordoned GPUs and the XID taints, and ``fell_back`` told (``"taints"``)."""
    log.warning(
        "ResourceSlice %s: the API server did not keep the device taints of %s (device taints are off "
        "in this cluster); publishing it without the unhealthy and cordoned GPUs and the XID taints instead",
        slice_name(node),
        ", ".join(sorted({name for name, _ in tainted})),
    )
    if fell_back is not None:
        fell_back("taints")
    return await publish_slice(
        kube, node, gpus, settings, unhealthy, node_uid, None, mig, None, fell_back, cordoned, False
    )


def _content(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What a slice says of the pool, compared across publishes: its devices (all of each: the
    attributes too, as a new driver version after a driver upgrade is a change of the pool that
    must raise its generation) and counter sets (:func:`_canonical`)."""
    spec = obj.get("spec") or {}
    devices = sorted((d for d in spec.get("devices") or [] if isinstance(d, dict)), key=lambda d: str(d.get("name")))
    sets = sorted(
        (c for c in spec.get("sharedCounters") or [] if isinstance(c, dict)), key=lambda c: str(c.get("name"))
    )
    return _canonical(devices), _canonical(sets)


#: the fields whose strings are quantities, which the API server writes back in its own form
_QUANTITY_FIELDS = frozenset({"capacity", "consumesCounters", "counters"})


def _canonical(value: Any, quantities: bool = False) -> Any:
    """``value`` in a form that compares equal across the API's re-formatting: a quantity under
    :data:`_QUANTITY_FIELDS` by its value (``"16106127360"`` comes back as ``"15Gi"``), and
    without the ``timeAdded`` the API server puts on a taint."""
    if isinstance(value, dict):
        return tuple(
            sorted(
                (k, _canonical(v, quantities or k in _QUANTITY_FIELDS)) for k, v in value.items() if k != "timeAdded"
            )
        )
    if isinstance(value, list):
        return tuple(_canonical(v, quantities) for v in value)
    if quantities and isinstance(value, str):
        try:
            return parse_quantity(value, "")
        except QuantityError:  # a name (a counter set's), not an amount
            return value
    return value


def _taints_of(obj: dict[str, Any]) -> set[tuple[str, str]]:
    """(device name, taint key) of every taint on a slice's devices."""
    return {
        (d.get("name", ""), (t or {}).get("key", ""))
        for d in ((obj or {}).get("spec") or {}).get("devices") or []
        for t in d.get("taints") or []
    }


async def delete_slice(kube: KubeClient, node: str, part: int = 0) -> None:
    try:
        await _answer(kube, "DELETE", f"{API}/resourceslices/{slice_name(node, part)}")
    except KubeError as exc:
        if exc.status != 404:
            raise
