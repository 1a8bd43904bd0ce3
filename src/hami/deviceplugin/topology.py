"""GPU interconnect topology from NVML -> ``hami.io/node-nvidia-score`` (§4.3, §5.6).

What this module owns: how every pair of this node's GPUs is connected, as
:func:`hami.node.nvml.read_links` reads it (the PCIe path between them and their NVLinks),
turned into HAMi's pair scores: the sum
over the pair's links of 10 (different CPUs), 20 (same CPU/NUMA node), 30 (same host bridge),
40 (several PCIe switches), 50 (one PCIe switch), 60 (same board), plus 100 per NVLink.

NVSwitch systems: a link whose far end is an NVSwitch reaches every other GPU on the fabric;
two GPUs both on the switches count ``min(links of a, links of b)`` NVLinks (HAMi#2103: all 28
pairs of an 8-GPU HGX board are NVLink pairs, not PCIe-only). A direct link's count is read on
both sides; when they disagree the pair's links are *asymmetric*, the pair scores 0 (as in
HAMi) and :func:`pair_scores` reports it so the plugin can warn (event
``AsymmetricGPUP2PLink``).

The NVML calls are in :func:`hami.node.nvml.read_links`; :func:`pair_scores` is pure, so tests
can feed it tables without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami.node.nvml import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    Topology,
)

#: PCIe common ancestor (NVML topology level) -> HAMi link score.
PCIE_SCORES = {
    TOPOLOGY_INTERNAL: 60,
    TOPOLOGY_SINGLE: 50,
    TOPOLOGY_MULTIPLE: 40,
    TOPOLOGY_HOSTBRIDGE: 30,
    TOPOLOGY_NODE: 20,
    TOPOLOGY_SYSTEM: 10,
}
NVLINK_SCORE = 100


@dataclass(frozen=True)
class Scores:
    scores: dict[str, dict[str, int]]
    asymmetric: tuple[tuple[str, str], ...]  # pairs scored 0 because each side says otherwise


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
            score = PCIE_SCORES.get(level, PCIE_SCORES[TOPOLOGY_SYSTEM]) + NVLINK_SCORE * nvlinks
        scores[a][b] = scores[b][a] = score
    return Scores(scores, tuple(asym))
