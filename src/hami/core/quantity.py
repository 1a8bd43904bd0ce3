"""Reading container resources as Kubernetes serialises them (plain dicts)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from .errors import RequestError

_INT = re.compile(r"^[+-]?\d+$")
_SUFFIX = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_QTY = re.compile(r"^([+-]?\d+)(k|M|G|T|Ki|Mi|Gi|Ti)$")


def parse_int_quantity(value: Any, where: str) -> int:
    """An integer resource quantity (``3000``, ``"3000"``, ``"2k"``). ``where`` names the field."""
    if isinstance(value, bool):
        raise RequestError(f"{where}: must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    if _INT.match(text):
        return int(text)
    m = _QTY.match(text)
    if m:
        return int(m.group(1)) * _SUFFIX[m.group(2)]
    raise RequestError(f"{where}: must be an integer quantity, got {value!r}")


def container_resources(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(limits, requests)`` of a container dict, empty mappings when absent."""
    res = container.get("resources") or {}
    return (res.get("limits") or {}), (res.get("requests") or {})
