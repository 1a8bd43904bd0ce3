"""Vendor registry: an explicit table, no import-time registration.

``build_vendors(config)`` returns the vendor instances for the sections set in
``device-config.yaml``, in a fixed order (the order of :data:`VENDORS`).
To add a vendor: write ``hami/vendors/<name>.py`` (see :mod:`hami.vendors.base`) and add one
line below.
"""

from __future__ import annotations

from typing import Callable

from hami.config import DeviceConfig, default_device_config

from .base import BaseVendor, ResourceNames, Selection
from .nvidia import NvidiaVendor

#: device-config.yaml section -> factory taking that section's parsed value.
VENDORS: tuple[tuple[str, Callable[..., BaseVendor]], ...] = (
    ("nvidia", NvidiaVendor),
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


__all__ = ["VENDORS", "BaseVendor", "NvidiaVendor", "ResourceNames", "Selection", "build_vendors"]
