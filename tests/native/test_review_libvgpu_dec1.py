"""libvgpu findings of the review of 1 Dec, each against the fake GPU: the region path followed
through a link another UID of the container planted (root truncating or creating a file of its
choice), slots that PID namespaces or an exiting process let another process take (their memory
granted twice), a stream-ordered loop a deferred release refused (regression review), and the
multi-device cooperative launch that bypassed the compute-share / priority gate."""

from __future__ import annotations

import fcntl
import mmap
import os
import selectors
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import BUILD, run_py
from .region_layout import SLOT_SIZE, read_region, take_slot_as_hami_core

pytestmark = pytest.mark.native

MiB = 1 << 20
REGION_SIZE = 2_008_952
RECENT_KERNEL = 2_008_904
SLOT_STATE = 1952  # procs[i].unused[1]: the limiter's state bits (2: paused by priority)
TWO_ALLOCS = "import cuda_probe as c; c.init(); print(c.alloc(600 << 20)[0], c.alloc(600 << 20)[0])"


def _victim(tmp_path: Path) -> tuple[Path, bytes]:
    """A file only root may touch, as a root-owned configuration file would be."""
    secret = tmp_path / "rootonly"
    secret.mkdir(mode=0o700)
    victim = secret / "victim.conf"
    content = b"root's configuration\n" * 100
    victim.write_bytes(content)
    victim.chmod(0o600)
    return victim, content


def _region_dir(tmp_path: Path, env: dict[str, str]) -> Path:
    d = tmp_path / "regiondir"
    d.mkdir()
    d.chmod(0o777)  # as the node lays a container's region directory out
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(d / "vgpu.cache")
    env["LIBCUDA_LOG_LEVEL"] = "2"
    return d / "vgpu.cache"


def test_region_path_planted_as_a_symlink_is_not_followed(vgpu_env, tmp_path):
    """Found by review, 1 Dec: any UID of the container could replace vgpu.cache by a symbolic link
    to a root-owned file; a root process making one CUDA call then truncated it to the region's
    size and wrote the region into it. The link is not followed: the file is untouched, the
    process says why, and its limit still holds (a region of its own)."""
    victim, content = _victim(tmp_path)
    cache = _region_dir(tmp_path, vgpu_env)
    cache.symlink_to(victim)
    p = run_py(TWO_ALLOCS, vgpu_env)
    assert victim.read_bytes() == content
    assert p.stdout.split() == ["0", "2"]
    assert f"shared region {cache} is a symbolic link: not followed" in p.stderr


def test_region_path_planted_as_a_dangling_symlink_creates_nothing(vgpu_env, tmp_path):
    """Found by review, 1 Dec: a link to a missing file made a root process create it, mode 0666
    (the reviewer's: a .pth file in a site-packages directory, run by root's next Python)."""
    target = tmp_path / "site" / "evil.pth"
    target.parent.mkdir()
    cache = _region_dir(tmp_path, vgpu_env)
    cache.symlink_to(target)
    p = run_py(TWO_ALLOCS, vgpu_env)
    assert not target.exists()
    assert p.stdout.split() == ["0", "2"]


def test_region_path_planted_as_a_hard_link_is_not_used(vgpu_env, tmp_path):
    """Found by review, 1 Dec: a hard link to another file at the region's path (another name of
    that very file) was sized and written like the region. A file with more than one name is not
    used."""
    victim, content = _victim(tmp_path)
    cache = _region_dir(tmp_path, vgpu_env)
    os.link(victim, cache)
    p = run_py(TWO_ALLOCS, vgpu_env)
    assert victim.read_bytes() == content
    assert p.stdout.split() == ["0", "2"]
    assert "a file with other names (hard links)" in p.stderr


def test_region_path_planted_as_a_fifo_does_not_hang_the_process(vgpu_env, tmp_path):
    """Found by review, 1 Dec (with the links): whatever is at the path is opened without blocking
    and used only as a regular file."""
    cache = _region_dir(tmp_path, vgpu_env)
    os.mkfifo(cache)
    p = run_py(TWO_ALLOCS, vgpu_env, timeout=30)
    assert p.stdout.split() == ["0", "2"]
    assert "not a regular file" in p.stderr


