"""CEL selectors on the DRA path (hami.dra.cel through hami.dra.fit and the simulator): the device
environment kube-scheduler gives them, the Kubernetes quantity and semver functions, and what a
false, failing or broken selector does to the search."""

import json

import pytest

from hami.cli import main
from hami.core import SchedulerConfig
from hami.dra import fit
from hami.dra.cel import CelCompileError, CelRuntimeError, DeviceCel, compile_selector, device_input
from hami.dra.explain import explain_pod
from hami.dra.model import SliceSettings, resource_slice
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import simulate_dra
from hami.sim.engine import SimulationError
from hami.vendors import build_vendors

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
MEM = 'device.capacity["gpu.hami.io"].memory'
STD = 'device.attributes["resource.kubernetes.io"]'
OURS = 'device.attributes["gpu.hami.io"]'


def gpu(i, model="Tesla T4", mib=15360, numa=None, cc=None):
    return PhysicalGPU(
        i, f"GPU-{model[:2]}-{i}", model, mib, f"0000:{i + 1:02x}:00.0", 0, numa_node=numa, compute_capability=cc
    )


def slice_of(node, gpus, driver=""):
    return resource_slice(node, gpus, SliceSettings(split_count=4, driver_version=driver))


def template(name, *selectors, count=1, caps=None, mode=None):
    exactly = {"deviceClassName": "gpu.hami.io", "selectors": [{"cel": {"expression": e}} for e in selectors]}
    if mode:
        exactly["allocationMode"] = mode
    else:
        exactly["count"] = count
    if caps:
        exactly["capacity"] = {"requests": caps}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod(name, tmpl):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tmpl}],
            "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def run(slices, docs):
    r = simulate_dra(slices, docs, CFG)
    return {p.name: p for p in r.pods}


def devices(p):
    return [d["device"] for c in p.containers for d in c["devices"]]


# ------------------------------------------------------------------ selectors in the search


def test_a_memory_capacity_selector_skips_the_small_gpu_that_comes_first():
    nodes = [slice_of("n", [gpu(0, "Tesla T4", 15360), gpu(1, "A10", 23028)])]
    pods = run(nodes, [template("big", f'{MEM}.compareTo(quantity("20Gi")) >= 0'), pod("p", "big")])
    assert devices(pods["p"]) == ["n/gpu-1"]
    # the same with isGreaterThan, and with the quantity compared for equality (semantic: 15Gi == 15360Mi)
    pods = run(
        nodes, [template("t4", f'{MEM} == quantity("15Gi")', f'{MEM}.isLessThan(quantity("16Gi"))'), pod("q", "t4")]
    )
    assert devices(pods["q"]) == ["n/gpu-0"]


def test_a_selector_on_the_standard_numa_node_attribute():
    nodes = [slice_of("n", [gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=1)])]
    pods = run(nodes, [template("numa1", f"{STD}.numaNode == 1", count=2), pod("p", "numa1")])
    assert devices(pods["p"]) == ["n/gpu-1", "n/gpu-2"]
    pods = run(nodes, [template("numa0", f"{STD}.numaNode == 0", count=2), pod("p", "numa0")])
    assert pods["p"].status == "pending"
    assert pods["p"].reasons["n"].startswith("claim p-gpu request gpu needs 2 GPUs, 1 fit")
    assert f"gpu-1: selector #0 ({STD}.numaNode == 0) is false" in pods["p"].reasons["n"]


