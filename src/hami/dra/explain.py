"""What the GPUs of the DRA path hold and why a claim does not fit (pure; ``hami dra --explain``).

kube-scheduler places claims on this path, and says only "cannot allocate all claims". This
module reads the same objects it does (the driver's ResourceSlices and the allocated
ResourceClaims) and answers per GPU: how much memory, cores and shares are taken, by which claims,
and for a claim's request what it would consume there (the device's request policy applied:
defaults for what it does not ask, memory rounded up to whole MiB) and what is short. It does not
replay kube-scheduler's allocator (node selectors, taints, constraints across requests are its
business); it explains capacity, which is what HAMi's users ask about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from hami.core.quantity import QuantityError, parse_int_quantity

from .claims import ClaimError, ClaimUsage, claim_usage
from .model import CORES, DRIVER, MEMORY, MIB, SHARES

CAPACITIES = (MEMORY, CORES, SHARES)


@dataclass
class DeviceUse:
    pool: str
    device: str
    uuid: str
    total: dict[str, int]
    default: dict[str, int]
    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAPACITIES, 0))
    claims: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.pool, self.device

    def left(self, name: str) -> int:
        return self.total.get(name, 0) - self.used.get(name, 0)


def _int(value: Any, where: str) -> int:
    try:
        return parse_int_quantity(value, where)
    except QuantityError:
        return 0


def usage(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], DeviceUse]:
    """Every device of the driver, with what the allocated claims consume on it."""
    out: dict[tuple[str, str], DeviceUse] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = (spec.get("pool") or {}).get("name") or ""
        for d in spec.get("devices") or ():
            caps = d.get("capacity") or {}
            total = {k: _int((caps.get(k) or {}).get("value"), k) for k in CAPACITIES}
            default = {k: _int(((caps.get(k) or {}).get("requestPolicy") or {}).get("default", total[k]), k)
                       for k in CAPACITIES}
            uuid = ((d.get("attributes") or {}).get("uuid") or {}).get("string", "")
            out[(pool, d.get("name", ""))] = DeviceUse(pool, d.get("name", ""), uuid, total, default)
    uses = []
    for c in claims:
        try:
            u = claim_usage(c)
        except ClaimError:
            continue  # an allocation the API server could not have stored: counted as nothing
        if u is not None:
            uses.append(u)
    return add_claims(out, uses)


def add_claims(devices: dict[tuple[str, str], DeviceUse], claims: Iterable[ClaimUsage]) -> dict[tuple[str, str], DeviceUse]:
    """Add what ``claims`` consume to ``devices`` (a result on a device not listed is left out)."""
    for u in claims:
        for r in u.results:
            dev = devices.get((r.pool, r.device))
            if dev is None:
                continue
            for k, v in r.resolved(dev.total).items():
                dev.used[k] += v
            dev.claims.append(u.key)
    return devices


def wanted(dev: DeviceUse, requests: Mapping[str, Any]) -> dict[str, int]:
    """What a request with these capacity requests would consume on ``dev``."""
    out = {}
    for k in CAPACITIES:
        out[k] = _int(requests[k], k) if k in requests and k != SHARES else dev.default[k]
    out[MEMORY] = -(-out[MEMORY] // MIB) * MIB  # the policy's 1Mi step
    return out


def shortfall(dev: DeviceUse, requests: Mapping[str, Any]) -> str:
    """'' when the request fits ``dev`` now, else what is short (e.g. ``memory 1200 MiB short``)."""
    need = wanted(dev, requests)
    short = []
    if need[MEMORY] > dev.total[MEMORY] or need[CORES] > dev.total[CORES]:
        return "asks for more than the whole GPU"
    for k in CAPACITIES:
        gap = need[k] - dev.left(k)
        if gap > 0:
            short.append(f"memory {gap // MIB} MiB short" if k == MEMORY else f"{k} {gap} short")
    return ", ".join(short)


def describe(uses: Mapping[tuple[str, str], DeviceUse], requests: Mapping[str, Any] | None = None) -> list[str]:
    """One line per GPU (pool order, then device): use, and with ``requests`` whether it fits."""
    lines = []
    for key in sorted(uses):
        d = uses[key]
        line = (f"{d.pool}/{d.device}: memory {d.used[MEMORY] // MIB}/{d.total[MEMORY] // MIB} MiB, "
                f"cores {d.used[CORES]}/{d.total[CORES]}, shares {d.used[SHARES]}/{d.total[SHARES]}")
        if requests is not None:
            why = shortfall(d, requests)
            line += f" -> {'fits' if not why else why}"
        lines.append(line)
    return lines


def claim_requests(claim: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(request name, capacity requests) of the claim's requests (``exactly``) that are not yet allocated."""
    reqs = (((claim.get("spec") or {}).get("devices") or {}).get("requests")) or ()
    return [(r.get("name", ""), dict(((r.get("exactly") or {}).get("capacity") or {}).get("requests") or {}))
            for r in reqs if r.get("exactly")]
