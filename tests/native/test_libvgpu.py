"""libvgpu against the fake GPU: limits, every allocation path, virtualized queries, entry
points (dlsym, cuGetProcAddress), multi-process sharing and robustness to SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import BUILD, run_py
from .region_layout import read_region

pytestmark = pytest.mark.native

MiB = 1 << 20
GiB = 1 << 30


@pytest.mark.parametrize(
    "value,expected",
    [
        ("1g", GiB),
        ("1G", GiB),
        ("1024m", GiB),
        ("1048576k", GiB),
        ("1073741824", GiB),
        ("1Gi", GiB),
        ("1GiB", GiB),
        ("1GB", 10**9),
        ("1000MB", 10**9),
        ("0x40000000", GiB),
        ("1.5g", 3 * GiB // 2),
        ("512Mi", 512 * MiB),
    ],
)
def test_limit_parsing(vgpu_env, value, expected):
    vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"] = value
    out = run_py("import cuda_probe as c; c.init(); print(c.mem_info()[1])", vgpu_env).stdout
    assert int(out) == expected


@pytest.mark.parametrize(
    "name,value",
    [
        ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1x"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "-1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "1.5"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1e30m"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1e-12g"),  # a limit, but less than a byte: it read as 0 (none)
        ("CUDA_DEVICE_MEMORY_LIMIT", "0.0001k"),
        ("CUDA_DEVICE_SM_LIMIT", "thirty"),
    ],
)
def test_bad_limits_are_rejected_loudly(vgpu_env, name, value):
    vgpu_env[name] = value
    p = run_py("import cuda_probe as c; c.init()", vgpu_env, check=False)
    assert p.returncode == 78
    assert f"invalid {name}='{value}'" in p.stderr


def test_per_device_limit_wins_and_sm_limit_is_stored(vgpu_env, tmp_path):
    vgpu_env["CUDA_DEVICE_MEMORY_LIMIT_1"] = "256m"
    vgpu_env["CUDA_DEVICE_SM_LIMIT"] = "30"
    out = run_py(
        """
import cuda_probe as c
c.init(0); t0 = c.mem_info()[1]
c.init(1); t1 = c.mem_info()[1]
print(t0, t1)
""",
        vgpu_env,
    ).stdout.split()
    assert out == [str(GiB), str(256 * MiB)]
    r = read_region(tmp_path / "vgpu.cache")
    assert r["limit"][:3] == [GiB, 256 * MiB, GiB]
    assert r["sm_limit"][:2] == [30, 30]


def test_allocate_up_to_limit_then_oom(vgpu_env):
    out = run_py(
        """
import cuda_probe as c
c.init()
ptrs = [c.alloc(256 << 20) for _ in range(4)]
print([rc for rc, _ in ptrs], c.alloc(256 << 20)[0], c.alloc(1)[0])
print(c.free(ptrs[0][1]), c.alloc(256 << 20)[0])
""",
        vgpu_env,
    ).stdout.splitlines()
    assert out == ["[0, 0, 0, 0] 2 2", "0 0"]  # equality with the limit is allowed


def test_every_allocation_api_is_counted(vgpu_env):
    vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"] = "64m"
    p = subprocess.run([str(BUILD / "tests" / "vgpu_apis")], env=vgpu_env, capture_output=True, text=True, timeout=60)
    lines = p.stdout.splitlines()
    assert p.returncode == 0, p.stdout + p.stderr
    assert [ln.split()[1] for ln in lines] == [
        "cuMemAlloc_v2",
        "cuMemAllocManaged",
        "cuMemAllocPitch_v2",
        "cuArrayCreate_v2",
        "cuArray3DCreate_v2",
        "cuMipmappedArrayCreate",
        "cuMemCreate",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "unknown-free",
        "double-free",
    ]
    assert all(ln.startswith("ok ") for ln in lines)


def test_oversubscribe_lets_managed_memory_through(vgpu_env):
    vgpu_env["CUDA_OVERSUBSCRIBE"] = "true"
    out = run_py(
        """
import ctypes as C, cuda_probe as c
c.init()
p = C.c_uint64()
print(c.cu.cuMemAllocManaged(C.byref(p), C.c_size_t(1536 << 20), 1), c.alloc(1536 << 20)[0])
""",
        vgpu_env,
    ).stdout.split()
    assert out == ["0", "2"]


def test_mem_info_total_mem_and_nvml_show_the_slice(vgpu_env):
    vgpu_env["FAKEGPU_CONTEXT_MEM"] = "100m"
    out = run_py(
        """
