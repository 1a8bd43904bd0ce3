"""`hami exec`'s region directory and region file on a machine shared by local users (found by
review, 1 Dec): a user who pre-created `<tmp>/hami-exec` (1777, theirs) could swap a symbolic
link in for a fresh region's name before the chmod by name (root's chmod then made the link's
target 0666), and every region was 0666, so any user could truncate (SIGBUS) or pause another's.
Now: a per-user directory `<tmp>/hami-exec-<uid>` (0700, checked without following links), regions
0600 set through the descriptor, the shared directory only with --shared and only when safe.
Tests run as root: other owners are simulated with os.chown to uid 1000."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
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
    """Scenario: right after the region file is created, its name is replaced by a symbolic link
    to a 0640 file; the link must not be followed (the target keeps 0640, a mode no region file
    has, so a chmod by name to either region mode would show) and the region refused."""
    victim = tmp_path / "victim"
    victim.write_text("secret")
    os.chmod(victim, 0o640)
    real_open = os.open

    def open_then_swap(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT:  # the region file: what the directory's owner could do in a shared sticky dir
            os.unlink(path, dir_fd=dir_fd)
            os.symlink(victim, path, dir_fd=dir_fd)
        return fd

    monkeypatch.setattr(execcmd.os, "open", open_then_swap)
    raised = None
    try:
        plan(tmp_path)
    except execcmd.ExecError as exc:
        raised = exc
    assert mode(victim) == 0o640  # not made the region's mode through the link
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


@pytest.mark.parametrize("dir_mode", [0o777, 0o755, 0o1775, 0o1770], ids=oct)
def test_shared_root_dir_must_be_1777(tmp, tmp_path, monkeypatch, dir_mode):
    """Scenario: --shared as uid 1000, <tmp>/hami-exec root's but not mode 1777: refused, saying how to make it."""
    shared = tmp / "hami-exec"
    shared.mkdir()
    os.chmod(shared, dir_mode)
    monkeypatch.setattr(execcmd.os, "getuid", lambda: OTHER_UID)
    with pytest.raises(execcmd.ExecError, match=f"mode {oct(dir_mode)}, not 0o1777") as err:
        plan(tmp_path, "--shared")
    assert f"install -d -m 1777 -o root -g root {shared}" in str(err.value)
    assert os.listdir(shared) == []
    assert mode(shared) == dir_mode  # not root's caller: left as it is


def test_shared_with_cache_is_refused(tmp_path):
    with pytest.raises(execcmd.ExecError, match="--shared: not with --cache"):
        plan(tmp_path, "--shared", "--cache", str(tmp_path / "a.cache"))


# --- found by review, 1 Dec (second pass): --shared's directory made by a non-root user breaks
# --shared for everyone, and the parent of <tmp>/hami-exec-<uid> (TMPDIR) was not checked.


def _fix_line(d) -> str:
    return f"install -d -m 1777 -o root -g root {d}"


@pytest.mark.parametrize("caller", [0, OTHER_UID, OTHER_UID + 1], ids=["root", "maker", "another-user"])
def test_shared_dir_made_by_a_user_is_refused_saying_how_to_fix(tmp, tmp_path, monkeypatch, caller):
    """Found by review, 1 Dec: uid 1000 made <tmp>/hami-exec (1777, theirs; what the previous
    hami exec did for its first caller, or a squatter): --shared of root, of uid 1000 itself and of
    uid 1001 is refused with the path, the owner and how root makes it (install / tmpfiles.d)."""
    planted = tmp / "hami-exec"
    planted.mkdir()
    os.chmod(planted, 0o1777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    monkeypatch.setattr(execcmd.os, "getuid", lambda: caller)
    with pytest.raises(execcmd.ExecError) as err:
        plan(tmp_path, "--shared")
    msg = str(err.value)
    assert repr(str(planted)) in msg and f"owned by uid {OTHER_UID}, not by root" in msg
    assert _fix_line(planted) in msg and f"d {planted} 1777 root root -" in msg
    assert os.listdir(planted) == []


def test_non_root_never_creates_the_shared_dir(tmp, tmp_path, monkeypatch):
    """Found by review, 1 Dec: --shared as uid 1000 with no <tmp>/hami-exec: refused, not created
    (else it would be uid 1000's and refused to everyone else), saying how root makes it."""
    monkeypatch.setattr(execcmd.os, "getuid", lambda: OTHER_UID)
    shared = tmp / "hami-exec"
    with pytest.raises(execcmd.ExecError, match="does not exist") as err:
        plan(tmp_path, "--shared")
    assert repr(str(shared)) in str(err.value) and _fix_line(shared) in str(err.value)
    assert not os.path.lexists(shared)


def test_root_creates_the_shared_dir_root_owned_1777(tmp, tmp_path):
    """Scenario: --shared as root with no <tmp>/hami-exec: made root's, sticky, 1777; region 0644."""
    env = plan(tmp_path, "--shared").env
    shared = tmp / "hami-exec"
    st = os.lstat(shared)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and mode(shared) == 0o1777
    assert os.path.dirname(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]) == str(shared) == env["HAMI_PEER_REGIONS"]
    assert mode(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]) == 0o644


