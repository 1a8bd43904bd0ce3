"""The DRA agent's sweep of prepared claims the API server no longer has, and its metrics: a fake
API client (an in-memory class with KubeClient's ``get``), a real Driver, checkpoint and files."""

import asyncio
import shutil
import tempfile
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest

from hami.dra.model import DRIVER, SliceSettings
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.command import UsageError, add_arguments, parse_bind, parse_interval
from hami.draplugin.plugin import Driver
from hami.draplugin.prepare import Paths, PrepareError
from hami.draplugin.sweep import sweep_loop, sweep_once
from hami.kube.client import KubeError
from hami.node.nvml import PhysicalGPU

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPUS = [PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0)]
PREFIX = "/apis/resource.k8s.io/v1/namespaces/"


def claim(name, uid, memory="3000Mi"):
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "node-a",
        "device": "gpu-0",
        "shareID": f"share-{uid}",
        "consumedCapacity": {"memory": memory, "cores": "30", "shares": "1"},
    }
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


class FakeKube:
    """KubeClient's ``get`` over an in-memory set of ResourceClaims: 404 for a missing one, and a
    chosen failure (``fail``) for any path while it is set."""

    def __init__(self):
        self.claims = {}  # (namespace, name) -> object
        self.fail: Exception | None = None
        self.paths = []

    def add(self, name, uid):
        self.claims[("ns", name)] = claim(name, uid)

    async def get(self, path, **query):
        self.paths.append(path)
        if self.fail is not None:
            raise self.fail
        assert path.startswith(PREFIX), path
        namespace, kind, name = path[len(PREFIX) :].split("/")
        assert kind == "resourceclaims"
        if (namespace, name) not in self.claims:
            raise KubeError("GET", path, 404, '{"kind":"Status","reason":"NotFound"}')
        return self.claims[(namespace, name)]

    async def read_claim(self, namespace, name):  # the Driver's reader, as command.py builds it
        return await self.get(f"{PREFIX}{namespace}/resourceclaims/{name}")


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="drasw", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_driver(root, kube):
    paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
    cp = Checkpoint(root / "state" / "checkpoint.json")
    return Driver("node-a", GPUS, SliceSettings(), cp, kube.read_claim, paths), paths


def files(paths, uid):
    return Path(paths.cdi_file(uid)), Path(paths.claim_dir(uid)), Path(paths.claim_record(uid))


def sample(driver, name, **labels):
    return driver.metrics.registry.get_sample_value(name, labels or None)


async def prepared(root, kube, *claims):
    driver, paths = make_driver(root, kube)
    for name, uid in claims:
        kube.add(name, uid)
        await driver.prepare("ns", name, uid)
        assert all(f.exists() for f in files(paths, uid))
    return driver, paths


async def test_a_deleted_claim_is_swept_and_a_present_one_kept(root):
    kube = FakeKube()
    driver, paths = await prepared(root, kube, ("gone", "uid-gone"), ("here", "uid-here"))
    del kube.claims[("ns", "gone")]

    result = await sweep_once(driver, kube)

    assert result.swept == {"uid-gone": "deleted"} and result.kept == ["uid-here"] and result.errors == {}
    assert not any(f.exists() for f in files(paths, "uid-gone"))
    assert all(f.exists() for f in files(paths, "uid-here"))
    # the checkpoint on disk no longer has it (a restarted agent would not bring it back)
    assert Checkpoint(root / "state" / "checkpoint.json").uids() == ["uid-here"]
    assert sample(driver, "hami_dra_swept_claims_total", reason="deleted") == 1
    assert sample(driver, "hami_dra_prepared_claims") == 1 and sample(driver, "hami_dra_prepared_devices") == 1
    # the sweep is not the kubelet: no unprepare is counted
    assert sample(driver, "hami_dra_unprepare_total", result="ok") == 0

    again = await sweep_once(driver, kube)  # nothing left to sweep
    assert again.swept == {} and again.kept == ["uid-here"]
    assert sample(driver, "hami_dra_swept_claims_total", reason="deleted") == 1


