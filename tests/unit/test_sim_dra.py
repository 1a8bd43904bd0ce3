"""``hami simulate --front-end dra``: the webhook's translation, then kube-scheduler's DRA allocator
restated (hami.dra.fit) on the slices the node agent would publish."""

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.cli import main
from hami.core import DeviceInfo, SchedulerConfig, admit_pod, encode_node_devices_json
from hami.node.nvml import PhysicalGPU
from hami.dra import fit
from hami.dra.explain import describe, usage
from hami.dra.model import MIB, SliceSettings, resource_slice
from hami.dra.translate import translate
from hami.sim.dra import DraOptions, simulate_dra
from hami.sim.engine import SimulationError
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, decide

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
NV = next(v for v in CFG.vendors if v.name == "NVIDIA")


def node(name, n=2, mem=15360, count=10, devcore=100, cpu=None, health=True):
    devs = [
        DeviceInfo(
            id=f"GPU-{name}-{i}",
            index=i,
            count=count,
            devmem=mem,
            devcore=devcore,
            type="NVIDIA-Tesla T4",
            mode="hami-core",
            health=health,
        )
        for i in range(n)
    ]
    out = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": encode_node_devices_json(devs)}},
    }
    if cpu is not None:
        out["status"] = {"allocatable": {"cpu": cpu, "memory": "64Gi"}}
    return out


def pod(name, ns="default", cpu=None, **limits):
    res = {"limits": {f"nvidia.com/{k.replace('_', '-')}": v for k, v in limits.items()}}
    if cpu:
        res["requests"] = {"cpu": cpu}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": res}]},
    }


def run(nodes, pods, opts=DraOptions()):
    r = simulate_dra(nodes, pods, CFG, opts)
    return r, {p.name: p for p in r.pods}


def where(p):
    return [d["device"] for c in p.containers for d in c["devices"]]


def test_second_share_goes_to_the_next_gpu_then_the_next_node():
    r, pods = run([node("a", n=2), node("b", n=1)], [pod(f"p{i}", gpu=1, gpumem=8000) for i in range(4)])
    assert [(pods[f"p{i}"].node, where(pods[f"p{i}"])) for i in range(3)] == [
        ("a", ["a/gpu-0"]),
        ("a", ["a/gpu-1"]),
        ("b", ["b/gpu-0"]),
    ]
    assert pods["p3"].status == "pending"
    assert pods["p3"].reasons == {
        "a": "claim p3-hami-gpu-0 request gpu: gpu-0: memory 640 MiB short; gpu-1: memory 640 MiB short",
        "b": "claim p3-hami-gpu-0 request gpu: gpu-0: memory 640 MiB short",
    }
    row = next(d for d in r.devices if d["node"] == "a" and d["device"] == "gpu-0")
    assert (row["usedmem"], row["totalmem"], row["used"], row["count"]) == (8000, 15360, 1, 10)


def test_split_count_caps_the_shares_of_a_gpu():
    r, pods = run([node("a", n=1, count=2)], [pod(f"p{i}", gpu=1, gpumem=100, gpucores=1) for i in range(3)])
    assert [pods[f"p{i}"].status for i in range(3)] == ["scheduled", "scheduled", "pending"]
    assert pods["p2"].reasons == {"a": "claim p2-hami-gpu-0 request gpu: gpu-0: shares 1 short"}


def test_a_whole_gpu_request_keeps_shares_off_it_and_the_reason_says_what_is_short():
    r, pods = run(
        [node("a", n=1)],
        [
            pod("whole", gpu=1),
            pod("excl", gpu=1, gpumem=1000, gpucores=100),
            pod("share", gpu=1, gpumem=100, gpucores=1),
        ],
    )
    got = pods["whole"].containers[0]["devices"][0]
    assert (got["usedmem"], got["usedcores"]) == (15360, 100)  # no gpumem: all of it (admission: gpucores 100)
    assert pods["excl"].status == pods["share"].status == "pending"
    assert (
        pods["share"].reasons["a"] == "claim share-hami-gpu-0 request gpu: gpu-0: memory 100 MiB short, cores 1 short"
    )
    # the same wording as hami dra --explain, from the same objects
    uses = usage(
        [resource_slice("a", [PhysicalGPU(0, "GPU-a-0", "Tesla T4", 15360, "", 0)], SliceSettings())],
        [
            {
                "metadata": {"namespace": "default", "name": "w"},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "driver": "gpu.hami.io",
                                    "pool": "a",
                                    "device": "gpu-0",
                                    "consumedCapacity": {"memory": f"{15360 * MIB}", "cores": "100", "shares": "1"},
                                }
                            ]
                        }
                    }
                },
            }
        ],
    )
    assert describe(uses, {"memory": "100Mi", "cores": "1"})[0].endswith("-> memory 100 MiB short, cores 1 short")