@pytest.mark.parametrize("caller", [0, OTHER_UID, OTHER_UID + 1], ids=["root", "user", "another-user"])
def test_root_owned_1777_shared_dir_is_used_by_every_user(tmp, tmp_path, monkeypatch, caller):
    """Scenario: root made <tmp>/hami-exec (install -d -m 1777 -o root -g root): every caller uses it."""
    shared = tmp / "hami-exec"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(execcmd.os, "getuid", lambda: caller)
    env = plan(tmp_path, "--shared").env
    region = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert os.path.dirname(region) == str(shared) == env["HAMI_PEER_REGIONS"]
    assert mode(region) == 0o644 and mode(shared) == 0o1777 and os.lstat(shared).st_uid == 0


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_another_users_file_of_the_same_name_is_not_reused(tmp, tmp_path, monkeypatch, planted):
    """Check (review, 1 Dec): in the shared dir uid 1000 pre-made the name the region would get (a
    0666 file of theirs, or a link to a file of root's): skipped (O_EXCL), another name is used."""
    shared = tmp / "hami-exec"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = tmp_path / "victim"
    victim.write_text("root's")
    os.chmod(victim, 0o600)
    taken = shared / "hami-exec-taken.cache"
    if planted == "file":
        taken.write_text("theirs")
        os.chmod(taken, 0o666)
    else:
        taken.symlink_to(victim)
    os.chown(taken, OTHER_UID, OTHER_UID, follow_symlinks=False)
    names = iter(["hami-exec-taken.cache", "hami-exec-fresh.cache"])
    monkeypatch.setattr(execcmd, "_region_name", lambda: next(names), raising=False)
    region = plan(tmp_path, "--shared").env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert region != str(taken) and os.path.dirname(region) == str(shared)
    st = os.lstat(taken)
    assert st.st_uid == OTHER_UID
    if planted == "file":
        assert taken.read_text() == "theirs" and mode(taken) == 0o666
    else:
        assert stat.S_ISLNK(st.st_mode) and os.readlink(taken) == str(victim)
    assert victim.read_text() == "root's" and mode(victim) == 0o600


def test_region_is_created_in_the_checked_directory(tmp, tmp_path, monkeypatch):
    """Found by review, 1 Dec: between the per-user dir's check and the region's creation the dir is
    renamed away and uid 1000's put in its place (what the owner of an untrusted TMPDIR could do):
    the region is created through the checked dir's descriptor (O_CREAT|O_EXCL|O_NOFOLLOW), so it
    never lands in the swapped-in dir, and the path then not naming it is refused."""
    mine = tmp / f"hami-exec-{os.getuid()}"
    swapped = tmp / "theirs"
    real_open = os.open
    creates = []

    def open_with_swap(path, flags, mode=0o777, *, dir_fd=None):
        if flags & os.O_CREAT and not creates:
            creates.append((flags, dir_fd))
            os.rename(mine, tmp / "moved")
            swapped.mkdir()
            os.chown(swapped, OTHER_UID, OTHER_UID)
            os.rename(swapped, mine)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(execcmd.os, "open", open_with_swap)
    raised = None
    try:
        plan(tmp_path)
    except execcmd.ExecError as exc:
        raised = exc
    assert os.listdir(mine) == []  # nothing of root's in uid 1000's dir
    assert raised is not None and "replaced" in str(raised)
    want = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    assert creates and creates[0][0] & want == want and creates[0][1] is not None


def _owned(path, uid, dir_mode):
    path.mkdir(exist_ok=True)
    os.chown(path, uid, uid)
    os.chmod(path, dir_mode)
    return path


