"""libvgpu's graph and stream-ordered memory hooks, review of 1 Dec (after the read-backs): what a
hook judged is what the driver did, when a second thread of the tenant changes the parameters
(cuGraphInstantiateWithParams' flags, cuMemPoolSetAttribute's threshold), the graph being
instantiated (an allocation node added meanwhile) or the stream's capture (ended meanwhile); and
allocation nodes nested deeper than the walk went, or that cannot be read. On the fake GPU; the
interleavings are fixed by the fake's pause points and failures on demand (docs/fakegpu.md), not
by timing."""

from __future__ import annotations

import pytest

from .conftest import run_py
from .test_review_memory_dec1d import PRELUDE, RACE, _probe

pytestmark = pytest.mark.native

GRAPHS = """
class InstParams(C.Structure):  # CUDA_GRAPH_INSTANTIATE_PARAMS
    _fields_ = [("flags", C.c_uint64), ("upload", C.c_void_p), ("err", C.c_void_p), ("result", C.c_int)]
class Child(C.Structure): _fields_ = [("graph", C.c_void_p), ("ownership", C.c_int)]
class NodeUnion(C.Union): _fields_ = [("pad", C.c_longlong * 29), ("alloc", AllocParams), ("graph", Child)]
class NodeParams(C.Structure):  # CUgraphNodeParams
    _fields_ = [("type", C.c_int), ("r0", C.c_int * 3), ("u", NodeUnion), ("r2", C.c_longlong)]
UPLOAD, NODE_GRAPH, MOVE, RELAXED = 2, 4, 1, 2
def new_graph():
    g = C.c_void_p(); c.check(cu.cuGraphCreate(C.byref(g), 0)); return g
def add_alloc(g, mib, free=True):  # an allocation node of `mib` in g, and its free node
    a, f = C.c_void_p(), C.c_void_p()
    p = AllocParams(PoolProps(1, 0, Loc(1, 0)), None, 0, mib * MiB, 0)
    c.check(cu.cuGraphAddMemAllocNode(C.byref(a), g, None, 0, C.byref(p)), "alloc node")
    if free:
        c.check(cu.cuGraphAddMemFreeNode(C.byref(f), g, (C.c_void_p * 1)(a), 1, C.c_uint64(p.dptr)), "free node")
def nest(g):  # a graph holding g as its child graph (moved into it)
    outer, node, prm = new_graph(), C.c_void_p(), NodeParams()
    prm.type, prm.u.graph = NODE_GRAPH, Child(g, MOVE)
    c.check(cu.cuGraphAddNode(C.byref(node), outer, None, C.c_size_t(0), C.byref(prm)), "child graph")
    return outer
def with_ctx(fn):  # fn for a thread of its own: the context made current there first
    ctx = C.c_void_p(); c.check(cu.cuCtxGetCurrent(C.byref(ctx)), "current")
    return lambda *a: cu.cuCtxSetCurrent(ctx) or fn(*a)
"""


def _graph_probe(env, code: str) -> list:
    return _probe(env, RACE + GRAPHS + code)


# ---- finding 1: cuGraphInstantiateWithParams read the upload flag twice ----