def test_driver_version_and_compute_capability_compare_as_versions_not_strings():
    # as strings "10.0.0" < "9.0.0" and "535.104.5" > "1000.0.0"; as versions neither holds
    old = slice_of("old", [gpu(0, cc="9.0")], driver="1000.0.0")
    new = slice_of("new", [gpu(0, cc="10.0")], driver="535.104.05")
    sel = f'{OURS}.cudaComputeCapability.compareTo(semver("9.5.0")) >= 0'
    pods = run([old, new], [template("bw", sel), pod("p", "bw")])
    assert (pods["p"].node, devices(pods["p"])) == ("new", ["new/gpu-0"])
    sel = f'{OURS}.driverVersion.isGreaterThan(semver("999.0.0"))'
    pods = run([new, old], [template("drv", sel), pod("p", "drv")])
    assert pods["p"].node == "old"
    sel = f'{OURS}.driverVersion.isGreaterThan(semver("1000.0.0"))'
    pods = run([new, old], [template("none", sel), pod("p", "none")])
    assert pods["p"].reasons == {
        n: f"claim p-gpu request gpu: gpu-0: selector #0 ({sel}) is false" for n in ("new", "old")
    }


def test_a_selector_that_matches_nothing_names_itself_per_gpu():
    nodes = [slice_of("n", [gpu(0), gpu(1)])]
    sel = f'{OURS}.type == "NVIDIA-H100"'
    pods = run(nodes, [template("h100", sel), pod("p", "h100")])
    assert pods["p"].status == "pending"
    assert pods["p"].reasons == {
        "n": f"claim p-gpu request gpu: gpu-0: selector #0 ({sel}) is false; gpu-1: selector #0 ({sel}) is false"
    }


def test_a_runtime_error_on_a_device_the_search_reaches_leaves_the_pod_pending():
    """gpu-0 has a compute capability, gpu-1 has none: a selector gpu-0 satisfies never reaches
    gpu-1; one it refuses does, and the missing key stops kube-scheduler's allocator with an
    error for the pod, even though another node would take it."""
    nodes = [slice_of("n", [gpu(0, cc="8.0"), gpu(1)]), slice_of("m", [gpu(0, cc="9.0")])]
    ok = run(nodes, [template("a", f'{OURS}.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0'), pod("p", "a")])
    assert (ok["p"].node, devices(ok["p"])) == ("n", ["n/gpu-0"])
    sel = f'{OURS}.cudaComputeCapability.compareTo(semver("9.0.0")) >= 0'
    bad = run(nodes, [template("b", sel), pod("p", "b")])["p"]
    assert bad.status == "pending"
    assert bad.reasons["n"] == (
        f"claim p-gpu request gpu: selector #0 ({sel}): CEL runtime error on gpu-1: no such key: "
        "cudaComputeCapability (kube-scheduler's allocator stops with this error)"
    )
    assert (
        bad.reasons["m"] == "the claims fit, but kube-scheduler stops scheduling the pod on the CEL runtime error on n"
    )
    # guarded as docs/dra.md advises, the same selector is false on gpu-1 instead of failing
    guarded = run(nodes, [template("c", f'"cudaComputeCapability" in {OURS} && {sel}'), pod("p", "c")])["p"]
    assert (guarded.node, devices(guarded)) == ("m", ["m/gpu-0"])


def test_allocation_mode_all_takes_only_the_devices_its_selectors_accept():
    nodes = [slice_of("n", [gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=1)])]
    pods = run(nodes, [template("all1", f"{STD}.numaNode == 1", mode="All"), pod("p", "all1")])
    assert devices(pods["p"]) == ["n/gpu-1", "n/gpu-2"]
    # All runs the selectors on every device first: one that fails is an error at once
    nodes = [slice_of("n", [gpu(0, cc="8.0"), gpu(1)])]
    sel = f'{OURS}.cudaComputeCapability == semver("8.0.0")'
    pods = run(nodes, [template("allcc", sel, mode="All"), pod("p", "allcc")])
    assert "CEL runtime error on gpu-1: no such key: cudaComputeCapability" in pods["p"].reasons["n"]