@pytest.mark.parametrize(
    "case",
    ["other-owner-0755", "other-owner-sticky-1777", "root-0777-not-sticky", "grandparent-other-owner"],
)
def test_untrusted_tmp_parent_is_refused_naming_tmpdir(tmp_path, monkeypatch, case):
    """Found by review, 1 Dec: root run with another user's TMPDIR (sudo -E): that user owns the
    parent of hami-exec-0 and could swap it; refused, naming TMPDIR and the untrusted directory.
    Root's world-writable non-sticky TMPDIR (emptyDir) stays refused for root, saying how to fix
    it (second review, 1 Dec: a non-root caller uses it, see test_non_root_trusts_its_tmpdir)."""
    if case == "grandparent-other-owner":
        bad = _owned(tmp_path / "home", OTHER_UID, 0o755)
        t = _owned(bad / "t", 0, 0o1777)
        expect = f"owned by uid {OTHER_UID}"
    else:
        t = bad = tmp_path / "t"
        dir_mode = {"other-owner-0755": 0o755, "other-owner-sticky-1777": 0o1777, "root-0777-not-sticky": 0o777}[case]
        _owned(t, 0 if case.startswith("root") else OTHER_UID, dir_mode)
        expect = "without the sticky bit" if case.startswith("root") else f"owned by uid {OTHER_UID}"
    monkeypatch.setenv("TMPDIR", str(t))
    monkeypatch.setattr(execcmd.tempfile, "tempdir", str(t))
    for extra in ((), ("--shared",)):
        with pytest.raises(execcmd.ExecError, match=expect) as err:
            plan(tmp_path, *extra)
        msg = str(err.value)
        assert f"TMPDIR={str(t)!r}" in msg and repr(str(bad)) in msg and "refused" in msg
        if case == "root-0777-not-sticky":
            assert f"chmod +t {t}" in msg and "--cache FILE" in msg
    assert os.listdir(t) == []


@pytest.mark.parametrize("case", ["root-sticky-like-tmp", "callers-own-0755"])
def test_trusted_tmp_parent_is_used(tmp_path, monkeypatch, case):
    """Scenario: TMPDIR root's and sticky (like /tmp), or the caller's own (uid 1000, 0755): used."""
    t = tmp_path / "t"
    caller = 0 if case.startswith("root") else OTHER_UID
    _owned(t, caller, 0o1777 if case.startswith("root") else 0o755)
    mine = t / f"hami-exec-{caller}"
    if caller:  # root runs the test: the caller's own dir is made for it
        _owned(mine, caller, 0o700)
    monkeypatch.setattr(execcmd.os, "getuid", lambda: caller)
    monkeypatch.setenv("TMPDIR", str(t))
    monkeypatch.setattr(execcmd.tempfile, "tempdir", str(t))
    env = plan(tmp_path).env
    assert os.path.dirname(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]) == str(mine) == env["HAMI_PEER_REGIONS"]


# --- found by the regression review of fc639ac, 1 Dec: the walk from / refused legitimate
# TMPDIRs (user namespaces, emptyDir /tmp, a user's 0775 ~/tmp, 0711 /home) and named the wrong
# directory; a failure on the region file was a traceback. The walk is now root's only.


def _as_caller(monkeypatch, uid: int, gid: int | None = None) -> None:
    """Run `hami exec` as if uid (real and effective) and primary gid were these (the test is root)."""
    monkeypatch.setattr(execcmd.os, "getuid", lambda: uid)
    monkeypatch.setattr(execcmd.os, "geteuid", lambda: uid)
    monkeypatch.setattr(execcmd.os, "getgid", lambda: uid if gid is None else gid)


def _use_tmpdir(monkeypatch, t) -> None:
    monkeypatch.setenv("TMPDIR", str(t))
    monkeypatch.setattr(execcmd.tempfile, "tempdir", str(t))