import ctypes as C, cuda_probe as c, pynvml as n
c.init()
rc, p = c.alloc(300 << 20)
f, t = c.mem_info()
tm = C.c_size_t(); c.cu.cuDeviceTotalMem_v2(C.byref(tm), 0)
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
m1 = n.nvmlDeviceGetMemoryInfo(h); m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
h1 = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(1))
print(t, f, tm.value, m1.total, m1.used, m1.free, m2.total, m2.used, m2.free, h1.total, h1.used)
""",
        vgpu_env,
    ).stdout.split()
    used = 400 * MiB  # 100 MiB context (measured through NVML) + 300 MiB data
    assert [int(x) for x in out] == [GiB, GiB - used, GiB, GiB, used, GiB - used, GiB, used, GiB - used, GiB, 0]


def test_queries_never_underflow_when_over_the_limit(vgpu_env, tmp_path):
    """A region whose usage exceeds the limit (e.g. limit lowered by hand) reports free = 0."""
    out = run_py(
        """
import cuda_probe as c, sys
sys.path.insert(0, ".")
from region_layout import poke_slot_total
c.init()
poke_slot_total(__import__("os").environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"], 0, 0, 3 << 30)
import pynvml as n
n.nvmlInit(); m = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0))
print(c.mem_info(), m.free, m.used)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == f"(0, {GiB}) 0 {3 * GiB}"


def test_entry_points_return_the_hooks(vgpu_env):
    """dlsym on the driver's handle, cuGetProcAddress (_v2, by version, per-thread flag,
    self lookup) all lead to libvgpu, and an allocation through such a pointer is counted."""
    out = run_py(
        f"""
import ctypes as C, cuda_probe as c
vg = C.CDLL({str(BUILD / "libvgpu.so")!r})
def addr(lib, name): return C.cast(getattr(lib, name), C.c_void_p).value
def gpa(sym, ver, flags, fn="cuGetProcAddress_v2"):
    p, st = C.c_void_p(), C.c_int()
    args = (sym, C.byref(p), ver, C.c_uint64(flags)) + ((C.byref(st),) if fn.endswith("_v2") else ())
    rc = getattr(c.cu, fn)(*args)
    return rc, p.value
print(addr(c.cu, "cuMemAlloc_v2") == addr(vg, "cuMemAlloc_v2"))
print(gpa(b"cuMemAlloc", 12000, 0)[1] == addr(vg, "cuMemAlloc_v2"),
      gpa(b"cuMemAlloc", 3000, 0)[1] == addr(c.cu, "cuMemAlloc"))
print(gpa(b"cuLaunchKernel", 12000, 2)[1] == addr(vg, "cuLaunchKernel_ptsz"),
      gpa(b"cuLaunchKernel", 12000, 0)[1] == addr(vg, "cuLaunchKernel"),
      gpa(b"cuMemAllocAsync", 12000, 2)[1] == addr(vg, "cuMemAllocAsync_ptsz"))
p = gpa(b"cuGetProcAddress", 12000, 0)[1]
print(p == addr(vg, "cuGetProcAddress_v2"), gpa(b"cuMemFree", 12000, 0, "cuGetProcAddress")[1] == addr(vg, "cuMemFree_v2"))
c.init()
legacy = (("cuLaunchKernelEx", "cuLaunchKernelEx"), ("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel"),
          ("cuGraphLaunch", "cuGraphLaunch"), ("cuMemCreate", "cuMemCreate"), ("cuMemGetInfo", "cuMemGetInfo_v2"),
          ("cuCtxCreate", "cuCtxCreate_v4"), ("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"))
per_thread = ("cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuMemAllocFromPoolAsync")
print([gpa(s.encode(), 12080, 0)[1] == addr(vg, name) for s, name in legacy]
      + [gpa(s.encode(), 12080, 2)[1] == addr(vg, s + "_ptsz") for s in per_thread])
alloc = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_uint64), C.c_size_t)(gpa(b"cuMemAlloc", 12000, 0)[1])
d = C.c_uint64()
print(alloc(C.byref(d), 1 << 30), alloc(C.byref(d), 1))
""",
        vgpu_env,
    ).stdout.splitlines()
    assert out == ["True", "True True", "True True True", "True True", str([True] * 11), "0 2"]


