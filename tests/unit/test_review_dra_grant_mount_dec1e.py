"""A DRA claim's grant file is the source of a read-only bind mount in each of the claim's running
containers (``<hook>/vgpu/hami-grant.env``). Found by review, 1 Dec: a repeat prepare (every
kubelet restart, then the next sandbox of any pod using the claim, which its tenant can start)
renamed a new grant over it, and a rename over a file that is a mount point in another mount
namespace unmounts it there: the running containers lost the mount, and the claim directory,
theirs to write, let them put a grant or a link of their choice at the name for the next
container's mount. Now an intact grant is left as it is (same inode), one the agent wrote with
other text is rewritten in place, anything else fails the prepare (never followed), and
``claims/`` is root's alone (0700). A real Driver, checkpoint and files (the helpers of
test_draplugin_lifecycle); one test makes a real bind mount in a mount namespace of its own."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from hami.draplugin.prepare import PrepareError
from hami.kube.client import KubeError

from .test_draplugin_lifecycle import Api, make, result


async def prepared(root):
    """A driver with claim ns/c (u1) prepared once; (driver, paths, api, grant path, answer)."""
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())
    first = await driver.prepare("ns", "c", "u1")
    return driver, paths, api, Path(paths.claim_dir("u1"), "hami-grant.env"), first


async def test_a_repeat_prepare_leaves_an_intact_grant_file_as_it_is(tmp_path):
    """Found by review, 1 Dec: the kubelet prepares the claim again (its cache reloaded after a
    restart, a second pod on the claim); the grant file was replaced (a new inode)."""
    driver, _, api, grant, first = await prepared(tmp_path)
    before = os.stat(grant)
    text = grant.read_text()

    assert await driver.prepare("ns", "c", "u1") == first  # the claim as prepared: a hit
    api.fail = KubeError("GET", "/x", 503, "unavailable")  # the claim cannot be read: answered as recorded
    assert await driver.prepare("ns", "c", "u1") == first

    after = os.stat(grant)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert after.st_mtime_ns == before.st_mtime_ns and grant.read_text() == text


def _unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


async def mount_survives(grant: Path, root: Path, act) -> bool:
    """Whether a container's read-only mount of ``grant`` (a mount namespace of its own, mounted as
    the runtime mounts a claim's container: the claim directory at ``<hook>/vgpu``, then the grant
    file read-only over its own name there, the same dentry as on the host) is still there after
    ``await act()``."""
    vgpu = root / "container-vgpu"
    vgpu.mkdir()
    target = vgpu / "hami-grant.env"
    script = (
        f"mount --bind '{grant.parent}' '{vgpu}' && mount --bind -o ro '{grant}' '{target}' && "
        f"echo mounted && read _ && grep -c ' {target} ' /proc/self/mountinfo; true"
    )
    container = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert container.stdout is not None and container.stdout.readline().strip() == "mounted"
        await act()
        out, _ = container.communicate("go\n")
    finally:
        if container.poll() is None:
            container.kill()
            container.wait()
    return out.strip() == "1"


@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare -m (a mount namespace of its own)")
async def test_a_repeat_prepare_keeps_the_grant_mounted_in_a_running_container(tmp_path):
    """Found by review, 1 Dec: a container's read-only mount of the grant (another mount
    namespace) was gone after the claim's repeat prepare; the kernel unmounts a mount point
    another namespace renames a file over."""
    driver, _, _, grant, first = await prepared(tmp_path)

    async def repeat() -> None:
        assert await driver.prepare("ns", "c", "u1") == first

    assert await mount_survives(grant, tmp_path, repeat), "the container's grant mount is gone after the repeat prepare"


async def test_a_link_at_the_grant_name_is_refused_and_never_followed(tmp_path):
    """Found by review, 1 Dec: with the mount lost, a tenant put a link to a host file at the
    grant's name for the next container's mount to resolve. The prepare now fails naming the
    claim and the file, and neither follows the link nor makes a new file under it."""
    driver, _, _, grant, _ = await prepared(tmp_path)
    outside = tmp_path / "kubelet-client-current.pem"
    outside.write_text("the host's key\n")
    grant.unlink()
    grant.symlink_to(outside)

    with pytest.raises(PrepareError) as err:
        await driver.prepare("ns", "c", "u1")

    assert "ns/c (u1)" in str(err.value) and str(grant) in str(err.value) and "symbolic link" in str(err.value)
    assert err.value.reason == "io"
    assert grant.is_symlink() and os.readlink(grant) == str(outside)  # left for the admin to see
    assert outside.read_text() == "the host's key\n" and stat.S_IMODE(outside.stat().st_mode) != 0o777


@pytest.mark.parametrize("what", ["missing", "fifo", "other owner", "two links", "a directory"])
async def test_anything_but_the_agents_grant_file_fails_the_prepare(tmp_path, what):
    """Found by review, 1 Dec: while the grant is mounted in a container nothing there can
    remove or replace it, so any of these means its mounts may be gone; made again, the tenant
    could replace it before the next container's mount: refused, naming claim, path and what."""
    driver, paths, _, grant, _ = await prepared(tmp_path)
    expect = {
        "missing": "missing",
        "fifo": "FIFO",
        "other owner": "owned by UID",
        "two links": "2 links",
        "a directory": "a directory",
    }[what]
    if what == "missing":
        grant.unlink()
    elif what == "fifo":
        grant.unlink()
        os.mkfifo(grant)  # opened for reading, this would block until a writer comes
    elif what == "other owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the file another owner")
        os.chown(grant, 1000, 1000)
    elif what == "two links":
        os.link(grant, Path(paths.claim_dir("u1"), "kept"))
    else:
        grant.unlink()
        grant.mkdir()
    with pytest.raises(PrepareError) as err:
        await driver.prepare("ns", "c", "u1")
    assert "ns/c (u1)" in str(err.value) and str(grant) in str(err.value) and expect in str(err.value)
    assert driver.checkpoint.get("u1") is not None  # still prepared: nothing of it removed


