"""Helpers shared by the vendor modules, public to them (the package's ``common`` floor).

Owns: reading a container's resources (``present``, ``percent_request``, ``whole_card_request``),
the small admission edits every webhook makes (``set_both``, ``set_limit``, ``env_append``,
``set_runtime_class``), cards synthesised from ``status.capacity`` (``synth_cards``,
``capacity_health``) and :class:`WholeDeviceVendor` for backends with nothing but whole cards.
Does not own: the vendor protocol and its defaults (``base``) or any fit logic (``hami.core.fit``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

from hami.core.codec import json_loads
from hami.core.errors import CodecError, CoreError, RequestError
from hami.core.health import HealthVerdict
from hami.core.names import devices_allocated, devices_to_allocate, no_use_uuid, node_handshake, use_uuid
from hami.core.quantity import container_resources, parse_int_quantity
from hami.core.types import MAX_NODE_DEVICES, PERCENT_UNSET, ContainerDeviceRequest, DeviceInfo

from .base import BaseVendor, lookup


def present(container: Mapping[str, Any]) -> set[str]:
    """Resource names set in limits or requests."""
    limits, requests = container_resources(container)
    return set(limits) | set(requests)


def in_limits(container: Mapping[str, Any], name: str) -> bool:
    return bool(name) and name in container_resources(container)[0]


def ensure_field(obj: dict, key: str, empty: Any) -> Any:
    """``obj[key]``, made ``empty`` first when absent or null (``setdefault`` keeps a null)."""
    if obj.get(key) is None:
        obj[key] = empty
    return obj[key]


def set_both(container: dict, name: str, value: int) -> None:
    """Write ``value`` to limits and requests (what HAMi's webhooks do when they normalise)."""
    res = ensure_field(container, "resources", {})
    ensure_field(res, "limits", {})[name] = value
    ensure_field(res, "requests", {})[name] = value


def set_limit(container: dict, name: str, value: int) -> None:
    """``resources.limits[name] = value``, and ``requests[name]`` too where the container names it
    there: the API server refuses an extended resource whose request differs from its limit."""
    resources = ensure_field(container, "resources", {})
    ensure_field(resources, "limits", {})[name] = value
    requests = resources.get("requests")
    if isinstance(requests, dict) and name in requests:
        requests[name] = value


def env_append(container: dict, name: str, value: str) -> None:
    """Set ``name=value`` in the container's env: the first entry of that name is replaced, not
    added twice (the webhook may be invoked again on its own output: reinvocationPolicy
    IfNeeded), and any later one removed (the last of a repeated name is the one the container
    gets, so a second ``NVIDIA_VISIBLE_DEVICES=all`` outlived the replaced first)."""
    env = ensure_field(container, "env", [])
    mine = [i for i, e in enumerate(env) if isinstance(e, dict) and e.get("name") == name]
    if not mine:
        env.append({"name": name, "value": value})
        return
    env[mine[0]] = {"name": name, "value": value}
    for i in reversed(mine[1:]):
        del env[i]


def set_runtime_class(pod: dict, name: str) -> None:
    """Give the pod ``spec.runtimeClassName = name`` unless it names one already (or ``name`` is empty)."""
    if name:
        spec = pod.setdefault("spec", {})
        if not spec.get("runtimeClassName"):
            spec["runtimeClassName"] = name


def where_of(container: Mapping[str, Any]) -> str:
    return f"container {container.get('name', '?')!r}"


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def capacity(node: Mapping[str, Any], name: str) -> int:
    """``status.capacity[name]`` as an int; 0 when absent. Raises CodecError when malformed."""
    raw = ((node.get("status") or {}).get("capacity") or {}).get(name)
    if raw is None:
        return 0
    try:
        return parse_int_quantity(raw, f"status.capacity[{name}]")
    except CoreError as exc:
        raise CodecError(str(exc)) from None


def node_name(node: Mapping[str, Any]) -> str:
    return (node.get("metadata") or {}).get("name") or ""


def synth_cards(
    node: Mapping[str, Any],
    vendor: str,
    word: str,
    cards: int,
    *,
    count: int,
    devmem: int,
    devcore: int,
    type_: str,
    numa_split: bool = False,
    custominfo: Mapping[str, Any] | None = None,
    source: str = "",
) -> tuple[DeviceInfo, ...]:
    """Per-card devices synthesised from node capacity, IDs ``<node>-<word>-<i>`` (§4.1 path b).
    Raises CodecError past :data:`MAX_NODE_DEVICES` cards (the node writes its own capacity)."""
    name = node_name(node)
    if cards > MAX_NODE_DEVICES:
        raise CodecError(
            f"status.capacity[{source or word}] gives {cards} cards: more than any machine has "
            f"({MAX_NODE_DEVICES} at most)"
        )
    return tuple(
        DeviceInfo(
            id=f"{name}-{word}-{i}",
            index=i,
            count=count,
            devmem=devmem,
            devcore=devcore,
            type=type_,
            numa=1 if numa_split and i >= cards // 2 else 0,
            health=True,
            vendor=vendor,
            custominfo=dict(custominfo) if custominfo else None,
        )
        for i in range(cards)
    )


def name_after_chip(vendor: BaseVendor, cw: str, register_annotation: str) -> None:
    """Per-chip backends (Ascend, Iluvatar): name, type and HAMi's ``<cw>``-keyed annotations."""
    vendor.name = vendor.request_type = cw
    vendor.register_annotation = register_annotation
    vendor.handshake_annotation = node_handshake(cw)
    vendor.allocated_annotation = devices_allocated(cw)
    vendor.to_allocate_annotation = devices_to_allocate(cw)
    vendor.use_uuid_annotation = use_uuid(cw)
    vendor.nouse_uuid_annotation = no_use_uuid(cw)


def load_json(text: str, where: str) -> Any:
    """``json.loads(text)``; CodecError ``<where>: not valid JSON (...)`` when it does not parse."""
    return json_loads(text, f"{where}: ")


def pod_annotation(pod: Any, key: str) -> str | None:
    """An annotation of the PodRequest passed to ``pod_annotations`` (None when absent)."""
    if pod is None:
        return None
    return (getattr(pod, "annotations", None) or {}).get(key)


def non_negative(where: str, *named: tuple[str, int]) -> None:
    """RequestError naming the first ``(resource, value)`` pair whose value is negative."""
    for name, value in named:
        if value < 0:
            raise RequestError(f"{where}: {name} must not be negative, got {value}")


def percent_request(
    vendor: BaseVendor,
    container: Mapping[str, Any],
    where: str,
    *,
    default_cores: int,
    memory: Callable[[Mapping[str, Any], str], int] | None = None,
) -> ContainerDeviceRequest | None:
    """Count + absolute memory (times memoryFactor) + core percent. ``memory(container, where)``
    replaces the plain read of the memory resource. No memory means the whole card's memory."""
    r = vendor.resources
    res = lookup(container, where)
    nums = res(r.count)
    if nums == 0:
        return None
    mem = memory(container, where) if memory else res(r.memory)
    cores = res(r.cores) if r.cores in present(container) else default_cores
    non_negative(where, (r.count, nums), (r.memory, mem), (r.cores, cores))
    mem *= r.memory_factor
    return ContainerDeviceRequest(
        vendor=vendor.name,
        nums=nums,
        type=vendor.request_type,
        memreq=mem,
        mem_percentage=PERCENT_UNSET if mem else 100,
        coresreq=min(cores, 100),
    )


def whole_card_request(
    vendor: BaseVendor, container: Mapping[str, Any], where: str, *, cores: int = 100
) -> ContainerDeviceRequest | None:
    """``<count>: n`` takes n whole cards (all the memory, ``cores`` percent); None when n is 0."""
    n = lookup(container, where)(vendor.resources.count)
    if n < 0:
        raise RequestError(f"{where}: {vendor.resources.count} must not be negative, got {n}")
    return (
        ContainerDeviceRequest(vendor=vendor.name, nums=n, type=vendor.request_type, mem_percentage=100, coresreq=cores)
        if n
        else None
    )


def capacity_health(vendor: BaseVendor, node: Mapping[str, Any]) -> HealthVerdict:
    """HAMi's rule for MetaX GPU and AMD (§4.4): healthy while ``capacity[count] > 0``; re-read every pass."""
    try:
        healthy = capacity(node, vendor.resources.count) > 0
    except CoreError:
        healthy = False
    return HealthVerdict(healthy, True)


class WholeDeviceVendor(BaseVendor):
    """Vendors whose devices are never split (Vastai, Biren): JSON registration with ``devcore``
    forced to 100, a request takes the whole memory (percentage 100) and no core share."""

    summary_prefilter = True

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        return tuple(replace(d, devcore=100) for d in super().node_devices(node))

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return whole_card_request(self, container, where, cores=0)