def test_a_region_created_under_a_restrictive_umask_is_still_shared(vgpu_env, tmp_path):
    """Any UID of the container may be the first to create the region: it is made 0666 through its
    descriptor (no longer by clearing the process's umask, which other threads share) and a
    second process attaches to it (opened without O_CREAT once it exists) under the same limit."""
    cache = _region_dir(tmp_path, vgpu_env)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, cuda_probe as c; c.init(); c.alloc(600 << 20); print('ready', flush=True); sys.stdin.read()",
        ],
        env=vgpu_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        umask=0o077,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert (cache.stat().st_mode & 0o777) == 0o666
        p = run_py("import cuda_probe as c; c.init(); print(c.alloc(600 << 20)[0])", vgpu_env)
        assert p.stdout.split() == ["2"]
    finally:
        holder.kill()
        holder.wait()


SLOW_EXIT = r"""
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
/* allocates argv[2] MiB and exits; its own exit handler (registered first: it runs after
 * libvgpu's) touches <dir>/exiting and waits for <dir>/go, holding the memory meanwhile */
static const char *g_dir;
static void mark(const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    fclose(fopen(p, "w"));
}
static void late(void)
{
    char p[4096];
    struct stat st;
    mark("exiting");
    snprintf(p, sizeof p, "%s/go", g_dir);
    while (stat(p, &st) != 0)
        usleep(10000);
}
int main(int argc, char **argv)
{
    CUcontext c;
    CUdeviceptr d;
    g_dir = argv[1];
    atexit(late);
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c))
        return 3;
    printf("alloc %d\n", (int)cuMemAlloc_v2(&d, (size_t)atoll(argv[2]) << 20));
    fflush(stdout);
    return 0;
}
"""


def _slow_exit(tmp_path: Path) -> Path:
    src, prog = tmp_path / "slow_exit.c", tmp_path / "slow_exit"
    src.write_text(SLOW_EXIT)
    subprocess.run(
        ["cc", "-O2", f"-I{BUILD / 'include'}", "-o", str(prog), str(src), f"-L{BUILD / 'fakegpu'}", "-l:libcuda.so.1"],
        check=True,
    )
    return prog


def _wait_for(path: Path, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + 60  # a hang guard, not a measurement
    while not path.exists():
        assert proc is None or proc.poll() is None, "the process ended first"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_an_exiting_process_keeps_its_charge_until_it_is_gone(vgpu_env, tmp_path):
    """Found by review, 1 Dec: libvgpu cleared its slot in its exit handler, but the process holds
    its driver memory until the kernel closes its files, after every other exit handler (which may
    run for long): meanwhile another process was granted the same 800 MiB under a 1 GiB limit."""
    prog, sync = _slow_exit(tmp_path), tmp_path / "sync"
    sync.mkdir()
    exiting = subprocess.Popen([str(prog), str(sync), "800"], env=vgpu_env, stdout=subprocess.PIPE, text=True)
    try:
        _wait_for(sync / "exiting", exiting)
        during = run_py("import cuda_probe as c; c.init(); print(c.alloc(800 << 20)[0])", vgpu_env).stdout
        slots = [
            (s["pid"], s["status"], s["used"][0]["total"] >> 20)
            for s in read_region(vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])["slots"]
        ]
    finally:
        (sync / "go").touch()
        out = exiting.communicate(timeout=60)[0]
    after = run_py("import cuda_probe as c; c.init(); print(c.alloc(800 << 20)[0])", vgpu_env).stdout
    assert out.split() == ["alloc", "0"]
    assert during.strip() == "2"  # CUDA_ERROR_OUT_OF_MEMORY: the exiting process still holds 800 MiB
    assert (exiting.pid, 0, 800) in slots  # kept, marked exited (HAMi's monitor skips status 0)
    assert after.strip() == "0"  # reclaimed once the process is gone


def _unshare_pid_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return probe.returncode == 0


HOLD_800 = """
import sys, os, cuda_probe as c
c.init(); rc, _ = c.alloc(800 << 20)
print(os.getpid(), rc, flush=True); sys.stdin.read()
"""


