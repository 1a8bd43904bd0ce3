"""An API server that never answers, for the tests of the node programs' request time-outs."""

from __future__ import annotations

import asyncio

import pytest

GUARD_S = 10.0  # far above every bound the tests set: only a call that waits for ever reaches it


async def within(aw, bound: float = GUARD_S):
    """``await aw``, failing the test (not raising a time-out of its own) if it is still waiting
    after ``bound`` seconds."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=bound)
    if not done:
        task.cancel()
        await asyncio.wait({task})
        pytest.fail(f"still waiting for the API server after {bound:g}s")
    return task.result()
