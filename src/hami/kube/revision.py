"""resourceVersions as etcd revisions: how the components order two copies of an object.

Kubernetes calls resourceVersions opaque, but with one etcd (the normal case) they are that
etcd's revision numbers, comparable across kinds. Every comparison here answers "unknown" for a
value that is not a number, and each caller says what it does then (read again, or accept).
"""

from __future__ import annotations

from typing import Any, Mapping


def revision(obj: Mapping[str, Any]) -> int | None:
    """The object's resourceVersion as an integer; None when absent or not numeric."""
    value = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def newer_than(rv: str | None, other: str | None) -> bool:
    """``rv`` is a later revision than ``other``; False when either is not a number (so a caller
    falls back to reading the API server)."""
    try:
        return int(rv or "") > int(other or "")
    except ValueError:
        return False
