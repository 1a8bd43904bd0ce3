"""Vendor registry: an explicit table, no import-time registration.

``build_vendors(config)`` returns the vendor instances for the sections set in
``device-config.yaml``, in a fixed order (the order of :data:`VENDORS`).
To add a vendor: write ``hami/vendors/<name>.py`` (see :mod:`hami.vendors.base`) and add one
line below.
"""

from __future__ import annotations

from typing import Callable

from hami.config import DeviceConfig, default_device_config

from .amd import AmdVendor
from .ascend import AscendVendor, make_ascend
from .awsneuron import AwsNeuronVendor
from .base import BaseVendor, ResourceNames, Selection
from .biren import BirenVendor
from .cambricon import CambriconVendor
from .enflame import EnflameDrsVendor, EnflameGcuVendor, make_enflame
from .hygon import HygonVendor
from .iluvatar import IluvatarVendor, make_iluvatars
from .kunlun import KunlunVendor, KunlunVxpuVendor, make_kunlun
from .metax import MetaxGpuVendor, MetaxSgpuVendor, make_metax
from .mthreads import MthreadsVendor
from .nvidia import NvidiaVendor
from .vastai import VastaiVendor

#: device-config.yaml section -> factory taking that section's parsed value (one vendor or a tuple).
VENDORS: tuple[tuple[str, Callable[..., BaseVendor | tuple[BaseVendor, ...]]], ...] = (
    ("nvidia", NvidiaVendor),
    ("vnpus", make_ascend),
    ("cambricon", CambriconVendor),
    ("hygon", HygonVendor),
    ("iluvatars", make_iluvatars),
    ("metax", make_metax),
    ("mthreads", MthreadsVendor),
    ("enflame", make_enflame),
    ("kunlun", make_kunlun),
    ("amd", AmdVendor),
    ("awsneuron", AwsNeuronVendor),
    ("vastai", VastaiVendor),
    ("biren", BirenVendor),
)


def build_vendors(config: DeviceConfig | None = None) -> tuple[BaseVendor, ...]:
    """A factory returns one vendor, or a tuple of them (one section may define several backends,
    e.g. ``vnpus`` -> one per Ascend chip, ``metax`` -> MetaX GPU and sGPU)."""
    config = config or default_device_config()
    out: list[BaseVendor] = []
    for section, factory in VENDORS:
        value = config.section(section)
        if not value:
            continue
        made = factory(value)
        out.extend(made if isinstance(made, tuple) else (made,))
    return tuple(out)


def managed_resource_names(vendors: tuple[BaseVendor, ...]) -> tuple[str, ...]:
    """Every extended-resource name the given vendors read from a pod (count, memory, memory
    percentage, cores, priority), sorted and without duplicates: the names kube-scheduler must
    leave to the extender (``managedResources`` with ``ignoredByScheduler``). The Helm chart
    computes the same list from device-config.yaml (``hami.managedResources``); a test keeps the
    two equal."""
    names = {
        n
        for v in vendors
        for n in (
            v.resources.count,
            v.resources.memory,
            v.resources.memory_percentage,
            v.resources.cores,
            v.resources.priority,
        )
        if n
    }
    return tuple(sorted(names))


__all__ = [
    "VENDORS",
    "AmdVendor",
    "AscendVendor",
    "AwsNeuronVendor",
    "BaseVendor",
    "BirenVendor",
    "CambriconVendor",
    "EnflameDrsVendor",
    "EnflameGcuVendor",
    "HygonVendor",
    "IluvatarVendor",
    "KunlunVendor",
    "KunlunVxpuVendor",
    "MetaxGpuVendor",
    "MetaxSgpuVendor",
    "MthreadsVendor",
    "NvidiaVendor",
    "ResourceNames",
    "Selection",
    "VastaiVendor",
    "build_vendors",
    "managed_resource_names",
]
