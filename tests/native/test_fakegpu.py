"""The fake GPU itself: devices, memory bookkeeping across processes, kernels, NVML."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import run_py

pytestmark = pytest.mark.native

GiB = 1 << 30
MiB = 1 << 20


def test_pynvml_sees_configured_devices(fake_env):
    fake_env["FAKEGPU_DEVICES"] = (
        "name=NVIDIA A100-SXM4-40GB,memory=40Gi,sms=108,numa=0,pci=0000:3b:00.0;"
        "memory=24GB,uuid=GPU-11111111-2222-3333-4444-555555555555,numa=1"
    )
    out = run_py(
        """
import pynvml as n
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m = n.nvmlDeviceGetMemoryInfo(h)
    print(n.nvmlDeviceGetName(h), n.nvmlDeviceGetUUID(h), m.total, m.used,
          n.nvmlDeviceGetPciInfo(h).busId, n.nvmlDeviceGetNumaNodeId(h),
          n.nvmlDeviceGetAttributes(h).multiprocessorCount)
h = n.nvmlDeviceGetHandleByUUID("GPU-11111111-2222-3333-4444-555555555555")
print(n.nvmlDeviceGetIndex(h), n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("0000:3b:00.0")))
n.nvmlShutdown()
""",
        fake_env,
    ).stdout.splitlines()
    assert out[0].split() == [
        "NVIDIA",
        "A100-SXM4-40GB",
        "GPU-f00dfeed-0000-4000-8000-000000000000",
        str(40 * GiB),
        "0",
        "00000000:3B:00.0",
        "0",
        "108",
    ]
    assert out[1].split()[-6:] == [
        "GPU-11111111-2222-3333-4444-555555555555",
        str(24 * 10**9),
        "0",
        "00000000:28:00.0",
        "1",
        "132",
    ]
    assert out[2] == "1 0"


def test_bad_config_is_one_clear_error(fake_env):
    fake_env["FAKEGPU_DEVICES"] = "memory=lots"
    p = run_py("import pynvml as n; n.nvmlInit()", fake_env, check=False)
    assert p.returncode == 2
    assert "fakegpu: invalid configuration: device key 'memory' = 'lots'" in p.stderr


def test_over_allocation_fails_across_processes_and_dead_memory_is_released(fake_env):
    fake_env["FAKEGPU_COUNT"] = "1"
    fake_env["FAKEGPU_MEMORY"] = "1Gi"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import sys, cuda_probe as c
c.init(); rc, p = c.alloc(700 << 20); assert rc == 0
print("ready", flush=True); sys.stdin.read()
""",
        ],
        env=fake_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        code = """
import cuda_probe as c, pynvml as n
c.init()
print(c.alloc(400 << 20)[0], c.alloc(300 << 20)[0])
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
print(sorted(p.usedGpuMemory >> 20 for p in n.nvmlDeviceGetComputeRunningProcesses(h)))
"""
        out = run_py(code, fake_env).stdout.split("\n")
        assert out[0] == "2 0"  # 700+400 > 1024 MiB fails; 700+300 fits
        assert out[1] == "[300, 700]"
    finally:
        holder.kill()
        holder.wait()
    out = run_py("import cuda_probe as c; c.init(); print(c.alloc(1000 << 20)[0])", fake_env).stdout
    assert out.strip() == "0"


def test_rounding_contexts_and_mem_info(fake_env):
    fake_env["FAKEGPU_MEMORY"] = "8Gi"
    fake_env["FAKEGPU_CONTEXT_MEM"] = "500Mi"
    out = run_py(
        """
import cuda_probe as c
c.init()
f0, t = c.mem_info()
rc, p = c.alloc(3 << 20)           # rounded to 4 MiB
f1, _ = c.mem_info()
rc2, q = c.alloc(100)              # rounded to 512 B
f2, _ = c.mem_info()
print(t, t - f0, f0 - f1, f1 - f2, c.free(p), c.free(p), c.free(0))
""",
        fake_env,
    ).stdout.split()
    assert out == [str(8 * GiB), str(500 * MiB), str(4 * MiB), "512", "0", "1", "0"]