async def test_a_claim_recreated_under_the_same_name_is_swept(root):
    kube = FakeKube()
    driver, paths = await prepared(root, kube, ("c", "uid-old"))
    kube.add("c", "uid-new")  # deleted and made again by name: another UID

    result = await sweep_once(driver, kube)

    assert result.swept == {"uid-old": "recreated"}
    assert not any(f.exists() for f in files(paths, "uid-old"))
    assert driver.checkpoint.uids() == []
    assert sample(driver, "hami_dra_swept_claims_total", reason="recreated") == 1


@pytest.mark.parametrize(
    "failure",
    [
        KubeError("GET", "/x", 403, "forbidden"),
        KubeError("GET", "/x", 500, "etcd timeout"),
        KubeError("GET", "/x", 0, "connection refused"),
        asyncio.TimeoutError(),
        OSError("network unreachable"),
    ],
    ids=["403", "500", "no-answer", "timeout", "oserror"],
)
async def test_an_api_error_keeps_everything(root, failure):
    kube = FakeKube()
    driver, paths = await prepared(root, kube, ("c", "uid-1"))
    del kube.claims[("ns", "c")]  # even a claim that is gone is kept while the API cannot say so
    kube.fail = failure

    result = await sweep_once(driver, kube)

    assert result.swept == {} and list(result.errors) == ["uid-1"]
    assert all(f.exists() for f in files(paths, "uid-1"))
    assert driver.checkpoint.uids() == ["uid-1"]
    assert sample(driver, "hami_dra_sweep_errors_total") == 1
    assert sample(driver, "hami_dra_swept_claims_total", reason="deleted") == 0

    kube.fail = None  # the API answers again: the next sweep removes it
    assert (await sweep_once(driver, kube)).swept == {"uid-1": "deleted"}


async def test_an_answer_without_a_uid_keeps_the_claim(root):
    kube = FakeKube()
    driver, paths = await prepared(root, kube, ("c", "uid-1"))
    kube.claims[("ns", "c")] = {"metadata": {"name": "c"}}
    result = await sweep_once(driver, kube)
    assert result.swept == {} and "metadata.uid" in result.errors["uid-1"]
    assert driver.checkpoint.uids() == ["uid-1"]


async def test_the_loop_sweeps_each_interval_and_stops(root):
    kube = FakeKube()
    driver, paths = await prepared(root, kube, ("c", "uid-1"))
    del kube.claims[("ns", "c")]
    stop = asyncio.Event()
    task = asyncio.create_task(sweep_loop(driver, kube, 0.01, stop))
    while driver.checkpoint.uids():
        await asyncio.sleep(0.01)
    stop.set()
    await task
    assert not Path(paths.cdi_file("uid-1")).exists()


async def test_prepare_and_unprepare_are_counted_by_result(root):
    kube = FakeKube()
    driver, _ = make_driver(root, kube)
    assert sample(driver, "hami_dra_prepare_total", result="ok") == 0
    assert sample(driver, "hami_dra_prepare_total", result="error") == 0

    kube.add("c1", "uid-1")
    await driver.prepare("ns", "c1", "uid-1")
    assert sample(driver, "hami_dra_prepare_total", result="ok") == 1
    assert sample(driver, "hami_dra_prepare_seconds_count") == 1
    assert sample(driver, "hami_dra_prepared_claims") == 1 and sample(driver, "hami_dra_prepared_devices") == 1

    with pytest.raises(PrepareError):  # the API server has another UID under that name
        await driver.prepare("ns", "c1", "uid-other")
    with pytest.raises(PrepareError, match="cannot read it from the API server: .*HTTP 404"):  # no such claim
        await driver.prepare("ns", "missing", "uid-m")
    assert sample(driver, "hami_dra_prepare_total", result="error") == 2
    assert sample(driver, "hami_dra_prepare_errors_total", reason="recreated") == 1
    assert sample(driver, "hami_dra_prepare_errors_total", reason="api") == 1
    assert sample(driver, "hami_dra_prepare_errors_total", reason="allocation") == 0
    assert sample(driver, "hami_dra_prepare_total", result="ok") == 1
    assert sample(driver, "hami_dra_prepare_seconds_count") == 3
    assert sample(driver, "hami_dra_prepared_claims") == 1

    await driver.unprepare("ns", "c1", "uid-1")
    await driver.unprepare("ns", "c1", "uid-1")  # a no-op that succeeds
    assert sample(driver, "hami_dra_unprepare_total", result="ok") == 2
    assert sample(driver, "hami_dra_unprepare_seconds_count") == 2
    assert sample(driver, "hami_dra_prepared_claims") == 0 and sample(driver, "hami_dra_prepared_devices") == 0


