"""The containers directory: one ``<podUID>_<container>`` directory per GPU container.

The device plugin creates ``$HOOK_PATH/containers/<podUID>_<container>/`` on the host and mounts
it into the container; the library writes its region file (``*.cache``) there. This module finds
those directories and their region files, and removes the ones of pods that are gone.

The DRA front end's kubelet plugin keeps one region per claim instead:
``$HOOK_PATH/claims/<claim UID>/`` (mounted into every container using the claim) and, beside it,
``claims/<claim UID>.json`` naming the claim (``namespace``, ``name``, ``uid``); :func:`scan_claims`
finds them. The plugin removes both when the claim is unprepared, so nothing here removes them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)


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


def _region_file(directory: Path) -> tuple[str | None, str]:
    try:
        caches = sorted(p.name for p in directory.iterdir() if p.name.endswith(".cache") and p.is_file())
    except OSError as exc:
        return None, f"cannot list {directory}: {exc.strerror}"
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
        if parts is None or not entry.is_dir():
            continue
        region, problem = _region_file(entry)
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
        raw = json.loads(path.read_text(encoding="utf-8"))
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
        if not entry.is_dir() or "_" in entry.name or entry.name.startswith("."):
            continue
        ns, name, problem = _claim_record(root / f"{entry.name}.json", entry.name)
        region, region_problem = _region_file(entry)
        out.append(ClaimDir(entry.name, ns, name, str(entry), region, problem or region_problem))
    return out


def stale(dirs: Iterable[ContainerDir], live_uids: set[str], now: float, grace_s: float) -> list[ContainerDir]:
    """Directories of pods not on this node whose last change is older than ``grace_s``."""
    out = []
    for d in dirs:
        if d.pod_uid in live_uids:
            continue
        try:
            mtime = max([os.stat(d.path).st_mtime] + ([os.stat(d.region).st_mtime] if d.region else []))
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