def test_kernels_take_time_and_show_up_in_process_utilization(fake_env):
    out = run_py(
        """
import os, time, cuda_probe as c, pynvml as n
c.init()
fn = c.function(b"busy_50ms")
def work():
    for _ in range(6):
        assert c.launch(fn) == 0
    print(c.cu.cuStreamQuery(None))           # 600 = CUDA_ERROR_NOT_READY: launches only enqueue
print(c.elapsed_ms(work))
c.check(c.cu.cuCtxSynchronize())
assert c.cu.cuStreamQuery(None) == 0
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
# Sampled 550 ms into 900 ms of queued work, the last complete sample period (1/6 s) lies
# inside the work unless this process stalls 200 ms. Sampled right after the work instead,
# the period could reach past its end (99% once in CI, on a loaded machine).
assert c.launch(c.function(b"busy_900ms")) == 0
time.sleep(0.55)
s = n.nvmlDeviceGetProcessUtilization(h, 0)
print([(x.pid == os.getpid(), x.smUtil) for x in s])
c.check(c.cu.cuCtxSynchronize())
""",
        fake_env,
    ).stdout.splitlines()
    assert out == ["600", "300.0", "[(True, 100)]"]


def test_big_grid_takes_more_waves_and_cooperative_limit(fake_env):
    fake_env["FAKEGPU_SMS"] = "2"  # one wave = 2 SMs x 16 blocks = 32 blocks
    out = run_py(
        """
import cuda_probe as c
c.init()
fn = c.function(b"k_10ms")
print(c.elapsed_ms(lambda: c.launch(fn, grid=64)), c.elapsed_ms(lambda: c.launch(fn, grid=32)),
      c.cu.cuLaunchCooperativeKernel(fn, 33, 1, 1, 1, 1, 1, 0, None, None))
""",
        fake_env,
    ).stdout.split()
    assert out == ["20.0", "10.0", "720"]


def test_get_proc_address_honours_version_and_per_thread_flag(fake_env):
    out = run_py(
        """
import ctypes as C, cuda_probe as c
cu = c.cu
def addr(name): return C.cast(getattr(cu, name), C.c_void_p).value
def q(sym, ver, flags):
    p, st = C.c_void_p(), C.c_int()
    rc = cu.cuGetProcAddress_v2(sym, C.byref(p), ver, C.c_uint64(flags), C.byref(st))
    return rc, st.value, p.value
print(q(b"cuMemAlloc", 3000, 0)[2] == addr("cuMemAlloc"), q(b"cuMemAlloc", 12000, 0)[2] == addr("cuMemAlloc_v2"))
print(q(b"cuLaunchKernel", 12000, 2)[2] == addr("cuLaunchKernel_ptsz"), q(b"cuLaunchKernel", 12000, 0)[2] == addr("cuLaunchKernel"))
print(q(b"cuCtxCreate", 12080, 0)[2] == addr("cuCtxCreate_v4"), q(b"cuCtxCreate", 11040, 0)[2] == addr("cuCtxCreate_v3"))
print(q(b"cuNoSuchThing", 12000, 0)[:2], q(b"cuMemAllocAsync", 11000, 0)[:2])
""",
        fake_env,
    ).stdout.splitlines()
    assert out == ["True True", "True True", "True True", "(500, 1) (500, 2)"]


def test_xid_events_from_file_and_from_call(fake_env, tmp_path):
    out = run_py(
        """
import ctypes as C, os, pynvml as n
n.nvmlInit()
h1 = n.nvmlDeviceGetHandleByIndex(1)
es = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h1, n.nvmlEventTypeXidCriticalError, es)
open(os.environ["FAKEGPU_STATE_DIR"] + "/xid", "w").write("0 31\\nGPU-f00dfeed-0000-4000-8000-000000000001 79\\n")
e = n.nvmlEventSetWait(es, 2000)
print(e.eventType, e.eventData, n.nvmlDeviceGetIndex(e.device))
C.CDLL("libnvidia-ml.so.1").fakegpu_inject_xid(1, 48)
print(n.nvmlEventSetWait(es, 2000).eventData)
try:
    n.nvmlEventSetWait(es, 50)
except n.NVMLError_Timeout:
    print("timeout")
""",
        fake_env,
    ).stdout.split("\n")
    assert out[:3] == ["8 79 1", "48", "timeout"]