@pytest.mark.parametrize(
    "limits",
    [
        {"gpu": 1, "gpumem": 3000, "gpucores": 30},
        {"gpu": 1, "gpumem_percentage": 100},
        {"gpu": 2, "gpumem": 1000},
        {"gpu": 1, "gpucores": 100, "gpumem": 2000},
        {"gpu": 1},
    ],
)
def test_what_a_claim_gets_is_what_the_webhooks_translation_asks(limits):
    p = pod("p", **limits)
    admitted, _ = admit_pod(p, CFG.vendors)
    _, [template] = translate(admitted, NV)
    [req] = template["spec"]["spec"]["devices"]["requests"]
    r, pods = run([node("a", n=2)], [p])
    got = pods["p"].containers[0]["devices"]
    assert len(got) == req["exactly"]["count"]
    fresh = fit.devices_of([resource_slice("a", [PhysicalGPU(0, "GPU-a-0", "T4", 15360, "", 0)], SliceSettings())])
    want = fit.wanted(next(iter(fresh.values())), req["exactly"]["capacity"]["requests"])
    # the tables show whole cores (a request naming none consumes a thousandth: 0 shown)
    assert all((d["usedmem"], d["usedcores"]) == (want["memory"] // MIB, fit.whole(want["cores"])) for d in got)
    if req["exactly"]["count"] > 1:
        assert len({d["uuid"] for d in got}) == len(got)  # distinct GPUs (distinctAttribute)


def test_a_request_the_webhook_refuses_is_denied_with_its_message():
    p = pod("half", gpu=1, gpumem_percentage=50)
    r, pods = run([node("a")], [p])
    expected = decide(p, AdmissionSettings(CFG.vendors, front_end="dra")).message
    assert pods["half"].status == "denied" and pods["half"].reasons == {"webhook": expected}
    assert "gpumem-percentage" in expected


def test_default_cores_and_min_memory_are_the_node_agents_policy():
    r, pods = run([node("a", n=1)], [pod("p", gpu=1, gpumem=10)], DraOptions(default_cores=7, min_memory_mib=64))
    [d] = pods["p"].containers[0]["devices"]
    # a translated pod asking no cores names the thousandth itself: the agent's default (for claims
    # users write, below) does not apply to it (quota counted it 0; it ran under that limit)
    assert (d["usedmem"], d["usedcores"]) == (64, 0)
    r, pods = run(
        [node("a", n=1)],
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "g",
                                    "exactly": {
                                        "deviceClassName": "gpu.hami.io",
                                        "capacity": {"requests": {"memory": "10Mi"}},
                                    },
                                }
                            ]
                        }
                    }
                },
            },
            own_claim_pod("q", template="t"),
        ],
        DraOptions(default_cores=7, min_memory_mib=64),
    )
    [d] = pods["q"].containers[0]["devices"]
    assert (d["usedmem"], d["usedcores"]) == (64, 7)


def own_claim_pod(name, claim=None, template=None):
    ref = {"name": "gpu", **({"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": [ref],
            "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def claim_doc(name, device_class="gpu.hami.io", caps=None, allocation=None):
    out = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": device_class,
                            **({"capacity": {"requests": caps}} if caps else {}),
                        },
                    }
                ]
            }
        },
    }
    if allocation:
        out["status"] = {"allocation": {"devices": {"results": allocation}}}
    return out


def test_pods_with_their_own_claims_share_one_allocation_and_stay_on_its_node():
    docs = [
        claim_doc("shared", caps={"memory": "4Gi", "cores": "10"}),
        own_claim_pod("p1", claim="shared"),
        own_claim_pod("p2", claim="shared"),
        claim_doc("whole", device_class="whole-gpu.hami.io"),
        own_claim_pod("w", claim="whole"),
        own_claim_pod("missing", claim="nope"),
    ]
    r, pods = run([node("a", n=1), node("b", n=1)], docs)
    assert pods["p1"].node == pods["p2"].node == "a"
    claims = {c["name"]: c for c in r.claims}
    assert claims["shared"]["pods"] == ["default/p1", "default/p2"]
    assert claims["shared"]["results"][0]["consumedCapacity"]["memory"] == "4096Mi"
    a0 = next(d for d in r.devices if d["node"] == "a")
    assert (a0["usedmem"], a0["used"]) == (4096, 1)  # allocated once, used by two pods
    assert pods["w"].node == "b" and where(pods["w"]) == ["b/gpu-0"]
    assert (
        pods["missing"].status == "pending" and "ResourceClaim default/nope not found" in pods["missing"].reasons["*"]
    )


def test_an_allocated_claim_in_the_input_counts_and_deleting_its_last_pod_frees_it():
    alloc = [
        {
            "request": "gpu",
            "driver": "gpu.hami.io",
            "pool": "a",
            "device": "gpu-0",
            "consumedCapacity": {"memory": "15000Mi", "cores": "0", "shares": "1"},
        }
    ]
    deleted = own_claim_pod("user", claim="held")
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    docs = [
        claim_doc("held", allocation=alloc),
        own_claim_pod("user", claim="held"),
        pod("before", gpu=1, gpumem=1000),
        deleted,
        pod("after", gpu=1, gpumem=1000),
    ]
    r, pods = run([node("a", n=1)], docs)
    assert pods["before"].status == "pending" and "memory 640 MiB short" in pods["before"].reasons["a"]
    assert pods["user"].status == "deleted" and pods["after"].status == "scheduled"
    a0 = r.devices[0]
    assert (a0["usedmem"], a0["used"]) == (1000, 1)


def test_resource_slices_are_read_as_nodes_and_unhealthy_gpus_are_left_out():
    sl = resource_slice("s", [PhysicalGPU(0, "GPU-s-0", "A10", 23028, "", 0)], SliceSettings(split_count=3))
    r, pods = run([sl, node("sick", n=1, health=False)], [pod("p", gpu=1, gpumem=20000)])
    assert pods["p"].node == "s" and {d["node"] for d in r.devices} == {"s"}
    assert any("unhealthy" in w for w in r.warnings)
    with pytest.raises(SimulationError, match="no node with a gpu.hami.io GPU"):
        run([node("sick", n=1, health=False)], [pod("p", gpu=1)])


def test_node_choice_follows_least_requested_cpu_and_ties_go_to_input_order():
    r, pods = run(
        [node("a", n=1, cpu="4"), node("b", n=1, cpu="4")],
        [pod("p0", cpu="2", gpu=1, gpumem=1000), pod("p1", gpu=1, gpumem=1000), pod("p2", gpu=1, gpumem=1000)],
    )
    assert [pods[f"p{i}"].node for i in range(3)] == ["a", "b", "b"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(1, 3),
            st.sampled_from([None, 500, 3000, 8000, 15360, 20000]),
            st.sampled_from([None, 0, 10, 50, 100]),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 4),
    st.integers(1, 3),
)
def test_property_no_gpu_is_ever_over_memory_cores_or_shares(requests, count, gpus):
    pods = []
    for i, (n, mem, cores) in enumerate(requests):
        limits = {"gpu": n}
        if mem is not None:
            limits["gpumem"] = mem
        if cores is not None:
            limits["gpucores"] = cores
        pods.append(pod(f"p{i}", **limits))
        if i % 7 == 6:  # now and then a pod goes away
            gone = pod(f"p{i - 3}")
            gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            pods.append(gone)
    r, out = run([node("a", n=gpus, count=count), node("b", n=1, count=count, mem=23028)], pods)
    for d in r.devices:
        assert d["usedmem"] <= d["totalmem"] and d["usedcores"] <= d["totalcore"] and d["used"] <= d["count"], d
    # the devices' use is exactly the sum over the live claims' results
    live = {}
    for c in r.claims:
        for res in c["results"]:
            k = (res["pool"], res["device"])
            live[k] = live.get(k, 0) + fit._int(res["consumedCapacity"]["shares"], "shares")
    assert {(d["node"], d["device"]): d["used"] for d in r.devices if d["used"]} == live
    for p in out.values():  # a pending pod's reasons name a node and a GPU, or ask for too many
        if p.status == "pending":
            assert all(
                ("short" in why or "needs" in why or "more than the whole GPU" in why) for why in p.reasons.values()
            )


