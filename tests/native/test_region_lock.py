"""The region lock of libvgpu: a robust process-shared mutex in the layout's last slot.
Uncontended it makes no system call; a holder killed inside it neither blocks a waiter already
sleeping on it nor later callers, and the waiter reclaims the dead holder's memory; no process
ever takes the lock's slot."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import BUILD, run_py
from .region_layout import LOCK_MAGIC, LOCK_SLOT, fill_slots, read_lock_slot, read_region

pytestmark = pytest.mark.native
MiB = 1 << 20
DRIVER = BUILD / "bench" / "bench_driver"
SYS_FUTEX = 202  # x86-64


def _loop_syscalls(env: dict[str, str], log: Path, op: str, n: int) -> list[str]:
    """Names of the system calls the driver's main thread makes inside the measured loop of `op`
    (bench_driver brackets loop k with close(-1001-k) / close(-2001-k))."""
    k = ["launch", "alloc", "meminfo", "nvml"].index(op)
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(log), str(DRIVER), op, str(n), "1"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    lines = log.read_text().splitlines()
    main, calls, inside, marks = lines[0].split()[0], [], False, 0
    for ln in lines:
        pid, _, call = ln.partition(" ")
        call = call.lstrip()
        if pid != main:
            continue
        if call.startswith(f"close({-1001 - k})"):
            inside, marks = True, marks + 1
        elif call.startswith(f"close({-2001 - k})"):
            inside, marks = False, marks + 1
        elif inside and not call.startswith(("<...", "+++", "---")):
            calls.append(call.split("(")[0])
    assert marks == 2, f"loop markers not found in {log}"
    return calls


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _strace_works(), reason="needs strace, allowed to trace its children")
@pytest.mark.parametrize("op", ["alloc", "meminfo", "nvml"])
def test_enforced_calls_make_no_system_call_of_their_own(vgpu_env, tmp_path, op):
    """With a limit, cuMemAlloc_v2 + cuMemFree_v2 pairs, cuMemGetInfo_v2 and
    nvmlDeviceGetMemoryInfo take the region lock in user space: the main thread makes exactly
    the system calls the fake driver makes alone (an fcntl lock would add two per call)."""
    vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"] = "64g"
    alone = {k: v for k, v in vgpu_env.items() if k != "LD_PRELOAD"}
    with_lib = _loop_syscalls(vgpu_env, tmp_path / "with.log", op, 50)
    without = _loop_syscalls(alone, tmp_path / "without.log", op, 50)
    assert sorted(with_lib) == sorted(without)


def _holder(env, code):
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    assert line == "ready", line + proc.stderr.read()
    return proc


def _wait_for(pred, what: str, limit_s: float = 30):
    deadline = time.monotonic() + limit_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _blocked_in_futex(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] == str(SYS_FUTEX)
    except (OSError, IndexError):
        return False


def test_waiter_asleep_on_the_lock_wakes_when_the_holder_is_killed_and_reclaims_its_memory(vgpu_env, tmp_path):
    cache = tmp_path / "vgpu.cache"
    # the holder's context is charged 600 MiB (no reservation, so no stall), then its first
    # allocation takes the lock and stalls inside it
    holder = _holder(
        dict(vgpu_env, LIBVGPU_TEST_STALL_IN_LOCK_MS="60000", LIBVGPU_CONTEXT_SIZE=str(600 * MiB)),
        """