async def test_a_grant_file_with_other_text_is_rewritten_in_place(tmp_path, caplog):
    """Found by review, 1 Dec: the agent's own file (an older agent's text, or one written into
    it) gets the recorded grant through the same inode, so the containers' mounts stay."""
    driver, _, _, grant, first = await prepared(tmp_path)
    text = grant.read_text()
    before = os.stat(grant)
    with open(grant, "r+") as f:  # as a process that can write it would
        f.write("CUDA_DEVICE_MEMORY_LIMIT_0=\n")
        f.truncate()
    os.chmod(grant, 0o666)

    assert await driver.prepare("ns", "c", "u1") == first

    after = os.stat(grant)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert grant.read_text() == text and stat.S_IMODE(after.st_mode) == 0o644
    assert any("ns/c (u1)" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


async def test_the_claims_directory_is_root_only(tmp_path):
    """Found by review, 1 Dec: ``claims/`` was 0755, so host users reached what tenants put in
    their claim directories (a setuid file, a device node). Made 0700, and set so at a repeat
    prepare where an older agent made it 0755."""
    driver, paths, _, _, first = await prepared(tmp_path)
    claims = Path(paths.claim_dir("u1")).parent
    assert stat.S_IMODE(claims.stat().st_mode) == 0o700
    assert stat.S_IMODE(Path(paths.claim_dir("u1")).stat().st_mode) == 0o777  # the containers' to write
    os.chmod(claims, 0o755)
    assert await driver.prepare("ns", "c", "u1") == first
    assert stat.S_IMODE(claims.stat().st_mode) == 0o700


@pytest.mark.parametrize("when", ["first prepare", "repeat prepare"])
async def test_a_link_in_place_of_the_claims_directory_fails_the_prepare(tmp_path, when):
    """``claims/`` a link (to a directory of the host): the prepare fails naming the claim, the
    path and why, and the link's target keeps its mode (never chmod'ed through the link)."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    if when == "first prepare":
        api = Api()
        driver, paths = make(tmp_path, api)
        api.set("c", "u1", result())
        claims = Path(paths.claim_dir("u1")).parent
        claims.parent.mkdir(parents=True, exist_ok=True)
    else:
        driver, paths, _, _, _ = await prepared(tmp_path)
        claims = Path(paths.claim_dir("u1")).parent
        claims.rename(tmp_path / "moved")
    claims.symlink_to(target)

    with pytest.raises(PrepareError) as err:
        await driver.prepare("ns", "c", "u1")

    message = str(err.value)
    assert "ns/c (u1)" in message and str(claims) in message and "symbolic link" in message
    assert err.value.reason == "io"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755 and list(target.iterdir()) == []


async def test_a_claim_directory_removed_entirely_is_made_again_with_its_grant(tmp_path):
    """The directory gone (an unprepare removed it, then failed to write the checkpoint): nothing
    of it is mounted anywhere, so it is made again as at the first prepare."""
    driver, paths, _, grant, first = await prepared(tmp_path)
    text = grant.read_text()
    shutil.rmtree(paths.claim_dir("u1"))
    assert await driver.prepare("ns", "c", "u1") == first
    assert grant.read_text() == text and stat.S_IMODE(grant.stat().st_mode) == 0o644
