"""The containers directory: one ``<podUID>_<container>`` directory per GPU container.

The device plugin creates ``$HOOK_PATH/containers/<podUID>_<container>/`` on the host and mounts
it into the container; the library writes its region file (``*.cache``) there. This module finds
those directories and their region files, and removes the ones of pods that are gone.

The DRA front end's kubelet plugin keeps one region per claim instead:
``$HOOK_PATH/claims/<claim UID>/`` (mounted into every container using the claim) and, beside it,
``claims/<claim UID>.json`` naming the claim (``namespace``, ``name``, ``uid``); :func:`scan_claims`
finds them. The plugin removes both when the claim is unprepared, so nothing here removes them.

Each region directory is mounted read-write into its container(s), so everything in it is the
container's to choose: only regular files count as regions (a symbolic link or a FIFO is passed
over, never followed or opened), and the name the device plugin / DRA driver gave the region
(:func:`hami.node.contract.container_region` / :func:`~hami.node.contract.claim_region`) is
read when it is there. Without it, the one ``*.cache`` file is read as HAMi's monitor does
(HAMi's device plugin draws a random name, ``hami exec --cache`` takes the user's). The
clean-up's "last change" is that of the directory and the region themselves (``lstat``), never
of what a link points at.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from hami.core.names import PRIORITY_RANGE
from hami.node import contract
from hami.node.files import read_small, remove_tree
from hami.node.layout import HookPaths

log = logging.getLogger(__name__)
_RECORD_LIMIT = 64 << 10  # a claim record is three short strings


@dataclass(frozen=True, slots=True)
class ContainerDir:
    pod_uid: str
    container: str
    path: str
    region: str | None  # the region file, None while the container has not started its library
    problem: str = ""  # why the directory is not usable ("" = fine)


def split_name(name: str) -> tuple[str, str] | None:
    """``<podUID>_<container>`` -> ``(uid, container)``. Pod UIDs and container names have no ``_``."""
    uid, sep, container = name.partition("_")
    if not sep or not uid or not container or "_" in container:
        return None
    return uid, container


def region_name(pod_uid: str, container: str) -> str:
    """The file name the device plugin gives a container's region (the directory's part is the host's)."""
    return os.path.basename(contract.container_region(HookPaths(), pod_uid, container))


def claim_region_name(claim_uid: str) -> str:
    """The file name the DRA driver gives a claim's region."""
    return os.path.basename(contract.claim_region(HookPaths(), claim_uid))


