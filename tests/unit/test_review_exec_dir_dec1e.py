"""`hami exec`'s region directory and region file on a machine shared by local users (found by
review, 1 Dec): a user who pre-created `<tmp>/hami-exec` (1777, theirs) could swap a symbolic
link in for a fresh region's name before the chmod by name (root's chmod then made the link's
target 0666), and every region was 0666, so any user could truncate (SIGBUS) or pause another's.
Now: a per-user directory `<tmp>/hami-exec-<uid>` (0700, checked without following links), regions
0600 set through the descriptor, the shared directory only with --shared and only when safe.
Tests run as root: other owners are simulated with os.chown to uid 1000."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from hami import execcmd

from .test_execcmd_priority import plan

OTHER_UID = 1000


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    """`tempfile.gettempdir()` of `hami exec` is tmp_path/t (a fresh temp dir per test)."""
    t = tmp_path / "t"
    t.mkdir()
    monkeypatch.setattr(execcmd.tempfile, "tempdir", str(t))
    return t


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("existing", [None, 0o777], ids=["new", "existing-0777"])
def test_default_region_is_0600_in_a_per_user_dir_0700(tmp, tmp_path, existing):
    """Scenario: a plain `hami exec`; the per-user dir is made (or reset, when ours) 0700."""
    mine = tmp / f"hami-exec-{os.getuid()}"
    if existing is not None:
        mine.mkdir()
        os.chmod(mine, existing)
    env = plan(tmp_path).env
    region = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert os.path.dirname(region) == str(mine)
    assert env["HAMI_PEER_REGIONS"] == str(mine)
    assert stat.S_ISDIR(os.lstat(mine).st_mode) and mode(mine) == 0o700
    assert stat.S_ISREG(os.lstat(region).st_mode) and mode(region) == 0o600


def test_attacker_made_shared_dir_is_not_used_by_default(tmp, tmp_path):
    """Scenario of the finding: uid 1000 pre-created <tmp>/hami-exec (1777); root's region must not go there."""
    planted = tmp / "hami-exec"
    planted.mkdir()
    os.chmod(planted, 0o1777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    env = plan(tmp_path).env
    assert os.path.dirname(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]) != str(planted)
    assert os.listdir(planted) == []


def test_symlinked_per_user_dir_is_refused(tmp, tmp_path):
    """Scenario: <tmp>/hami-exec-<uid> is a symbolic link to a directory elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp / f"hami-exec-{os.getuid()}"
    link.symlink_to(elsewhere)
    with pytest.raises(execcmd.ExecError, match="symbolic link") as err:
        plan(tmp_path)
    assert repr(str(link)) in str(err.value)
    assert os.listdir(elsewhere) == []


def test_per_user_dir_owned_by_another_uid_is_refused(tmp, tmp_path):
    """Scenario: uid 1000 pre-created <tmp>/hami-exec-<our uid> (0777) to read or swap our regions."""
    squatted = tmp / f"hami-exec-{os.getuid()}"
    squatted.mkdir()
    os.chmod(squatted, 0o777)
    os.chown(squatted, OTHER_UID, OTHER_UID)
    with pytest.raises(execcmd.ExecError, match=f"owned by uid {OTHER_UID}") as err:
        plan(tmp_path)
    assert repr(str(squatted)) in str(err.value)
    assert os.listdir(squatted) == []


def test_region_mode_is_set_through_the_descriptor(tmp, tmp_path, monkeypatch):
    """Scenario: between mkstemp and the mode change, the fresh name is replaced by a symbolic link
    to a 0600 file; the link must not be followed (the target keeps 0600) and the region refused."""
    victim = tmp_path / "victim"
    victim.write_text("secret")
    os.chmod(victim, 0o600)
    real_mkstemp = tempfile.mkstemp

    def mkstemp_then_swap(*a, **kw):
        fd, name = real_mkstemp(*a, **kw)
        os.unlink(name)
        os.symlink(victim, name)  # what the directory's owner could do in a shared sticky dir
        return fd, name

    monkeypatch.setattr(execcmd.tempfile, "mkstemp", mkstemp_then_swap)
    raised = None
    try:
        plan(tmp_path)
    except execcmd.ExecError as exc:
        raised = exc
    assert mode(victim) == 0o600  # not made 0666 through the link
    assert raised is not None and "replaced" in str(raised)


def test_shared_dir_owned_by_another_uid_is_refused(tmp, tmp_path):
    """Scenario: --shared, and uid 1000 pre-created <tmp>/hami-exec (1777)."""
    planted = tmp / "hami-exec"
    planted.mkdir()
    os.chmod(planted, 0o1777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(execcmd.ExecError, match=f"--shared: directory .*owned by uid {OTHER_UID}"):
        plan(tmp_path, "--shared")
    assert os.listdir(planted) == []


def test_shared_dir_symlink_is_refused(tmp, tmp_path):
    """Scenario: --shared, and <tmp>/hami-exec is a symbolic link."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp / "hami-exec").symlink_to(elsewhere)
    with pytest.raises(execcmd.ExecError, match="--shared: directory .*symbolic link"):
        plan(tmp_path, "--shared")
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("dir_mode,ok", [(0o777, False), (0o1777, True)])
def test_shared_root_dir_must_be_sticky(tmp, tmp_path, monkeypatch, dir_mode, ok):
    """Scenario: --shared as uid 1000, <tmp>/hami-exec root's: used only when sticky, region 0644."""
    shared = tmp / "hami-exec"
    shared.mkdir()
    os.chmod(shared, dir_mode)
    monkeypatch.setattr(execcmd.os, "getuid", lambda: OTHER_UID)
    if not ok:
        with pytest.raises(execcmd.ExecError, match="without the sticky bit"):
            plan(tmp_path, "--shared")
        return
    env = plan(tmp_path, "--shared").env
    region = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert os.path.dirname(region) == str(shared) == env["HAMI_PEER_REGIONS"]
    assert mode(region) == 0o644  # peers read it; only its owner writes it


def test_shared_with_cache_is_refused(tmp_path):
    with pytest.raises(execcmd.ExecError, match="--shared: not with --cache"):
        plan(tmp_path, "--shared", "--cache", str(tmp_path / "a.cache"))