def test_visible_devices_filter_and_order(fake_env):
    fake_env["FAKEGPU_COUNT"] = "4"
    fake_env["CUDA_VISIBLE_DEVICES"] = "2,GPU-f00dfeed-0000-4000-8000-000000000000,9,1"
    out = run_py(
        """
import ctypes as C, cuda_probe as c
c.check(c.cu.cuInit(0))
n = C.c_int(); c.cu.cuDeviceGetCount(C.byref(n))
ids = []
for i in range(n.value):
    b = C.create_string_buffer(32); c.cu.cuDeviceGetPCIBusId(b, 32, i); ids.append(b.value.decode())
print(n.value, ids)
""",
        fake_env,
    ).stdout.strip()
    assert out == "2 ['0000:38:00.0', '0000:18:00.0']"


def test_config_file_devices_and_globals(fake_env, tmp_path):
    cfg = tmp_path / "gpus.conf"
    cfg.write_text(
        "# two small GPUs\ncontext_mem=10Mi\n"
        "device name=Tesla T4,memory=16GB,sms=40,numa=-1\n"
        "device name=Tesla T4,memory=16GB,sms=40,pci=0000:af:00.0\n"
    )
    fake_env["FAKEGPU_CONFIG"] = str(cfg)
    out = run_py(
        """
import cuda_probe as c, pynvml as n
c.init(1)
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
print([n.nvmlDeviceGetName(h) for h in hs], [n.nvmlDeviceGetMemoryInfo(h).used >> 20 for h in hs],
      n.nvmlDeviceGetPciInfo(hs[1]).busId)
try:
    n.nvmlDeviceGetNumaNodeId(hs[0])
except n.NVMLError_NotSupported:
    print("numa not supported")
""",
        fake_env,
    ).stdout.splitlines()
    assert out == ["['Tesla T4', 'Tesla T4'] [0, 10] 00000000:AF:00.0", "numa not supported"]


def test_graphs_launch_ex_and_pools(fake_env):
    out = run_py(
        """
import ctypes as C, time, cuda_probe as c
cu = c.cu
c.init()
fn = c.function(b"k_5ms")
class Params(C.Structure):   # CUDA_KERNEL_NODE_PARAMS (v2 layout prefix + kern/ctx)
    _fields_ = [("func", C.c_void_p), ("gx", C.c_uint), ("gy", C.c_uint), ("gz", C.c_uint),
                ("bx", C.c_uint), ("by", C.c_uint), ("bz", C.c_uint), ("shm", C.c_uint),
                ("params", C.c_void_p), ("extra", C.c_void_p), ("kern", C.c_void_p), ("ctx", C.c_void_p)]
g, node, ex = C.c_void_p(), C.c_void_p(), C.c_void_p()
c.check(cu.cuGraphCreate(C.byref(g), 0))
p = Params(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None, None)
for _ in range(4):
    c.check(cu.cuGraphAddKernelNode_v2(C.byref(node), g, None, C.c_size_t(0), C.byref(p)))
c.check(cu.cuGraphInstantiateWithFlags(C.byref(ex), g, C.c_ulonglong(0)))
graph_ms = c.elapsed_ms(lambda: c.check(cu.cuGraphLaunch(ex, None)))
class Cfg(C.Structure):
    _fields_ = [("gx", C.c_uint), ("gy", C.c_uint), ("gz", C.c_uint), ("bx", C.c_uint), ("by", C.c_uint),
                ("bz", C.c_uint), ("shm", C.c_uint), ("stream", C.c_void_p), ("attrs", C.c_void_p), ("n", C.c_uint)]
ex_ms = c.elapsed_ms(lambda: c.check(cu.cuLaunchKernelEx(C.byref(Cfg(1, 1, 1, 1, 1, 1, 0, None, None, 0)), fn, None, None)))
pool = C.c_void_p(); c.check(cu.cuDeviceGetDefaultMemPool(C.byref(pool), 0))
def attr(a):
    v = C.c_uint64(); c.check(cu.cuMemPoolGetAttribute(pool, a, C.byref(v))); return v.value >> 20
thr = C.c_uint64(64 << 20); c.check(cu.cuMemPoolSetAttribute(pool, 4, C.byref(thr)))
d = C.c_uint64(); c.check(cu.cuMemAllocAsync(C.byref(d), C.c_size_t(10 << 20), None))
held = attr(5), attr(7)
c.check(cu.cuMemFreeAsync(d, None))
cached = attr(5), attr(7), c.mem_info()[1] - c.mem_info()[0] >> 20
c.check(cu.cuMemPoolTrimTo(pool, C.c_size_t(0)))
print(graph_ms, ex_ms, held, cached, attr(5))
""",
        fake_env,
    ).stdout.strip()
    assert out == "20.0 5.0 (10, 10) (10, 0, 10) 0"


