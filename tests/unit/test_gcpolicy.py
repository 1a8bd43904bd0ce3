"""hami.gcpolicy: young collections rarely, full ones only on the periodic pass, which freezes
what survived and, every THAW_EVERY passes, collects the frozen objects too (`--gc-interval`)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import weakref

import pytest

from hami import gcpolicy
from hami.core.errors import ConfigError
from hami.scheduler import options as O


@pytest.fixture
def collector():
    """The interpreter's collector as it was, whatever a test did to it."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


ALIVE: "weakref.WeakSet[Cycle]" = weakref.WeakSet()


class Cycle:
    """A garbage cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self
        ALIVE.add(self)


def _cycles_alive() -> int:
    """Cycle objects not yet freed, frozen or not (gc.get_objects lists no frozen object)."""
    return len(ALIVE)


def test_tune_sets_rare_young_and_no_automatic_full_collections(collector):
    previous = gcpolicy.tune()
    assert len(previous) == 3
    assert gc.get_threshold() == (gcpolicy.GEN0, gcpolicy.GEN1, gcpolicy.NEVER)
    # a full collection comes after NEVER middle ones of GEN1 young ones of GEN0 allocations each
    assert gcpolicy.GEN0 * gcpolicy.GEN1 * gcpolicy.NEVER >= 10**11


def test_a_pass_collects_garbage_cycles_then_freezes_the_survivors(collector):
    gc.unfreeze()
    gc.collect()
    kept = [Cycle() for _ in range(50)]
    for _ in range(200):
        Cycle()  # unreachable at once; only a cyclic collection frees them
    assert _cycles_alive() >= 250
    found, took = gcpolicy.full_pass(thaw=False)
    assert found >= 200 and took >= 0
    assert _cycles_alive() == 50  # the garbage went, what is reachable stayed
    # the survivors are frozen: out of every generation, so the next pass does not walk them
    assert gc.get_freeze_count() > 0
    assert not any(o is kept[0] for o in gc.get_objects())


def test_garbage_frozen_while_live_is_collected_by_the_thawing_pass(collector):
    gc.unfreeze()
    gc.collect()
    live = [Cycle() for _ in range(30)]
    gcpolicy.full_pass(thaw=False)  # frozen while still referenced
    del live  # now garbage cycles, but frozen
    gcpolicy.full_pass(thaw=False)
    assert _cycles_alive() == 30  # a pass without thaw never frees them
    found, _ = gcpolicy.full_pass(thaw=True)
    assert found >= 30
    assert _cycles_alive() == 0


def test_the_loop_thaws_every_nth_pass(collector, monkeypatch):
    calls: list[bool] = []
    monkeypatch.setattr(gcpolicy, "full_pass", lambda thaw: calls.append(thaw) or (0, 0.0))

    async def run() -> None:
        task = asyncio.ensure_future(gcpolicy.collect_periodically(interval=0.001, thaw_every=3))
        while len(calls) < 7:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert calls[:7] == [False, False, True, False, False, True, False]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_gc_interval_flag_defaults_to_ten_minutes_and_zero_keeps_pythons_collector():
    assert O.options_from_args(_args()).gc_interval == 600.0
    assert O.options_from_args(_args("--gc-interval=90s")).gc_interval == 90.0
    assert O.options_from_args(_args("--gc-interval=0")).gc_interval == 0.0
    with pytest.raises(ConfigError, match="--gc-interval"):
        O.options_from_args(_args("--gc-interval=often"))