def test_allocation_mode_all_fails_when_one_selected_gpu_has_no_room():
    """kube-scheduler v1.37.2 (randomized comparison, seed 1): All takes every device its
    selectors pick, whatever is allocated; one without room for the request leaves the pod
    pending, it is not left out (the simulation used to place it on the GPUs with room)."""
    nodes = [slice_of("n", [gpu(0, "NVIDIA L4", 23034), gpu(1, "NVIDIA L4", 23034), gpu(2, "NVIDIA A10", 23028)])]
    # the fill names cores 0, as the claims of that run did (a request naming none now consumes a
    # thousandth of a core, which would make the All request short of cores first)
    fill = [template("fill", f"{OURS}.index == 0", caps={"memory": "22Gi", "cores": "0"}), pod("f", "fill")]
    alltake = template("all", caps={"memory": "7Gi", "cores": "100"}, mode="All")
    pods = run(nodes, [*fill, alltake, pod("p", "all")])
    assert devices(pods["f"]) == ["n/gpu-0"]
    assert pods["p"].status == "pending"
    assert "request gpu (allocationMode All): gpu-0: memory" in pods["p"].reasons["n"], pods["p"].reasons
    # with room on every GPU it takes all three
    pods = run(nodes, [alltake, pod("p", "all")])
    assert devices(pods["p"]) == ["n/gpu-0", "n/gpu-1", "n/gpu-2"]


def test_allocation_mode_all_leaves_out_a_selected_gpu_too_small_for_the_request():
    """kube-scheduler v1.37.2 (randomized comparison, seed 908797658): with consumable capacity
    the allocator drops from All the selected devices whose whole capacity cannot hold the
    request; only what others use is checked in the search (the simulation used to leave the
    pod pending, or fall back to a later ``firstAvailable`` subrequest)."""
    t4_l4 = [slice_of("n", [gpu(0), gpu(1, "NVIDIA A10", 23028)])]
    pods = run(t4_l4, [template("big", caps={"memory": "20Gi"}, mode="All"), pod("p", "big")])
    assert devices(pods["p"]) == ["n/gpu-1"]
    # no selected GPU could hold it: pending, each one named
    pods = run(t4_l4, [template("huge", caps={"memory": "30Gi"}, mode="All"), pod("p", "huge")])
    assert pods["p"].status == "pending"
    assert "no GPU is selected" not in pods["p"].reasons["n"]
    assert "gpu-1: asks for more than the whole GPU" in pods["p"].reasons["n"], pods["p"].reasons
    # the case the comparison found: firstAvailable [All 20Gi, one GPU 6Gi] with matchAttribute
    # on the type, on L4, T4, T4, L4: the first subrequest takes the two L4s
    node = [slice_of("n", [gpu(0, "NVIDIA L4", 23034), gpu(1), gpu(2), gpu(3, "NVIDIA L4", 23034)])]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "fa", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "firstAvailable": [
                                {
                                    "name": "s0",
                                    "deviceClassName": "gpu.hami.io",
                                    "allocationMode": "All",
                                    "capacity": {"requests": {"memory": "20Gi", "cores": "50"}},
                                },
                                {
                                    "name": "s1",
                                    "deviceClassName": "gpu.hami.io",
                                    "capacity": {"requests": {"memory": "6Gi", "cores": "5"}},
                                },
                            ],
                        }
                    ],
                    "constraints": [{"matchAttribute": "gpu.hami.io/type"}],
                }
            }
        },
    }
    r = simulate_dra(node, [claim, pod("p", "fa")], CFG)
    assert devices(r.pods[0]) == ["n/gpu-0", "n/gpu-3"]
    assert [x["request"] for x in r.claims[0]["results"]] == ["gpu/s0", "gpu/s0"]


