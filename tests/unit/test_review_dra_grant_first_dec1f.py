"""A DRA claim's grant file is the source of a read-only bind mount in each of the claim's running
containers, and a rename over a file that is a mount point in another mount namespace unmounts it
there. Found by the regression review of the repeat-prepare fix (1 Dec):

- the FIRST prepare of a claim (no checkpoint entry: the checkpoint moved away as docs/dra.md
  says, dra.stateDir changed) still renamed a new grant over the one a running pod mounts; now a
  directory that is there is kept and its grant checked in place as at a repeat prepare (kept,
  rewritten in place, anything else refused and never followed);
- a region directory the agent made, then failed to write the grant into (ENOSPC, the agent
  killed between), was refused at every retry ("missing"): the pod stuck in ContainerCreating.
  Now the directory is made whole under a dot name in ``claims/`` and renamed to its name.

A real Driver, checkpoint and files (the helpers of test_draplugin_lifecycle)."""

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest

from hami.draplugin import plugin
from hami.draplugin.prepare import PrepareError

from .test_draplugin_lifecycle import Api, make, result
from .test_review_dra_grant_mount_dec1e import _unshare_works, mount_survives, prepared


async def lost_checkpoint(root):
    """Claim ns/c (u1) prepared (a pod runs with its grant mounted), then its checkpoint moved
    away as docs/dra.md says for an unreadable one; a new driver on the same paths. (driver,
    paths, grant path, answer of the first prepare)."""
    _, paths, api, grant, first = await prepared(root)
    checkpoint = root / "state" / "checkpoint.json"
    checkpoint.rename(root / "state" / "checkpoint.json.moved-away")
    driver, _ = make(root, api)
    assert driver.checkpoint.get("u1") is None
    return driver, paths, grant, first


async def test_a_first_prepare_keeps_an_intact_grant_that_is_there(tmp_path):
    """Found by review, 1 Dec: the checkpoint moved away, the claim's next prepare (a second pod, a
    kubelet restart) took the first-prepare path and renamed a new grant over the mounted one."""
    driver, _, grant, first = await lost_checkpoint(tmp_path)
    before = os.stat(grant)
    text = grant.read_text()

    assert await driver.prepare("ns", "c", "u1") == first

    after = os.stat(grant)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert after.st_mtime_ns == before.st_mtime_ns and grant.read_text() == text
    assert driver.checkpoint.get("u1") is not None


@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare -m (a mount namespace of its own)")
async def test_a_first_prepare_keeps_the_grant_mounted_in_a_running_container(tmp_path):
    """Found by review, 1 Dec: pod P1 runs with the grant mounted (another mount namespace), the
    checkpoint is moved away, and the next prepare of the claim unmounted P1's grant."""
    driver, _, grant, first = await lost_checkpoint(tmp_path)

    async def first_prepare() -> None:
        assert await driver.prepare("ns", "c", "u1") == first

    assert await mount_survives(grant, tmp_path, first_prepare), (
        "P1's grant mount is gone after the claim's first prepare"
    )


async def test_a_first_prepare_rewrites_the_agents_grant_with_other_text_in_place(tmp_path):
    """Found by review, 1 Dec: the same scenario, the grant the agent wrote holding other text:
    the new grant goes through the same inode (the running pod's mount stays)."""
    driver, _, grant, first = await lost_checkpoint(tmp_path)
    text = grant.read_text()
    before = os.stat(grant)
    with open(grant, "r+") as f:
        f.write("CUDA_DEVICE_MEMORY_LIMIT_0=\n")
        f.truncate()

    assert await driver.prepare("ns", "c", "u1") == first

    after = os.stat(grant)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert grant.read_text() == text and stat.S_IMODE(after.st_mode) == 0o644