def sim(capsys, *args):
    code = main(["simulate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_front_end_dra_on_the_bundled_example(capsys):
    code, out, err = sim(capsys, "--front-end", "dra", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["frontEnd"] == "dra" and doc["claims"]
    placed = [p for p in doc["pods"] if p["status"] == "scheduled"]
    assert placed and all(
        d["device"].startswith(p["node"] + "/") for p in placed for c in p["containers"] for d in c["devices"]
    )
    code, out, err = sim(capsys, "--front-end", "dra")
    assert code == 0 and "PODS" in out and "gpu-0" in out
    code, _, extender_err = sim(capsys, "-o", "json")  # the default stays the extender
    assert code == 0


def test_cli_front_end_dra_html_is_the_ui_page_with_the_same_numbers(tmp_path, capsys):
    import re

    code, out, err = sim(capsys, "--front-end", "dra", "-o", "json")
    rows = {d["uuid"]: d for d in json.loads(out)["devices"]}
    code, out, err = sim(capsys, "--front-end", "dra", "-o", "html")
    assert code == 0, err
    snap = json.loads(re.search(r'id="hami-snapshot">(.*?)</script>', out, re.S).group(1))
    assert "--front-end dra" in snap["title"]
    seen = {d["uuid"]: d for n in snap["nodes"]["items"] for d in n["devices"]}
    assert seen.keys() == rows.keys()
    for uuid, d in seen.items():
        r = rows[uuid]
        assert (d["memoryMiB"]["allocated"], d["cores"]["allocated"], d["slots"]["allocated"]) == (
            r["usedmem"],
            r["usedcores"],
            r["used"],
        ), uuid
    pending = {p["name"] for p in snap["pending"]["items"]}
    assert "train-gpt-8x-h100" in pending  # its use-gputype H100 selector leaves too few H100s
    # train-llama-8x's hami.io/gpu-scheduler-policy cannot be expressed on DRA: refused, not pending
    assert "train-llama-8x" not in pending
    # a ResourceClaim shared by two pods counts once on the page too
    nodes = tmp_path / "n.yaml"
    nodes.write_text(yaml.safe_dump(node("a", n=1)))
    pods = tmp_path / "p.yaml"
    pods.write_text(
        yaml.safe_dump_all(
            [
                claim_doc("shared", caps={"memory": "4Gi"}),
                own_claim_pod("p1", claim="shared"),
                own_claim_pod("p2", claim="shared"),
            ]
        )
    )
    code, out, err = sim(capsys, "--front-end", "dra", "--nodes", str(nodes), "--pods", str(pods), "-o", "html")
    snap = json.loads(re.search(r'id="hami-snapshot">(.*?)</script>', out, re.S).group(1))
    [d] = [d for n in snap["nodes"]["items"] for d in n["devices"]]
    assert (d["memoryMiB"]["allocated"], d["slots"]["allocated"]) == (4096, 1)


def test_cli_front_end_dra_bad_input_is_one_line(tmp_path, capsys):
    code, _, err = sim(capsys, "--front-end", "dra", "--min-memory", "0")
    assert code == 1 and "--min-memory must be an integer >= 1" in err
    nodes = tmp_path / "n.yaml"
    nodes.write_text(yaml.safe_dump(node("a")))
    pods = tmp_path / "p.yaml"
    bad = claim_doc("c", caps={"memory": "lots"})
    pods.write_text(yaml.safe_dump_all([bad]))
    code, _, err = sim(capsys, "--front-end", "dra", "--nodes", str(nodes), "--pods", str(pods))
    assert code == 1 and "ResourceClaim default/c spec.devices.requests[0].exactly.capacity.requests.memory" in err
    assert len(err.strip().splitlines()) == 1


def test_policy_rounds_up_to_min_and_step_and_refuses_above_max():
    p = fit.Policy(default=5, min=4, max=20, step=4)
    assert [p.consume(x) for x in (None, 1, 4, 5, 20, 21)] == [5, 4, 4, 8, 20, None]
    assert [fit.Policy(default=1, values=(1, 2)).consume(x) for x in (None, 2, 3)] == [1, 2, None]


def test_a_pod_placed_by_the_extender_is_pre_placed_and_not_counted():
    old = pod("old", gpu=1, gpumem=15000)
    old["metadata"]["annotations"] = {
        "hami.io/vgpu-node": "a",
        "hami.io/vgpu-devices-allocated": "GPU-a-0,NVIDIA,15000,0:;",
    }
    r, pods = run([node("a", n=1)], [old, pod("new", gpu=1, gpumem=15000)])
    assert pods["old"].status == "pre-placed" and pods["old"].node == "a"
    assert pods["new"].status == "scheduled"  # the DRA path does not see the extender's 15000 MiB
    assert [w for w in r.warnings if "extender allocation" in w] == [
        "1 pod holds an extender allocation (default/old on a): the DRA path does not count it on "
        "the GPUs, only in its namespace's quota (docs/dra.md, Migrating from the extender)"
    ]


def test_many_pods_placed_by_the_extender_are_one_warning():
    # a cluster dump's running pods gave one warning each before
    olds = []
    for i in range(5):
        old = pod(f"old{i}", gpu=1, gpumem=1000)
        old["metadata"]["annotations"] = {
            "hami.io/vgpu-node": "a",
            "hami.io/vgpu-devices-allocated": "GPU-a-0,NVIDIA,1000,0:;",
        }
        olds.append(old)
    r, pods = run([node("a", n=1)], olds)
    (line,) = [w for w in r.warnings if "extender allocation" in w]
    assert line.startswith(
        "5 pods hold an extender allocation (default/old0 on a, default/old1 on a, default/old2 on a and 2 more)"
    )


def test_allocate_tries_sets_of_devices_not_their_orderings():
    # 16 GPUs, 7 of them free: 8 distinct ones cannot be had. Trying every ordering of the free
    # ones would not end in any reasonable time; trying sets ends at once.
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 15360, "", 0) for i in range(16)]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings())]).values())
    for d in devs[7:]:
        d.used["memory"] = d.total["memory"]
    req = [fit.Request("gpu", "gpu.hami.io", 8, {"memory": "1Gi"})]
    distinct = [{"requests": ["gpu"], "distinctAttribute": "gpu.hami.io/uuid"}]
    assert fit.allocate(devs, req, distinct) is None
    picks = fit.allocate(devs, [fit.Request("gpu", "gpu.hami.io", 7, {"memory": "1Gi"})], distinct)
    assert [p.device.device for p in picks] == [f"gpu-{i}" for i in range(7)]
    # without the constraint too: the devices of one request are distinct (kube-scheduler looks
    # for a request's next device after the last one it took), though gpu-0 has room for three
    picks = fit.allocate(devs, [fit.Request("gpu", "gpu.hami.io", 3, {"memory": "1Gi"})])
    assert [p.device.device for p in picks] == ["gpu-0", "gpu-1", "gpu-2"]
    # a constraint the room count cannot see: 14 free GPUs, but 7 per NUMA node, and 8 on one
    # node asked; the search walks sets in slice order and ends at once
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 15360, "", i % 2) for i in range(16)]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings())]).values())
    for d in devs[14:]:
        d.used["memory"] = d.total["memory"]
    same_numa = [{"requests": ["gpu"], "matchAttribute": "gpu.hami.io/numa"}]
    assert fit.allocate(devs, req, same_numa) is None
    assert (
        fit.why_not(devs, req, "c", same_numa)
        == "claim c: every request fits on its own, but not together (constraints or shared GPUs)"
    )
    picks = fit.allocate(devs, [fit.Request("gpu", "gpu.hami.io", 7, {"memory": "1Gi"})], same_numa)
    assert [p.device.device for p in picks] == [f"gpu-{i}" for i in range(0, 14, 2)]


