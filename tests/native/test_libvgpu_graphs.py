"""libvgpu against the fake GPU: CUDA graph memory. A graph's allocation nodes
(cuGraphAddMemAllocNode, cuGraphAddNode, stream-ordered allocations captured from a stream) take
their memory from the device's graph pool when the graph is uploaded or launched, through no
allocation hook: a process held graph memory beyond its limit, and captured allocations were
charged at capture time and given back by the captured free before the graph ever ran."""

from __future__ import annotations

import pytest

from .conftest import run_py

pytestmark = pytest.mark.native

# Shared by the probes: the container's ledger (MiB), what the fake driver says the process holds
# (MiB, NVML's per-process figure, which libvgpu does not touch), and graph builders.
PRELUDE = """
import ctypes as C, os, cuda_probe as c, pynvml as n
from region_layout import read_region
cu = c.cu
MiB = 1 << 20
def ledger(dev=0):
    r = read_region(os.environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    return sum(s["used"][dev]["total"] for s in r["slots"] if s["pid"]) >> 20
n.nvmlInit(); nvh = n.nvmlDeviceGetHandleByIndex(0)
def held():
    return sum(p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(nvh)) >> 20
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class PoolProps(C.Structure):
    _fields_ = [("atype", C.c_int), ("htypes", C.c_int), ("loc", Loc), ("win", C.c_void_p),
                ("maxsize", C.c_size_t), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 54)]
class AllocParams(C.Structure):
    _fields_ = [("props", PoolProps), ("access", C.c_void_p), ("naccess", C.c_size_t),
                ("bytesize", C.c_size_t), ("dptr", C.c_uint64)]
class Child(C.Structure): _fields_ = [("graph", C.c_void_p), ("ownership", C.c_int)]
class NodeUnion(C.Union): _fields_ = [("pad", C.c_longlong * 29), ("alloc", AllocParams), ("graph", Child)]
class NodeParams(C.Structure):
    _fields_ = [("type", C.c_int), ("r0", C.c_int * 3), ("u", NodeUnion), ("r2", C.c_longlong)]
class InstParams(C.Structure):
    _fields_ = [("flags", C.c_uint64), ("upload", C.c_void_p), ("err", C.c_void_p), ("result", C.c_int)]
NODE_GRAPH, NODE_ALLOC, MOVE, AUTO_FREE, UPLOAD = 4, 10, 1, 1, 2
def graph():
    g = C.c_void_p(); c.check(cu.cuGraphCreate(C.byref(g), 0)); return g
def alloc_node(g, mib, after=None, dev=0):
    node, p = C.c_void_p(), AllocParams(PoolProps(1, 0, Loc(1, dev)), None, 0, mib << 20, 0)
    deps = (C.c_void_p * 1)(after) if after else None
    c.check(cu.cuGraphAddMemAllocNode(C.byref(node), g, deps, 1 if after else 0, C.byref(p)), "alloc node")
    return node, p.dptr
def free_node(g, dptr, after):
    node = C.c_void_p()
    c.check(cu.cuGraphAddMemFreeNode(C.byref(node), g, (C.c_void_p * 1)(after), 1, C.c_uint64(dptr)), "free node")
    return node
def instantiate(g, flags=0):
    x = C.c_void_p(); return cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(flags)), x
def launch(x, s=None):
    return cu.cuGraphLaunch(x, s)
def trim(dev=0):
    c.check(cu.cuDeviceGraphMemTrim(dev), "trim")
def stream():
    s = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(s), 0)); return s
def proc(name, version=12080, pt=False):
    fn, st = C.c_void_p(), C.c_int()
    # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM is 1 << 1 (1 is LEGACY_STREAM)
    c.check(cu.cuGetProcAddress_v2(name, C.byref(fn), version, C.c_uint64(2 if pt else 0), C.byref(st)), name)
    return fn.value
"""


