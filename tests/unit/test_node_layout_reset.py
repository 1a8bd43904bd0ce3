"""A container's region directory is the container's to write, and the node agent (root) resets
it and writes the grant file in it at every container creation. Found by review (1 Dec): the
directory was emptied in place and reused when that failed, and the grant file written through
whatever was at its name, so another container of the pod holding the directory open could keep
a link there and have the host's ld.so.preload overwritten; and a directory of 50,000 files held
the NRI hook past containerd's deadline."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hami.node import files, layout
from hami.node.layout import GRANT_FILE, TRASH_PREFIX, remove_trash, reset_cache_dir, write_grant


def _settle(containers: Path) -> None:
    deadline = time.monotonic() + 60  # a hang guard for the background removal, not a measurement
    while any(p.name.startswith(TRASH_PREFIX) for p in containers.iterdir()):
        assert time.monotonic() < deadline, "the old directory was never removed"
        time.sleep(0.01)


def test_the_grant_file_replaces_a_link_planted_at_its_name_and_writes_nothing_through_it(tmp_path):
    host_file = tmp_path / "ld.so.preload"
    host_file.write_text("/usr/local/vgpu/libvgpu.so\n")
    region = tmp_path / "containers" / "uid_main"
    region.mkdir(parents=True)
    (region / GRANT_FILE).symlink_to(host_file)
    write_grant(str(region), "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n")
    assert host_file.read_text() == "/usr/local/vgpu/libvgpu.so\n"  # untouched
    assert not (region / GRANT_FILE).is_symlink()
    assert (region / GRANT_FILE).read_text() == "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n"
    assert (region / GRANT_FILE).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in region.iterdir()) == [GRANT_FILE]  # no temporary file left


def test_a_reset_renames_the_old_directory_aside_and_removes_it_off_the_callers_thread(tmp_path, monkeypatch):
    containers = tmp_path / "containers"
    region = containers / "uid_main"
    (region / "deep" / "er").mkdir(parents=True)
    for i in range(50):
        (region / f"f{i}").write_text("x")
    (region / GRANT_FILE).symlink_to(tmp_path / "elsewhere")
    old_inode = region.stat().st_ino
    removed_on: list[str] = []
    real = layout.remove_tree

    def recording(path):
        removed_on.append(threading.current_thread().name)
        real(path)

    monkeypatch.setattr(layout, "remove_tree", recording)
    reset_cache_dir(str(region))
    assert region.stat().st_ino != old_inode  # a new directory, whatever the old one held
    assert list(region.iterdir()) == [] and region.stat().st_mode & 0o777 == 0o777
    _settle(containers)
    assert removed_on == ["remove uid_main"]  # in its own thread, not the caller's (the event loop)
    assert sorted(p.name for p in containers.iterdir()) == ["uid_main"]
    reset_cache_dir(str(containers / "uid_new"))  # none yet: just made
    assert (containers / "uid_new").is_dir()


def test_whatever_is_at_the_name_is_put_aside_and_a_failure_to_make_the_directory_is_an_error(tmp_path, monkeypatch):
    containers = tmp_path / "containers"
    containers.mkdir()
    (containers / "uid_main").write_text("not a directory")  # renamed aside, then made anew
    reset_cache_dir(str(containers / "uid_main"))
    assert (containers / "uid_main").is_dir()
    _settle(containers)

    def refused(path, exist_ok=False):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(layout.os, "makedirs", refused)
    with pytest.raises(OSError):  # raised to the caller: the container is refused, nothing reused
        reset_cache_dir(str(containers / "uid_main"))


def test_what_an_earlier_agent_left_aside_is_removed_at_start(tmp_path):
    containers = tmp_path / "containers"
    (containers / f"{TRASH_PREFIX}0123").mkdir(parents=True)
    (containers / f"{TRASH_PREFIX}0123" / "region.cache").write_text("x")
    (containers / "uid_main").mkdir()
    remove_trash(str(containers))
    _settle(containers)
    assert sorted(p.name for p in containers.iterdir()) == ["uid_main"]


def test_the_grant_files_temporary_copy_is_made_where_no_container_writes(tmp_path, monkeypatch):
    """Regression review (1 Dec): the temporary file was made in the region directory, which the
    claim's running containers write: swapped for a link before the rename (inotify tells when),
    the link landed at the grant's name, and the next container's mount resolved it to a host
    file. It is made in the directory above (the agent's alone) and renamed in."""
    region = tmp_path / "claims" / "uid1"
    region.mkdir(parents=True)
    made_in: list[str] = []
    real = files.tempfile.mkstemp

    def recording(*args, **kwargs):
        made_in.append(str(kwargs.get("dir")))
        return real(*args, **kwargs)

    monkeypatch.setattr(files.tempfile, "mkstemp", recording)
    write_grant(str(region), "HAMI_GRANT_DEVICES=GPU-1\n")
    assert made_in == [str(tmp_path / "claims")]
    assert (region / GRANT_FILE).read_text() == "HAMI_GRANT_DEVICES=GPU-1\n"
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["uid1"]  # nothing left beside it