def test_more_devices_than_a_claim_can_hold_is_denied_or_a_clear_error():
    r, pods = run([node("a")], [pod("huge", gpu="1Gi"), pod("ok", gpu=1, gpumem=100)])
    assert pods["huge"].status == "denied" and "a claim holds at most 32" in pods["huge"].reasons["webhook"]
    assert pods["ok"].status == "scheduled"
    bad = claim_doc("c")
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = 33
    with pytest.raises(SimulationError, match=r"ResourceClaim default/c spec.devices.requests: 33 devices asked"):
        run([node("a")], [bad])
    bad["spec"]["devices"]["requests"] = "x"
    with pytest.raises(SimulationError, match=r"spec.devices.requests: must be a list"):
        run([node("a")], [bad])


def test_a_request_never_gets_one_gpu_twice_and_the_reason_counts_gpus():
    # 8 GPUs with room for 3 shares each: a request of count 30 (or 9) cannot be had, room for
    # 24 shares or not; kube-scheduler gives one request distinct devices only
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 15360, "", 0) for i in range(8)]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings(split_count=3))]).values())
    for n in (30, 9):
        req = [fit.Request("gpu", "gpu.hami.io", n, {"memory": "10Mi"})]
        assert fit.allocate(devs, req) is None
        assert fit.why_not(devs, req, "c") == f"claim c request gpu needs {n} GPUs, the node publishes 8"
    picks = fit.allocate(devs, [fit.Request("gpu", "gpu.hami.io", 8, {"memory": "10Mi"})])
    assert [p.device.device for p in picks] == [f"gpu-{i}" for i in range(8)]
    for d in devs[2:]:
        d.used["shares"] = 3
    req = [fit.Request("gpu", "gpu.hami.io", 3, {"memory": "10Mi"})]
    assert fit.allocate(devs, req) is None
    assert fit.why_not(devs, req, "c").startswith("claim c request gpu needs 3 GPUs, 2 fit (gpu-2: shares 1 short; ")
    # two requests of one claim may each take the same shared GPU
    picks = fit.allocate(
        devs,
        [
            fit.Request("a", "gpu.hami.io", 2, {"memory": "10Mi"}),
            fit.Request("b", "gpu.hami.io", 1, {"memory": "10Mi"}),
        ],
    )
    assert [(p.request, p.device.device) for p in picks] == [("a", "gpu-0"), ("a", "gpu-1"), ("b", "gpu-0")]


def test_a_nodes_given_slice_wins_over_its_registration_and_a_device_counts_once():
    sl = resource_slice("a", [PhysicalGPU(0, "GPU-s-0", "A10", 23028, "", 0)], SliceSettings(split_count=3))
    r, pods = run([node("a", n=2, cpu="8"), sl, sl], [pod("p", gpu=1, gpumem=20000)])
    assert [(d["node"], d["device"], d["totalmem"]) for d in r.devices] == [("a", "gpu-0", 23028)]
    assert pods["p"].node == "a"
    assert any("registration annotation is not used" in w for w in r.warnings)
    assert any("published twice" in w for w in r.warnings)


def _paths(o, pre=()):
    if pre:
        yield pre
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, pre + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _paths(v, pre + (i,))