def _is_regular(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


_LIST_LIMIT = 4096  # directory entries looked at when the region is not where it is expected
_NAMES_SHOWN = 3


def printable(text: str) -> str:
    """``text`` with each character that is not printable written as its escape (``\\n``,
    ``\\x1b``): file names in a region directory are the container's to choose, and one holding a
    newline or a terminal escape would otherwise write lines of its choosing into the log."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _short(name: str, width: int = 64) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _region_file(directory: Path, expected: str | None = None) -> tuple[str | None, str]:
    """The directory's region file: ``expected`` when it is a regular file there (one ``lstat``),
    else the first regular ``*.cache`` file among the first ``_LIST_LIMIT`` entries (with a
    problem when there are several). Links, FIFOs, devices and directories are never candidates.
    The container owns the directory: the listing and the problem text are bounded whatever it
    puts there."""
    if expected is not None:
        try:
            if stat.S_ISREG(os.lstat(directory / expected).st_mode):
                return str(directory / expected), ""
        except OSError:
            pass
    caches = []
    try:
        with os.scandir(directory) as it:
            for n, e in enumerate(it):
                if n >= _LIST_LIMIT:
                    break
                if e.name.endswith(".cache") and _is_regular(e):
                    caches.append(e.name)
    except OSError as exc:
        return None, f"cannot list {directory}: {exc.strerror}"
    if not caches:
        return None, ""
    caches.sort()
    if len(caches) > 1:  # one container, one region: the library was pointed at two paths
        shown = ", ".join(_short(c) for c in caches[:_NAMES_SHOWN]) + (", ..." if len(caches) > _NAMES_SHOWN else "")
        return str(directory / caches[0]), f"{len(caches)} region files ({shown}); reading {_short(caches[0])}"
    return str(directory / caches[0]), ""


def scan(containers_dir: str) -> list[ContainerDir]:
    """Every container directory, sorted by name. A missing ``containers_dir`` is empty."""
    root = Path(containers_dir)
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        return []
    out: list[ContainerDir] = []
    for entry in entries:
        parts = split_name(entry.name)
        if parts is None or not entry.is_dir() or entry.is_symlink():
            continue
        region, problem = _region_file(entry, region_name(*parts))
        out.append(ContainerDir(parts[0], parts[1], str(entry), region, problem))
    return out


@dataclass(frozen=True, slots=True)
class ClaimDir:
    """One DRA claim's region directory; ``namespace``/``name`` from its record ("" when unreadable)."""

    uid: str
    namespace: str
    name: str
    path: str
    region: str | None
    problem: str = ""
    #: the GPUs the driver gave the claim (its record's ``devices``); None: a record from before
    #: they were written, nothing to check the region's UUIDs against
    devices: tuple[str, ...] | None = None
    #: the task priority its configuration set (the record's ``priority``, 0..1000; None: none set)
    priority: int | None = None


def _claim_record(path: Path, uid: str) -> tuple[str, str, str, tuple[str, ...] | None, int | None]:
    """``(namespace, name, problem, devices, priority)`` from ``claims/<uid>.json``."""
    try:
        raw = json.loads(read_small(path, _RECORD_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        return "", "", f"{path}: no record of the claim (prepared by an older hami dra?)", None, None
    except (OSError, ValueError) as exc:
        return "", "", f"{path}: unreadable claim record: {exc}", None, None
    ns, name = (raw.get("namespace"), raw.get("name")) if isinstance(raw, dict) else (None, None)
    if not isinstance(ns, str) or not ns or not isinstance(name, str) or not name or raw.get("uid") != uid:
        return "", "", f"{path}: the claim record must hold namespace, name and uid {uid!r}", None, None
    devices = raw.get("devices")
    if devices is not None and not (isinstance(devices, list) and all(isinstance(d, str) for d in devices)):
        return "", "", f"{path}: the claim record's devices must be a list of UUIDs", None, None
    priority, (low, high) = raw.get("priority"), PRIORITY_RANGE
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool) or not low <= priority <= high
    ):
        return "", "", f"{path}: the claim record's priority must be an integer {low}..{high}", None, None
    return ns, name, "", None if devices is None else tuple(devices), priority


def scan_claims(claims_dir: str) -> list[ClaimDir]:
    """Every claim directory, sorted by UID. A missing ``claims_dir`` is empty."""
    root = Path(claims_dir)
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        return []
    out: list[ClaimDir] = []
    for entry in entries:
        if not entry.is_dir() or entry.is_symlink() or "_" in entry.name or entry.name.startswith("."):
            continue
        ns, name, problem, devices, priority = _claim_record(root / f"{entry.name}.json", entry.name)
        region, region_problem = _region_file(entry, claim_region_name(entry.name))
        out.append(ClaimDir(entry.name, ns, name, str(entry), region, problem or region_problem, devices, priority))
    return out


class GoneDirs:
    """The directories of pods gone from this node, due for removal once gone for ``grace_s``.

    "Gone" is timed from when this process first saw the pod missing from the node's pod list,
    on its own clock: never from the directory's or the region's modification times, which the
    container sets (a region stamped in the year 2100 would otherwise never be due). A pod back
    in the list, or whose directories are all gone, is forgotten; a restarted monitor starts the
    grace again.
    """

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def due(self, dirs: Iterable[ContainerDir], live_uids: set[str], now: float, grace_s: float) -> list[ContainerDir]:
        since: dict[str, float] = {}
        out = []
        for d in dirs:
            if d.pod_uid in live_uids:
                continue
            first = since.setdefault(d.pod_uid, self._since.get(d.pod_uid, now))
            if now - first >= grace_s:
                out.append(d)
        self._since = since
        return out


#: directories whose removal failed, warned about once (a tenant can make one fail for good: a
#: subdirectory of its own with mode 0700, which the monitor, holding no capability, cannot list)
_unremovable: set[str] = set()


def remove(dirs: Iterable[ContainerDir]) -> list[str]:
    """Delete the given directories; returns the paths removed."""
    removed = []
    for d in dirs:
        try:
            remove_tree(d.path)  # (however deep the container nested it; links not followed)
        except FileNotFoundError:
            _unremovable.discard(d.path)
            continue
        except OSError as exc:
            if d.path not in _unremovable:
                if len(_unremovable) >= 4096:
                    _unremovable.clear()
                _unremovable.add(d.path)
                log.warning(  # the error names a file the container may have named
                    "could not remove %s: %s (tried again every period, said once)",
                    printable(d.path),
                    printable(str(exc)),
                )
            continue
        _unremovable.discard(d.path)
        log.info("removed the region of pod %s container %s (pod is gone)", d.pod_uid, d.container)
        removed.append(d.path)
    return removed