@pytest.mark.parametrize(
    "expression, what",
    [
        ("device.driver ==", "syntax error"),
        ('cel.bind(d, device.attributes["gpu.hami.io"], d.index == 0)', "cel.bind() is not available"),
        ('device.driver.nosuch("x")', "undeclared reference to function 'nosuch'"),
        (f'{MEM}.compareTo(quantity("16 Gi")) > 0', 'quantity("16 Gi")'),
        (f'{OURS}.driverVersion.isGreaterThan(semver("550"))', "invalid semver '550'"),
    ],
)
def test_a_compile_error_stops_the_run_naming_claim_request_and_expression(expression, what):
    with pytest.raises(SimulationError) as err:
        run([slice_of("n", [gpu(0)])], [template("t", "true", expression), pod("p", "t")])
    msg = str(err.value)
    assert "ResourceClaimTemplate default/t spec.spec.devices.requests[0].exactly.selectors[1]" in msg
    assert "(request gpu): CEL compile error in" in msg and repr(expression) in msg and what in msg


def test_the_cli_says_one_line_for_a_compile_error(tmp_path, capsys):
    import yaml

    nodes, pods = tmp_path / "n.yaml", tmp_path / "p.yaml"
    nodes.write_text(yaml.safe_dump(slice_of("n", [gpu(0)])))
    pods.write_text(yaml.safe_dump_all([template("t", "device.driver =="), pod("p", "t")]))
    code = main(["simulate", "--front-end", "dra", "--nodes", str(nodes), "--pods", str(pods)])
    err = capsys.readouterr().err
    assert code != 0 and "selectors[0].cel.expression (request gpu): CEL compile error" in err