@pytest.mark.parametrize("fn", ["cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"])
def test_an_upload_flag_cleared_while_the_driver_reads_the_params_still_uploads_what_was_reserved(vgpu_env, fn):
    """Found by review, 1 Dec: cuGraphInstantiateWithParams judged the upload from p->flags and
    the driver read p->flags again; a second thread clearing the flag in between had the hook
    reserve, the driver map nothing, the reservation settled away and the graph marked mapped, so
    its launch mapped 512 MiB unchecked and uncharged (a 600 MiB allocation then fitted under
    1 GiB). The driver now gets the copy that was judged; its answers are copied back to p."""
    row = _graph_probe(
        vgpu_env,
        f"""
c.init()
g = new_graph(); add_alloc(g, 512)
x, p = C.c_void_p(), InstParams(UPLOAD, None, None, 7)
resume = call_paused("cuGraphInstantiate:entry", cu.{fn}, C.byref(x), g, C.byref(p))
p.flags = 0  # the tenant's other thread, before the driver reads it
row = [resume(), p.result, ledger(), held()]
row += [cu.cuGraphLaunch(x, None), ledger(), held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [0, 0, 512, 512, 0, 512, 512, 2]


@pytest.mark.parametrize("fn", ["cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"])
def test_an_upload_flag_set_while_the_driver_reads_the_params_uploads_nothing_unchecked(vgpu_env, fn):
    """Found by review, 1 Dec (the other way round): the flag set after the hook judged 'no
    upload' had the driver upload 512 MiB beside 600 MiB under a 1 GiB limit, unchecked and
    uncharged until a launch. The driver now instantiates without uploading, as judged, and the
    launch is refused."""
    row = _graph_probe(
        vgpu_env,
        f"""
c.init()
rc, big = c.alloc(600 * MiB)
g = new_graph(); add_alloc(g, 512)
x, p = C.c_void_p(), InstParams(0, None, None, 7)
resume = call_paused("cuGraphInstantiate:entry", cu.{fn}, C.byref(x), g, C.byref(p))
p.flags = UPLOAD
row = [rc, resume(), p.result, ledger(), held(), cu.cuGraphLaunch(x, None), ledger(), held()]
print(row)
""",
    )
    assert row == [0, 0, 0, 600, 600, 2, 600, 600]


# ---- finding 2: allocation nodes nested deeper than the walk went, or unreadable ----


def test_an_allocation_node_nested_40_child_graphs_deep_is_counted(vgpu_env):
    """Found by review, 1 Dec: the walk for allocation nodes stopped below 32 nested child graphs;
    a 512 MiB allocation node 40 levels down left the graph with footprint 0, unrecorded, and its
    launch mapped 512 MiB unchecked and uncharged. The walk now has no depth limit."""
    row = _graph_probe(
        vgpu_env,
        """
c.init()
g = new_graph(); add_alloc(g, 512)
for _ in range(40):
    g = nest(g)
x = C.c_void_p()
row = [cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(0)), cu.cuGraphLaunch(x, None)]
row += [ledger(), held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [0, 0, 512, 512, 2]


@pytest.mark.parametrize(
    "call",
    ["cuGraphGetNodes", "cuGraphNodeGetType", "cuGraphMemAllocNodeGetParams", "cuGraphChildGraphNodeGetGraph"],
)
def test_a_graph_whose_nodes_cannot_be_read_is_refused_not_counted_as_empty(vgpu_env, call):
    """Found by review, 1 Dec: a node the walk could not read (its type, its allocation
    parameters, its child graph, a graph's node list) was skipped, so a graph of a 512 MiB
    allocation node could be instantiated with footprint 0 and launched unchecked and uncharged.
    The instantiation now fails with the error the driver gave, and says why; asked again (the
    node readable), it is counted."""
    env = {**vgpu_env, "LIBCUDA_LOG_LEVEL": "2"}
    p = run_py(
        PRELUDE
        + RACE
        + GRAPHS
        + f"""
c.init()
inner = new_graph(); add_alloc(inner, 512)
g = nest(inner)
x = C.c_void_p()
cu.fakegpu_fail_next_call(b"{call}", 999)
row = [cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(0)), x.value, ledger(), held()]
row += [cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(0)), cu.cuGraphLaunch(x, None), ledger(), held()]
print(row)
""",
        env,
    )
    assert p.stdout.strip().splitlines()[-1] == str([999, None, 0, 0, 0, 0, 512, 512])
    assert "CUDA graph refused: its allocation nodes cannot be counted" in p.stderr
    assert f"{call} returned 999" in p.stderr


# ---- finding 3: cuMemPoolSetAttribute read the threshold back ----


def test_a_release_threshold_overwritten_after_the_driver_read_it_is_remembered_as_the_driver_has_it(vgpu_env):
    """Found by review, 1 Dec: cuMemPoolSetAttribute remembered the release threshold read back
    from the tenant's variable after the driver had used it; a second thread writing 0 there in
    between left the pool remembered as keeping nothing while the driver kept up to UINT64_MAX:
    512 MiB freed into the pool stayed held, uncharged (a 600 MiB allocation then fitted under
    1 GiB). The driver now gets a copy, and that copy is remembered."""
    row = _graph_probe(
        vgpu_env,
        """
c.init()
pool = mkpool()
keep = C.c_uint64((1 << 64) - 1)
resume = call_paused("cuMemPoolSetAttribute", cu.cuMemPoolSetAttribute, pool, 4, C.byref(keep))  # RELEASE_THRESHOLD
keep.value = 0  # the tenant's other thread, once the driver has read it
row = [resume()]
d = C.c_uint64()
c.check(cu.cuMemAllocFromPoolAsync(C.byref(d), C.c_size_t(512 * MiB), pool, None), "alloc")
c.check(cu.cuMemFreeAsync(d, None), "free")  # the pool keeps it (its threshold is UINT64_MAX)
row += [ledger(), held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [0, 512, 512, 2]


# ---- finding 4: cuMemAllocAsync on a stream whose capture ended while the driver ran ----
# The regression review (1 Dec) found the repair after the call (look at the capture again, then
# reserve, or free and refuse) defeatable; a capture can no longer end while an allocation is
# between its look at the capture and the driver's return (cuStreamEndCapture waits for it).

# libvgpu's log (its stderr) where the probe reads it: a thread waiting in a hook says so (debug
# level), which is how a test knows it waits without timing it; copied to stderr at exit.
LOGWATCH = """
import atexit, tempfile
_log, _err = tempfile.TemporaryFile(), os.dup(2)
os.dup2(_log.fileno(), 2)
atexit.register(lambda: (_log.seek(0), os.write(_err, _log.read())))
def logged(text):
    _log.seek(0); return text.encode() in _log.read()
def waits(t, text):  # once `t` is done, or libvgpu logged `text` (t waits in a hook): whether it waits
    while t.is_alive() and not logged(text):
        time.sleep(0.001)
    return t.is_alive()
END_WAITS = "waits for the stream-ordered allocations in the driver"
ALLOC_WAITS = "waits for a cuStreamEndCapture in the driver"
GLOBAL, MEM_ALLOC = 0, 10
def alloc_nodes(g):  # how many allocation nodes graph g holds
    n = C.c_size_t(); c.check(cu.cuGraphGetNodes(g, None, C.byref(n)), "nodes")
    nodes = (C.c_void_p * max(n.value, 1))(); c.check(cu.cuGraphGetNodes(g, nodes, C.byref(n)), "nodes")
    kinds = [C.c_int() for _ in range(n.value)]
    for node, k in zip(nodes, kinds):
        c.check(cu.cuGraphNodeGetType(C.c_void_p(node), C.byref(k)), "type")
    return sum(k.value == MEM_ALLOC for k in kinds)
def stream():
    s = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(s), 0), "stream"); return s
