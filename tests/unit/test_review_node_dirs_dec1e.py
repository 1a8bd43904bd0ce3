"""The node layout's directories a local user or a tenant could turn against the host
(hami.node.layout.prepare_hook_dir; found by review, 1 Dec)."""

from __future__ import annotations

import logging

import os
import stat
from pathlib import Path

import pytest

from hami.node.layout import HookPaths, prepare_hook_dir, reset_cache_dir

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _victim(tmp_path: Path) -> Path:
    """A host directory that is not the agent's to open up (as /etc), with a file in it."""
    victim = tmp_path / "etc"
    victim.mkdir()
    os.chmod(victim, 0o755)
    (victim / "ld.so.preload").write_text("")
    return victim


def test_a_symlinked_lock_dir_is_refused_and_its_target_keeps_its_mode(tmp_path):
    """Found by review, 1 Dec: a local user made /tmp/vgpulock -> /etc before the agent's first
    start, and the agent's chmod by name made the host's /etc 1777."""
    victim = _victim(tmp_path)
    lock = tmp_path / "vgpulock"
    lock.symlink_to(victim)
    with pytest.raises(OSError, match=r"lock directory \(--lock-dir\) .*vgpulock.*symbolic link"):
        prepare_hook_dir(HookPaths(str(tmp_path / "hook"), str(lock)))
    assert _mode(victim) == 0o755
    assert lock.is_symlink()


def test_a_lock_dir_holding_other_files_is_kept_as_it_is_and_logged(tmp_path, caplog):
    """Found by review, 1 Dec: the kubelet's hostPath mount resolves a host link, so the agent
    sees the link's target (/etc) as a real root-owned directory: made 1777 it was root for any
    local user. Then (regression review, 1 Dec) refusing to start over a stray entry stopped the
    agent for a file anyone could put there. Now nothing is made writable: the mode stays, what it
    holds is logged, and the agent starts."""
    victim = _victim(tmp_path)
    with caplog.at_level(logging.WARNING):
        prepare_hook_dir(HookPaths(str(tmp_path / "hook"), str(victim)))
    assert _mode(victim) == 0o755
    assert "'ld.so.preload'" in caplog.text and str(victim) in caplog.text


def test_an_empty_root_owned_lock_dir_is_never_made_writable(tmp_path):
    """Regression review, 1 Dec: a link the kubelet resolved to an empty root-owned directory
    (/usr/local/sbin on stock Debian: first in root's PATH) passed every check and was made 1777."""
    empty = tmp_path / "sbin"
    empty.mkdir(mode=0o755)
    prepare_hook_dir(HookPaths(str(tmp_path / "hook"), str(empty)))
    assert _mode(empty) == 0o755


def test_a_lock_dir_with_only_what_hami_core_leaves_is_accepted(tmp_path):
    """A lock directory HAMi's own libvgpu used before (its ``lock`` file, ``hostpid/``) is kept."""
    lock = tmp_path / "vgpulock"
    lock.mkdir()
    lock.chmod(0o777)  # as HAMi's device plugin left it
    (lock / "lock").write_text("")
    (lock / "hostpid").mkdir()
    prepare_hook_dir(HookPaths(str(tmp_path / "hook"), str(lock)))
    assert _mode(lock) == 0o777  # kept as it was: running HAMi pods may still write their lock there


@root_only
def test_a_lock_dir_owned_by_another_uid_is_refused(tmp_path):
    """Found by review, 1 Dec: a local user made /tmp/vgpulock (after a reboot cleared /tmp)
    as a directory of theirs, which the agent then shared with every GPU container."""
    lock = tmp_path / "vgpulock"
    lock.mkdir(mode=0o755)
    os.chown(lock, 12345, 12345)
    with pytest.raises(OSError, match=r"lock directory \(--lock-dir\) .*vgpulock.*owned by uid 12345"):
        prepare_hook_dir(HookPaths(str(tmp_path / "hook"), str(lock)))
    assert _mode(lock) == 0o755


def test_a_fresh_lock_dir_is_roots_and_not_writable_by_others(tmp_path):
    """Under umask 0 (the test review, 1 Dec: under the usual 022 a directory made 0777 and never
    chmodded read as 0755 too): the mode is the agent's own, not the umask's."""
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "run" / "vgpulock"))
    old = os.umask(0)
    try:
        prepare_hook_dir(paths)
        assert _mode(Path(paths.lock_dir)) == 0o755
        prepare_hook_dir(paths)  # a restart: the directory it made, still empty
        assert _mode(Path(paths.lock_dir)) == 0o755
    finally:
        os.umask(old)


def test_the_parents_of_region_directories_are_roots_alone(tmp_path):
    """Found by review, 1 Dec: a container's root (MKNOD, FOWNER, FSETID by default) planted a
    setuid-root binary or a 0666 block device in its region directory, which every local user
    reached through the 0755 containers/ (claims/, nri/ likewise)."""
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    vgpu = Path(paths.vgpu_dir)
    (vgpu / "containers").mkdir(parents=True, mode=0o755)  # as an older agent or the kubelet made it
    os.chmod(vgpu / "containers", 0o755)
    prepare_hook_dir(paths)
    for sub in ("containers", "claims", "nri"):
        assert _mode(vgpu / sub) == 0o700, sub
    # the region directories themselves stay the containers' (any UID in them writes there)
    region = Path(paths.cache_dir("pod", "main"))
    reset_cache_dir(str(region))
    assert _mode(region) == 0o777  # (a claim's: tests/unit/test_review_dra_grant_mount_dec1e.py)


def test_parents_made_later_are_roots_alone_too(tmp_path):
    """containers/ made on demand (none at the agent's start) is 0700 as well (claims/, by the DRA
    agent: tests/unit/test_review_dra_grant_mount_dec1e.py)."""
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    region = Path(paths.cache_dir("pod", "main"))
    reset_cache_dir(str(region))
    assert _mode(region.parent) == 0o700


def test_a_symlinked_parent_is_refused(tmp_path):
    """containers/ replaced by a link is not made 0700 (nor used) through it."""
    victim = _victim(tmp_path)
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    vgpu = Path(paths.vgpu_dir)
    vgpu.mkdir(parents=True)
    (vgpu / "containers").symlink_to(victim)
    with pytest.raises(OSError, match=r"hook directory \(--hook-path\) .*containers.*symbolic link"):
        prepare_hook_dir(paths)
    assert _mode(victim) == 0o755