def test_a_graphs_allocation_nodes_are_checked_against_the_limit_when_it_maps_them(vgpu_env):
    """A graph allocating 600 MiB launched beside a 600 MiB cuMemAlloc under a 1 GiB limit: the
    launch succeeded (1200 MiB held, none of it charged). Its first launch now reserves the
    graph's memory under the limit; later launches reuse what it holds (no second charge); the
    pool's reservation stays charged until cuDeviceGraphMemTrim, after which the next launch is
    checked again."""
    out = run_py(
        PRELUDE
        + """
c.init()
g = graph(); a, d = alloc_node(g, 600); free_node(g, d, a)
rc, x = instantiate(g)
rc2, big = c.alloc(600 * MiB)
row = [rc, rc2, launch(x), ledger(), held()]
c.check(c.free(big))
row += [launch(x), ledger(), held(), c.alloc(600 * MiB)[0], launch(x), launch(x), ledger(), held()]
trim(); row += [ledger(), held()]
rc, big = c.alloc(600 * MiB)
row += [rc, launch(x), ledger(), held(), c.free(big), launch(x), ledger()]
row += [cu.cuGraphExecDestroy(x), ledger(), held()]    # the pool keeps the pages: still charged
trim(); row += [ledger(), held()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == str(
        [0, 0, 2, 600, 600, 0, 600, 600, 2, 0, 0, 600, 600, 0, 0, 0, 2, 600, 600, 0, 0, 600, 0, 600, 600, 0, 0]
    )


def test_a_graph_over_the_limit_is_refused_at_instantiation_whatever_the_entry_point(vgpu_env):
    """Allocation nodes whose pages alone exceed the limit (700 + 700 MiB, both live at once) can
    never run under it: every instantiation entry point (by name, the pre-11.4 signature, with
    params, through cuGetProcAddress) refuses with CUDA_ERROR_OUT_OF_MEMORY; before, it was
    instantiated, and nothing checked its launch. A graph whose second 700 MiB follows the free of the
    first gets the same addresses from the driver (its peak, 700 MiB, is what it maps) and runs."""
    out = run_py(
        PRELUDE
        + """
c.init()
two = graph(); alloc_node(two, 700); alloc_node(two, 700)
x = C.c_void_p()
p = InstParams(0, None, None, 0)
by_gpa = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_void_p, C.c_ulonglong)(proc(b"cuGraphInstantiate"))
rcs = [instantiate(two)[0], cu.cuGraphInstantiate(C.byref(x), two, None, None, C.c_size_t(0)),
       cu.cuGraphInstantiateWithParams(C.byref(x), two, C.byref(p)), by_gpa(C.byref(x), two, 0)]