def test_sixteen_racing_processes_never_exceed_the_limit(vgpu_env, tmp_path):
    p = subprocess.run(
        [str(BUILD / "tests" / "vgpu_race"), "16", "20"], env=vgpu_env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    fields = dict(kv.split("=") for kv in p.stdout.split())
    total, smallest = int(fields["sum"]), 20 * MiB
    assert total <= GiB
    assert GiB - total < smallest  # everyone stopped only when nothing fit any more
    # the children left with _exit (no atexit): their slots are reaped by the next allocation
    out = run_py("import cuda_probe as c; c.init(); print(c.alloc(1 << 30)[0])", vgpu_env).stdout
    assert out.strip() == "0"


def _holder(env, code):
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline().strip()
    assert line == "ready", line
    return proc


def test_sigkill_while_holding_memory_reclaims_it(vgpu_env, tmp_path):
    holder = _holder(
        vgpu_env,
        """
import sys, cuda_probe as c
c.init(); assert c.alloc(700 << 20)[0] == 0
print("ready", flush=True); sys.stdin.read()
""",
    )
    pid = holder.pid
    r = read_region(tmp_path / "vgpu.cache")
    assert any(s["pid"] == pid and s["used"][0]["total"] == 700 * MiB for s in r["slots"])
    os.kill(pid, signal.SIGKILL)
    holder.wait()
    out = run_py(
        "import cuda_probe as c; c.init(); print(c.alloc(600 << 20)[0], c.mem_info()[0] >> 20)", vgpu_env
    ).stdout.split()
    assert out == ["0", "424"]
    r = read_region(tmp_path / "vgpu.cache")
    assert all(s["pid"] != pid for s in r["slots"])


def test_a_process_that_execs_leaves_no_charge_behind(vgpu_env, tmp_path):
    """exec() frees a process's driver memory but keeps its PID: judged by the PID, its slot
    held 900 MiB of the 1 GiB for as long as the new program (here `sleep`) ran."""
    holder = _holder(
        vgpu_env,
        """
import os, cuda_probe as c
c.init(); assert c.alloc(900 << 20)[0] == 0
print("ready", flush=True)
os.execv("/bin/sleep", ["sleep", "600"])
""",
    )
    try:
        deadline = time.monotonic() + 30
        while os.readlink(f"/proc/{holder.pid}/exe") != os.path.realpath("/bin/sleep"):
            assert time.monotonic() < deadline, "the holder never exec'd"
            time.sleep(0.02)
        out = run_py("import cuda_probe as c; c.init(); print(c.alloc(900 << 20)[0])", vgpu_env).stdout
        assert out.strip() == "0"
        r = read_region(tmp_path / "vgpu.cache")
        assert [s["used"][0]["total"] for s in r["slots"] if s["pid"] == holder.pid] == []
    finally:
        holder.kill()
        holder.wait()


def test_a_slot_freed_by_libvgpu_and_taken_by_hami_core_is_judged_by_its_pid(vgpu_env, tmp_path):
    """A slot libvgpu gave back kept its namespace mark; HAMi-core (or an older libvgpu mid-upgrade)
    registering there writes no mark and takes no lock byte, so the slot was judged by a lock
    nobody held: dead while its process lived, and its 900 MiB free for another 900 MiB. (A
    libvgpu process keeps its slot through exit, for the next one to reclaim, mark included;
    HAMi-core appends at proc_num, as here.)"""
    from .region_layout import take_slot_as_hami_core

    run_py("import cuda_probe as c; c.init(); assert c.alloc(100 << 20)[0] == 0", vgpu_env)
    live = subprocess.Popen(["sleep", "600"])
    try:
        slot = read_region(tmp_path / "vgpu.cache")["proc_num"]
        take_slot_as_hami_core(tmp_path / "vgpu.cache", slot, live.pid, 0, 900 << 20)
        out = run_py("import cuda_probe as c; c.init(); print(c.alloc(900 << 20)[0])", vgpu_env).stdout
        assert out.strip() == "2"  # CUDA_ERROR_OUT_OF_MEMORY: the live process's 900 MiB still count
    finally:
        live.kill()
        live.wait()


def test_frees_after_the_exit_handler_never_reach_a_slot_another_process_took(vgpu_env, tmp_path):
    """A handler registered before libvgpu's exit handler (a library's static destructors: a
    caching allocator emptying itself) still frees memory afterwards. When libvgpu gave its slot
    back at exit, those frees were subtracted from the slot, which meanwhile another process could
    have taken: its 600 MiB were counted as 88 and a further 900 MiB fitted in 1 GiB. The slot is
    now kept, charge included, until the process is gone: the 600 MiB do not fit while the exiting
    process still holds its 512 (found by review, 1 Dec), its late free lands in its own slot, and
    900 MiB fit once it is gone."""
    prog = tmp_path / "late_free"
    subprocess.run(
        [
            "cc",
            "-O2",
            f"-I{BUILD / 'include'}",
            "-o",
            str(prog),
            str(Path(__file__).parent / "late_free.c"),
            f"-L{BUILD / 'fakegpu'}",
            "-l:libcuda.so.1",
        ],
        check=True,
    )
    sync = tmp_path / "sync"
    sync.mkdir()
    a = subprocess.Popen([str(prog), str(sync), "512"], env=vgpu_env, stdout=subprocess.PIPE, text=True)
    b = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import os, time, cuda_probe as c
sync = {str(sync)!r}
while not os.path.exists(sync + "/exiting"): time.sleep(0.01)
c.init(); print(c.alloc(600 << 20)[0], flush=True)
open(sync + "/go", "w").close()
while not os.path.exists(sync + "/freed"): time.sleep(0.01)
print(c.alloc(900 << 20)[0])
""",
        ],
        env=vgpu_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    a_out = a.communicate(timeout=60)[0]
    (sync / "freed").touch()
    b_out = b.communicate(timeout=60)[0]
    assert a_out.splitlines() == ["alloc 0", "late free 0"]
    assert b_out.split() == ["2", "0"]


def test_sigkill_while_holding_the_lock_does_not_block_others(vgpu_env, tmp_path):
    env = dict(vgpu_env, LIBVGPU_TEST_STALL_IN_LOCK_MS="30000")
    holder = _holder(
        env,
        """
import sys, cuda_probe as c
c.init(); print("ready", flush=True)
c.alloc(1 << 20)      # takes the region lock and stalls inside it
""",
    )
    cache = tmp_path / "vgpu.cache"
    deadline = time.monotonic() + 10
    while read_region(cache)["owner_pid"] != holder.pid:
        assert time.monotonic() < deadline, "holder never took the lock"
        time.sleep(0.02)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    # bounded recovery: the probe's own timeout (20 s) fails the test if the lock stayed held
    out = run_py("import cuda_probe as c; c.init(); print(c.alloc(512 << 20)[0])", vgpu_env, timeout=20).stdout
    assert out.strip() == "0"


def test_fork_child_gets_its_own_slot(vgpu_env, tmp_path):
    out = run_py(
        """
import os, cuda_probe as c
c.init(); c.alloc(100 << 20)
pid = os.fork()
if pid == 0:
    import ctypes as C
    c.init(); rc, p = c.alloc(200 << 20)
    os._exit(0 if rc == 0 else 1)
_, st = os.waitpid(pid, 0)
print(st, c.mem_info()[0] >> 20)
""",
        vgpu_env,
    ).stdout.split()
    assert out == ["0", str(1024 - 100)]  # the exited child's 200 MiB is gone again


def test_launch_updates_last_kernel_time(vgpu_env, tmp_path):
    run_py(
        """
import cuda_probe as c
c.init(); fn = c.function(b"k_1us")
assert c.launch(fn) == 0
c.check(c.cu.cuCtxSynchronize())
""",
        vgpu_env,
    )
    r = read_region(tmp_path / "vgpu.cache")
    assert abs(r["last_kernel_time"] - time.time()) < 5
    assert r["recent_kernel"] == 2


def test_dlsym_on_a_library_without_the_name_finds_nothing(vgpu_env):
    """dlsym(handle, "cuMemAllocAsync") gave libvgpu's hook whatever the handle held: libm had
    CUDA entry points, and an older driver lacking a newer one seemed to have it (the caller
    then got CUDA_ERROR_NOT_INITIALIZED from a hook with nothing behind it instead of taking its
    fallback). A library that has the name still leads to the hook."""
    out = run_py(
        f"""
import ctypes as C, ctypes.util
vg = C.CDLL({str(BUILD / "libvgpu.so")!r})
cu, m = C.CDLL("libcuda.so.1"), C.CDLL(ctypes.util.find_library("m"))
def addr(lib, name): return C.cast(getattr(lib, name), C.c_void_p).value
print(hasattr(m, "cuMemAllocAsync"), hasattr(m, "nvmlDeviceGetMemoryInfo"), hasattr(m, "cos"))
print(addr(cu, "cuMemAllocAsync") == addr(vg, "cuMemAllocAsync"), addr(C.CDLL(None), "cuMemAlloc_v2") == addr(vg, "cuMemAlloc_v2"))
""",
        vgpu_env,
    ).stdout.split()
    assert out == ["False", "False", "True", "True", "True"]


def test_dlsym_rtld_next_keeps_the_callers_meaning(vgpu_env):
    """dlsym(RTLD_NEXT, "which") from libnext_a must find libnext_b's symbol; a naive C
    interposer calling glibc's dlsym would resolve it relative to libvgpu (-> "A")."""
    p = subprocess.run([str(BUILD / "tests" / "vgpu_next")], env=vgpu_env, capture_output=True, text=True, timeout=30)
    assert p.stdout.strip() == "B"


def test_nvml_only_process_sees_the_limit(vgpu_env):
    """nvidia-smi-like: no CUDA call at all, NVML alone shows total = limit."""
    # numbered limits alone, as HAMi's device plugin sets them (from the environment a numbered
    # limit only lowers a set unnumbered one)
    del vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"]
    vgpu_env.update({"CUDA_DEVICE_MEMORY_LIMIT_0": "1g", "CUDA_DEVICE_MEMORY_LIMIT_1": "3g"})
    out = run_py(
        """
import pynvml as n
n.nvmlInit()
print([n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i)).total >> 20 for i in range(2)])
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[1024, 3072]"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process under another UID")
def test_processes_of_different_uids_share_one_region(vgpu_env):
    import shutil
    import tempfile

    shared = tempfile.mkdtemp(prefix="hami-uid-test-", dir="/tmp")
    try:
        os.chmod(shared, 0o777)
        env = dict(
            vgpu_env,
            CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{shared}/vgpu.cache",
            FAKEGPU_STATE_DIR=f"{shared}/machine",
            HOME=shared,
        )
        holder = _holder(
            env,
            """
import sys, cuda_probe as c
c.init(); assert c.alloc(600 << 20)[0] == 0
print("ready", flush=True); sys.stdin.read()
""",
        )
        try:
            p = subprocess.run(
                [str(BUILD / "tests" / "vgpu_alloc"), "600", "400"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                user=65534,
                group=65534,
                extra_groups=[],
            )  # set in C: no Python after fork
            assert p.stdout.split() == ["65534", "2", "0"], p.stderr
        finally:
            holder.kill()
            holder.wait()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_context_teardown_returns_what_the_driver_freed(vgpu_env, tmp_path):
    """cuCtxDestroy, cuDevicePrimaryCtxReset (cudaDeviceReset) and the last primary release
    free the context's allocations in the driver; the ledger follows, as does the fake."""
    vgpu_env["FAKEGPU_CONTEXT_MEM"] = "50m"
    out = run_py(
        """
import ctypes as C, os, cuda_probe as c, pynvml as n
from region_layout import read_region
cu = c.cu
def ledger():
    r = read_region(os.environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    return sum(s["used"][0]["total"] for s in r["slots"] if s["pid"]) >> 20
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
def driver():
    return sum(p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)) >> 20
c.init(); c.alloc(300 << 20)
row = [(ledger(), driver())]
c.check(cu.cuDevicePrimaryCtxReset_v2(0)); row.append((ledger(), driver()))
ctx = C.c_void_p(); c.check(cu.cuCtxCreate_v2(C.byref(ctx), 0, 0)); c.alloc(200 << 20); row.append((ledger(), driver()))
c.check(cu.cuCtxDestroy_v2(ctx)); row.append((ledger(), driver()))
c.init(); c.alloc(100 << 20); c.check(cu.cuDevicePrimaryCtxRelease_v2(0)); c.check(cu.cuDevicePrimaryCtxRelease_v2(0))
row.append((ledger(), driver()))
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[(350, 350), (50, 50), (300, 300), (50, 50), (0, 0)]"


def test_a_context_made_while_another_process_frees_memory_is_charged_in_full(vgpu_env):
    """The first context of a process is charged what it takes. Measured as the device's used
    memory before and after the creation, another container's process freeing memory in between
    (here 600 MiB, while a 300 MiB context is made) made the figure 0 and the context free of
    charge; the process's own NVML figure is not moved by other processes."""
    import subprocess as sp
    import sys as _sys

    vgpu_env["FAKEGPU_CONTEXT_MEM"] = "300m"
    # another container's process: the same GPU, no libvgpu (vgpu_env is fake_env with it added)
    plain = {k: v for k, v in vgpu_env.items() if k not in ("LD_PRELOAD", "CUDA_DEVICE_MEMORY_SHARED_CACHE")}
    mine_env = dict(vgpu_env, FAKEGPU_CONTEXT_DELAY_MS="3000")
    other = sp.Popen(
        [
            _sys.executable,
            "-c",
            "import sys, cuda_probe as c\nc.init(); rc, p = c.alloc(600 << 20); print(rc, flush=True)\n"
            "sys.stdin.readline(); c.free(p); print('freed', flush=True); sys.stdin.readline()",
        ],
        env=plain,
        stdin=sp.PIPE,
        stdout=sp.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "0"
        mine = sp.Popen(
            [
                _sys.executable,
                "-c",
                "import os, cuda_probe as c\nfrom region_layout import read_region\nprint('making', flush=True)\n"
                "c.init()\nr = read_region(os.environ['CUDA_DEVICE_MEMORY_SHARED_CACHE'])\n"
                "print(sum(s['used'][0]['total'] for s in r['slots'] if s['pid']) >> 20, flush=True)",
            ],
            env=mine_env,
            stdout=sp.PIPE,
            text=True,
        )
        assert mine.stdout.readline().strip() == "making"
        time.sleep(1.0)  # inside the 3 s the context takes to make, once charged by the driver
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "freed"
        charged = mine.stdout.readline().strip()
        assert mine.wait(60) == 0
        assert charged == "300"
    finally:
        other.kill()
        other.wait()


def run_with_mount(code: str, env: dict[str, str], source, target, *more) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter in a mount namespace of its own where ``source`` is bind
    mounted read-only at ``target`` (as the device plugin's mounts appear in a container), and
    each further ``(source, target)`` of ``more`` too."""
    mounts = "".join(f"mount --bind -o ro {s} {t} && " for s, t in ((source, target), *more))
    script = f'{mounts}exec {sys.executable} -c "$PROBE"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env={**env, "PROBE": code},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_container_the_nri_hook_never_served_sees_no_device(vgpu_env, tmp_path):
    """``HAMI_NRI_INJECTION=pending``: Allocate's marker, which the NRI hook turns to ``done`` with
    the grant; still pending, the container was created while the hook was away and what it sees
    (an image's ``NVIDIA_VISIBLE_DEVICES=all``) is not its grant: CUDA and NVML report no device,
    without touching a region (none is mounted in that case)."""
    probe = """
import ctypes as C
cu = C.CDLL("libcuda.so.1"); nvml = C.CDLL("libnvidia-ml.so.1")
n = C.c_int(-1)
print(cu.cuInit(0), cu.cuDeviceGetCount(C.byref(n)), nvml.nvmlInit_v2(), nvml.nvmlInit())
"""
    vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(tmp_path / "not-mounted" / "vgpu.cache")  # opening it: exit 78
    vgpu_env["HAMI_NRI_INJECTION"] = "pending"
    p = run_py(probe, vgpu_env)
    assert p.stdout.split() == ["100", "3", "4", "4"], p  # NO_DEVICE, NOT_INITIALIZED; NVML NO_PERMISSION
    assert "grant was never applied" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    vgpu_env["HAMI_NRI_INJECTION"] = "done"  # the hook's: the grant applies
    vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(tmp_path / "vgpu.cache")
    assert run_py(probe, vgpu_env).stdout.split() == ["0", "0", "0", "0"]
    # Allocate's other marker, a file mounted at <hook>/vgpu/grant-pending, which the hook removes:
    # a pod's envFrom can put "done" over the variable, not take a mount away. libvgpu finds it in
    # the mount table (a mount namespace of the test's own, as the container's): a plain file of
    # that name is not the marker (a pod could make one where it may write)
    hook = tmp_path / "hook" / "vgpu"
    hook.mkdir(parents=True)
    (hook / "grant-pending").write_text("")
    (tmp_path / "marker").write_text("")
    assert run_py(probe, vgpu_env).stdout.split() == ["0", "0", "0", "0"]
    p = run_with_mount(probe, vgpu_env, tmp_path / "marker", hook / "grant-pending")
    assert p.stdout.split() == ["100", "3", "4", "4"], p
    assert "grant was never applied (<hook>/vgpu/grant-pending is mounted" in p.stderr, p.stderr


def test_the_mounted_grant_file_wins_over_the_environment(vgpu_env, tmp_path):
    """The device plugin mounts the grant read-only at ``<hook>/vgpu/hami-grant.env``; libvgpu
    finds it in its mount table and takes every setting it names from it, so the container's
    env (a pod's ``envFrom``, an image's ``ENV``) changes no limit. A plain file of that name is
    not the grant (a pod could write one), and without the mount the env is read as before."""
    hook = tmp_path / "hook" / "vgpu"
    hook.mkdir(parents=True)
    region = tmp_path / "granted.cache"
    (tmp_path / "grant").write_text(
        f"CUDA_DEVICE_MEMORY_LIMIT=\nCUDA_DEVICE_MEMORY_LIMIT_0=256m\nCUDA_DEVICE_SM_LIMIT=30\n"
        f"CUDA_DEVICE_MEMORY_SHARED_CACHE={region}\nCUDA_OVERSUBSCRIBE=\n# a comment\nnot a setting\n"
    )
    (hook / "hami-grant.env").write_text("CUDA_DEVICE_MEMORY_LIMIT_0=128m\n")  # a plain file: ignored
    # the pod's own values, as an envFrom would give them
    del vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"]  # numbered alone: it is what the env says
    vgpu_env.update({"CUDA_DEVICE_MEMORY_LIMIT_0": "4g", "CUDA_DEVICE_SM_LIMIT": "100", "CUDA_OVERSUBSCRIBE": "true"})
    probe = "import cuda_probe as c; c.init(); print(c.mem_info()[1])"
    assert run_py(probe, vgpu_env).stdout.split() == [str(4 * GiB)]
    p = run_with_mount(probe, vgpu_env, tmp_path / "grant", hook / "hami-grant.env")
    assert p.returncode == 0 and p.stdout.split() == [str(256 * MiB)], p
    r = read_region(region)  # the grant's region, not the env's
    assert r["limit"][0] == 256 * MiB and r["sm_limit"][0] == 30


def test_a_second_mount_named_as_the_grant_or_an_empty_grant_stops_the_process(vgpu_env, tmp_path):
    """A pod's own mount of that name (a termination message path, an image's VOLUME, which no
    admission rule sees) could be found first and give the env back its say: with more than one,
    libvgpu refuses to choose; a grant it cannot read or that names nothing stops it too."""
    hook, elsewhere = tmp_path / "hook" / "vgpu", tmp_path / "data"
    for d in (hook, elsewhere):
        d.mkdir(parents=True)
        (d / "hami-grant.env").write_text("")
    (tmp_path / "grant").write_text("CUDA_DEVICE_MEMORY_LIMIT_0=256m\n")
    (tmp_path / "empty").write_text("")
    probe = "import cuda_probe as c; c.init(); print(c.mem_info()[1])"
    grant = (tmp_path / "grant", hook / "hami-grant.env")
    p = run_with_mount(probe, vgpu_env, tmp_path / "empty", elsewhere / "hami-grant.env", grant)
    assert p.returncode == 78 and "2 mounts are named hami-grant.env" in p.stderr, p
    p = run_with_mount(probe, vgpu_env, tmp_path / "empty", hook / "hami-grant.env")
    assert p.returncode == 78 and "names no setting" in p.stderr, p
    assert run_with_mount(probe, vgpu_env, *grant).stdout.split() == [str(256 * MiB)]


def test_a_process_that_sees_a_gpu_its_grant_does_not_name_gets_none(vgpu_env, tmp_path):
    """``HAMI_GRANT_DEVICES`` (the grant file's): a pod's own ``NVIDIA_VISIBLE_DEVICES`` (an envFrom)
    could have the runtime show it every GPU of the node; libvgpu then gives it none, through CUDA
    and NVML."""
    probe = """
import ctypes as C
cu = C.CDLL("libcuda.so.1"); nvml = C.CDLL("libnvidia-ml.so.1")
n = C.c_int(-1)
u = C.create_string_buffer(96); d = C.c_void_p()
nvml.nvmlInit_v2(); nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(d)); nvml.nvmlDeviceGetUUID(d, u, 96)
first = u.value.decode()
nvml.nvmlDeviceGetHandleByIndex_v2(1, C.byref(d)); nvml.nvmlDeviceGetUUID(d, u, 96)
print(first, u.value.decode())
"""
    first, second = run_py(probe, vgpu_env).stdout.split()  # no list: every device (HAMi-core's contract)
    check = probe.replace(
        "print(first, u.value.decode())",
        "ctx = C.c_void_p()\nprint(cu.cuInit(0), nvml.nvmlInit_v2(), cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0))",
    )
    vgpu_env["HAMI_GRANT_DEVICES"] = f"{first.upper()},GPU-other"  # compared in any letter case
    p = run_py(check, vgpu_env)
    # no context either, for a program that goes on after cuInit failed
    assert p.stdout.split() == ["100", "4", "100"] and f"the process sees {second}" in p.stderr, p
    vgpu_env["HAMI_GRANT_DEVICES"] = f"{first},{second}"
    assert run_py(check, vgpu_env).stdout.split() == ["0", "0", "0"]


def test_limits_follow_the_grants_device_order_whatever_the_first_process_sees(vgpu_env):
    """The grant numbers its limits by its device list (HAMI_GRANT_DEVICES); the region gave its
    device indices to GPUs in the order the first process met them, so a first process with
    CUDA_VISIBLE_DEVICES=1 gave GPU 1 the limit of GPU 0 for every later process. Found by an
    adversarial review."""
    uuids = run_py(
        """
import ctypes as C
nvml = C.CDLL("libnvidia-ml.so.1"); u = C.create_string_buffer(96); d = C.c_void_p()
nvml.nvmlInit_v2()
for i in (0, 1):
    nvml.nvmlDeviceGetHandleByIndex_v2(i, C.byref(d)); nvml.nvmlDeviceGetUUID(d, u, 96); print(u.value.decode())
""",
        vgpu_env,
    ).stdout.split()
    del vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"]
    vgpu_env.update(
        CUDA_DEVICE_MEMORY_LIMIT_0="1g", CUDA_DEVICE_MEMORY_LIMIT_1="4g", HAMI_GRANT_DEVICES=",".join(uuids)
    )
    vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] += ".granted"  # a region this grant's first process makes
    total = "import cuda_probe as c; c.init(); print(c.mem_info()[1] >> 20)"
    assert run_py(total, dict(vgpu_env, CUDA_VISIBLE_DEVICES="1")).stdout.split() == ["4096"]  # the first process
    assert run_py(total, vgpu_env).stdout.split() == ["1024"]  # GPU 0 keeps GPU 0's limit
    assert run_py(total, dict(vgpu_env, CUDA_VISIBLE_DEVICES="1")).stdout.split() == ["4096"]


def test_a_device_count_written_into_the_region_cannot_move_writes_outside_it(vgpu_env, tmp_path):
    """device_num is read from a file the container writes: a negative or huge count indexed
    uuids[] out of bounds (a crash, or a write before the mapping that also left the process
    unlimited). Found by an adversarial review."""
    import struct

    cache = tmp_path / "vgpu.cache"
    run_py("import cuda_probe as c; c.init()", vgpu_env)
    for count in (0x80000000, 0xFFFFFFFFFFFFFFFF, 0xFFFFFFF0):
        with open(cache, "r+b") as f:
            f.seek(56)  # device_num
            f.write(struct.pack("<Q", count))
        p = run_py("import cuda_probe as c; c.init(); print(c.alloc(2 << 30)[0])", vgpu_env, check=False)
        assert p.returncode == 0 and p.stdout.split() == ["2"], (count, p)  # refused: still limited
