"""Regressions of the day's DRA index change (slice_devices now fills ``index`` from the ``gpu-N``
device name, -1 when neither the attribute nor the name says): a claim's grant in /api/v1/pods
said ``null`` for an unknown GPU index (the page shows "#?"); it took the -1 and showed "#-1"."""

from __future__ import annotations

from hami.dra.model import SliceSettings, resource_slice
from hami.ui import model

from .test_dra_claims import Gpu, claim, result
from .test_ui_api import NOW
from .test_ui_dra import cluster  # noqa: F401 - the fixture


def _unnumbered(node: str) -> dict:
    """A slice whose one GPU has no index attribute and a name that does not start with gpu-N."""
    s = resource_slice(node, [Gpu(0, "GPU-odd-0")], SliceSettings(split_count=4))
    [d] = s["spec"]["devices"]
    d["name"] = "card-a"
    d["attributes"].pop("index")
    return s


def test_a_grant_on_a_gpu_of_unknown_index_says_null(cluster):  # noqa: F811 - the fixture
    cluster.slice_handler.apply("ADDED", _unnumbered("dra-2"))
    cluster.claim_handler.apply("ADDED", claim("c7", results=[result("dra-2", "card-a", "100Mi", "5")]))
    items = model.pods_document(cluster, NOW, {})["items"]
    [c7] = [i for i in items if (i.get("claim") or {}).get("name") == "c7"]
    [g] = [g for ctr in c7["containers"] for g in ctr["grants"]]
    assert (g["uuid"], g["device"]) == ("GPU-odd-0", "card-a")
    assert g["index"] is None  # openapi: integer or null; the page shows "#?" for null
    # the GPU itself, in /nodes, keeps its -1 (an integer there, as before)
    [node] = [n for n in model.nodes_document(cluster, NOW)["items"] if n["name"] == "dra-2"]
    assert [d["index"] for d in node["devices"]] == [-1]


def test_a_grant_on_a_gpu_named_gpu_n_has_that_index(cluster):  # noqa: F811 - the fixture
    s = _unnumbered("dra-3")
    s["spec"]["devices"][0]["name"] = "gpu-5"
    cluster.slice_handler.apply("ADDED", s)
    cluster.claim_handler.apply("ADDED", claim("c8", results=[result("dra-3", "gpu-5", "100Mi", "5")]))
    items = model.pods_document(cluster, NOW, {})["items"]
    [c8] = [i for i in items if (i.get("claim") or {}).get("name") == "c8"]
    assert [g["index"] for ctr in c8["containers"] for g in ctr["grants"]] == [5]
