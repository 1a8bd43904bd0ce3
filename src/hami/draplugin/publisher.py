"""The controller side of the DRA driver: writes the node's ResourceSlice and the DeviceClasses.

Both are written with server-side apply (field manager ``hami-dra``), so a second publish of the
same content changes nothing and a restart never needs to read first. The pool generation goes up
only when the devices change (kube-scheduler uses it to tell a newer pool from an older one).
The slice is owned by its Node when the Node's UID is known, so deleting the Node removes it.

Who writes what (RBAC in the chart): the node agent may apply ``resourceslices`` (cluster-scoped;
RBAC cannot narrow it to one node's slice, so docs/dra.md names this), the installer applies
``deviceclasses``. The API path and the object come from :mod:`hami.dra.model`.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from hami.core.quantity import parse_int_quantity
from hami.kube.client import KubeClient, KubeError

from hami.dra.model import GpuLike, SliceSettings, device_classes, resource_slice, slice_name

log = logging.getLogger(__name__)

FIELD_MANAGER = "hami-dra"
APPLY = "application/apply-patch+yaml"
API = "/apis/resource.k8s.io/v1"


async def _apply(kube: KubeClient, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    return await kube.request(
        "PATCH", path, [("fieldManager", FIELD_MANAGER), ("force", "true"), ("fieldValidation", "Strict")], obj, APPLY
    )


async def apply_device_classes(kube: KubeClient, extended_resource_name: str | None = None) -> list[str]:
    """Create or update the share and whole-GPU classes; their names."""
    names = []
    for cls in device_classes(extended_resource_name):
        name = cls["metadata"]["name"]
        await _apply(kube, f"{API}/deviceclasses/{name}", cls)
        names.append(name)
    return names


async def publish_slice(
    kube: KubeClient,
    node: str,
    gpus: Iterable[GpuLike],
    settings: SliceSettings,
    unhealthy: frozenset[str] = frozenset(),
    node_uid: str = "",
) -> dict[str, Any]:
    """Apply the node's slice; returns it as the API server stored it."""
    path = f"{API}/resourceslices/{slice_name(node)}"
    gpus = list(gpus)
    wanted = resource_slice(node, gpus, settings, 1, unhealthy)
    try:
        current = await kube.get(path)
    except KubeError as exc:
        if exc.status != 404:
            raise
        current = None
    if current is not None:
        pool = current["spec"]["pool"]
        same = _devices_of(current) == _devices_of(wanted)
        wanted["spec"]["pool"]["generation"] = pool["generation"] if same else pool["generation"] + 1
    if node_uid:
        wanted["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    stored = await _apply(kube, path, wanted)
    log.info(
        "ResourceSlice %s: %d GPU(s), pool generation %d",
        slice_name(node),
        len(wanted["spec"]["devices"]),
        wanted["spec"]["pool"]["generation"],
    )
    return stored


def _devices_of(obj: dict[str, Any]) -> list[tuple[str, str, tuple[tuple[str, int], ...]]]:
    """Device names, UUIDs and capacity values: the pool's content, compared across the API's
    re-formatting of quantities (``"16106127360"`` comes back as ``"15Gi"``)."""

    def capacity(d: dict[str, Any]) -> tuple[tuple[str, int], ...]:
        return tuple(
            sorted(
                (k, parse_int_quantity(v.get("value"), f"capacity.{k}")) for k, v in (d.get("capacity") or {}).items()
            )
        )

    return sorted(
        (d["name"], ((d.get("attributes") or {}).get("uuid") or {}).get("string", ""), capacity(d))
        for d in obj["spec"].get("devices") or []
    )


async def delete_slice(kube: KubeClient, node: str) -> None:
    try:
        await kube.request("DELETE", f"{API}/resourceslices/{slice_name(node)}")
    except KubeError as exc:
        if exc.status != 404:
            raise