def test_the_bundled_example_places_the_selector_claim_on_an_a10(capsys):
    assert main(["simulate", "--example", "dra", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tune = next(p for p in doc["pods"] if p["name"] == "tune-0")
    assert tune["status"] == "scheduled" and tune["node"] == "a10-node"
    assert tune["containers"][0]["devices"][0]["type"] == "NVIDIA-A10"


def test_hami_dra_explain_names_the_selector_that_rules_a_gpu_out():
    sl = slice_of("n", [gpu(0, numa=0), gpu(1, numa=1)])
    sel = f"{STD}.numaNode == 1"
    claim = template("x", sel)["spec"]["spec"]
    claims = [{"metadata": {"namespace": "default", "name": "c"}, "spec": claim}]
    p = {
        "metadata": {"namespace": "default", "name": "p"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
    }
    lines = explain_pod(p, [sl], claims)
    assert f"  n/gpu-0: memory 0/15360 MiB, cores 0/100, shares 0/4 -> selector #0 ({sel}) is false" in lines
    assert "  n/gpu-1: memory 0/15360 MiB, cores 0/100, shares 0/4 -> fits" in lines
    assert lines[-1] == "  n: fits (c on gpu-1)"


# ------------------------------------------------------------------ the environment itself


def _device(**attrs):
    doc = {
        "attributes": attrs,
        "capacity": {"memory": {"value": "16Gi"}, "example.com/slots": {"value": "1500m"}},
        "allowMultipleAllocations": True,
    }
    return DeviceCel("gpu.hami.io", doc)


def test_the_device_variable_has_kubernetes_shape():
    got = device_input(
        "gpu.hami.io",
        {
            "attributes": {"index": {"int": 3}, "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}},
            "capacity": {"memory": {"value": "1Gi"}},
        },
    )
    assert got == {
        "driver": "gpu.hami.io",
        "allowMultipleAllocations": False,
        "attributes": {"gpu.hami.io": {"index": 3}, "resource.kubernetes.io": {"pciBusID": "0000:3b:00.0"}},
        "capacity": {"gpu.hami.io": {"memory": {"__quantity__": "1073741824/1"}}},
    }


@pytest.mark.parametrize(
    "expression, want",
    [
        ('device.driver == "gpu.hami.io" && device.allowMultipleAllocations', True),
        (f'{MEM} == quantity("16384Mi")', True),
        (f"{MEM}.asInteger() == 17179869184", True),
        ('quantity("9").isLessThan(quantity("10")) && quantity("1Ki").compareTo(quantity("999")) == 1', True),
        ('device.capacity["example.com"].slots.isInteger()', False),
        ('device.capacity["example.com"].slots.asApproximateFloat() == 1.5', True),
        ('device.capacity["example.com"].slots.add(quantity("500m")) == quantity("2")', True),
        ('device.capacity["example.com"].slots.sub(1).sign() == 1', True),
        ('semver("1.2.3-alpha.1").isLessThan(semver("1.2.3-alpha.beta"))', True),
        ('semver("1.2.3-rc.1").isLessThan(semver("1.2.3"))', True),
        ('semver("v1.2", true) == semver("1.2.0")', True),
        (f"{OURS}.v.major() == 12 && {OURS}.v.minor() == 4 && {OURS}.v.patch() == 0", True),
        ('isQuantity("1Gi") && !isQuantity("1 Gi") && isSemver("1.0.0") && !isSemver("1.0")', True),
        ('"x" in device.attributes["other.example.com"]', False),  # an unknown domain is an empty map
        (f'{OURS}.model.lowerAscii().startsWith("tesla")', True),
    ],
)
def test_kubernetes_functions(expression, want):
    dev = _device(model={"string": "Tesla T4"}, v={"version": "12.4.0"})
    assert dev.matches(compile_selector(expression)) is want


@pytest.mark.parametrize(
    "expression, error",
    [
        (f"{OURS}.nosuch == 1", "no such key: nosuch"),
        ('device.attributes["other.example.com"].x == 1', "no such key: x"),
        (f"{OURS}.model", "the expression returned str, not bool"),
        (f'{MEM}.compareTo(semver("1.0.0")) > 0', "no such overload"),
        ('quantity(device.driver) == quantity("1")', "invalid quantity 'gpu.hami.io'"),
    ],
)
def test_runtime_errors(expression, error):
    with pytest.raises(CelRuntimeError, match=error.replace("(", r"\(")):
        _device(model={"string": "Tesla T4"}).matches(compile_selector(expression))


def _counting(sel, calls):
    real = sel.program

    class Counting:
        def execute(self, ctx):
            calls.append(1)
            return real.execute(ctx)

    object.__setattr__(sel, "program", Counting())
    return real


def test_an_expression_is_compiled_once_and_a_device_evaluates_it_once():
    sel = compile_selector(f'{OURS}.model == "Tesla T4" || true')
    assert compile_selector(f'{OURS}.model == "Tesla T4" || true') is sel
    dev, other, calls = _device(model={"string": "Tesla T4"}), _device(model={"string": "A10"}), []
    real = _counting(sel, calls)
    try:
        assert dev.matches(sel) and dev.matches(sel) and other.matches(sel)
    finally:
        object.__setattr__(sel, "program", real)
    assert len(calls) == 2  # once per device


def test_a_selector_that_reads_no_attribute_is_evaluated_once_for_all_devices_of_a_driver():
    sel = compile_selector('device.driver == "gpu.hami.io" && device.allowMultipleAllocations == true')
    calls = []
    real = _counting(sel, calls)
    try:
        assert all(_device(model={"string": m}).matches(sel) for m in ("T4", "A10", "A100"))
        assert not DeviceCel("other.io", {"allowMultipleAllocations": True}).matches(sel)
    finally:
        object.__setattr__(sel, "program", real)
    assert len(calls) == 2  # gpu.hami.io once, other.io once


def test_a_compile_error_names_what_is_wrong():
    with pytest.raises(CelCompileError, match="at most 10240"):
        compile_selector("true || " * 2000 + "true")
    with pytest.raises(CelCompileError, match="empty"):
        compile_selector("  ")


def test_fit_refused_by_checks_the_class_selectors_too(monkeypatch):
    [dev] = fit.devices_of([slice_of("n", [gpu(0)])]).values()
    r = fit.Request("gpu", "gpu.hami.io", 1, {})
    assert fit.refused_by(dev, r) == ""
    monkeypatch.setitem(fit.CLASS_SELECTORS, "gpu.hami.io", (compile_selector('device.driver == "other.io"'),))
    assert fit.refused_by(dev, r) == 'class gpu.hami.io selector #0 (device.driver == "other.io") is false'