async def test_each_driver_has_its_own_registry(root):
    kube = FakeKube()
    a, _ = make_driver(root / "a", kube)
    b, _ = make_driver(root / "b", kube)
    kube.add("c", "uid-1")
    await a.prepare("ns", "c", "uid-1")
    assert sample(a, "hami_dra_prepare_total", result="ok") == 1
    assert sample(b, "hami_dra_prepare_total", result="ok") == 0


async def test_metrics_are_served_on_the_products_listener(root):
    kube = FakeKube()
    driver, _ = make_driver(root, kube)
    kube.add("c", "uid-1")
    await driver.prepare("ns", "c", "uid-1")
    runner = await driver.metrics.serve("127.0.0.1", 0)
    try:
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    finally:
        await runner.cleanup()
    assert 'hami_dra_prepare_total{result="ok"} 1.0' in text
    assert "hami_dra_prepared_claims 1.0" in text and "hami_dra_prepared_devices 1.0" in text
    assert "# TYPE hami_dra_prepare_seconds histogram" in text
    assert generate_latest(driver.metrics.registry).decode().count("hami_dra_swept_claims_total{") == 3


def test_flags_defaults_and_bad_values():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([])
    assert args.metrics_bind_address == "" and parse_bind(args.metrics_bind_address) is None
    assert parse_interval(args.sweep_interval) == 300
    assert parse_bind(":9396") == ("0.0.0.0", 9396) and parse_bind("[::]:9396") == ("::", 9396)
    assert parse_interval("0") == 0 and parse_interval("30s") == 30 and parse_interval("1h30m") == 5400
    with pytest.raises(UsageError, match=r"--metrics-bind-address: invalid address '9396x'"):
        parse_bind("9396x")
    with pytest.raises(UsageError, match=r"--sweep-interval: invalid duration '5 days'"):
        parse_interval("5 days")


async def test_prepare_failures_are_counted_by_reason(root):
    kube = FakeKube()
    driver, paths = make_driver(root, kube)

    def errors(reason):
        return sample(driver, "hami_dra_prepare_errors_total", reason=reason)

    assert all(errors(r) == 0 for r in ("invalid_uid", "api", "recreated", "allocation", "checkpoint", "io", "other"))
    with pytest.raises(PrepareError, match="not a Kubernetes UID"):
        await driver.prepare("ns", "c", "../etc")
    kube.claims[("ns", "bare")] = {"metadata": {"namespace": "ns", "name": "bare", "uid": "uid-b"}}
    with pytest.raises(PrepareError, match="not allocated"):
        await driver.prepare("ns", "bare", "uid-b")
    kube.fail = asyncio.TimeoutError()  # an API read that times out is "api", not "io"
    kube.add("c2", "uid-2")
    with pytest.raises(PrepareError, match="cannot read it from the API server"):
        await driver.prepare("ns", "c2", "uid-2")
    kube.fail = None
    Path(paths.cdi_dir).parent.mkdir(parents=True, exist_ok=True)
    Path(paths.cdi_dir).write_text("a file where the CDI directory should be")
    with pytest.raises(OSError):
        await driver.prepare("ns", "c2", "uid-2")
    # nothing half-applied: the region directory and the claim record made before are gone again
    assert not Path(paths.claim_dir("uid-2")).exists() and not Path(paths.claim_record("uid-2")).exists()
    assert (errors("invalid_uid"), errors("allocation"), errors("api"), errors("io")) == (1, 1, 1, 1)
    assert sample(driver, "hami_dra_prepare_total", result="error") == 4
    assert sample(driver, "hami_dra_prepared_claims") == 0
    text = generate_latest(driver.metrics.registry).decode()
    assert "# TYPE hami_dra_prepare_errors_total counter" in text
    assert 'hami_dra_unprepare_errors_total{reason="checkpoint"} 0.0' in text


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


