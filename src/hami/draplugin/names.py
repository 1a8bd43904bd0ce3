"""GPU device names that outlive NVML's numbering.

The agent publishes a GPU as ``gpu-<n>`` and kube-scheduler books shares by that name: a claim's
allocation says ``gpu-3``, not a UUID. NVML numbers the GPUs it sees from 0 on every start, so
when one drops off the bus (Xid 79) and the agent restarts, the GPUs after it move down one
index. Named by index, ``gpu-3`` would then be another physical GPU: the running claims booked on
``gpu-3`` sit on the GPU now published as ``gpu-2``, whose shares kube-scheduler hands out again
(memory booked twice), and a claim allocated before the restart but not yet prepared would be
given the wrong GPU.

So the agent keeps ``UUID -> n`` in ``<state dir>/device-names.json``: a GPU seen before keeps
its number; a new one takes its NVML index when no GPU (present or gone) holds it, else the next
number above all held ones. A gone GPU's number stays reserved, so its name is never reused for
another GPU; delete the file (with no claim prepared on the node) to name the GPUs by index
again. On a first start every GPU gets its NVML index: the names published before this file
existed. The ``index`` attribute stays NVML's index either way.

A file that cannot be read as this record stops the agent (as a damaged checkpoint does): naming
by index instead could be exactly the mistake above.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from hami.node.files import read_small, write_atomic
from hami.node.nvml import PhysicalGPU

FILE = "device-names.json"
VERSION = 1
log = logging.getLogger(__name__)


class NamesError(Exception):
    """The names record cannot be read or written; the message names the file."""


def _read(path: Path) -> dict[str, int]:
    try:
        raw = read_small(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise NamesError(f"device names {path}: cannot read: {exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise NamesError(f"device names {path}: not JSON ({exc})") from None
    slots = doc.get("slots") if isinstance(doc, dict) and doc.get("version") == VERSION else None
    if not isinstance(slots, dict) or not all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in slots.items()
    ):
        raise NamesError(
            f'device names {path}: expected {{"version": {VERSION}, "slots": {{"<GPU UUID>": <number>, ...}}}} '
            "(delete the file, with no claim prepared on this node, to name the GPUs by their NVML index)"
        )
    if len(set(slots.values())) != len(slots):
        raise NamesError(f"device names {path}: two GPUs hold one number")
    return dict(slots)


def keep_names(gpus: Sequence[PhysicalGPU], state_dir: str | Path, *, write: bool = True) -> list[PhysicalGPU]:
    """``gpus`` (NVML order kept), each with its ``slot``: the number its device names carry.
    ``write=False`` (``--dry-run``) reads the record but leaves it as it is."""
    path = Path(state_dir) / FILE
    known = _read(path)
    slots = dict(known)
    held = set(slots.values())
    out = []
    for g in gpus:
        slot = slots.get(g.uuid)
        if slot is None:
            slot = g.index if g.index not in held else max(held) + 1
            slots[g.uuid] = slot
            held.add(slot)
        if slot != g.index:
            log.info("GPU %s (NVML index %d) keeps its device name gpu-%d (%s)", g.uuid, g.index, slot, path)
        out.append(replace(g, slot=slot))
    gone = sorted(n for u, n in known.items() if u not in {g.uuid for g in gpus})
    if gone:
        log.warning(
            "GPUs named %s before are not here now: their names stay unused (a claim booked on one "
            "is not moved to another GPU)",
            ", ".join(f"gpu-{n}" for n in gone),
        )
    if write and slots != known:
        try:
            write_atomic(path, json.dumps({"version": VERSION, "slots": slots}, sort_keys=True) + "\n")
        except OSError as exc:
            raise NamesError(f"device names {path}: cannot write: {exc}") from None
    return out