def test_any_field_of_the_dra_inputs_replaced_by_junk_is_a_clear_error_or_a_result():
    """Every field of a claim, a template, pods naming them, a HAMi pod and a ResourceSlice, set in
    turn to values of other types: the run ends with a result or SimulationError (one line at the
    command), never another exception (such as a MemoryError for nvidia.com/gpu: 1Gi)."""
    import copy

    from hami.core import CoreError

    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.hami.io", "count": 2}}],
                    "constraints": [{"requests": ["g"], "distinctAttribute": "gpu.hami.io/uuid"}],
                }
            }
        },
    }
    pods = [
        claim_doc("c", caps={"memory": "1Gi"}),
        own_claim_pod("p1", claim="c"),
        template,
        own_claim_pod("p2", template="t"),
        pod("p3", gpu=2, gpumem=1000),
    ]
    nodes = [node("a"), resource_slice("s", [PhysicalGPU(0, "GPU-s-0", "A10", 23028, "", 0)], SliceSettings())]
    junk = [None, "x", -1, [], [1], {}, True, 1.5, "1Gi", [{"name": 1}]]
    tried = 0
    for which, docs in (("pods", pods), ("nodes", nodes)):
        for path in list(_paths(docs)):
            for value in junk:
                changed = copy.deepcopy(docs)
                target = changed
                for k in path[:-1]:
                    target = target[k]
                target[path[-1]] = value
                tried += 1
                try:
                    if which == "pods":
                        simulate_dra(nodes, changed, CFG)
                    else:
                        simulate_dra(changed, pods, CFG)
                except (SimulationError, CoreError):
                    pass
    assert tried > 1000


def test_a_gpu_pod_the_webhook_leaves_alone_is_pending_not_deviceless():
    p = pod("other", gpu=1, gpumem=100)
    p["spec"]["schedulerName"] = "my-scheduler"
    r, pods = run([node("a")], [p])
    assert pods["other"].status == "pending" and "scheduler 'my-scheduler'" in pods["other"].reasons["*"]


def test_the_bundled_dra_example(capsys):
    code, out, err = sim(capsys, "--example", "dra", "-o", "json")  # --example dra means --front-end dra
    assert code == 0, err
    doc = json.loads(out)
    assert doc["frontEnd"] == "dra" and not doc["warnings"]
    status = {p["name"]: (p["status"], p["node"]) for p in doc["pods"]}
    assert status == {
        "chat-0": ("deleted", "t4-node"),
        "chat-1": ("scheduled", "t4-node"),
        "render-a": ("scheduled", "a10-node"),
        "render-b": ("scheduled", "a10-node"),
        "ddp-0": ("scheduled", "t4-node"),
        "notebook": ("denied", None),
        "embed-0": ("scheduled", "a10-node"),
        "embed-1": ("pending", None),
        "chat-2": ("scheduled", "t4-node"),
        "tune-0": ("scheduled", "a10-node"),  # its CEL selector asks for an A10
    }
    ddp = next(p for p in doc["pods"] if p["name"] == "ddp-0")
    assert sorted(d["device"] for d in ddp["containers"][0]["devices"]) == ["t4-node/gpu-0", "t4-node/gpu-1"]
    embed = next(p for p in doc["pods"] if p["name"] == "embed-1")
    assert embed["reasons"]["a10-node"].endswith("gpu-1: memory 16972 MiB short")


def test_the_device_config_shapes_the_translation(tmp_path, capsys):
    nodes = tmp_path / "n.yaml"
    nodes.write_text(yaml.safe_dump(node("a", n=1)))
    pods = tmp_path / "p.yaml"
    pods.write_text(yaml.safe_dump_all([pod("f", gpu=1, gpumem=1000, gpucores=10), pod("d", gpu=1, gpumem=500)]))
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text("nvidia:\n  memoryFactor: 2\n  defaultMemory: 3000\n  defaultCores: 7\n")
    code, out, err = sim(
        capsys, "--front-end", "dra", "--nodes", str(nodes), "--pods", str(pods), "--config", str(cfg), "-o", "json"
    )
    assert code == 0, err
    got = {p["name"]: p["containers"][0]["devices"][0] for p in json.loads(out)["pods"]}
    assert (got["f"]["usedmem"], got["f"]["usedcores"]) == (2000, 10)  # gpumem x memoryFactor
    assert (got["d"]["usedmem"], got["d"]["usedcores"]) == (1000, 7)  # defaultCores, as the webhook applies it


def test_unknown_class_is_a_reason_and_a_request_of_neither_kind_a_clear_stop():
    r, pods = run([node("a", n=1)], [claim_doc("c", device_class="other.example.com"), own_claim_pod("p", claim="c")])
    assert pods["p"].reasons == {
        "a": "claim c request gpu: device class 'other.example.com' is not gpu.hami.io or mig.gpu.hami.io or whole-gpu.hami.io"
    }
    alt = claim_doc("alt")
    alt["spec"]["devices"]["requests"][0] = {"name": "gpu"}
    with pytest.raises(
        SimulationError, match=r"requests\[0\] \(gpu\): needs exactly one of 'exactly' and 'firstAvailable'"
    ):
        run([node("a")], [alt])


def test_an_over_committed_gpu_in_the_input_does_not_hide_the_others():
    # an allocated claim in the input that already takes more than gpu-0 has (a hand-written file)
    over = [
        {
            "request": "gpu",
            "driver": "gpu.hami.io",
            "pool": "a",
            "device": "gpu-0",
            "consumedCapacity": {"memory": "40000Mi", "cores": "0", "shares": "1"},
        }
    ]
    tmpl = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "g",
                            "exactly": {
                                "deviceClassName": "gpu.hami.io",
                                "count": 2,
                                "capacity": {"requests": {"memory": "1Gi"}},
                            },
                        }
                    ],
                    "constraints": [{"distinctAttribute": "gpu.hami.io/uuid"}],
                }
            }
        },
    }
    r, pods = run([node("a", n=3)], [claim_doc("big", allocation=over), tmpl, own_claim_pod("p", template="t")])
    assert sorted(where(pods["p"])) == ["a/gpu-1", "a/gpu-2"]


# ---------------------------------------------------------------- kube-scheduler's allocator, restated
# (a) one request never gets the same GPU twice: the allocator looks for a request's next device
#     after the last one it took; (b) all of a pod's unallocated claims are placed in one search
#     that goes back into earlier claims when a later one does not fit.


