"""``hami simulate --example mig``: a MIG-mode A100 node next to an L4 node, end to end."""

import json

from hami.cli import main


def run(capsys, *args):
    code = main(["simulate", "--example", "mig", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_mig_example_places_profiles_and_explains_the_pending_pod(capsys):
    data = json.loads(run(capsys, "-o", "json"))
    pods = {p["name"]: p for p in data["pods"]}
    grants = {
        n: [(d["uuid"][:12], d["usedmem"], d["usedcores"], d.get("mig")) for c in p["containers"] for d in c["devices"]]
        for n, p in pods.items()
    }
    mig = lambda profile, start, size: {"profile": profile, "start": start, "size": size}  # noqa: E731
    assert grants["embed-legacy"] == [("GPU-3f1c2a9e", 4864, 13, mig("1g.5gb", 6, 1))]  # rebuilt from annotations
    # equal scores: the highest NUMA node first, as HAMi (docs/compatibility.md)
    assert grants["finetune-7g"] == [("GPU-c5d7e9f1", 40192, 91, mig("7g.40gb", 0, 8))]
    # whisper-small's 1g.5gb@6 on GPU 3 (deleted later) blocks the high 3g.20gb placement: the low one is taken
    assert grants["llama-8b"] == [("GPU-1b3d5f7a", 19968, 39, mig("3g.20gb", 0, 4))]
    assert grants["sdxl-pair"] == [
        ("GPU-3f1c2a9e", 9856, 13, mig("1g.10gb", 4, 2)),
        ("GPU-3f1c2a9e", 9856, 13, mig("1g.10gb", 2, 2)),
    ]
    assert grants["notebook"] == [("GPU-6e8a0c2e", 8000, 30, None)]  # vgpu-mode hami-core: the L4 node
    assert pods["too-big"]["node"] is None
    # its reasons are those of the final ledger (kube-scheduler retries it): no MIG GPU has 40500 MiB
    # free by then (until 1 Dec: "1/4 CardInsufficientMemory, 3/4 CardMigTopologyInfeasible", from
    # the nearly empty GPUs it was first tried on; review)
    assert pods["too-big"]["reasons"] == {
        "gpu-l4-01": "2/2 CardInsufficientMemory",
        "gpu-mig-01": "4/4 CardInsufficientMemory",
    }
    devices = {(d["node"], d["index"]): d for d in data["devices"]}
    assert devices[("gpu-mig-01", 3)]["used"] == 1  # whisper-small deleted, its 1g.5gb freed
    assert all(d["health"] for d in data["devices"])


def test_mig_example_table_names_profiles(capsys):
    out = run(capsys)
    assert "MIG 7g.40gb@0" in out and "gpu-mig-01: 4/4 CardInsufficientMemory" in out
    assert run(capsys, "-o", "json") == run(capsys, "-o", "json")