def test_vmm_memory_lives_until_released_and_unmapped(fake_env):
    fake_env["FAKEGPU_MEMORY"] = "1Gi"
    out = run_py(
        """
import ctypes as C, cuda_probe as c
cu = c.cu
c.init()
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("htypes", C.c_int), ("loc", Loc), ("win", C.c_void_p), ("flags", C.c_uint64)]
prop = Prop(1, 0, Loc(1, 0), None, 0)
gran = C.c_size_t(); c.check(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0))
h, va = C.c_uint64(), C.c_uint64()
c.check(cu.cuMemCreate(C.byref(h), C.c_size_t(256 << 20), C.byref(prop), C.c_ulonglong(0)))
c.check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(256 << 20), C.c_size_t(0), C.c_uint64(0), C.c_ulonglong(0)))
c.check(cu.cuMemMap(va, C.c_size_t(256 << 20), C.c_size_t(0), h, C.c_ulonglong(0)))
used = lambda: (c.mem_info()[1] - c.mem_info()[0]) >> 20
a = used(); c.check(cu.cuMemRelease(h)); b = used()
c.check(cu.cuMemUnmap(va, C.c_size_t(256 << 20))); print(gran.value >> 20, a, b, used())
""",
        fake_env,
    ).stdout.strip()
    assert out == "2 256 256 0"


def test_a_driver_directory_carries_its_configuration_and_state_dir(fake_env, tmp_path):
    # installed like a driver: the libraries in one directory with fakegpu.conf beside them;
    # a process that loads them from there needs no FAKEGPU_* variable at all
    import shutil

    from .conftest import FAKE

    driver, state = tmp_path / "nvidia" / "lib64", tmp_path / "state"
    driver.mkdir(parents=True)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        shutil.copy(FAKE / name, driver / name)
    (driver / "fakegpu.conf").write_text(f"state_dir={state}\ndevice name=Tesla T4,memory=15Gi\n")
    env = {k: v for k, v in fake_env.items() if not k.startswith("FAKEGPU_")}
    env["LD_LIBRARY_PATH"] = str(driver)
    code = """
import cuda_probe as c, pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
c.init(); rc, p = c.alloc(100 << 20); assert rc == 0
print(n.nvmlDeviceGetCount(), n.nvmlDeviceGetName(h), n.nvmlDeviceGetMemoryInfo(h).total >> 30)
"""
    assert run_py(code, env).stdout.split() == ["1", "Tesla", "T4", "15"]
    assert (state / "state").is_file()  # the state went where the configuration says
    (driver / "fakegpu.conf").write_text("state_dir=relative\n")
    p = run_py("import pynvml as n; n.nvmlInit()", env, check=False)
    assert p.returncode == 2 and "fakegpu: invalid configuration: state_dir = 'relative'" in p.stderr


