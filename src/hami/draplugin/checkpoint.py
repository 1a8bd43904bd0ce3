"""The node-local record of prepared claims, so that prepare and unprepare are idempotent
across plugin and kubelet restarts.

One JSON file (``<state dir>/checkpoint.json``) maps a claim UID to what was prepared for it:
the kubelet's Device entries, the CDI spec written and (``allocation``) the fingerprint of the
allocation prepared (an entry written before it was kept has none; it is checked on its devices).
The kubelet may call prepare again for a claim already prepared (after its own restart, or a
retry): when the claim's allocation still has that fingerprint, or the claim cannot be read, the
stored answer is returned and the CDI file rewritten if it went missing (``/var/run`` is a tmpfs);
another allocation under the same UID is prepared anew. Unprepare of an unknown claim succeeds. Every change goes through the node's one durable writer
(:func:`hami.node.files.write_atomic`: temporary file, fsync, rename, fsync of the directory), so a
crash leaves either the old or the new record, never half of one.
A corrupt file (not UTF-8, not JSON, another envelope, a claim's record without the fields
prepare and unprepare read back) is an error naming the path, not an empty record: silently
forgetting prepared claims would leak CDI specs and shared regions. The agent then refuses to
start and leaves the file as it is, for someone to look at (docs/dra.md).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

from hami.node.files import read_small, write_atomic

VERSION = 1
log = logging.getLogger(__name__)


class CheckpointError(Exception):
    """The checkpoint file cannot be read or written; the message names the file."""


def _entry_problem(entry: Any) -> str:
    """What is wrong with one claim's record ("" when nothing): the fields prepare and unprepare
    read back (``devices``, ``cdi_file``, ``cdi_spec``, ``claim_dir``) must have their types."""
    if not isinstance(entry, dict):
        return f"expected an object, got {type(entry).__name__}"
    devices = entry.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
        return "devices: expected a list of objects"
    if not isinstance(entry.get("cdi_file"), str) or not entry["cdi_file"]:
        return "cdi_file: expected a path"
    if not isinstance(entry.get("cdi_spec"), dict):
        return "cdi_spec: expected an object"
    if not isinstance(entry.get("claim_dir", ""), str):
        return "claim_dir: expected a path"
    return ""


class Checkpoint:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._claims: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            text = read_small(self.path).decode()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(f"checkpoint {self.path}: cannot read: {exc}") from None
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"checkpoint {self.path}: not UTF-8 text ({exc})") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"checkpoint {self.path}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("claims"), dict):
            raise CheckpointError(
                f'checkpoint {self.path}: expected {{"version": {VERSION}, "claims": {{...}}}}, '
                f"got version {doc.get('version') if isinstance(doc, dict) else None!r}"
            )
        for uid, entry in doc["claims"].items():
            bad = _entry_problem(entry)
            if bad:
                raise CheckpointError(f"checkpoint {self.path}: claim {uid!r}: {bad}")
        return doc["claims"]

    def _save(self) -> None:
        data = json.dumps({"version": VERSION, "claims": self._claims}, sort_keys=True, indent=1)
        try:
            write_atomic(self.path, data, mode=0o600)
        except OSError as exc:  # a WriteError, which names the path
            raise CheckpointError(f"checkpoint {exc}") from None

    def get(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._claims.get(uid)
            return json.loads(json.dumps(entry)) if entry is not None else None

    def put(self, uid: str, entry: dict[str, Any]) -> None:
        """Record ``entry``; if the file cannot be written, the memory is as before too (a retry
        must not find an entry that neither the disk nor the node's files hold)."""
        with self._lock:
            before = self._claims.get(uid)
            self._claims[uid] = entry
            try:
                self._save()
            except BaseException:
                if before is None:
                    del self._claims[uid]
                else:
                    self._claims[uid] = before
                raise

    def remove(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._claims.pop(uid, None)
            if entry is not None:
                try:
                    self._save()
                except BaseException:
                    self._claims[uid] = entry
                    raise
            return entry

    def uids(self) -> list[str]:
        with self._lock:
            return sorted(self._claims)

    def refs(self) -> dict[str, tuple[str, str]]:
        """Each prepared claim's (namespace, name), by UID ("" where an entry lacks one)."""
        with self._lock:
            return {uid: (str(e.get("namespace") or ""), str(e.get("name") or "")) for uid, e in self._claims.items()}

    def counts(self) -> tuple[int, int]:
        """(claims, devices) prepared: the metrics' gauges."""
        with self._lock:
            return len(self._claims), sum(len(e.get("devices") or ()) for e in self._claims.values())


#: the version of ``health.json``; a file of another version is read as no marks (logged)
HEALTH_VERSION = 1


class HealthRecord:
    """The node-local record of the GPUs the agent marked unhealthy and of their informational
    XID notes (:class:`hami.draplugin.health.HealthBook`), so that a restart of the agent does not
    publish a failed GPU as healthy until it fails again. Times are Unix seconds (a monotonic
    clock does not survive the restart); ``boot`` is the boot id they were made under.

    A sibling of ``checkpoint.json``, not a part of it: that file's version stays 1, so an older
    agent rolled back to still reads its claims, and a damaged health record costs the marks,
    never the prepared claims. A record that cannot be read, another version, or one made before
    the node rebooted (its GPUs were reset) is read as no marks, logged, and replaced by the next
    write; the agent starts either way."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def load(self, boot: str = "") -> tuple[dict[str, float], dict[str, tuple[int, float]]]:
        """(UUID -> when it was marked, UUID -> (its last non-fatal XID, when)); both empty when
        there is no usable record, or it was made under another boot than ``boot``."""
        try:
            text = read_small(self.path).decode()
        except FileNotFoundError:
            return {}, {}
        except (OSError, UnicodeDecodeError) as exc:
            return self._unusable(f"cannot read it ({exc})")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return self._unusable(f"not JSON ({exc})")
        if not isinstance(doc, dict) or doc.get("version") != HEALTH_VERSION:
            found = doc.get("version") if isinstance(doc, dict) else None
            return self._unusable(f"expected version {HEALTH_VERSION}, got {found!r}")
        made = doc.get("boot")
        if boot and isinstance(made, str) and made and made != boot:
            log.info(
                "health record %s: made before the node rebooted (its GPUs were reset): no GPU stays marked", self.path
            )
            return {}, {}
        marks, notes = doc.get("unhealthy"), doc.get("notes", {})
        if not isinstance(marks, dict) or not isinstance(notes, dict):
            return self._unusable("expected the objects 'unhealthy' and 'notes'")
        try:
            return (
                {str(u): _seconds(t) for u, t in marks.items()},
                {str(u): (_xid(n["xid"]), _seconds(n["at"])) for u, n in notes.items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            return self._unusable(f"a malformed entry ({exc!r})")

    def _unusable(self, why: str) -> tuple[dict[str, float], dict[str, tuple[int, float]]]:
        log.warning(
            "health record %s: %s; starting with no GPU marked unhealthy (it is rewritten at the next mark)",
            self.path,
            why,
        )
        return {}, {}

    def save(self, boot: str, marks: dict[str, float], notes: dict[str, tuple[int, float]]) -> None:
        data = json.dumps(
            {
                "version": HEALTH_VERSION,
                "boot": boot,
                "unhealthy": marks,
                "notes": {u: {"xid": x, "at": t} for u, (x, t) in notes.items()},
            },
            sort_keys=True,
            indent=1,
        )
        with self._lock:
            try:
                write_atomic(self.path, data, mode=0o600)
            except OSError as exc:  # a WriteError, which names the path
                raise CheckpointError(f"health record {exc}") from None


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected Unix seconds, got {value!r}")
    return float(value)


def _xid(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an XID, got {value!r}")
    return value
