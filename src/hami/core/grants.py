"""A pod's grants read one vendor at a time, and what an unreadable one takes out (pure, no I/O).

The scheduler's cache (:mod:`hami.scheduler.state`) and ``hami simulate`` (:mod:`hami.sim.engine`)
read running pods' allocation annotations the same way:

* :func:`read_grants`: one vendor's malformed annotation leaves out that vendor's grant only; the
  other vendors' grants still count (HAMi's reader dropped the whole pod, and its readable GPUs
  looked free);
* :func:`unreadable_vendors`: the vendors whose grant is neither read nor otherwise known;
* :func:`cordon_vendors`: while such a pod runs (bound, not finished), those vendors' devices on
  its node (``spec.nodeName``) are cordoned (``CardCordoned``): the pod uses some of them, nobody
  can say which, and counting them free put new pods onto GPUs it was using.
"""

from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet, Any, Iterable, Mapping

from .errors import CoreError
from .ledger import allocation_from_pod
from .types import NodeDevices, PodAllocation

__all__ = ("read_grants", "unreadable_vendors", "cordon_vendors", "running_on")


def read_grants(pod: Mapping[str, Any], vendors: Iterable[Any]) -> tuple[PodAllocation | None, dict[str, str]]:
    """``(the pod's allocation, {vendor: why its grant cannot be read})``. The allocation holds
    the grants that can be read (None when there are none); the key ``""`` says why nothing of the
    pod could be read beyond the vendors named (an error that is no one vendor's annotation)."""
    vendors = tuple(vendors)
    try:
        return allocation_from_pod(pod, vendors), {}
    except CoreError as whole:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        errors: dict[str, str] = {}
        for v in vendors:
            if annotations.get(v.allocated_annotation) is None:
                continue
            try:
                allocation_from_pod(pod, (v,))
            except CoreError as exc:
                errors[v.name] = str(exc)
        if not errors:  # not one vendor's annotation: nothing is known
            return None, {"": str(whole)}
        try:
            return allocation_from_pod(pod, tuple(v for v in vendors if v.name not in errors)), errors
        except CoreError as exc:
            return None, {**errors, "": str(exc)}


def unreadable_vendors(alloc: PodAllocation | None, errors: Mapping[str, str]) -> dict[str, str]:
    """``{vendor: why}`` for the vendors of ``errors`` that ``alloc`` (what is read, or held from
    before) holds no device of: their devices are the ones the pod holds unknowably."""
    return {v: m for v, m in errors.items() if v and (alloc is None or not any(alloc.devices.get(v, ())))}


def running_on(pod: Mapping[str, Any]) -> str | None:
    """The node a pod runs on for :func:`cordon_vendors`: its ``spec.nodeName`` while it is bound
    and not finished (phase Succeeded or Failed), else None."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    return (pod.get("spec") or {}).get("nodeName") or None


def cordon_vendors(node: NodeDevices, vendors: AbstractSet[str]) -> NodeDevices:
    """``node`` with every device of ``vendors`` cordoned, beside its own cordons."""
    if not vendors:
        return node
    held = frozenset(d.id for d in node.devices if d.vendor in vendors)
    return replace(node, cordoned=node.cordoned | held)