async def test_a_gone_claim_is_swept_only_after_the_grace_period(root):
    kube = FakeKube()
    driver, paths = await prepared(root, kube, ("c", "uid-1"), ("d", "uid-2"))
    del kube.claims[("ns", "c")]
    kube.claims[("ns", "d")] = claim("d", "uid-new")  # re-created under its name
    clock, gone = Clock(), {}

    first = await sweep_once(driver, kube, 60, gone, clock)
    assert first.swept == {} and first.waiting == {"uid-1": "deleted", "uid-2": "recreated"}
    assert driver.checkpoint.uids() == ["uid-1", "uid-2"] and all(f.exists() for f in files(paths, "uid-1"))

    clock.now += 59  # not yet
    assert (await sweep_once(driver, kube, 60, gone, clock)).swept == {}
    kube.fail = KubeError("GET", "x", 503, "unavailable")  # an API error neither sweeps nor resets the wait
    clock.now += 5
    failed = await sweep_once(driver, kube, 60, gone, clock)
    assert failed.swept == {} and set(failed.errors) == {"uid-1", "uid-2"}
    assert driver.checkpoint.uids() == ["uid-1", "uid-2"]
    kube.fail = None
    done = await sweep_once(driver, kube, 60, gone, clock)
    assert done.swept == {"uid-1": "deleted", "uid-2": "recreated"} and gone == {}
    assert driver.checkpoint.uids() == [] and not any(f.exists() for f in files(paths, "uid-1"))
    assert sample(driver, "hami_dra_swept_claims_total", reason="deleted") == 1


async def test_a_claim_found_again_or_unprepared_meanwhile_is_forgotten(root):
    kube = FakeKube()
    driver, paths = await prepared(root, kube, ("c", "uid-1"), ("d", "uid-2"))
    saved = kube.claims.pop(("ns", "c"))
    del kube.claims[("ns", "d")]
    clock, gone = Clock(), {}
    assert set((await sweep_once(driver, kube, 60, gone, clock)).waiting) == {"uid-1", "uid-2"}
    kube.claims[("ns", "c")] = saved  # the API server has it again (same UID): the wait starts over
    await driver.unprepare("ns", "d", "uid-2")  # the kubelet did it itself
    clock.now += 30
    again = await sweep_once(driver, kube, 60, gone, clock)
    assert again.kept == ["uid-1"] and gone == {}
    del kube.claims[("ns", "c")]
    clock.now += 40  # gone again: a new wait from here, not from the first sighting
    assert (await sweep_once(driver, kube, 60, gone, clock)).waiting == {"uid-1": "deleted"}
    assert driver.checkpoint.uids() == ["uid-1"]


def test_the_grace_flag_defaults_to_a_minute():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([])
    assert parse_interval(args.sweep_grace, "--sweep-grace") == 60
    with pytest.raises(UsageError, match=r"--sweep-grace: invalid duration 'soon'"):
        parse_interval("soon", "--sweep-grace")
