"""The node's one durable writer (hami.node.files.write_atomic) and the files that go through it:
both checkpoints, both kinds of CDI spec and the DRA claim record. Checkpoints written by the
code before the writer was shared still load."""

from __future__ import annotations

import json
import os
import stat

import pytest

from hami.node.mig import Checkpoint as MigCheckpoint, Entry
from hami.draplugin.checkpoint import Checkpoint as DraCheckpoint, CheckpointError
from hami.node import files
from hami.node.cdi import CdiConfig, CdiGpu, spec, write_document, write_spec
from hami.node.files import WriteError, write_atomic


@pytest.fixture
def fsyncs(monkeypatch):
    """The paths fsynced, in order (files and directories)."""
    seen: list[str] = []
    real = os.fsync

    def spy(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(files.os, "fsync", spy)
    return seen


def test_write_is_complete_durable_and_leaves_no_temporary(tmp_path, fsyncs):
    target = tmp_path / "deep" / "state.json"
    assert write_atomic(target, "one", mode=0o600) == target
    write_atomic(target, b"two")
    assert target.read_text() == "two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(target.parent) == ["state.json"]
    # each write: the temporary file's data, then the directory holding the rename
    assert fsyncs[1::2] == [str(target.parent)] * 2
    assert all(p.startswith(str(target.parent) + "/.state.json.") for p in fsyncs[0::2])


def test_a_failed_write_names_the_path_and_keeps_the_old_content(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    target.write_text("old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(WriteError, match=f"{target}: cannot write .*No space left") as err:
        write_atomic(target, "new")
    assert isinstance(err.value, OSError)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["state.json"]


def test_an_unwritable_directory_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WriteError, match=str(blocker / "x.json")):
        write_atomic(blocker / "x.json", "{}")


# ----------------------------------------------------------------------- every writer goes through it


def _dir_synced(fsyncs, directory) -> bool:
    return str(directory) in fsyncs


def test_mig_checkpoint_is_written_durably(tmp_path, fsyncs):
    MigCheckpoint(tmp_path / "mig" / "checkpoint.json").save({})
    assert _dir_synced(fsyncs, tmp_path / "mig")


def test_dra_checkpoint_is_written_durably_and_private(tmp_path, fsyncs):
    DraCheckpoint(tmp_path / "dra" / "checkpoint.json").put("u", {"devices": []})
    assert _dir_synced(fsyncs, tmp_path / "dra")
    assert stat.S_IMODE((tmp_path / "dra" / "checkpoint.json").stat().st_mode) == 0o600


def test_cdi_specs_are_written_durably(tmp_path, fsyncs):
    path = write_spec(spec([CdiGpu("GPU-1", 0)], CdiConfig("cdi-cri")), tmp_path / "cdi")
    claim = write_document(
        {"cdiVersion": "0.6.0", "kind": "gpu.hami.io/claim", "devices": []}, tmp_path / "cdi" / "gpu.hami.io-u.json"
    )
    assert _dir_synced(fsyncs, tmp_path / "cdi")
    assert json.loads(claim.read_text())["kind"] == "gpu.hami.io/claim"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path / "cdi")) == ["gpu.hami.io-u.json", "hami-gpu.json"]


def test_dra_checkpoint_write_failure_names_the_file(tmp_path, monkeypatch):
    cp = DraCheckpoint(tmp_path / "checkpoint.json")
    monkeypatch.setattr(files.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'checkpoint.json'}: cannot write"):
        cp.put("u", {})


# ----------------------------------------------------------------------- old files still load


def test_mig_checkpoint_written_by_the_old_writer_loads(tmp_path):
    # byte for byte what the device plugin wrote before (json.dumps(..., indent=1), version 1)
    entry = {
        "pod_uid": "uid-1",
        "pod": "ns/p",
        "container": 0,
        "device": 0,
        "gpu_uuid": "GPU-1",
        "profile": "1g.5gb",
        "start": 0,
        "size": 1,
        "state": "ready",
        "gpu_instance_id": 7,
        "compute_instance_id": 0,
        "mig_uuid": "MIG-1",
    }
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 1, "entries": [entry]}, indent=1))
    loaded = MigCheckpoint(path).load()
    assert loaded == {"uid-1/0/0": Entry(**entry)}
    MigCheckpoint(path).save(loaded)  # and the new writer writes what the old reader read
    assert json.loads(path.read_text()) == {"version": 1, "entries": [entry]}


def test_dra_checkpoint_written_by_the_old_writer_loads(tmp_path):
    claims = {
        "uid-1": {
            "namespace": "ns",
            "name": "c",
            "devices": [{"device_name": "gpu-0"}],
            "cdi_file": "/var/run/cdi/gpu.hami.io-uid-1.json",
            "cdi_spec": {"kind": "gpu.hami.io/claim"},
            "claim_dir": "/usr/local/vgpu/claims/uid-1",
        }
    }
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 1, "claims": claims}, sort_keys=True, indent=1))
    cp = DraCheckpoint(path)
    assert cp.uids() == ["uid-1"] and cp.get("uid-1") == claims["uid-1"]


# --- reading back: only a regular file, never blocking, bounded ---------------------------------


def test_read_small_reads_a_regular_file(tmp_path):
    path = tmp_path / "f.json"
    path.write_bytes(b'{"a": 1}')
    assert files.read_small(path) == b'{"a": 1}'


def test_read_small_refuses_a_fifo_without_blocking(tmp_path):
    """A FIFO nobody writes to: a plain open() waits for a writer for ever. (If this test hangs,
    read_small blocks.)"""
    fifo = tmp_path / "checkpoint.json"
    os.mkfifo(fifo)
    with pytest.raises(files.NotRegularFileError, match="not a regular file") as err:
        files.read_small(fifo)
    assert str(fifo) in str(err.value)


