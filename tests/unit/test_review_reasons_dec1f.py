"""Found by review, 1 Dec (reasons): what ``hami explain``, the UI's pending view and the
``FilteringSucceed`` event say.

1. A pod whose devices fit but which kube-scheduler refuses for cpu was said to fit now, unqualified
   (the scheduler's cache holds only the pods with devices: kube-scheduler's cpu, memory and pod
   count filters are not checked, and the answer must say so).
2. GPUs held back because a running pod's grant on the node cannot be read were a bare
   ``CardCordoned`` (whose docs said to edit ``hami.io/device-cordon``, which was empty).
3. ``FilteringSucceed`` counted only the nodes the search examined before its first fit as if
   they were every node offered.
"""

from __future__ import annotations

import copy
import pathlib
import time

from hami.core import SchedulerConfig
from hami.scheduler import state as state_module
from hami.scheduler.explain import render
from hami.scheduler.extender import _fit_message
from hami.scheduler.state import ClusterState
from hami.ui import model
from hami.vendors import build_vendors

from .test_scheduler_extender import args, seen, service
from .test_scheduler_state import node as gpu_node
from .test_scheduler_state import pod as gpu_pod

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
HELD = "held back: a running pod's allocation on this node cannot be read"


def _register(*ids: str) -> str:
    return (
        "["
        + ",".join(
            f'{{"id":"{u}","index":{i},"count":10,"devmem":24000,"devcore":100,'
            '"type":"NVIDIA-A10","mode":"hami-core","health":true}'
            for i, u in enumerate(ids)
        )
        + "]"
    )


def _node(name: str, *ids: str, cpu: str = "8") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                "hami.io/node-nvidia-register": _register(*ids),
                "hami.io/node-handshake": "Requesting_2099-11-21 22:00:00",
            },
        },
        "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "10"}},
    }


def _pending(name: str, namespace: str, requests: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {
                        "requests": requests or {},
                        "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def _state(nodes: list[dict], pods: list[dict]) -> ClusterState:
    st = ClusterState(SchedulerConfig(build_vendors(None)), "hami-scheduler", {})
    st.node_handler.replace(copy.deepcopy(nodes))
    st.pod_handler.replace(copy.deepcopy(pods))
    return st


# ---------------------------------------------------------------- 1: resource fit not checked


def test_a_pod_whose_devices_fit_is_not_said_to_fit_unqualified_cpu_is_not_checked():
    """Found by review, 1 Dec (t3): node n1 has 8 CPUs and a free GPU, the pod asks 1 GPU and
    64 CPUs; the UI said fitsNow with an empty summary and explain "It fits now" unqualified."""
    pod = _pending("cpuheavy", "a", {"cpu": "64"})
    st = _state([_node("n1", "GPU-a")], [pod])
    doc = model.explain_doc(pod, st, time.time())
    # the read API keeps its fields and values (the devices fit: HAMi would choose n1) ...
    assert (doc["fitsNow"], doc["wouldChoose"]) == (True, "n1")
    # ... and its summary says what is not checked, without naming a node (a caller that may not
    # list nodes sees the summary with wouldChoose removed)
    summary = doc["summary"]
    assert "cpu, memory, pod count" in summary and "not checked" in summary, summary
    assert "kubectl describe pod" in summary and "n1" not in summary, summary
    text = render(copy.deepcopy(pod), _state([_node("n1", "GPU-a")], [pod]), [], time.time())
    line = next(x for x in text.splitlines() if x.startswith("It fits now"))
    assert "for its devices" in line and "(cpu, memory, pod count) are not checked" in line, text
    assert "kubectl describe pod -n a cpuheavy" in line, text


def test_the_qualification_comes_before_the_other_nodes_reasons():
    """Found by review, 1 Dec: with one node fitting and one refusing, the summary still leads
    with what is not checked, then the refusals counted as before."""
    pod = _pending("p", "a")
    full = _pending("holder", "b")
    full["spec"]["nodeName"] = "n2"
    full["metadata"]["annotations"] = {
        "hami.io/vgpu-node": "n2",
        "hami.io/vgpu-devices-allocated": "GPU-z,NVIDIA,24000,0:;",
        "hami.io/bind-phase": "success",
    }
    full["status"] = {"phase": "Running"}
    st = _state([_node("n1", "GPU-a"), _node("n2", "GPU-z")], [pod, full])
    doc = model.explain_doc(pod, st, time.time())
    assert doc["wouldChoose"] == "n1"
    assert doc["summary"] == f"{model.NOT_CHECKED}; 1 node: 1/1 CardInsufficientMemory", doc["summary"]


def test_a_pod_that_fits_nowhere_keeps_its_summary_unchanged():
    """The qualification is for a pod said to fit only: a refusal's summary is as before."""
    pod = _pending("p", "a")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 30000
    doc = model.explain_doc(pod, _state([_node("n1", "GPU-a")], [pod]), time.time())
    assert (doc["fitsNow"], doc["summary"]) == (False, "1 node: 1/1 CardInsufficientMemory")


# ---------------------------------------------------------------- 2: held back, not cordoned


def _t7() -> tuple[ClusterState, dict]:
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "running-bad",
            "namespace": "tenant-b",
            "uid": "u-1",
            "annotations": {
                "hami.io/vgpu-node": "n1",
                "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,notanumber,0:;",
                "hami.io/bind-phase": "success",
            },
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "nodeName": "n1",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}}
            ],
        },
        "status": {"phase": "Running"},
    }
    new = _pending("new", "tenant-a")
    return _state([_node("n1", "GPU-a", "GPU-b")], [bad, new]), new


