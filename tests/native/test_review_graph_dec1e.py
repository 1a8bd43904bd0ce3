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


def test_cumemallocasync_whose_capture_ended_meanwhile_is_charged_as_the_real_allocation_it_made(vgpu_env):
    """Found by review, 1 Dec: cuMemAllocAsync saw its stream capturing and passed the call
    through uncounted (a captured allocation is the graph's); a second thread ending the capture
    (relaxed mode allows it) before the driver allocated made it a real 512 MiB allocation, held
    untracked and uncharged. The capture is looked at again after the call: no longer the same
    capture, the allocation is reserved under the limit and tracked (its free gives it back)."""
    row = _graph_probe(
        vgpu_env,
        """
c.init()
s = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(s), 0), "stream")
d = C.c_uint64()
c.check(cu.cuStreamBeginCapture_v2(s, RELAXED), "begin")
resume = call_paused("cuMemAllocAsync", with_ctx(cu.cuMemAllocAsync), C.byref(d), C.c_size_t(512 * MiB), s)
g = C.c_void_p(); c.check(cu.cuStreamEndCapture(s, C.byref(g)), "end")  # the other thread ends it
row = [resume(), d.value != 0, ledger(), held(), c.alloc(600 * MiB)[0]]
row += [cu.cuMemFreeAsync(d, s), ledger(), held()]
print(row)
""",
    )
    assert row == [0, True, 512, 512, 2, 0, 0, 0]


def test_cumemallocasync_whose_capture_ended_meanwhile_is_freed_and_refused_over_the_limit(vgpu_env):
    """The same race beside 600 MiB under a 1 GiB limit: the real 512 MiB allocation does not fit;
    it is freed again and CUDA_ERROR_OUT_OF_MEMORY returned (before, it was held, uncharged: 1112 MiB
    held, the ledger at 600)."""
    row = _graph_probe(
        vgpu_env,
        """
c.init()
rc, big = c.alloc(600 * MiB)
s = C.c_void_p(); c.check(cu.cuStreamCreate(C.byref(s), 0), "stream")
d = C.c_uint64()
c.check(cu.cuStreamBeginCapture_v2(s, RELAXED), "begin")
resume = call_paused("cuMemAllocAsync", with_ctx(cu.cuMemAllocAsync), C.byref(d), C.c_size_t(512 * MiB), s)
g = C.c_void_p(); c.check(cu.cuStreamEndCapture(s, C.byref(g)), "end")
row = [rc, resume(), d.value, ledger(), held()]
print(row)
""",
    )
    assert row == [0, 2, 0, 600, 600]


def test_cumemallocasync_in_a_capture_that_goes_on_stays_the_graphs(vgpu_env):
    """The look after the call changes nothing for a capture still going on: the captured
    allocation is not charged (the graph's launch is), as before."""
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
