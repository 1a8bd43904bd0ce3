"""hami simulate's table cuts device ids to tell them apart (found by a regression review of the
cut that tells two chips of one board apart): every id was compared with every other, at each
length tried, so a large cluster's table took as long as the simulation many times over (16000
GPUs: about a minute of comparisons). The ids are the same as that definition gives; the work
grows with the number of ids, not its square."""

from __future__ import annotations

import random
import uuid

import pytest

from hami.sim.report import SHORT_ID, _short_ids


def by_definition(ids: set[str]) -> dict[str, str]:
    """Each id cut to the fewest characters, at least SHORT_ID, that no other id starts with."""
    out = {}
    for u in ids:
        n = SHORT_ID
        while n < len(u) and any(o != u and o[:n] == u[:n] for o in ids):
            n += 1
        out[u] = u[:n]
    return out


@pytest.mark.parametrize(
    "ids",
    [
        set(),
        {"GPU-7d1c55e0-aaaa-bbbb"},
        {"NPU-7f3c0a1e-0002", "NPU-7f3c0a1e-0003", "NPU-7f3c0a1e-0013", "GPU-1"},
        {"NPU-7f3c0a1e", "NPU-7f3c0a1e-0", "NPU-7f3c0a1e-01", "NPU-7f3c0a1f"},  # one id the start of another
        {"GPU-aaaaaaaaaaaaaaaa", "GPU-aaaaaaaaaaaaaaab", "GPU-aaaaaaaaaaab", "GPU-b"},
    ],
)
def test_the_cut_is_the_one_its_definition_gives(ids):
    assert _short_ids(ids) == by_definition(ids)


class Counted(str):
    """An id that counts the characters and slices read of it."""

    reads = 0

    def __getitem__(self, key):
        Counted.reads += 1
        return str.__getitem__(self, key)


def test_the_work_grows_with_the_number_of_ids_not_its_square():
    rng = random.Random(7)
    ids = {Counted(f"GPU-{uuid.UUID(int=rng.getrandbits(128))}") for _ in range(2000)}
    Counted.reads = 0
    short = _short_ids(ids)
    assert len(set(short.values())) == len(ids)
    # each id is read about as far as it shares its start with its neighbours in sorted order;
    # comparing every pair read each id thousands of times
    assert Counted.reads < 100 * len(ids), Counted.reads
