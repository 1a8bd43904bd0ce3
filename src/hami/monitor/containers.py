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
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from hami.node import contract
from hami.node.files import read_small
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


def _region_file(directory: Path, expected: str | None = None) -> tuple[str | None, str]:
    """The directory's region file: ``expected`` when it is a regular file there, else the first
    regular ``*.cache`` file (with a problem when there are several). Links, FIFOs, devices and
    directories are never candidates."""
    try:
        with os.scandir(directory) as it:
            caches = sorted(e.name for e in it if e.name.endswith(".cache") and _is_regular(e))
    except OSError as exc:
        return None, f"cannot list {directory}: {exc.strerror}"
    if expected is not None and expected in caches:
        return str(directory / expected), ""
    if not caches:
        return None, ""
    if len(caches) > 1:  # one container, one region: the library was pointed at two paths
        return str(directory / caches[0]), f"{len(caches)} region files ({', '.join(caches)}); reading {caches[0]}"
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


def _claim_record(path: Path, uid: str) -> tuple[str, str, str]:
    """``(namespace, name, problem)`` from ``claims/<uid>.json``."""
    try:
        raw = json.loads(read_small(path, _RECORD_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        return "", "", f"{path}: no record of the claim (prepared by an older hami dra?)"
    except (OSError, ValueError) as exc:
        return "", "", f"{path}: unreadable claim record: {exc}"
    ns, name = (raw.get("namespace"), raw.get("name")) if isinstance(raw, dict) else (None, None)
    if not isinstance(ns, str) or not ns or not isinstance(name, str) or not name or raw.get("uid") != uid:
        return "", "", f"{path}: the claim record must hold namespace, name and uid {uid!r}"
    return ns, name, ""


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
        ns, name, problem = _claim_record(root / f"{entry.name}.json", entry.name)
        region, region_problem = _region_file(entry, claim_region_name(entry.name))
        out.append(ClaimDir(entry.name, ns, name, str(entry), region, problem or region_problem))
    return out


def stale(dirs: Iterable[ContainerDir], live_uids: set[str], now: float, grace_s: float) -> list[ContainerDir]:
    """Directories of pods not on this node whose last change is older than ``grace_s``. The times
    are the directory's and the region's own (``lstat``): a link in the directory cannot lend it
    the age of what it points at."""
    out = []
    for d in dirs:
        if d.pod_uid in live_uids:
            continue
        try:
            mtime = max([os.lstat(d.path).st_mtime] + ([os.lstat(d.region).st_mtime] if d.region else []))
        except FileNotFoundError:
            continue
        if now - mtime >= grace_s:
            out.append(d)
    return out


def remove(dirs: Iterable[ContainerDir]) -> list[str]:
    """Delete the given directories; returns the paths removed."""
    removed = []
    for d in dirs:
        try:
            shutil.rmtree(d.path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not remove %s: %s", d.path, exc)
            continue
        log.info("removed the region of pod %s container %s (pod is gone)", d.pod_uid, d.container)
        removed.append(d.path)
    return removed
