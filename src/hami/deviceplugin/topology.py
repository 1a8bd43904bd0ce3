"""GPU interconnect topology from NVML -> ``hami.io/node-nvidia-score`` (§4.3, §5.6).

What this module owns: reading, for every pair of this node's GPUs, how they are connected
(the PCIe path between them from ``nvmlDeviceGetTopologyCommonAncestor``, and their NVLinks
from ``nvmlDeviceGetNvLinkState`` / ``nvmlDeviceGetNvLinkRemoteDeviceType`` /
``nvmlDeviceGetNvLinkRemotePciInfo_v2``), and turning that into HAMi's pair scores: the sum
over the pair's links of 10 (different CPUs), 20 (same CPU/NUMA node), 30 (same host bridge),
40 (several PCIe switches), 50 (one PCIe switch), 60 (same board), plus 100 per NVLink.

NVSwitch systems: a link whose far end is an NVSwitch reaches every other GPU on the fabric;
two GPUs both on the switches count ``min(links of a, links of b)`` NVLinks (HAMi#2103: all 28
pairs of an 8-GPU HGX board are NVLink pairs, not PCIe-only). A direct link's count is read on
both sides; when they disagree the pair's links are *asymmetric*, the pair scores 0 (as in
HAMi) and :func:`pair_scores` reports it so the plugin can warn (event
``AsymmetricGPUP2PLink``).

The NVML calls are isolated in :func:`read_links`; :func:`pair_scores` is pure, so tests can
feed it tables without a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import combinations
from typing import Sequence

import pynvml

log = logging.getLogger(__name__)

#: PCIe common ancestor (NVML topology level) -> HAMi link score.
PCIE_SCORES = {
    pynvml.NVML_TOPOLOGY_INTERNAL: 60,
    pynvml.NVML_TOPOLOGY_SINGLE: 50,
    pynvml.NVML_TOPOLOGY_MULTIPLE: 40,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: 30,
    pynvml.NVML_TOPOLOGY_NODE: 20,
    pynvml.NVML_TOPOLOGY_SYSTEM: 10,
}
NVLINK_SCORE = 100
MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's view of its links: direct NVLinks per peer UUID and NVLinks into an NVSwitch."""

    uuid: str
    direct: dict[str, int] = field(default_factory=dict)
    switch: int = 0


@dataclass(frozen=True)
class Topology:
    """Everything the score needs: per-GPU links and the PCIe level of every pair (a, b)."""

    gpus: tuple[GpuLinks, ...]
    pcie: dict[tuple[str, str], int]  # (uuid a, uuid b) -> NVML topology level, a before b


@dataclass(frozen=True)
class Scores:
    scores: dict[str, dict[str, int]]
    asymmetric: tuple[tuple[str, str], ...]  # pairs scored 0 because each side says otherwise


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _norm_bus(bus: str) -> str:
    """NVML bus ids to one form: ``00000000:3B:00.0`` and ``0000:3b:00.0`` -> ``0000:3b:00.0``."""
    domain, _, rest = bus.strip().lower().partition(":")
    return f"{domain[-4:]}:{rest}"


def _links_of(handle, uuid: str, by_bus: dict[str, str]) -> GpuLinks:
    direct: dict[str, int] = {}
    switch = 0
    for link in range(MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError:  # not supported / no such link: the GPU has fewer links
            continue
        try:
            kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except pynvml.NVMLError:
            kind = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU  # older drivers: decide by the remote bus id
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switch += 1
            continue
        try:
            bus = _norm_bus(_text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except pynvml.NVMLError as exc:
            log.info("GPU %s link %d: remote end unknown (%s); not counted", uuid, link, exc)
            continue
        peer = by_bus.get(bus)
        if peer is not None and peer != uuid:
            direct[peer] = direct.get(peer, 0) + 1
    return GpuLinks(uuid, direct, switch)


def read_links(uuids: Sequence[str]) -> Topology:
    """Read the links of the GPUs ``uuids`` (NVML must be initialised). A GPU whose links
    cannot be read counts as PCIe-only; a pair whose PCIe level cannot be read, as SYSTEM."""
    handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids}
    by_bus = {_norm_bus(_text(pynvml.nvmlDeviceGetPciInfo(h).busId)): u for u, h in handles.items()}
    gpus = tuple(_links_of(handles[u], u, by_bus) for u in uuids)
    pcie = {}
    for a, b in combinations(uuids, 2):
        try:
            pcie[(a, b)] = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
        except pynvml.NVMLError as exc:
            log.info("GPUs %s and %s: PCIe path unknown (%s); scored as different CPUs", a, b, exc)
            pcie[(a, b)] = pynvml.NVML_TOPOLOGY_SYSTEM
    return Topology(gpus, pcie)


def pair_scores(topo: Topology) -> Scores:
    """HAMi's pairwise scores, symmetric, every ordered pair present; asymmetric pairs score 0."""
    links = {g.uuid: g for g in topo.gpus}
    scores: dict[str, dict[str, int]] = {g.uuid: {} for g in topo.gpus}
    asym = []
    for (a, b), level in topo.pcie.items():
        la, lb = links[a], links[b]
        ab, ba = la.direct.get(b, 0), lb.direct.get(a, 0)
        if ab != ba:
            asym.append((a, b))
            score = 0
        else:
            nvlinks = ab + (min(la.switch, lb.switch) if la.switch and lb.switch else 0)
            score = PCIE_SCORES.get(level, PCIE_SCORES[pynvml.NVML_TOPOLOGY_SYSTEM]) + NVLINK_SCORE * nvlinks
        scores[a][b] = scores[b][a] = score
    return Scores(scores, tuple(asym))