def sized_node(name, *mib):
    """A node given by its ResourceSlice: one GPU per size (MiB), in that order."""
    return resource_slice(
        name, [PhysicalGPU(i, f"GPU-{name}-{i}", "T4", m, "", 0) for i, m in enumerate(mib)], SliceSettings()
    )


def gpu_containers_pod(name, *gpumem):
    """A HAMi pod with one container per amount: the webhook gives each container its own claim."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [
                {"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": m}}}
                for i, m in enumerate(gpumem)
            ]
        },
    }


def count_template(name, count, memory="1000Mi", constraint=False):
    """A ResourceClaimTemplate of one request of ``count`` devices, without a distinctAttribute."""
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "g",
                    "exactly": {
                        "deviceClassName": "gpu.hami.io",
                        "count": count,
                        "capacity": {"requests": {"memory": memory}},
                    },
                }
            ]
        }
    }
    if constraint:
        spec["devices"]["constraints"] = [{"requests": ["g"], "distinctAttribute": "gpu.hami.io/uuid"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": spec},
    }


def per_container(p):
    return [[d["device"] for d in c["devices"]] for c in p.containers]


@pytest.mark.parametrize(
    "nodes, docs, status, devices, reason",
    [
        pytest.param(  # (a) count 2 on two GPUs, room for both on gpu-0: still two GPUs
            [node("a", n=2)],
            [count_template("t", 2), own_claim_pod("p", template="t")],
            "scheduled",
            [["a/gpu-0", "a/gpu-1"]],
            None,
            id="count-2-takes-two-gpus",
        ),
        pytest.param(  # (a) the same with the constraint written out: no difference
            [node("a", n=2)],
            [count_template("t", 2, constraint=True), own_claim_pod("p", template="t")],
            "scheduled",
            [["a/gpu-0", "a/gpu-1"]],
            None,
            id="count-2-with-distinct-attribute",
        ),
        pytest.param(  # (a) one GPU with room for ten shares cannot serve a request of count 2
            [node("a", n=1)],
            [count_template("t", 2), own_claim_pod("p", template="t")],
            "pending",
            None,
            {"a": "claim p-gpu request g needs 2 GPUs, the node publishes 1"},
            id="count-2-on-one-gpu",
        ),
        pytest.param(  # (a) three GPUs, one full: 3 asked, 2 fit, and the full one says why
            [node("a", n=3)],
            [
                claim_doc("full", caps={"memory": "15360Mi"}),
                own_claim_pod("f", claim="full"),
                count_template("t", 3),
                own_claim_pod("p", template="t"),
            ],
            "pending",
            None,
            {"a": "claim p-gpu request g needs 3 GPUs, 2 fit (gpu-0: memory 1000 MiB short)"},
            id="count-3-two-fit",
        ),
        pytest.param(  # (b) container 0 fits either GPU, container 1 only gpu-0: container 0 is moved to gpu-1
            [sized_node("a", 23028, 15360)],
            [gpu_containers_pod("p", 8000, 20000)],
            "scheduled",
            [["a/gpu-1"], ["a/gpu-0"]],
            None,
            id="backtrack-into-the-first-claim",
        ),
        pytest.param(  # (b) two levels: the third claim sends the search back past the second into the first
            [sized_node("a", 16384, 8192, 8192)],
            [gpu_containers_pod("p", 8192, 8192, 16384)],
            "scheduled",
            [["a/gpu-1"], ["a/gpu-2"], ["a/gpu-0"]],
            None,
            id="backtrack-two-levels",
        ),
        pytest.param(  # (b) no placement of the three: the reason names the third claim, beside the first two
            [sized_node("a", 16384, 8192)],
            [gpu_containers_pod("p", 7000, 7000, 10000)],
            "pending",
            None,
            {
                "a": "claim p-hami-gpu-2 request gpu: gpu-0: memory 7616 MiB short; gpu-1: asks for more "
                "than the whole GPU (after the pod's claims p-hami-gpu-0 on gpu-0, p-hami-gpu-1 on "
                "gpu-0; no other placement of them leaves room either)"
            },
            id="three-claims-no-placement",
        ),
        pytest.param(  # (b) the three ask more memory than the two GPUs have: said at once, naming the third
            [sized_node("a", 16384, 8192)],
            [gpu_containers_pod("p", 8192, 8192, 9000)],
            "pending",
            None,
            {
                "a": "claim p-hami-gpu-2: the pod's claims up to it ask at least memory 25384 MiB, the "
                "GPUs have 24576 MiB left"
            },
            id="three-claims-more-than-the-node",
        ),
        pytest.param(  # (b) a claim that cannot fit even alone is named with its own shortfall
            [sized_node("a", 16384, 8192)],
            [gpu_containers_pod("p", 1000, 20000)],
            "pending",
            None,
            {
                "a": "claim p-hami-gpu-1 request gpu: gpu-0: asks for more than the whole GPU; gpu-1: asks "
                "for more than the whole GPU"
            },
            id="second-claim-too-big-alone",
        ),
    ],
)
def test_the_allocator_search_on_one_node(nodes, docs, status, devices, reason):
    r, pods = run(nodes, docs)
    p = pods["p"]
    assert p.status == status, p.reasons
    if devices is not None:
        assert per_container(p) == devices
    if reason is not None:
        assert p.reasons == reason
    for d in r.devices:  # whatever was searched, only the placed claims count
        assert d["usedmem"] <= d["totalmem"]


def test_a_claim_already_allocated_is_not_moved_by_the_search():
    # the pod's first claim is allocated (input status) on gpu-0; its second only fits gpu-0's
    # rest if the first were elsewhere: kube-scheduler searches only the unallocated claims
    held = [
        {
            "request": "gpu",
            "driver": "gpu.hami.io",
            "pool": "a",
            "device": "gpu-0",
            "consumedCapacity": {"memory": "8000Mi", "cores": "0", "shares": "1"},
        }
    ]
    big = claim_doc("big", caps={"memory": "20000Mi"})
    p = own_claim_pod("p", claim="small")
    p["spec"]["resourceClaims"].append({"name": "big", "resourceClaimName": "big"})
    p["spec"]["containers"][0]["resources"]["claims"].append({"name": "big"})
    r, pods = run(
        [sized_node("a", 23028, 15360)], [claim_doc("small", caps={"memory": "8000Mi"}, allocation=held), big, p]
    )
    assert pods["p"].status == "pending"
    assert pods["p"].reasons["a"].startswith("claim big request gpu: gpu-0: memory 4972 MiB short")
    # unallocated, the two are placed together: small moves to gpu-1
    r, pods = run([sized_node("a", 23028, 15360)], [claim_doc("small", caps={"memory": "8000Mi"}), big, p])
    assert pods["p"].status == "scheduled" and where(pods["p"]) == ["a/gpu-1", "a/gpu-0"]


def test_the_search_bound_gives_up_with_a_reason_naming_the_claim():
    # 13 one-GPU claims of 7000 MiB on 6 GPUs of 15360 MiB (two fit each): in memory and shares
    # the sum fits, so only trying the placements of the first 12 shows there is none
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 15360, "", 0) for i in range(6)]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings(split_count=3))]).values())
    asks = [fit.ClaimAsk(f"c{i}", [fit.Request("gpu", "gpu.hami.io", 1, {"memory": "7000Mi"})]) for i in range(13)]
    found = fit.allocate_claims(devs, asks, steps=500)
    assert found.picks is None and found.gave_up
    assert (
        fit.why_not_claims(devs, asks, found, steps=500)
        == "claim c12: the search gave up after 500 placements tried (kube-scheduler bounds it by time instead)"
    )
    assert all(d.used["shares"] == 0 for d in devs)  # nothing stays committed
    picks = fit.allocate_claims(devs, asks[:12], steps=500).picks
    assert [p.device.device for c in picks for p in c] == [f"gpu-{i // 2}" for i in range(12)]
    # asking more shares than the GPUs have left in all ends at once, naming the claim that passes it
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings(split_count=2))]).values())
    asks = [fit.ClaimAsk(f"c{i}", [fit.Request("gpu", "gpu.hami.io", 1, {"memory": "10Mi"})]) for i in range(13)]
    found = fit.allocate_claims(devs, asks, steps=1)
    assert not found.gave_up
    assert (
        fit.why_not_claims(devs, asks, found)
        == "claim c12: the pod's claims up to it ask at least shares 13, the GPUs have 12 left"
    )


def _reference(devices, claims):
    """kube-scheduler's allocator as literally as it reads (recursive, no bounds, no shortcuts),
    to check that the bounded search finds the same first placement."""
    extra = {d.key: dict.fromkeys(fit.CAPACITIES, 0) for d in devices}
    result = [[] for _ in claims]

    class Stop(Exception):
        pass

    def usable(d, r, ci):
        need = fit.wanted(d, r.capacity)
        if need is None:
            return None
        p = fit.Pick(r.name, d, need)
        if r.count < 0 and not fit._constraint_ok(claims[ci].constraints, result[ci], p):
            raise Stop  # All: the allocator gives up on the node (an error, not a dead end)
        if any(need[k] > d.left(k) - extra[d.key][k] for k in fit.CAPACITIES):
            return None
        return p if fit._constraint_ok(claims[ci].constraints, result[ci], p) else None

    # allocationMode All: every device its selectors pick (none here) whose whole capacity could
    # hold the request (dynamic-resource-allocation v0.37.2 with consumable capacity), with room
    # now or not: one without room fails it (kube-scheduler v1.37.2, the randomized kwok tests)
    def could_hold(d, r):
        need = fit.wanted(d, r.capacity)
        return need is not None and all(need[k] <= d.total[k] for k in fit.CAPACITIES)

    every = {
        (ci, ri): [d for d in devices if could_hold(d, r)]
        for ci, c in enumerate(claims)
        for ri, r in enumerate(c.requests)
        if r.count < 0
    }

    def one(ci, ri, n, start):
        if ci == len(claims):
            return True
        if ri == len(claims[ci].requests):
            return one(ci + 1, 0, 0, 0)
        r = claims[ci].requests[ri]
        if r.device_class not in fit.CLASSES:
            return False
        if r.count < 0 and not every[(ci, ri)]:
            return False
        if n == (len(every[(ci, ri)]) if r.count < 0 else r.count):
            return one(ci, ri + 1, 0, 0)
        for i in [devices.index(every[(ci, ri)][n])] if r.count < 0 else range(start, len(devices)):
            p = usable(devices[i], r, ci)
            if p is None:
                continue
            result[ci].append(p)
            for k in fit.CAPACITIES:
                extra[p.device.key][k] += p.consumed[k]
            if one(ci, ri, n + 1, i + 1):
                return True
            result[ci].pop()
            for k in fit.CAPACITIES:
                extra[p.device.key][k] -= p.consumed[k]
        return False

    try:
        return result if one(0, 0, 0, 0) else None
    except Stop:
        return None


_REQ = st.tuples(st.sampled_from([1, 1, 2, 3, -1]), st.sampled_from([None, 1000, 4000, 7000, 9000]))
_CLAIM = st.tuples(
    st.lists(_REQ, min_size=1, max_size=2), st.sampled_from([None, "distinctAttribute", "matchAttribute"])
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from([8192, 15360, 23028]), st.integers(0, 1), st.sampled_from([0, 3000, 8000])),
        min_size=1,
        max_size=4,
    ),
    st.lists(_CLAIM, min_size=1, max_size=3),
    st.integers(2, 4),
)
def test_property_the_search_finds_the_allocators_first_placement(gpus, claims, split):
    devs = list(
        fit.devices_of(
            [
                resource_slice(
                    "a",
                    [PhysicalGPU(i, f"GPU-{i}", "T4", m, "", numa) for i, (m, numa, _) in enumerate(gpus)],
                    SliceSettings(split_count=split),
                )
            ]
        ).values()
    )
    for d, (_, _, used) in zip(devs, gpus):
        d.used["memory"] = used * MIB
    asks = []
    for ci, (reqs, constraint) in enumerate(claims):
        requests = [
            fit.Request(f"r{ri}", "gpu.hami.io", count, {} if mem is None else {"memory": f"{mem}Mi"})
            for ri, (count, mem) in enumerate(reqs)
        ]
        attr = "gpu.hami.io/uuid" if constraint == "distinctAttribute" else "gpu.hami.io/numa"
        asks.append(fit.ClaimAsk(f"c{ci}", requests, [{constraint: attr}] if constraint else []))
    want = _reference(devs, asks)
    found = fit.allocate_claims(devs, asks)
    assert not found.gave_up
    got = found.picks
    assert (got is None) == (want is None)
    if got is not None:
        assert [[(p.request, p.device.device, p.consumed) for p in c] for c in got] == [
            [(p.request, p.device.device, p.consumed) for p in c] for c in want
        ]
    else:
        assert fit.why_not_claims(devs, asks, found).startswith(f"claim {asks[max(found.stuck, 0)].name}")


def test_a_constraint_on_a_standard_attribute_reads_it_under_its_own_domain():
    """resource.kubernetes.io/numaNode is that name, not gpu.hami.io/resource.kubernetes.io/..."""
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 15360, "", 0, numa_node=n) for i, n in enumerate((0, 1, 1))]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings())]).values())
    two = [fit.Request("gpu", "gpu.hami.io", 2, {"memory": "1Gi"})]
    picks = fit.allocate(devs, two, [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/numaNode"}])
    assert [p.device.device for p in picks] == ["gpu-1", "gpu-2"]
    assert fit.allocate(devs, two, [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]) is None  # none has one


def test_constraints_read_as_the_allocator_reads_them():
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 15360, "", i // 2) for i in range(4)]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings())]).values())
    one = [fit.Request("gpu", "gpu.hami.io", 1, {"memory": "1Gi"})]
    # distinctAttribute on an attribute a device lacks: that device never qualifies
    assert fit.allocate(devs, one, [{"distinctAttribute": "gpu.hami.io/nothing"}]) is None
    # allocationMode All with a constraint one of its devices breaks: kube-scheduler stops with an
    # error there (no going back into earlier claims), and the reason says so
    every = fit.ClaimAsk(
        "all", [fit.Request("gpu", "gpu.hami.io", -1, {"memory": "1Gi"})], [{"matchAttribute": "gpu.hami.io/numa"}]
    )
    found = fit.allocate_claims(devs, [fit.ClaimAsk("first", one), every])
    assert found.picks is None
    assert fit.why_not_claims(devs, [fit.ClaimAsk("first", one), every], found) == (
        "claim all request gpu (allocationMode All): gpu-2 breaks a constraint of the claim, which ends "
        "kube-scheduler's search"
    )
    # without the constraint it takes every GPU; a full one is not left out, it fails the request
    # (kube-scheduler v1.37.2 leaves the pod pending: the randomized kwok test, seed 1)
    found = fit.allocate_claims(devs, [fit.ClaimAsk("all", every.requests)])
    assert [p.device.device for p in found.picks[0]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    devs[3].used["memory"] = devs[3].total["memory"]
    assert fit.allocate_claims(devs, [fit.ClaimAsk("all", every.requests)]).picks is None
    # the same inside one claim: its first request took gpu-0 (NUMA 1), the All request's next
    # GPU is on NUMA 0; the allocator does not go back to move the first request, it stops
    gpus = [
        PhysicalGPU(0, "GPU-0", "T4", 8192, "", 1),
        PhysicalGPU(1, "GPU-1", "T4", 15360, "", 0),
        PhysicalGPU(2, "GPU-2", "T4", 15360, "", 0),
    ]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings())]).values())
    mixed = fit.ClaimAsk(
        "mixed",
        [
            fit.Request("one", "gpu.hami.io", 1, {"memory": "1000Mi"}),
            fit.Request("all", "gpu.hami.io", -1, {"memory": "1000Mi"}),
        ],
        [{"matchAttribute": "gpu.hami.io/numa"}],
    )
    found = fit.allocate_claims(devs, [mixed])
    assert found.picks is None and "gpu-1 breaks a constraint" in fit.why_not_claims(devs, [mixed], found)
    assert _reference(devs, [mixed]) is None


def test_a_claim_its_own_constraints_rule_out_is_not_blamed_on_the_pods_other_claims():
    # claim two asks two GPUs on one NUMA node; the node has one GPU per NUMA node: it cannot be
    # had even alone, whatever claim one does
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 15360, "", i) for i in range(2)]
    devs = list(fit.devices_of([resource_slice("a", gpus, SliceSettings())]).values())
    asks = [
        fit.ClaimAsk("one", [fit.Request("gpu", "gpu.hami.io", 1, {"memory": "1Gi"})]),
        fit.ClaimAsk(
            "two", [fit.Request("gpu", "gpu.hami.io", 2, {"memory": "1Gi"})], [{"matchAttribute": "gpu.hami.io/numa"}]
        ),
    ]
    found = fit.allocate_claims(devs, asks)
    assert found.picks is None and found.stuck == 1
    assert (
        fit.why_not_claims(devs, asks, found)
        == "claim two: every request fits on its own, but not together (constraints or shared GPUs)"
    )


def test_a_gated_pod_stays_pending_and_holds_nothing():
    """Found by review, 1 Dec: `--front-end dra` placed a Kueue-gated pod (kube-scheduler never
    schedules one) ahead of an admitted pod, which was then reported pending for memory."""
    gated = pod("a-queued", gpu=1, gpumem=10000)
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    _, pods = run([node("a", n=1)], [gated, pod("b-admitted", gpu=1, gpumem=10000)])
    assert pods["a-queued"].status == "pending" and pods["a-queued"].node is None
    assert pods["a-queued"].reasons == {"*": "scheduling gated (kueue.x-k8s.io/admission)"}
    assert (pods["b-admitted"].status, pods["b-admitted"].node) == ("scheduled", "a")