def _region_dir(tmp_path) -> str:
    env = plan(tmp_path).env
    assert env["HAMI_PEER_REGIONS"] == os.path.dirname(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    return env["HAMI_PEER_REGIONS"]


@pytest.mark.parametrize("caller", [OTHER_UID, 0], ids=["user", "root"])
def test_non_root_trusts_its_tmpdir_root_is_told_how_to_fix_it(tmp_path, monkeypatch, caller):
    """Found by review, 1 Dec: a Kubernetes emptyDir /tmp (root's, 0777, not sticky) was refused
    to every caller; a user (uid 1000) uses it (whoever could swap its hami-exec-1000 can only hurt
    that user's own task), root is refused saying `chmod +t` or --cache."""
    t = _owned(tmp_path / "emptydir", 0, 0o777)
    _use_tmpdir(monkeypatch, t)
    _as_caller(monkeypatch, caller)
    mine = t / f"hami-exec-{caller}"
    if caller:
        _owned(mine, caller, 0o755)
        assert _region_dir(tmp_path) == str(mine) and mode(mine) == 0o700
    else:
        with pytest.raises(execcmd.ExecError, match="writable by every user without the sticky bit") as err:
            plan(tmp_path)
        assert f"chmod +t {t}" in str(err.value) and "--cache FILE" in str(err.value)
        assert os.listdir(t) == []


@pytest.mark.parametrize(
    "case, accepted",
    [
        ("user-own-0775", True),
        ("user-under-other-owner", True),
        ("root-group-root-0775", True),
        ("root-other-group-0775", False),
    ],
)
def test_group_writable_tmpdir(tmp_path, monkeypatch, case, accepted):
    """Found by review, 1 Dec: a user's own ~/tmp made 0775 (umask 002, user-private group) was
    refused; for a user any TMPDIR is its choice (also one under another user's directory); for
    root, group-writable is fine when the group is root's own (gid 0), refused for another group."""
    caller = 0 if case.startswith("root") else OTHER_UID
    parent = tmp_path
    if case == "user-under-other-owner":
        parent = _owned(tmp_path / "theirs", OTHER_UID + 1, 0o755)
    t = _owned(parent / "tmp", caller, 0o775)
    if case == "root-other-group-0775":
        os.chown(t, 0, OTHER_UID)
    _use_tmpdir(monkeypatch, t)
    _as_caller(monkeypatch, caller)
    mine = t / f"hami-exec-{caller}"
    if caller:
        _owned(mine, caller, 0o700)
    if accepted:
        assert _region_dir(tmp_path) == str(mine)
    else:
        with pytest.raises(execcmd.ExecError, match=f"writable by group gid {OTHER_UID}") as err:
            plan(tmp_path)
        assert repr(str(t)) in str(err.value) and f"chmod g-w {t}" in str(err.value)


def _fake_proc(tmp_path, monkeypatch, uid_map: str, overflow: str) -> None:
    (tmp_path / "uid_map").write_text(uid_map)
    (tmp_path / "overflowuid").write_text(overflow)
    monkeypatch.setattr(execcmd, "_UID_MAP", str(tmp_path / "uid_map"), raising=False)
    monkeypatch.setattr(execcmd, "_OVERFLOW_UID", str(tmp_path / "overflowuid"), raising=False)


@pytest.mark.parametrize(
    "uid_map, accepted",
    [("         0       1000          1\n", True), ("         0          0 4294967295\n", False)],
    ids=["user-namespace", "identity-map"],
)
def test_overflow_uid_counts_as_root_in_a_user_namespace(tmp_path, monkeypatch, uid_map, accepted):
    """Found by review, 1 Dec: root in a user namespace where host root is unmapped (rootless
    podman; /proc/self/uid_map `0 1000 1`) sees / and /tmp owned by the overflow uid (here 4242,
    read from /proc/sys/kernel/overflowuid): every TMPDIR was refused. That uid counts as root
    there; with the identity map (no user namespace) it is another user, refused."""
    _fake_proc(tmp_path, monkeypatch, uid_map, "4242\n")
    host = _owned(tmp_path / "host", 4242, 0o755)
    t = _owned(host / "tmp", 4242, 0o1777)
    _use_tmpdir(monkeypatch, t)
    if accepted:
        assert _region_dir(tmp_path) == str(t / "hami-exec-0")
    else:
        with pytest.raises(execcmd.ExecError, match="owned by uid 4242, not by root") as err:
            plan(tmp_path)
        assert repr(str(host)) in str(err.value)


def test_execute_only_ancestor_is_looked_up_not_read(tmp_path, monkeypatch):
    """Found by review, 1 Dec: a root-owned 0711 ancestor (hardened /home, HPC /scratch) was opened
    O_RDONLY, refused to a caller that cannot read it (root in a user namespace); ancestors are
    now opened O_PATH. The kernel's EACCES for that caller is played by os.open (the test is root)."""
    xonly = _owned(tmp_path / "home", 0, 0o711)
    t = _owned(xonly / "t", 0, 0o1777)
    _use_tmpdir(monkeypatch, t)
    xo = os.stat(xonly)
    real_open = os.open
    reads = []

    def open_without_read_permission(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (xo.st_dev, xo.st_ino) and not flags & os.O_PATH:
            os.close(fd)
            reads.append(path)
            raise PermissionError(13, "Permission denied")
        return fd

    monkeypatch.setattr(execcmd.os, "open", open_without_read_permission)
    assert _region_dir(tmp_path) == str(t / "hami-exec-0")
    assert reads == []


def test_open_error_names_the_directory_that_failed(tmp_path, monkeypatch):
    """Found by review, 1 Dec: TMPDIR <tmp_path>/file/t with `file` a regular file: the error named
    <tmp_path> (the last directory opened), not `file`, the one that failed."""
    (tmp_path / "file").write_text("")
    t = tmp_path / "file" / "t"
    _use_tmpdir(monkeypatch, t)
    with pytest.raises(execcmd.ExecError) as err:
        plan(tmp_path)
    msg = str(err.value)
    assert f"cannot open {str(tmp_path / 'file')!r}: Not a directory" in msg
    assert f"cannot open {str(tmp_path)!r}" not in msg


def test_region_file_failure_is_one_error_line(tmp, tmp_path, monkeypatch):
    """Found by review, 1 Dec: a failing fchmod of the new region file (EPERM, e.g. a filesystem
    that refuses modes) was a bare OSError (traceback); now one line naming the file and the
    error, and the file is removed."""
    real_fchmod = os.fchmod

    def fchmod(fd, m):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionError(1, "Operation not permitted")
        return real_fchmod(fd, m)

    monkeypatch.setattr(execcmd.os, "fchmod", fchmod)
    mine = tmp / f"hami-exec-{os.getuid()}"
    with pytest.raises(execcmd.ExecError) as err:
        plan(tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"region file '{mine}/hami-exec-") and "Operation not permitted" in msg
    assert "\n" not in msg and os.listdir(mine) == []


_USERNS_CHILD = r"""
import ctypes, os, sys
from hami import execcmd  # imported first: the host's files may not be readable in the namespace
host = int(sys.argv[1])
r, w = os.pipe()
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r); os.close(w2)
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
        print("SKIP unshare: errno", ctypes.get_errno(), flush=True)
        os._exit(0)
    os.write(w, b"x")
    os.read(r2, 1)
    os.setgid(0); os.setuid(0)
    try:
        d, fd = execcmd._exec_dir(False)
        print("OK", execcmd._new_region(d, fd, 0o600), flush=True)
    except Exception as exc:
        print("ERR", type(exc).__name__, exc, flush=True)
    os._exit(0)
os.close(w); os.close(r2)
if os.read(r, 1):
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {host} 1"), ("gid_map", f"0 {host} 1")):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)
    os.write(w2, b"x")
os.waitpid(pid, 0)
"""


def test_root_of_a_real_user_namespace_uses_a_tmpdir_under_host_roots_dirs(tmp_path):
    """Found by review, 1 Dec: root of a user namespace mapped to host uid 1000 (rootless podman,
    bubblewrap) sees / and /tmp owned by 65534 and a host-root 0711 directory it cannot read:
    its own TMPDIR below them was refused ("'/' is owned by uid 65534"). Real namespace, needs root."""
    st = os.stat("/tmp")
    if os.geteuid() != 0 or st.st_uid != 0 or not st.st_mode & stat.S_ISVTX:
        pytest.skip("needs root and a root-owned sticky /tmp")
    base = tempfile.mkdtemp(prefix="hami-userns-", dir="/tmp")
    try:
        os.chmod(base, 0o711)  # host root's, execute-only
        t = os.path.join(base, "t")
        os.mkdir(t)
        os.chown(t, OTHER_UID, OTHER_UID)
        src = os.path.dirname(os.path.dirname(execcmd.__file__))
        env = {**os.environ, "TMPDIR": t, "PYTHONPATH": src}
        out = subprocess.run(
            [sys.executable, "-c", _USERNS_CHILD, str(OTHER_UID)], env=env, capture_output=True, text=True, timeout=60
        )
        line = out.stdout.strip()
        if line.startswith("SKIP") or not line:
            pytest.skip(f"no user namespace here: {line or out.stderr.strip()[-300:]}")
        assert line.startswith(f"OK {t}/hami-exec-0/hami-exec-"), line
        region = line.split(" ", 1)[1]
        assert os.stat(region).st_uid == OTHER_UID and mode(region) == 0o600
    finally:
        shutil.rmtree(base)