def test_visible_devices_env_plays_the_container_runtime(fake_env, tmp_path):
    cfg = tmp_path / "fakegpu.conf"
    cfg.write_text(
        "visible_devices_env=NVIDIA_VISIBLE_DEVICES\n"
        "device uuid=GPU-00000000-0000-4000-8000-000000000000\n"
        "device uuid=GPU-11111111-0000-4000-8000-000000000000\n"
        "device uuid=GPU-22222222-0000-4000-8000-000000000000\n"
    )
    fake_env["FAKEGPU_CONFIG"] = str(cfg)
    code = """
import ctypes as C, cuda_probe as c, pynvml as n
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
print([n.nvmlDeviceGetUUID(h)[4:8] for h in hs], [n.nvmlDeviceGetIndex(h) for h in hs],
      [n.nvmlDeviceGetMinorNumber(h) for h in hs])
count = C.c_int(); c.cu.cuInit(0); c.cu.cuDeviceGetCount(C.byref(count)); print(count.value)
try:
    n.nvmlDeviceGetHandleByUUID("GPU-11111111-0000-4000-8000-000000000000"); print("found")
except n.NVMLError_NotFound:
    print("not found")
"""
    fake_env["NVIDIA_VISIBLE_DEVICES"] = "GPU-22222222-0000-4000-8000-000000000000,0"
    assert run_py(code, fake_env).stdout.splitlines() == ["['2222', '0000'] [0, 1] [2, 0]", "2", "not found"]
    fake_env["NVIDIA_VISIBLE_DEVICES"] = "all"  # the device plugin's and the monitor's view
    assert run_py(code, fake_env).stdout.splitlines()[:2] == ["['0000', '1111', '2222'] [0, 1, 2] [0, 1, 2]", "3"]
    fake_env["NVIDIA_VISIBLE_DEVICES"] = "GPU-99999999-0000-4000-8000-000000000000"
    p = run_py(code, fake_env, check=False)
    assert p.returncode == 2 and "invalid configuration: NVIDIA_VISIBLE_DEVICES = 'GPU-9999" in p.stderr


def _in_own_pid_namespace(code: str, env: dict[str, str]) -> subprocess.Popen:
    """`code` as PID 1 of a new PID namespace with its own /proc, as in a container."""
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--map-root-user", sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_processes_of_different_pid_namespaces_are_told_apart(fake_env):
    """Two containers' first processes are both PID 1: the fake GPU keys a process by PID
    namespace and PID, reports a distinct PID for each through NVML (a synthetic one above
    pid_max, since neither can know its host PID), and reclaims a killed one's memory."""
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--map-root-user", "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"PID namespaces with their own /proc are not available here: {probe.stderr!r}")
    fake_env["FAKEGPU_COUNT"] = "1"
    fake_env["FAKEGPU_MEMORY"] = "2Gi"
    holder = """
import os, sys, cuda_probe as c
c.init(); rc, p = c.alloc({mib} << 20); assert rc == 0
print(os.getpid(), flush=True); sys.stdin.read()
"""
    a = _in_own_pid_namespace(holder.format(mib=300), fake_env)
    b = _in_own_pid_namespace(holder.format(mib=500), fake_env)
    try:
        assert a.stdout.readline().strip() == "1", a.stderr.read()
        assert b.stdout.readline().strip() == "1", b.stderr.read()
        listing = """
import pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
print(sorted((p.usedGpuMemory >> 20, p.pid) for p in n.nvmlDeviceGetComputeRunningProcesses(h)))
print(n.nvmlDeviceGetMemoryInfo(h).used >> 20)
"""
        out = run_py(listing, fake_env).stdout.splitlines()
        rows = eval(out[0])
        assert [mib for mib, _ in rows] == [300, 500]
        pids = [pid for _, pid in rows]
        assert len(set(pids)) == 2 and all(pid >= 4194304 for pid in pids)  # pid_max <= 2**22
        a.kill()
        a.wait()
        # no kill() can see a process of another namespace: the slot's lock tells that it died
        out = run_py(listing, fake_env).stdout.splitlines()
        assert eval(out[0]) == [rows[1]]  # b's 500 MiB under b's PID; a's 300 MiB released
        assert int(out[1]) == 500
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_topology_and_mig_answers(fake_env):
    """The NVML answers the device plugin does not read itself: P2P status, link partner types,
    and the MIG errors (overlap, instance count, mode change while in use)."""
    fake_env["FAKEGPU_DEVICES"] = (
        "name=NVIDIA A100-SXM4-40GB,mig_mode=1,nvlink=1x2,pcie_switch=0;"
        "name=NVIDIA A100-SXM4-40GB,nvlink=0x2,nvswitch=1,pcie_switch=0;"
        "name=NVIDIA L4,numa=1"
    )
    code = """
import ctypes as C, pynvml as n
n.nvmlInit()
a, b, c = (n.nvmlDeviceGetHandleByIndex(i) for i in range(3))
p2p = lambda x, y, i: n.nvmlDeviceGetP2PStatus(x, y, i) == n.NVML_P2P_STATUS_OK
print(p2p(a, b, n.NVML_P2P_CAPS_INDEX_NVLINK), p2p(a, c, n.NVML_P2P_CAPS_INDEX_NVLINK), p2p(a, b, n.NVML_P2P_CAPS_INDEX_PCI),
      p2p(a, c, 0), n.nvmlDeviceGetTopologyCommonAncestor(a, c))  # 0: READ (pynvml has it as a tuple)
print([n.nvmlDeviceGetNvLinkRemoteDeviceType(b, l) for l in range(3)])
def err(f, *args):
    try:
        f(*args); return "ok"
    except n.NVMLError as e:
        return type(e).__name__.replace("NVMLError_", "")
print(err(n.nvmlDeviceGetMigMode, c))
me = n.nvmlDeviceGetGpuInstanceProfileInfo(a, n.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)
pl = n.c_nvmlGpuInstancePlacement_t(); pl.start, pl.size = 6, 1
gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(a, me.id, C.byref(pl))
pl.start = 5
print(err(n.nvmlDeviceCreateGpuInstanceWithPlacement, a, me.id, C.byref(pl)),   # one +me instance per GPU
      err(n.nvmlDeviceSetMigMode, a, 0))                                          # instances exist
full = n.nvmlDeviceGetGpuInstanceProfileInfo(a, n.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
pl.start, pl.size = 0, 8
print(err(n.nvmlDeviceCreateGpuInstanceWithPlacement, a, full.id, C.byref(pl)))  # overlaps slice 6
n.nvmlGpuInstanceDestroy(gi)
print(err(n.nvmlDeviceSetMigMode, a, 0), n.nvmlDeviceGetMigMode(a))
"""
    out = run_py(code, fake_env).stdout.splitlines()
    assert out == [
        "True False True False 50",
        "[0, 0, 2]",
        "NotSupported",
        "InsufficientResources InUse",
        "InsufficientResources",
        "ok [0, 0]",
    ]