@pytest.mark.parametrize("what", ["link", "fifo"])
async def test_a_first_prepare_refuses_a_link_or_fifo_at_the_grant_name(tmp_path, what):
    """Found by review, 1 Dec: the same scenario, the tenant's link or FIFO at the grant's name
    (its mount gone): refused naming claim, path and what, nothing followed or opened, and the
    directory left (removing it would unmount it in the claim's pods)."""
    driver, paths, grant, _ = await lost_checkpoint(tmp_path)
    outside = tmp_path / "kubelet-client-current.pem"
    outside.write_text("the host's key\n")
    grant.unlink()
    if what == "link":
        grant.symlink_to(outside)
    else:
        os.mkfifo(grant)  # opened for reading, this would block until a writer comes
    region = Path(paths.claim_dir("u1"), "region.cache")
    region.write_text("the pod's region")

    with pytest.raises(PrepareError) as err:
        await driver.prepare("ns", "c", "u1")

    message = str(err.value)
    assert "ns/c (u1)" in message and str(grant) in message
    assert ("symbolic link" if what == "link" else "FIFO") in message and err.value.reason == "io"
    assert outside.read_text() == "the host's key\n" and stat.S_IMODE(outside.stat().st_mode) != 0o777
    if what == "link":
        assert grant.is_symlink() and os.readlink(grant) == str(outside)
    else:
        assert stat.S_ISFIFO(os.lstat(grant).st_mode)
    assert region.read_text() == "the pod's region"  # the directory kept
    assert driver.checkpoint.get("u1") is None and not Path(paths.cdi_file("u1")).exists()


def _fail_once(monkeypatch):
    """write_grant in the plugin fails once with ENOSPC, as a full disk would."""
    real = plugin.write_grant
    calls = []

    def write_grant(directory, text):
        calls.append(directory)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(directory, text)

    monkeypatch.setattr(plugin, "write_grant", write_grant)
    return calls


def _made_whole(paths, uid, text=None, left=()):
    """The claim's directory 0777 with its grant 0644 (``text``), nothing but ``left`` dot-named
    beside it."""
    directory = Path(paths.claim_dir(uid))
    grant = directory / "hami-grant.env"
    assert stat.S_IMODE(directory.lstat().st_mode) == 0o777 and stat.S_ISDIR(directory.lstat().st_mode)
    assert stat.S_ISREG(grant.lstat().st_mode) and stat.S_IMODE(grant.lstat().st_mode) == 0o644
    if text is not None:
        assert grant.read_text() == text
    assert [n for n in os.listdir(directory.parent) if n.startswith(".")] == list(left)  # nothing of the making


async def test_a_region_made_again_whose_grant_write_failed_is_made_at_the_retry(tmp_path, monkeypatch):
    """Found by review, 1 Dec: the directory gone (an unprepare whose checkpoint write failed),
    the repeat prepare made it, then failed to write the grant (ENOSPC): every retry was refused
    as a grant missing from a directory that may be mounted."""
    driver, paths, _, grant, first = await prepared(tmp_path)
    text = grant.read_text()
    shutil.rmtree(paths.claim_dir("u1"))
    calls = _fail_once(monkeypatch)

    with pytest.raises(OSError) as err:
        await driver.prepare("ns", "c", "u1")
    assert err.value.errno == errno.ENOSPC
    half_made = os.path.lexists(paths.claim_dir("u1"))

    assert await driver.prepare("ns", "c", "u1") == first  # (refused as "missing" before)
    assert len(calls) == 2 and not half_made  # never shown without its grant
    _made_whole(paths, "u1", text)


async def test_a_first_prepare_whose_grant_write_failed_is_made_at_the_retry(tmp_path, monkeypatch):
    """Found by review, 1 Dec: the same at the first prepare (the directory made, the grant write
    failed): the retry must make it, not refuse it."""
    api = Api()
    driver, paths = make(tmp_path, api)
    api.set("c", "u1", result())
    calls = _fail_once(monkeypatch)

    with pytest.raises(OSError) as err:
        await driver.prepare("ns", "c", "u1")
    assert err.value.errno == errno.ENOSPC
    assert driver.checkpoint.get("u1") is None
    half_made = os.path.lexists(paths.claim_dir("u1"))

    await driver.prepare("ns", "c", "u1")
    assert len(calls) == 2 and driver.checkpoint.get("u1") is not None and not half_made
    _made_whole(paths, "u1")


