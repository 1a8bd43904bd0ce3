"""The worked example in ``hami.core.usage.collapse_picks``'s docstring, checked two ways: on the
picks directly, and on the allocation the scheduler makes for that pod on a one-GPU node."""

import pytest

from hami.core import collapse, filter_pod, pod_request
from hami.core.types import ContainerKind
from hami.core.usage import collapse_picks

from ._corekit import CONFIG, ctr, ledger, node, pod

SIDECAR, INIT, APP = ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP
KINDS = (SIDECAR, INIT, APP, APP)  # log, setup, train, eval
PICKS = [
    (0, "NVIDIA", "GPU-x", 1000, 10),
    (1, "NVIDIA", "GPU-x", 6000, 30),
    (2, "NVIDIA", "GPU-x", 3000, 40),
    (3, "NVIDIA", "GPU-x", 2000, 20),
]


@pytest.mark.parametrize("app_only, result", [(False, (3, 7000, 70)), (True, (3, 6000, 70))])
def test_the_worked_example(app_only, result):
    (use,) = collapse_picks(PICKS, KINDS, app_only)
    assert (use.slots, use.mem, use.cores) == result


def test_the_worked_example_as_scheduled():
    raw = pod(
        init=[ctr("log", mem=1000, cores=10, sidecar=True), ctr("setup", mem=6000, cores=30)],
        containers=[ctr("train", mem=3000, cores=40), ctr("eval", mem=2000, cores=20)],
    )
    assert [c.kind for c in pod_request(raw, CONFIG.vendors).containers] == list(KINDS)
    got = filter_pod(raw, None, ledger(node("n", n=1)), CONFIG, 0)
    (use,) = collapse(got.allocation.devices, KINDS)
    assert (use.slots, use.mem, use.cores) == (3, 7000, 70)