UTIL_PROBE = r"""
import os, subprocess, sys, time, cuda_probe as c, pynvml as n
P = 2.0  # FAKEGPU_SAMPLE_PERIOD_US below
CHILD = "import cuda_probe as c; c.init(); fn = c.function(b'busy_50ms'); [c.launch(fn) for _ in range(2)]; c.check(c.cu.cuCtxSynchronize())"
c.init(); fn = c.function(b"busy_50ms")
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
for attempt in range(4):
    time.sleep(P - time.time() % P + 0.01)        # just after a period boundary
    period = int(time.time() // P)
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    for _ in range(4):
        assert c.launch(fn) == 0
    c.check(c.cu.cuCtxSynchronize())
    assert child.wait() == 0
    if int(time.time() // P) == period:           # all the work fell in one period
        break
else:
    raise SystemExit("the work never fitted in one sample period")
time.sleep(P - time.time() % P + 0.05)            # that period is now complete
s = n.nvmlDeviceGetProcessUtilization(h, 0)
print(sorted(("me" if x.pid == os.getpid() else "child" if x.pid == child.pid else x.pid, x.smUtil) for x in s))
"""


@pytest.mark.parametrize(
    "attribution, expected",
    [("split", ["[('child', 5), ('me', 10)]"]), ("resident", ["[('child', 15)]", "[('me', 15)]"])],
)
def test_process_utilization_attribution(fake_env, attribution, expected):
    """split: each process its own busy time (100 ms and 200 ms of a 2 s period); resident, as a
    real driver: one row per sample, one of the processes, with the device's whole 15 %."""
    fake_env["FAKEGPU_SAMPLE_PERIOD_US"] = "2000000"
    fake_env["FAKEGPU_UTIL_ATTRIBUTION"] = attribution
    out = run_py(UTIL_PROBE, fake_env).stdout.strip()
    assert out in expected


def test_bad_attribution_is_refused_naming_the_key(fake_env):
    fake_env["FAKEGPU_UTIL_ATTRIBUTION"] = "fair"
    proc = run_py("import cuda_probe as c; c.init()", fake_env, check=False)
    assert proc.returncode != 0
    assert "util_attribution" in proc.stderr and "fair" in proc.stderr