def test_read_small_refuses_a_directory_and_a_file_past_the_bound(tmp_path):
    with pytest.raises(IsADirectoryError):
        files.read_small(tmp_path)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    assert files.read_small(big, limit=101) == b"x" * 101
    with pytest.raises(OSError, match="larger than 100 bytes") as err:
        files.read_small(big, limit=100)
    assert str(big) in str(err.value)
    with pytest.raises(FileNotFoundError):
        files.read_small(tmp_path / "missing")


def test_a_fifo_at_the_dra_checkpoint_is_an_error_naming_it(tmp_path):
    """Found by make fuzz: a FIFO at the DRA agent's checkpoint path hung its start."""
    fifo = tmp_path / "checkpoint.json"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="cannot read.*not a regular file") as err:
        DraCheckpoint(fifo)
    assert str(fifo) in str(err.value)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # left as it was, for someone to look at


def test_a_fifo_at_the_mig_checkpoint_is_an_error_naming_it(tmp_path):
    from hami.node.nvml import MigError

    fifo = tmp_path / "mig.json"
    os.mkfifo(fifo)
    with pytest.raises(MigError, match="unreadable") as err:
        MigCheckpoint(fifo).load()
    assert str(fifo) in str(err.value)


def test_a_fifo_or_non_utf8_node_config_is_an_error_naming_it(tmp_path):
    from hami.node.settings import NodeConfigError, _read

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(NodeConfigError, match="cannot read") as err:
        _read(fifo, json.loads, "node config")
    assert str(fifo) in str(err.value)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{")
    with pytest.raises(NodeConfigError, match="not UTF-8"):
        _read(bad, json.loads, "node config")


def test_remove_tree_takes_any_depth_and_never_follows_a_link(tmp_path):
    """A container nests directories as deep as it likes in its region or claim directory:
    shutil.rmtree recursed once per level and raised RecursionError past ~1000, which the DRA
    agent did not catch (found by review). Links, in the tree or in its place, are unlinked."""
    import os

    from hami.node.files import remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    top = tmp_path / "claim"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    try:
        for i in range(3000):  # deeper than any path: walked by descriptor
            os.mkdir("d" * 200, dir_fd=fd)
            if i % 500 == 0:
                os.symlink(outside, "link", dir_fd=fd)
                with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
                    f.write("y")
            inner = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    remove_tree(top)
    assert not top.exists() and (outside / "keep").read_text() == "x"
    remove_tree(top)  # absent: nothing to do
    (tmp_path / "a-link").symlink_to(outside)
    remove_tree(tmp_path / "a-link")
    assert not (tmp_path / "a-link").is_symlink() and (outside / "keep").exists()
    (tmp_path / "a-file").write_text("z")
    remove_tree(tmp_path / "a-file")
    assert not (tmp_path / "a-file").exists()


def test_remove_tree_raises_what_it_cannot_remove(tmp_path, monkeypatch):
    """A file that cannot go (EACCES, EBUSY) is the caller's to report: raised, not skipped."""
    import os

    import pytest

    from hami.node import files

    (tmp_path / "c" / "d").mkdir(parents=True)
    (tmp_path / "c" / "d" / "f").write_text("x")

    def refuse(name, *, dir_fd=None):
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(files.os, "unlink", refuse)
    with pytest.raises(PermissionError):
        files.remove_tree(tmp_path / "c")
    assert (tmp_path / "c" / "d" / "f").exists()
    monkeypatch.undo()
    files.remove_tree(tmp_path / "c")
    assert not (tmp_path / "c").exists() and os.listdir(tmp_path) == []


def test_remove_tree_stops_when_a_directory_is_moved_up_under_it(tmp_path, monkeypatch):
    """A container still running moves the directory being emptied up a level: climbing back by
    "..", the walk went one level too high, out of the tree, and emptied its neighbours (another
    claim's region, libvgpu itself; found by review). Each parent is checked now."""
    import errno
    import os

    import pytest

    from hami.node import files

    claims = tmp_path / "claims"
    (claims / "X" / "X" / "big").mkdir(parents=True)
    (claims / "X" / "X" / "big" / "f").write_text("x")
    (claims / "OTHER").mkdir()
    (claims / "OTHER" / "keep").write_text("y")
    (claims / "record.json").write_text("{}")
    big = os.stat(claims / "X" / "X" / "big")
    real = files._empty_of_files

    def moving(fd):
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (big.st_dev, big.st_ino):
            os.rename(claims / "X" / "X" / "big", claims / "X" / "big")  # the tenant, meanwhile
        return real(fd)

    monkeypatch.setattr(files, "_empty_of_files", moving)
    with pytest.raises(OSError) as err:
        files.remove_tree(claims / "X")
    assert err.value.errno == errno.ESTALE and "moved" in str(err.value)
    assert (claims / "OTHER" / "keep").read_text() == "y" and (claims / "record.json").exists()
    monkeypatch.undo()
    files.remove_tree(claims / "X")  # the next try, nothing moving: all of it
    assert sorted(p.name for p in claims.iterdir()) == ["OTHER", "record.json"]


def test_remove_tree_reads_a_wide_directory_once(tmp_path, monkeypatch):
    """After each subdirectory the walk read its parent again from the start: quadratic in a
    directory of many subdirectories (40,000: 40 s; found by review). Each is read once now."""
    import os

    from hami.node import files

    top = tmp_path / "wide"
    top.mkdir()
    for i in range(300):
        (top / f"d{i}").mkdir()
        (top / f"d{i}" / "f").write_text("x")
    reads = []
    real = os.scandir
    monkeypatch.setattr(files.os, "scandir", lambda fd: reads.append(fd) or real(fd))
    files.remove_tree(top)
    assert not top.exists() and len(reads) == 301