async def test_what_a_killed_agent_left_of_a_making_is_removed_and_never_read(tmp_path):
    """Found by review, 1 Dec: the agent killed between making the directory and writing its
    grant. Now only a dot-named directory is left in claims/: the next prepare makes the claim's
    directory and removes it; another claim's such directory (and unfinished file names) is
    left alone; the monitor does not read it as a claim."""
    from hami.monitor.containers import scan_claims

    api = Api()
    driver, paths = make(tmp_path, api)
    api.set("c", "u1", result())
    claims = Path(paths.claim_dir("u1")).parent
    claims.mkdir(parents=True, mode=0o700)
    left = claims / ".u1.tmp-0123456789abcdef"
    left.mkdir()
    other = claims / ".u1.tmp-x.tmp-0123456789abcdef"  # claim "u1.tmp-x"'s, not u1's
    other.mkdir()
    assert [c.uid for c in scan_claims(str(claims))] == []

    await driver.prepare("ns", "c", "u1")

    assert not left.exists() and other.exists()
    _made_whole(paths, "u1", left=[other.name])
    assert [c.uid for c in scan_claims(str(claims))] == ["u1"]
    other.rmdir()
    left.mkdir()
    await driver.unprepare("ns", "c", "u1")  # an unprepare removes it as well
    assert os.listdir(claims) == []


async def test_an_unprepare_whose_removal_fails_part_way_leaves_no_grantless_directory(tmp_path, monkeypatch):
    """Found by the regression review of e113fc3, 1 Dec: the removal unlinked the grant first,
    then failed deeper in the container's tree (EBUSY, EIO); the unprepare still ended the claim,
    and the claim's next prepare found its directory without a grant and refused it as tampered.
    Now the directory is taken from its name first: the next prepare makes it anew, and what the
    removal left is swept at the agent's next start (never read as a claim)."""
    from hami.monitor.containers import scan_claims

    driver, paths, api, grant, first = await prepared(tmp_path)
    directory = Path(paths.claim_dir("u1"))
    (directory / "deep").mkdir()
    (directory / "deep" / "stuck").write_text("a file the removal cannot take")
    real = plugin.remove_tree

    def fails_part_way(path):
        for name in sorted(os.listdir(path)):  # the grant and other files first, as remove_tree goes
            if os.path.isfile(os.path.join(path, name)):
                os.unlink(os.path.join(path, name))
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))

    monkeypatch.setattr(plugin, "remove_tree", fails_part_way)
    await driver.unprepare("ns", "c", "u1")
    monkeypatch.setattr(plugin, "remove_tree", real)

    claims = directory.parent
    assert not directory.exists() and driver.checkpoint.get("u1") is None
    [left] = os.listdir(claims)
    assert left.startswith(".u1.gone-") and [c.uid for c in scan_claims(str(claims))] == []

    [line] = driver.sweep_remains()  # what the removal left: swept at the agent's next start
    assert "removed 1" in line and os.listdir(claims) == []
    assert await driver.prepare("ns", "c", "u1") == first  # made anew, not refused
    _made_whole(paths, "u1")


async def test_an_unprepare_that_cannot_take_the_directory_away_keeps_the_claim_prepared(tmp_path, monkeypatch):
    """The directory cannot be renamed (EBUSY: a mount point here): the unprepare fails, the claim
    stays prepared with its directory whole, and the kubelet's retry finishes it."""
    driver, paths, _, grant, first = await prepared(tmp_path)
    real = os.rename

    def busy(src, dst, *a, **kw):
        if os.fspath(src) == paths.claim_dir("u1"):
            raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(src))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(plugin.os, "rename", busy)
    with pytest.raises(OSError):
        await driver.unprepare("ns", "c", "u1")
    assert driver.checkpoint.get("u1") is not None and grant.read_text()
    monkeypatch.setattr(plugin.os, "rename", real)
    await driver.unprepare("ns", "c", "u1")
    assert driver.checkpoint.get("u1") is None and not Path(paths.claim_dir("u1")).exists()
