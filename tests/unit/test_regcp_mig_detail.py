"""`hami explain`'s MIG detail counts what the failing container saw: its own instances (a
count above 1 on one GPU) and the instances of the pod's earlier containers. Before, an empty
A100 refusing a container's second instance was called "fragmented ... (none)", and a pod's
earlier container's instance was left out of the list."""

from __future__ import annotations

import pytest

from hami.core.explain import pending_verdict

from ._corekit import CONFIG, ctr, pod
from .test_explain_mig_detail import _ledger


def _detail(containers, *held) -> str:
    v = pending_verdict(pod("p", containers=containers), _ledger(*held), CONFIG, CONFIG.vendors, 0.0)
    [node] = v.nodes
    [dev] = node.devices
    assert dev.reason == "CardMigTopologyInfeasible"
    return dev.detail


@pytest.mark.parametrize(
    "gpus,mem,want",
    [
        (2, 20000, "too many: 2 instances of 20000 MiB asked, 1 fits beside the instances there (none)"),
        (8, 5000, "too many: 8 instances of 5000 MiB asked, 4 fit beside the instances there (none)"),
    ],
)
def test_a_container_whose_own_instances_fill_the_gpu_is_too_many_not_fragmented(gpus, mem, want):
    assert _detail([ctr(gpu=gpus, mem=mem)]) == want


def test_the_pods_earlier_containers_instances_are_listed():
    got = _detail([ctr(name="a", mem=15000), ctr(name="b", mem=15000)], ("1g.5gb", 0, 1))
    assert got == (
        "fragmented: 3g.20gb, 4g.20gb, 7g.40gb would hold 15000 MiB, but no placement of it is clear of the "
        "instances there (1g.5gb@0, 3g.20gb@4)"
    )
