"""Modes of the node's shared directories (hami.node.layout.prepare_hook_dir)."""

from __future__ import annotations

import stat
from pathlib import Path

from hami.node.layout import HookPaths, prepare_hook_dir, reset_cache_dir


def test_the_lock_directory_is_writable_by_no_container(tmp_path):
    """Every GPU container of the node mounts the lock directory: read-write, 0777 alone let one
    container delete or replace another's files there (found by review), and 01777 followed. The
    containers now mount it read-only and nothing of ours writes in it, so the agent makes it
    0755, root's: made world-writable, a link the kubelet resolved made a host directory so
    (regression review, 1 Dec: tests/unit/test_review_node_dirs_dec1e.py)."""
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    prepare_hook_dir(paths)
    mode = Path(paths.lock_dir).stat().st_mode
    assert stat.S_IMODE(mode) == 0o755
    # a container's own region directory stays its own: world-writable for any UID in it
    own = tmp_path / "hook" / "vgpu" / "containers" / "x"
    reset_cache_dir(str(own))
    assert stat.S_IMODE(own.stat().st_mode) == 0o777