import cuda_probe as c
c.init(); print("ready", flush=True)
c.alloc(1 << 20)
""",
    )
    _wait_for(lambda: read_region(cache)["owner_pid"] == holder.pid, "holder never took the lock")
    assert read_lock_slot(cache)["mutex_owner_tid"] == holder.pid
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import cuda_probe as c
c.init(); print(c.alloc(900 << 20)[0], c.mem_info()[0] >> 20, flush=True)
""",
        ],
        env=dict(vgpu_env, LIBCUDA_LOG_LEVEL="2", LIBVGPU_CONTEXT_SIZE="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the waiter sleeps in the kernel on the lock (a futex), behind the holder
        _wait_for(lambda: _blocked_in_futex(waiter.pid) or waiter.poll() is not None, "waiter never blocked")
        assert waiter.poll() is None, waiter.communicate()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        out, err = waiter.communicate(timeout=60)
    finally:
        waiter.kill()
        holder.kill()
    assert waiter.returncode == 0, err
    # 900 MiB fit only because the dead holder's 600 MiB were reclaimed
    assert out.split() == ["0", str(1024 - 900)]
    assert "died holding it; recovering" in err
    r = read_region(cache)
    assert all(s["pid"] != holder.pid for s in r["slots"]) and r["owner_pid"] == 0


def test_lock_stays_usable_after_recovery(vgpu_env, tmp_path):
    """After an owner-dead recovery the mutex is consistent again: later processes lock and
    unlock it normally (an unrecovered robust mutex would fail every later lock)."""
    holder = _holder(
        dict(vgpu_env, LIBVGPU_TEST_STALL_IN_LOCK_MS="60000"),
        """
import cuda_probe as c
c.init(); print("ready", flush=True)
c.alloc(1 << 20)
""",
    )
    cache = tmp_path / "vgpu.cache"
    _wait_for(lambda: read_region(cache)["owner_pid"] == holder.pid, "holder never took the lock")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    for _ in range(3):
        p = run_py(
            "import cuda_probe as c; c.init(); print(c.alloc(300 << 20)[0], c.alloc(300 << 20)[0])",
            dict(vgpu_env, LIBCUDA_LOG_LEVEL="2"),
            timeout=30,
        )
        assert p.stdout.split() == ["0", "0"]
        assert "region lock failed" not in p.stderr
    assert read_lock_slot(cache)["mutex_owner_tid"] == 0


def test_the_lock_slot_is_never_taken_by_a_process(vgpu_env, tmp_path):
    """A region with every usable slot busy (1023 live processes): a newcomer finds no slot and
    says so, the lock's slot (pid 0, status 0, so HAMi's monitor skips it) stays intact, and an
    allocation under the limit is refused: with no slot nothing could be charged (it used to
    succeed uncharged, past the limit; found by an adversarial review)."""
    cache = tmp_path / "vgpu.cache"
    run_py("import cuda_probe as c; c.init()", vgpu_env)
    lock = read_lock_slot(cache)
    assert (lock["pid"], lock["status"], lock["magic"]) == (0, 0, LOCK_MAGIC)
    fill_slots(cache, os.getpid(), LOCK_SLOT)  # this test process is alive: nothing to reap
    p = run_py("import cuda_probe as c; c.init(); print(c.alloc(1 << 20)[0])", dict(vgpu_env, LIBCUDA_LOG_LEVEL="2"))
    assert p.stdout.strip() == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert f"no free process slot in {cache} ({LOCK_SLOT} in use)" in p.stderr
    assert "out of memory: no free process slot in the shared region" in p.stderr
    assert read_region(cache)["proc_num"] == LOCK_SLOT
    lock = read_lock_slot(cache)
    assert (lock["pid"], lock["status"], lock["magic"], lock["mutex_owner_tid"]) == (0, 0, LOCK_MAGIC, 0)


def test_region_without_the_lock_gets_it_at_attach(vgpu_env, tmp_path):
    """A region created by a libvgpu without this lock (magic absent) gets the mutex from the
    first process that attaches, under the file lock, and works."""
    cache = tmp_path / "vgpu.cache"
    run_py("import cuda_probe as c; c.init()", vgpu_env)
    from .region_layout import LOCK_MAGIC_OFFSET

    with open(cache, "r+b") as f:
        f.seek(LOCK_MAGIC_OFFSET)
        f.write(b"\0" * 72)  # magic + mutex zeroed, as an older region would have them
    p = run_py("import cuda_probe as c; c.init(); print(c.alloc(512 << 20)[0], c.alloc(600 << 20)[0])", vgpu_env)
    assert p.stdout.split() == ["0", "2"]
    assert read_lock_slot(cache)["magic"] == LOCK_MAGIC


def test_unusable_region_file_falls_back_to_a_private_region_that_still_enforces(vgpu_env):
    """A region path that is no regular file (/dev/null): the process says so and enforces its
    limit on its own, with the same lock, instead of allocating unchecked."""
    p = run_py(
        "import cuda_probe as c; c.init(); print(c.alloc(600 << 20)[0], c.alloc(600 << 20)[0])",
        dict(vgpu_env, CUDA_DEVICE_MEMORY_SHARED_CACHE="/dev/null", LIBCUDA_LOG_LEVEL="2"),
    )
    assert p.stdout.split() == ["0", "2"]
    assert "shared region /dev/null: not a regular file" in p.stderr


def _power_cut_copy(vgpu_env, tmp_path) -> tuple[Path, int]:
    """A region as the disk holds it after a power cut: copied while a process (charged 600 MiB)
    held its lock, that process then gone without any exit (no robust-futex notice reaches a
    copy). Returns the copy and the dead holder's PID."""
    cache = tmp_path / "vgpu.cache"
    holder = _holder(
        dict(vgpu_env, LIBVGPU_TEST_STALL_IN_LOCK_MS="60000", LIBVGPU_CONTEXT_SIZE=str(600 * MiB)),
        """
import cuda_probe as c
c.init(); print("ready", flush=True)
c.alloc(1 << 20)
""",
    )
    _wait_for(lambda: read_region(cache)["owner_pid"] == holder.pid, "holder never took the lock")
    left = tmp_path / "left.cache"
    shutil.copyfile(cache, left)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert read_lock_slot(left)["mutex_owner_tid"] == holder.pid
    return left, holder.pid


def _reuse_pid(path: Path, dead: int, alive: int) -> None:
    """The dead holder's slot now names a live process (PIDs are handed out again after a boot)."""
    r = read_region(path)
    [i] = [k for k, s in enumerate(r["slots"]) if s["pid"] == dead]
    with open(path, "r+b") as f:
        f.seek(1856 + i * 1960)
        f.write(alive.to_bytes(4, "little"))


def test_a_region_from_before_a_reboot_gets_a_fresh_lock_and_empty_slots(vgpu_env, tmp_path):
    """The region's directory outlives a node reboot: its mutex is locked by a thread of the
    previous boot (nothing will ever release it: the first process of the restarted container
    hung) and its slots name PIDs the new boot gives to others. The first process to attach sees
    another boot's id in the lock slot and resets both; the limit is kept."""
    from .region_layout import BOOT_ID_OFFSET

    left, dead = _power_cut_copy(vgpu_env, tmp_path)
    _reuse_pid(left, dead, os.getpid())
    with open(left, "r+b") as f:
        f.seek(BOOT_ID_OFFSET)
        f.write(b"00000000-0000-4000-8000-000000000000\0")
    p = run_py(
        "import cuda_probe as c; c.init(); print(c.alloc(900 << 20)[0], c.mem_info()[0] >> 20)",
        dict(vgpu_env, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(left), LIBCUDA_LOG_LEVEL="3", LIBVGPU_CONTEXT_SIZE="0"),
        timeout=60,
    )
    # 900 MiB of the 1 GiB limit fit: the 600 MiB of the reused PID's slot are not counted
    assert p.stdout.split() == ["0", str(1024 - 900)]
    assert "written before the node's last boot; lock and 1 slot(s) reset" in p.stderr
    r, lock = read_region(left), read_lock_slot(left)
    assert all(s["pid"] != os.getpid() for s in r["slots"])
    assert lock["mutex_owner_tid"] == 0 and lock["magic"] == LOCK_MAGIC
    assert lock["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_a_region_of_this_boot_keeps_its_slots(vgpu_env, tmp_path):
    """The reset is for another boot only: a slot of a live process in a region of this boot is
    left alone (its memory still counts)."""
    cache = tmp_path / "vgpu.cache"
    run_py("import cuda_probe as c; c.init()", dict(vgpu_env, LIBVGPU_CONTEXT_SIZE=str(600 * MiB)))
    fill_slots(cache, os.getpid(), 1)
    from .region_layout import poke_slot_total

    poke_slot_total(cache, 0, 0, 600 * MiB)
    p = run_py(
        "import cuda_probe as c; c.init(); print(c.alloc(900 << 20)[0])", dict(vgpu_env, LIBVGPU_CONTEXT_SIZE="0")
    )
    assert p.stdout.strip() == "2"  # CUDA_ERROR_OUT_OF_MEMORY: the live slot's 600 MiB count
    assert read_region(cache)["slots"][0]["pid"] == os.getpid()


def _in_own_pid_namespace(env: dict, code: str, **kw) -> subprocess.Popen:
    """``code`` as PID 1 of a new PID namespace (as each container of a pod, sharing a DRA
    claim's region, runs)."""
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


HOLD = """
import sys, cuda_probe as c
c.init(); rc, _ = c.alloc(800 << 20); print("held", rc, flush=True); sys.stdin.read()
"""


def test_processes_of_two_pid_namespaces_sharing_a_region_keep_each_others_charges(vgpu_env):
    """Both PID 1 of their own namespace: the second took the first's live slot as its own
    "stale" one, or reaped it (kill() answers for its own namespace), and 800 MiB + 800 MiB fit
    under a 1 GiB claim. Found by an adversarial review."""
    first = _in_own_pid_namespace(vgpu_env, HOLD)
    try:
        assert first.stdout.readline().split() == ["held", "0"], first.stderr.read()
        second = _in_own_pid_namespace(vgpu_env, HOLD)
        line = second.stdout.readline().split()
        second.stdin.close()
        second.wait(timeout=30)
        assert line == ["held", "2"], second.stderr.read()  # over the limit: refused
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    # the first is gone (its namespace with it): its slot is reclaimed by a process of another one
    third = _in_own_pid_namespace(vgpu_env, HOLD)
    line = third.stdout.readline().split()
    third.stdin.close()
    third.wait(timeout=30)
    assert line == ["held", "0"], third.stderr.read()