row = [rcs, held()]
seq = graph(); a, d1 = alloc_node(seq, 700); f = free_node(seq, d1, a); b, d2 = alloc_node(seq, 700, after=f)
rc, xs = instantiate(seq)
row += [d1 == d2, rc, launch(xs), ledger(), held()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[[2, 2, 2, 2], 0, True, 0, 0, 700, 700]"


def test_captured_stream_ordered_allocations_are_charged_when_the_graph_runs(vgpu_env):
    """cuMemAllocAsync on a capturing stream allocates nothing: it records an allocation node.
    It was charged at capture and given back by the captured cuMemFreeAsync, so every launch of
    the graph held 800 MiB uncharged (a cuMemAlloc of 800 MiB then fitted under 1 GiB); and a
    capture beside 600 MiB already allocated was refused although nothing was allocated. The
    graph's memory is now charged when it runs, checked against the limit then."""
    out = run_py(
        PRELUDE
        + """
c.init()
s = stream()
k = c.function(b"step")
def capture(mib):
    c.check(cu.cuStreamBeginCapture_v2(s, 0), "begin")
    d = C.c_uint64()
    rc = cu.cuMemAllocAsync(C.byref(d), C.c_size_t(mib * MiB), s)
    if rc == 0:
        c.check(c.launch(k, stream=s), "kernel"); c.check(cu.cuMemFreeAsync(d, s), "free")
    g = C.c_void_p(); c.check(cu.cuStreamEndCapture(s, C.byref(g)), "end")
    return rc, g
rc, g = capture(800)
row = [rc, ledger()]
rc, x = instantiate(g)
row += [rc, launch(x, s), ledger(), held(), c.alloc(800 * MiB)[0]]
c.check(cu.cuGraphExecDestroy(x)); trim()
rc, big = c.alloc(600 * MiB)
rc2, g2 = capture(800)
rc3, x2 = instantiate(g2)
row += [ledger(), rc2, rc3, launch(x2, s), ledger(), held(), c.free(big), launch(x2, s), ledger(), held()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == str([0, 0, 0, 0, 800, 800, 2, 600, 0, 0, 2, 600, 600, 0, 0, 800, 800])


def test_uploads_are_checked_on_every_entry_point_and_through_cugetprocaddress(vgpu_env):
    """cuGraphUpload maps a graph's memory without running it, as does an instantiation with
    CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: both are checked, the per-thread variants and the
    functions cuGetProcAddress hands out (the runtime's path) included; a trim found through
    cuGetProcAddress gives the pool's memory back."""
    out = run_py(
        PRELUDE
        + """
c.init()
s = stream()
F = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p)
upload_pt = F(proc(b"cuGraphUpload", pt=True))
with_params = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_void_p, C.POINTER(InstParams))(proc(b"cuGraphInstantiateWithParams"))
gpa_trim = C.CFUNCTYPE(C.c_int, C.c_int)(proc(b"cuDeviceGraphMemTrim"))
gpa_launch = F(proc(b"cuGraphLaunch", pt=True))
g = graph(); alloc_node(g, 600)
x = C.c_void_p(); p = InstParams(0, None, None, 0)
c.check(with_params(C.byref(x), g, C.byref(p)))
rc, big = c.alloc(600 * MiB)
row = [rc, upload_pt(x, s), cu.cuGraphUpload(x, s), gpa_launch(x, None), ledger(), held(), c.free(big)]
row += [upload_pt(x, s), ledger(), held(), c.alloc(600 * MiB)[0]]
c.check(cu.cuGraphExecDestroy(x)); row += [gpa_trim(0), ledger(), held()]
rc, big = c.alloc(600 * MiB)
up = InstParams(UPLOAD, s, None, 0)
row += [rc, with_params(C.byref(x), g, C.byref(up)), c.free(big), with_params(C.byref(x), g, C.byref(up)), ledger(), held()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == str([0, 2, 2, 2, 600, 600, 0, 0, 600, 600, 2, 0, 0, 0, 0, 2, 0, 0, 600, 600])


def test_allocation_nodes_of_a_child_graph_count_and_live_allocations_keep_their_charge(vgpu_env):
    """A graph moved into another with cuGraphAddNode (the only way a child holds memory nodes)
    counts toward its parent; an allocation the graph does not free stays held (and charged)
    after cuMemFree gives it back to the pool, and an AUTO_FREE_ON_LAUNCH relaunch maps nothing
    new."""
    out = run_py(
        PRELUDE
        + """
c.init()
child = graph(); alloc_node(child, 1500)
parent = graph(); node = C.c_void_p()
np = NodeParams(NODE_GRAPH); np.u.graph = Child(child, MOVE)
c.check(cu.cuGraphAddNode(C.byref(node), parent, None, C.c_size_t(0), C.byref(np)), "child node")
row = [instantiate(parent)[0], held()]
g = graph(); np = NodeParams(NODE_ALLOC); np.u.alloc = AllocParams(PoolProps(1, 0, Loc(1, 0)), None, 0, 600 * MiB, 0)
c.check(cu.cuGraphAddNode(C.byref(node), g, None, C.c_size_t(0), C.byref(np)), "alloc node")
rc, x = instantiate(g, AUTO_FREE)
row += [rc, launch(x), ledger(), cu.cuMemFree_v2(C.c_uint64(np.u.alloc.dptr)), ledger(), c.alloc(600 * MiB)[0]]
row += [launch(x), launch(x), ledger(), held()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[2, 0, 0, 0, 600, 0, 600, 2, 0, 0, 600, 600]"


def test_a_forked_child_starts_with_no_graph_charge_of_its_parents(vgpu_env):
    """fork() copied the parent's graph records and graph-pool charge into the child: its first
    trim (or graph launch) then released the parent's charge from the child's own slot, and the
    child got 600 MiB past its 1 GiB limit."""
    out = run_py(
        PRELUDE
        + """
c.init()
g = graph(); a, d = alloc_node(g, 600); free_node(g, d, a)
rc, x = instantiate(g); c.check(rc); c.check(launch(x)); c.check(cu.cuCtxSynchronize())
parent = ledger()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    c.init()
    rc, p = c.alloc(300 * MiB)
    before = ledger() - parent
    trim()
    after = ledger() - parent
    rc2, q = c.alloc(300 * MiB)  # parent 600 + child 300 + 300 > the 1 GiB limit
    os.write(w, repr([rc, before, after, rc2]).encode()); os._exit(0)
os.waitpid(pid, 0)
print(parent, os.read(r, 200).decode())
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "600 [0, 300, 300, 2]", out


def test_a_device_reset_gives_back_the_graph_pools_charge(vgpu_env):
    """cudaDeviceReset (cuDevicePrimaryCtxReset) frees the primary context's memory, its graphs'
    too: the graph pool's reservation was kept on the ledger, so after a reset the process could
    allocate 600 MiB less than its limit allowed, until it exited. The charge now follows the
    driver's own figure after a reset, and a graph still launchable after it counts as unmapped:
    its next launch is checked again (here beside 900 MiB under the 1 GiB limit: refused)."""
    out = run_py(
        PRELUDE
        + """
c.init()
g = graph(); a, d = alloc_node(g, 600); free_node(g, d, a)
rc, x = instantiate(g); c.check(rc); c.check(launch(x)); c.check(cu.cuCtxSynchronize())
row = [ledger(), held()]
c.check(cu.cuDevicePrimaryCtxReset_v2(0), "reset")
c.init()
row += [ledger(), held()]
rc, big = c.alloc(900 * MiB)
row += [rc, ledger(), launch(x), ledger(), held()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == str([600, 600, 0, 0, 0, 900, 2, 900, 900]), out