"""


def _capture_probe(env, code: str) -> list:
    return _probe({**env, "LIBCUDA_LOG_LEVEL": "4"}, RACE + GRAPHS + LOGWATCH + code)


@pytest.mark.parametrize(
    "alloc, end",
    [
        ("cuMemAllocAsync", "cuStreamEndCapture"),
        ("cuMemAllocAsync_ptsz", "cuStreamEndCapture_ptsz"),
        ("cuMemAllocFromPoolAsync", "cuStreamEndCapture"),
        ("cuMemAllocFromPoolAsync_ptsz", "cuStreamEndCapture_ptsz"),
    ],
)
def test_cumemallocasync_in_the_driver_holds_off_a_cuStreamEndCapture_on_another_thread(vgpu_env, alloc, end):
    """Found by review, 1 Dec, and again by the regression review: cuMemAllocAsync saw its stream
    capturing and passed the call through uncounted (a captured allocation is the graph's); a
    second thread ending the capture (relaxed mode allows it) before the driver allocated made it a
    real 512 MiB allocation, held untracked and uncharged, which the repair of 1 Dec then charged as
    real. cuStreamEndCapture (+ _ptsz, as cuGetProcAddress hands them out) now waits for the
    allocation in the driver: it is the capture's node (nothing real made, nothing charged), and the
    graph's launch is charged."""
    pool = "pool, " if "Pool" in alloc else ""
    row = _capture_probe(
        vgpu_env,
        f"""
c.init()
s, d, g = stream(), C.c_uint64(), C.c_void_p()
pool = mkpool()
c.check(cu.cuStreamBeginCapture_v2(s, RELAXED), "begin")
resume = call_paused({alloc.replace("_ptsz", "")!r}, with_ctx(cu.{alloc}), C.byref(d), C.c_size_t(512 * MiB), {pool}s)
# the tenant's other thread ends the capture, through cuGetProcAddress (the CUDA runtime's way)
fn, st = C.c_void_p(), C.c_int()
c.check(cu.cuGetProcAddress_v2(b"cuStreamEndCapture", C.byref(fn), 12000, C.c_uint64({2 if "ptsz" in end else 0}), C.byref(st)))
t = on_thread(with_ctx(C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p)(fn.value)), s, C.byref(g))
row = [waits(t, END_WAITS), resume(), t.result(), d.value != 0, ledger(), held(), alloc_nodes(g)]
x = C.c_void_p(); c.check(cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(0)), "instantiate")
row += [cu.cuGraphLaunch(x, s), ledger(), held()]
print(row)
""",
    )
    assert row == [True, 0, 0, True, 0, 0, 1, 0, 512, 512]


def test_a_capture_ended_and_a_global_one_begun_during_cumemallocasync_leaves_nothing_past_the_limit(vgpu_env):
    """Found by the regression review, 1 Dec (finding 1): beside 600 MiB under a 1 GiB limit, a
    second thread ended capture A while cuMemAllocAsync was in the driver and began a global-mode
    capture B before the hook looked again; the 512 MiB did not fit, the free fell back to the
    synchronous cuMemFree (the stream was capturing again), which global mode forbids, and the hook
    charged it past the limit and handed the pointer over (the ledger ended at 1112 MiB). Now the end
    of A waits for the allocation: it is A's node, B begins after, nothing is charged or held
    past the limit."""
    row = _capture_probe(
        vgpu_env,
        """
c.init()
rc, big = c.alloc(600 * MiB)
s, d, ga, gb = stream(), C.c_uint64(), C.c_void_p(), C.c_void_p()
c.check(cu.cuStreamBeginCapture_v2(s, RELAXED), "begin A")
resume = call_paused("cuMemAllocAsync", with_ctx(cu.cuMemAllocAsync), C.byref(d), C.c_size_t(512 * MiB), s)
t = on_thread(with_ctx(lambda: [cu.cuStreamEndCapture(s, C.byref(ga)), cu.cuStreamBeginCapture_v2(s, GLOBAL)]))
row = [rc, waits(t, END_WAITS), resume(), t.result(), ledger(), held(), alloc_nodes(ga)]
row += [cu.cuStreamEndCapture(s, C.byref(gb)), alloc_nodes(gb), ledger(), held()]
print(row)
""",
    )
    assert row == [0, True, 0, [0, 0], 600, 600, 1, 0, 0, 600, 600]


@pytest.mark.parametrize("beside", [0, 600])
def test_cumemallocasync_whose_capture_is_invalidated_meanwhile_stays_the_graphs(vgpu_env, beside):
    """Found by the regression review, 1 Dec (finding 2): the repair compared the capture's id
    before and after the driver call, but cuStreamGetCaptureInfo gives an id only for an active
    capture: one invalidated meanwhile (here a cuStreamSynchronize of the capturing stream on
    another thread, which capture forbids, as a legitimate program's mistake can) read as another
    capture, and the allocation node was charged as a real 512 MiB allocation (beside 600 MiB:
    charged past the limit, 1112 MiB). An invalidated capture is a capture: the node stays
    uncharged, and the capture ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph."""
    row = _capture_probe(
        vgpu_env,
        f"""
c.init()
rc, big = c.alloc({beside} * MiB) if {beside} else (0, 0)
s, d, g = stream(), C.c_uint64(), C.c_void_p()
c.check(cu.cuStreamBeginCapture_v2(s, RELAXED), "begin")
resume = call_paused("cuMemAllocAsync:made", with_ctx(cu.cuMemAllocAsync), C.byref(d), C.c_size_t(512 * MiB), s)
row = [rc, cu.cuStreamSynchronize(s), resume(), d.value != 0, ledger(), held()]
row += [cu.cuStreamEndCapture(s, C.byref(g)), g.value, ledger(), held()]
print(row)
""",
    )
    assert row == [0, 900, 0, True, beside, beside, 901, None, beside, beside]


def test_cumemallocasync_while_cuStreamEndCapture_is_in_the_driver_waits_and_is_a_real_allocation(vgpu_env):
    """The other order (found by the regression review's design check, 1 Dec): an allocation
    arriving while the capture's end is in the driver waits for it, then sees no capture and is
    reserved and charged as the real allocation the driver makes (before, it could look while the
    capture was still there and have the driver decide after it ended)."""
    row = _capture_probe(
        vgpu_env,
        """
c.init()
s, d, g = stream(), C.c_uint64(), C.c_void_p()
c.check(cu.cuStreamBeginCapture_v2(s, RELAXED), "begin")
resume = call_paused("cuStreamEndCapture", with_ctx(cu.cuStreamEndCapture), s, C.byref(g))
t = on_thread(with_ctx(cu.cuMemAllocAsync), C.byref(d), C.c_size_t(512 * MiB), s)
row = [waits(t, ALLOC_WAITS), resume(), t.result(), d.value != 0, ledger(), held(), alloc_nodes(g)]
row += [cu.cuMemFreeAsync(d, s), ledger(), held()]
print(row)
""",
    )
    assert row == [True, 0, 0, True, 512, 512, 0, 0, 0, 0]


def test_cumemallocasync_in_a_capture_that_goes_on_stays_the_graphs(vgpu_env):
    """A capture nobody ends meanwhile: the captured allocation is not charged (the graph's launch
    is), as before."""
    row = _graph_probe(
        vgpu_env,
        """
c.init()
s = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(s), 0), "stream")
d = C.c_uint64()
c.check(cu.cuStreamBeginCapture_v2(s, RELAXED), "begin")
row = [cu.cuMemAllocAsync(C.byref(d), C.c_size_t(512 * MiB), s), d.value != 0, ledger()]
c.check(cu.cuMemFreeAsync(d, s), "free")
g = C.c_void_p(); c.check(cu.cuStreamEndCapture(s, C.byref(g)), "end")
x = C.c_void_p(); c.check(cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(0)), "instantiate")
row += [ledger(), cu.cuGraphLaunch(x, s), ledger(), held()]
print(row)
""",
    )
    assert row == [0, True, 0, 0, 0, 512, 512]


# ---- finding 5: allocation nodes added while the driver instantiated ----


@pytest.mark.parametrize("case", ["none", "smaller", "over", "uploaded"])
def test_allocation_nodes_added_while_the_driver_instantiates_are_counted(vgpu_env, case):
    """Found by review, 1 Dec: the graph was walked for its allocation nodes before the driver
    instantiated it; a second thread adding one meanwhile (the driver's walk sees it) left the
    executable graph remembered with the smaller footprint or none. none: a graph without
    allocation nodes, 512 MiB added: unrecorded, its launch mapped them unchecked and uncharged;
    smaller: 2 MiB remembered, 512 MiB added, beside 600 MiB: the launch reserved 2 MiB and ended
    1114 MiB charged under a 1 GiB limit; over: 2 x 700 MiB added, which never fit, instantiated;
    uploaded: the same as smaller through an uploading instantiation. The graph is walked again
    once made: the larger footprint counts, and over the limit the executable graph is destroyed
    and refused (an upload of unchecked pages is trimmed back)."""
    env = {**vgpu_env, "LIBCUDA_LOG_LEVEL": "2"}
    p = run_py(
        PRELUDE
        + RACE
        + GRAPHS
        + f"""
c.init()
case = {case!r}
row = []
if case in ("smaller", "uploaded"):
    row.append(c.alloc(600 * MiB)[0])
g = new_graph()
if case in ("smaller", "uploaded"):
    add_alloc(g, 2)
x, prm = C.c_void_p(), InstParams(UPLOAD, None, None, 7)
if case == "uploaded":
    resume = call_paused("cuGraphInstantiate:entry", cu.cuGraphInstantiateWithParams, C.byref(x), g, C.byref(prm))
else:
    resume = call_paused("cuGraphInstantiate:entry", cu.cuGraphInstantiateWithFlags, C.byref(x), g, C.c_ulonglong(0))
if case == "over":
    add_alloc(g, 700, free=False); add_alloc(g, 700, free=False)
else:
    add_alloc(g, 512)
row += [resume(), x.value is not None, ledger(), held()]
if x.value:
    row += [cu.cuGraphLaunch(x, None), ledger(), held()]
print(row)
""",
        env,
    )
    row = p.stdout.strip().splitlines()[-1]
    expected = {
        "none": [0, True, 0, 0, 0, 512, 512],
        "smaller": [0, 0, True, 600, 600, 2, 600, 600],
        "over": [2, False, 0, 0],
        "uploaded": [0, 2, False, 600, 600],
    }[case]
    assert row == str(expected)
    if case in ("over", "uploaded"):
        assert "CUDA graph refused" in p.stderr


# ---- regression review, finding 3: a refused uploading instantiation trimmed a queued upload ----


@pytest.mark.parametrize("fn", ["cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"])
def test_a_refused_upload_still_queued_on_its_stream_is_trimmed_once_the_stream_reached_it(vgpu_env, fn):
    """Found by the regression review, 1 Dec (finding 3; the fake's model of an upload queued on a
    busy stream, not seen on a GPU): beside 600 MiB under a 1 GiB limit, an uploading instantiation
    of a 2 MiB graph to which another thread added 512 MiB meanwhile is refused after the driver made
    it; the hook destroyed it and trimmed the graph pool while the upload still waited behind a
    kernel on its stream, so the trim left its pages and they stayed reserved and charged past the
    limit (1114 MiB). The upload stream is now synchronized first: the trim gives them back."""
    row = _graph_probe(
        vgpu_env,
        f"""
c.init()
row = [c.alloc(600 * MiB)[0]]
u = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(u), 0), "stream")
g = new_graph(); add_alloc(g, 2)
c.check(c.launch(c.function(b"queued_1s"), stream=u), "kernel")  # the upload waits behind it
x, prm = C.c_void_p(), InstParams(UPLOAD, u, None, 7)
resume = call_paused("cuGraphInstantiate:entry", cu.{fn}, C.byref(x), g, C.byref(prm))
add_alloc(g, 512)
row += [resume(), x.value is not None, ledger(), held()]
print(row)
""",
    )
    assert row == [0, 2, False, 600, 600]