@pytest.mark.skipif(not _unshare_pid_works(), reason="needs PID namespaces with their own /proc (root)")
def test_pid_1_of_several_namespaces_never_share_a_charge(vgpu_env, tmp_path):
    """Found by review, 1 Dec: three containers' PID 1 on one region (a shared DRA claim). E exits
    slowly (its slot cleared by its exit handler, its slot lock still held); P registered in E's
    slot, could not take its lock and left the slot unmarked, judged by PID alone; Q, PID 1 too,
    took P's slot as "its own stale slot" and wiped P's 800 MiB: 1.6 GiB held under 1 GiB."""
    prog, sync = _slow_exit(tmp_path), tmp_path / "sync"
    sync.mkdir()
    ns = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    e = subprocess.Popen(ns + [str(prog), str(sync), "100"], env=vgpu_env, stdout=subprocess.PIPE, text=True)
    p = q = None
    try:
        _wait_for(sync / "exiting", e)
        p = subprocess.Popen(
            ns + [sys.executable, "-c", HOLD_800],
            env=vgpu_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        p_line = p.stdout.readline().split()
        (sync / "go").touch()
        assert e.communicate(timeout=60)[0].split() == ["alloc", "0"]
        q = subprocess.Popen(
            ns + [sys.executable, "-c", HOLD_800],
            env=vgpu_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        q_line = q.stdout.readline().split()
        region = read_region(vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    finally:
        (sync / "go").touch()
        for proc in (p, q, e):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert p_line == ["1", "0"]
    assert q_line == ["1", "2"]  # CUDA_ERROR_OUT_OF_MEMORY: P's 800 MiB still count
    assert sum(s["used"][0]["total"] for s in region["slots"] if s["pid"]) == 800 * MiB


def test_an_unmarked_slot_whose_lock_byte_is_held_is_not_reclaimed(vgpu_env, tmp_path):
    """Found by review, 1 Dec: a slot without a namespace mark was judged by its PID alone, even
    while a live process held its lock byte -- the process of another namespace, whose PID means
    nothing here. Such a slot (900 MiB) counts while its byte is held."""
    cache = Path(vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    run_py("import cuda_probe as c; c.init()", vgpu_env)  # creates the region
    dead = subprocess.Popen(["true"])
    dead.wait()  # a PID nothing in this namespace has now
    slot = read_region(cache)["proc_num"]
    take_slot_as_hami_core(cache, slot, dead.pid, 0, 900 << 20)
    with open(cache, "r+b") as f:
        lock = struct.pack("<hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, REGION_SIZE + 1 + slot, 1, 0)
        fcntl.fcntl(f.fileno(), fcntl.F_OFD_SETLK, lock)  # the slot's owner, alive elsewhere
        held = run_py("import cuda_probe as c; c.init(); print(c.alloc(900 << 20)[0])", vgpu_env).stdout
    gone = run_py("import cuda_probe as c; c.init(); print(c.alloc(900 << 20)[0])", vgpu_env).stdout
    assert held.strip() == "2"
    assert gone.strip() == "0"  # its byte dropped: reclaimed by its PID, as before


STREAM_LOOP = """
import ctypes as C, cuda_probe as c
cu = c.cu
c.init()
s = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(s), 0))
k = c.function(b"busy_20ms")
rcs = []
for it in range(8):  # a 300 MiB temporary per step, stream-ordered on one busy stream
    p = C.c_uint64()
    rc = cu.cuMemAllocAsync(C.byref(p), C.c_size_t(300 << 20), s)
    rcs.append(rc)
    if rc:
        break
    c.check(c.launch(k, stream=s))
    c.check(cu.cuMemFreeAsync(C.c_uint64(p.value), s))
print(*rcs)
"""


def test_allocating_again_after_a_stream_ordered_free_on_a_busy_stream_fits_the_limit(vgpu_env):
    """A regression review (1 Dec) of a change that gave cuMemFreeAsync's charge back only when
    the stream ran the free: every pending free stayed counted and the common loop (allocate,
    launch, free, allocate again on one stream) was refused at its 4th step under a 1 GiB limit,
    though the driver hands the freed memory to the next allocation on that stream. Reverted:
    the charge goes back when the free is queued (the gap is documented, docs/libvgpu.md)."""
    assert run_py(STREAM_LOOP, vgpu_env).stdout.split() == ["0"] * 8


LEADER_EXIT = r"""
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
/* allocates 800 MiB; its main thread then exits (pthread_exit) while another thread keeps the
 * process, and its GPU memory, alive until <argv[1]> exists */
static const char *g_go;
static void *hold(void *a)
{
    struct stat st;
    (void)a;
    while (stat(g_go, &st) != 0)
        usleep(10000);
    return NULL;
}
int main(int argc, char **argv)
{
    CUcontext c;
    CUdeviceptr d;
    pthread_t t;
    g_go = argv[1];
    if (argc < 2 || cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c))
        return 3;
    printf("alloc %d\n", (int)cuMemAlloc_v2(&d, (size_t)800 << 20));
    fflush(stdout);
    pthread_create(&t, NULL, hold, NULL);
    pthread_exit(NULL);
}
"""


def test_a_process_whose_main_thread_exited_keeps_its_charge_while_another_thread_lives(vgpu_env, tmp_path):
    """A regression review (1 Dec): a marked slot of this namespace was judged dead by its PID,
    and a process whose main thread exited reads dead (a zombie leader) while another thread
    still holds its GPU memory: its slot was reclaimed and the 800 MiB granted again. Such a slot
    is now judged by its lock byte alone, held until the last thread is gone."""
    src, prog, go = tmp_path / "leader_exit.c", tmp_path / "leader_exit", tmp_path / "go"
    src.write_text(LEADER_EXIT)
    subprocess.run(
        [
            "cc",
            "-O2",
            "-pthread",
            f"-I{BUILD / 'include'}",
            "-o",
            str(prog),
            str(src),
            f"-L{BUILD / 'fakegpu'}",
            "-l:libcuda.so.1",
        ],
        check=True,
    )
    holder = subprocess.Popen([str(prog), str(go)], env=vgpu_env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().split() == ["alloc", "0"]
        deadline = time.monotonic() + 60  # a hang guard
        while Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the main thread never exited"
            time.sleep(0.01)
        during = run_py("import cuda_probe as c; c.init(); print(c.alloc(800 << 20)[0])", vgpu_env).stdout
    finally:
        go.touch()
        holder.wait(timeout=60)
    after = run_py("import cuda_probe as c; c.init(); print(c.alloc(800 << 20)[0])", vgpu_env).stdout
    assert during.strip() == "2"  # CUDA_ERROR_OUT_OF_MEMORY: the process still holds 800 MiB
    assert after.strip() == "0"  # reclaimed once it is gone


MULTI = """
import ctypes as C, sys, cuda_probe as c
cu = c.cu
class Params(C.Structure):
    _fields_ = [("function", C.c_void_p), ("gx", C.c_uint), ("gy", C.c_uint), ("gz", C.c_uint),
                ("bx", C.c_uint), ("by", C.c_uint), ("bz", C.c_uint), ("shm", C.c_uint),
                ("stream", C.c_void_p), ("params", C.c_void_p)]
entries = []
for dev in (0, 1):
    c.init(dev)
    s = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(s), 0))
    entries.append(Params(c.function(b"k_1us"), 1, 1, 1, 1, 1, 1, 0, s, None))
lst = (Params * 2)(*entries)
print("ready", flush=True)
sys.stdin.readline()
print(cu.cuLaunchCooperativeKernelMultiDevice(lst, 2, 0), flush=True)
"""


def test_the_multi_device_cooperative_launch_goes_through_the_gate(vgpu_env, tmp_path):
    """Found by review, 1 Dec: cuLaunchCooperativeKernelMultiDevice was not hooked, so it launched
    past the compute-share and priority gate: here HAMi's monitor blocks the container
    (recent_kernel = -1) and the launch must wait (paused) until it is lifted. The container has a
    compute limit: a block holds only there, as in HAMi-core (test_review_priority_dec1d.py)."""
    vgpu_env["CUDA_DEVICE_SM_LIMIT"] = "50"
    cache = Path(vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    proc = subprocess.Popen(
        [sys.executable, "-c", MULTI], env=vgpu_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        slot = next(i for i, s in enumerate(read_region(cache)["slots"]) if s["pid"] == proc.pid)
        with open(cache, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
            mm[RECENT_KERNEL : RECENT_KERNEL + 4] = struct.pack("<i", -1)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            state = 1856 + slot * SLOT_SIZE + SLOT_STATE
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + 60  # a hang guard
            while not struct.unpack_from("<Q", mm, state)[0] & 2:
                assert not sel.select(timeout=0.01), "launched while the container was blocked"
                assert time.monotonic() < deadline, "the launch never reached the gate"
            mm[RECENT_KERNEL : RECENT_KERNEL + 4] = struct.pack("<i", 2)
        assert proc.stdout.readline().strip() == "0"
    finally:
        proc.kill()
        proc.wait()


def test_cu_get_proc_address_gives_the_multi_device_launch_hook(vgpu_env):
    """Found by review, 1 Dec: the function cuGetProcAddress returns for the multi-device
    cooperative launch is libvgpu's hook (else a framework resolving it that way skips the gate)."""
    out = run_py(
        f"""
import ctypes as C, cuda_probe as c
vg = C.CDLL({str(BUILD / "libvgpu.so")!r})
c.init()
p, st = C.c_void_p(), C.c_int()
rc = c.cu.cuGetProcAddress_v2(b"cuLaunchCooperativeKernelMultiDevice", C.byref(p), 12000, C.c_uint64(0), C.byref(st))
print(rc, p.value == C.cast(vg.cuLaunchCooperativeKernelMultiDevice, C.c_void_p).value)
""",
        vgpu_env,
    ).stdout.split()
    assert out == ["0", "True"]