def test_gpus_held_back_by_an_unreadable_grant_say_so_without_naming_the_pod():
    """Found by review, 1 Dec (t7): a running pod's grant on n1 cannot be read, so n1's NVIDIA
    GPUs take no new pod; the UI and explain said a bare CardCordoned (the cordon annotation is
    empty). Now each device's reason says why, and the UI names no pod (tenant isolation)."""
    st, new = _t7()
    assert "hami.io/device-cordon" not in st.nodes["n1"]["metadata"]["annotations"]
    doc = model.explain_doc(new, st, time.time())
    devices = doc["nodes"][0]["devices"]
    assert [d["reason"] for d in devices] == [f"CardCordoned ({HELD})"] * 2, devices
    assert doc["nodes"][0]["reason"] == f"2/2 CardCordoned (NVIDIA devices {HELD})"
    assert HELD in doc["summary"], doc["summary"]
    assert "running-bad" not in repr(doc) and "tenant-b" not in repr(doc)
    text = render(copy.deepcopy(new), st, [], time.time())
    gpu_lines = [x for x in text.splitlines() if x.strip().startswith("gpu ")]
    assert len(gpu_lines) == 2 and all(x.endswith(f"-> CardCordoned ({HELD})") for x in gpu_lines), text
    assert st.held_back_vendors("n1") == frozenset({"NVIDIA"})


def test_a_cordon_by_annotation_stays_a_bare_card_cordoned():
    """The explanation is for the held-back cause only: an operator's cordon reads as before."""
    n = _node("n1", "GPU-a", "GPU-b")
    n["metadata"]["annotations"]["hami.io/device-cordon"] = "GPU-a,GPU-b"
    pod = _pending("p", "a")
    st = _state([n], [pod])
    doc = model.explain_doc(pod, st, time.time())
    assert [d["reason"] for d in doc["nodes"][0]["devices"]] == ["CardCordoned"] * 2
    assert doc["summary"] == "1 node: 2/2 CardCordoned"
    assert "held back" not in render(copy.deepcopy(pod), st, [], time.time())


def test_the_ui_and_the_scheduler_use_the_same_words():
    assert model.HELD_BACK == state_module.HELD_BACK == HELD


def test_the_docs_give_the_held_back_cause_of_card_cordoned():
    """docs/reasons.md and docs/troubleshooting.md told the operator to edit an empty
    hami.io/device-cordon; their CardCordoned rows now name the other cause, its metric and event."""
    server = (pathlib.Path(state_module.__file__).parent / "server.py").read_text()
    assert '"hami_scheduler_unreadable_allocations"' in server and '"UnreadableAllocation"' in server
    for doc in ("reasons.md", "troubleshooting.md"):
        row = next(x for x in (DOCS / doc).read_text().splitlines() if x.startswith("|") and "`CardCordoned`" in x)
        assert "hami_scheduler_unreadable_allocations" in row and "UnreadableAllocation" in row, (doc, row)


# ---------------------------------------------------------------- 3: FilteringSucceed's counts


async def test_filtering_succeed_says_how_many_of_the_nodes_offered_were_examined():
    """Found by review, 1 Dec (t6): 5 nodes that all fit; the search stops at the first, and the
    event read "0 nodes not fit, 1 nodes fit(n0:...)" as if that were every node."""
    names = [f"n{i}" for i in range(5)]
    svc = service(*(gpu_node(n, gpus=4) for n in names))
    ext = svc.extender
    written: list[tuple[str, str]] = []

    def record(pod, reason, message, kind="Normal"):
        written.append((reason, message() if callable(message) else message))

    ext.events.record = record
    answer = await ext.filter(args(seen(svc, gpu_pod("p", mem=1000)), names))
    assert answer["Error"] == "" and len(answer["NodeNames"]) == 1
    chosen = answer["NodeNames"][0]
    message = next(m for r, m in written if r == "FilteringSucceed")
    assert message.startswith(f"find fit node({chosen}), "), message
    assert " of 5 nodes examined: " in message, message
    # every node fits: what the text counts as fit and not fit adds up to what it says it examined
    head, _, counts = message.partition(" nodes examined: ")
    examined, offered = (int(x) for x in head.rsplit(", ", 1)[1].split(" of "))
    not_fit = int(counts.split(" nodes not fit")[0])
    fit = int(counts.split(", ")[1].split(" nodes fit")[0])
    assert offered == 5 and examined == not_fit + fit < 5 and not_fit == 0, message


def test_filtering_succeed_is_hamis_text_when_every_node_was_examined():
    class Result:
        node = "n1"
        failed = {"n2": object()}
        scores = {"n1": 3.7712}

    assert _fit_message(Result(), 2) == "find fit node(n1), 1 nodes not fit, 1 nodes fit(n1:3.77)"
    assert _fit_message(Result()) == "find fit node(n1), 1 nodes not fit, 1 nodes fit(n1:3.77)"
    assert (
        _fit_message(Result(), 9) == "find fit node(n1), 2 of 9 nodes examined: 1 nodes not fit, 1 nodes fit(n1:3.77)"
    )
