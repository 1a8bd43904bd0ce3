"""`hami monitor` facing a hostile tenant: what it writes into its own region directory.

The directory is mounted read-write into the container, so the file names in it and every byte
of the region are the tenant's to choose. None of it may forge the monitor's log, put the
tenant's usage under a GPU another pod was given, or multiply its usage on one GPU."""

from __future__ import annotations

import logging
import uuid as uuidlib

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.monitor import command
from hami.monitor.exporter import ContainerGrant, MonitorCollector, PodRef

from . import _regionkit as kit

GiB = 1 << 30
TENANT = "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa"
VICTIM = "0b6f3b4e-2222-4d7e-9a8e-bbbbbbbbbbbb"
CLAIM = "0b6f3b4e-4444-4d7e-9a8e-dddddddddddd"


def _expected(uid: str, container: str) -> str:
    """The device plugin's region name (hami.node.contract.container_region), spelled independently."""
    return f"{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'hami:{uid}/{container}')}.cache"


def _samples(root, pods, claims=None, name="hami_vgpu_memory_used_bytes") -> list[tuple[dict, float]]:
    registry = CollectorRegistry()
    registry.register(
        MonitorCollector("n1", str(root / "containers"), pods=lambda: pods, host=lambda: [], claims_dir=claims)
    )
    out = []
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        out += [(s.labels, s.value) for s in fam.samples if s.name == name]
    return out


# ------------------------------------------------------------------ the log


def test_a_region_file_name_cannot_forge_lines_in_the_monitors_log(tmp_path, caplog):
    """Without the device plugin's name in the directory, the monitor reads the one ``*.cache``
    file there, whatever its name: a name holding a newline (or a terminal escape) went into the
    warning as it was, and the tenant wrote whole log lines of its choice ("removed the region of
    pod <victim>") into the node agent's log."""
    d = tmp_path / "containers" / f"{TENANT}_main"
    d.mkdir(parents=True)
    forged = f"x\n2026-01-01 00:00:00,000 INFO hami.monitor: removed the region of pod {VICTIM}\x1b[2K.cache"
    (d / forged).write_bytes(b"not a region")
    pods = {TENANT: PodRef("t", "tenant", TENANT, grants=(ContainerGrant("main", ("GPU-t",), 1),))}
    with caplog.at_level(logging.WARNING):
        _samples(tmp_path, pods)
    said = [r.getMessage() for r in caplog.records if "skipping region" in r.getMessage()]
    assert said, "the unreadable region is warned about"
    assert all(m.isprintable() for m in said), said  # was: a newline and an ESC in the message
    assert any("\\n2026-01-01" in m for m in said)  # still named, escaped


def test_a_feedback_write_failure_names_the_file_without_its_control_characters(tmp_path, caplog, monkeypatch):
    """The feedback loop's warning names the region path too (the tenant's file name when the
    device plugin's is not there)."""
    d = tmp_path / "containers" / f"{TENANT}_main"
    path = kit.write(d / "a\r\nFAKE LINE.cache", uuids=("GPU-t",), recent_kernel=3)

    def refuse(*args, **kwargs):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(command, "write_int32", refuse)
    with caplog.at_level(logging.WARNING):
        command.apply({path: command.Writes(recent_kernel=2)}, {path: "v1"})
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("feedback: cannot write")]
    assert len(said) == 1 and said[0].isprintable(), said  # was: "\r\n" in the message
    assert "a\\r\\nFAKE LINE.cache" in said[0]


def test_a_feedback_write_that_keeps_failing_is_warned_about_once(tmp_path, caplog, monkeypatch):
    """A region the container made unwritable fails every period (5 s): it was two warnings a
    period for as long as the pod ran. Now once, again after a success, or for another error."""
    path = kit.write(tmp_path / "containers" / f"{TENANT}_main" / "x.cache", uuids=("GPU-t",), recent_kernel=3)
    errors = [OSError(13, "Permission denied")]

    def write(*args, **kwargs):
        if errors[0] is not None:
            raise errors[0]

    monkeypatch.setattr(command, "write_int32", write)
    monkeypatch.setattr(command, "_write_failures", {})

    def warned(writes: int) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for _ in range(writes):
                command.apply({path: command.Writes(recent_kernel=2)}, {path: "v1"})
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("feedback:")]

    assert len(warned(5)) == 1
    errors[0] = OSError(28, "No space left on device")  # another error: said
    (said,) = warned(3)
    assert "No space left" in said
    errors[0] = None
    assert warned(2) == [f"feedback: recent_kernel of {path} written again"]
    errors[0] = OSError(13, "Permission denied")
    assert len(warned(2)) == 1
    command.apply({}, {})  # the region is no longer read: forgotten
    assert command._write_failures == {}


# ------------------------------------------------------------------ whose GPU


def test_a_pod_without_a_grant_cannot_report_usage_on_another_pods_gpu(tmp_path):
    """A pod whose allocation annotation is gone or unreadable (a tenant can patch its own pod's
    annotations) has no grant to check its region against. Its region was then exported as it
    stood: the tenant put 80 GiB under the victim's GPU. Such a region now counts only on GPUs
    no grant on the node names (as the feedback loop reads a claim the driver recorded no GPUs
    for); honest pods without a grant still show on their own GPU."""
    ctr = tmp_path / "containers"
    kit.write(
        ctr / f"{TENANT}_main" / _expected(TENANT, "main"),
        uuids=("GPU-victim", "GPU-free"),
        limits=(80 * GiB, 80 * GiB),
        procs=[kit.Proc(pid=1, used={0: (0, 0, 80 * GiB, 80 * GiB), 1: (0, 0, GiB, GiB)})],
    )
    kit.write(
        ctr / f"{VICTIM}_main" / _expected(VICTIM, "main"),
        uuids=("GPU-victim",),
        procs=[kit.Proc(pid=1, used={0: (0, 0, GiB, GiB)})],
    )
    pods = {
        TENANT: PodRef("t", "tenant", TENANT),  # annotation stripped: no grants
        VICTIM: PodRef("v", "victim", VICTIM, grants=(ContainerGrant("main", ("GPU-victim",), 1),)),
    }
    got = {(lab["pod"], lab["device_uuid"]): v for lab, v in _samples(tmp_path, pods)}
    assert ("tenant", "GPU-victim") not in got  # was 80 GiB under the victim's GPU
    # and without a grant to check against, the region's own UUID string is no label either
    assert got == {("tenant", ""): GiB, ("victim", "GPU-victim"): GiB}


def test_a_claim_without_recorded_devices_cannot_report_usage_on_a_granted_gpu(tmp_path):
    """The same for a DRA claim whose record (from an older driver) names no GPUs: the exporter
    took its region's word, the feedback loop did not."""
    claims = tmp_path / "claims"
    claim_dir = claims / CLAIM
    kit.write(
        claim_dir / "r.cache",
        uuids=("GPU-victim",),
        procs=[kit.Proc(pid=1, used={0: (0, 0, 40 * GiB, 40 * GiB)})],
    )
    (claims / f"{CLAIM}.json").write_text(f'{{"namespace": "t", "name": "c1", "uid": "{CLAIM}"}}')
    kit.write(tmp_path / "containers" / f"{VICTIM}_main" / _expected(VICTIM, "main"), uuids=("GPU-victim",))
    pods = {
        TENANT: PodRef("t", "tenant", TENANT, claims=(("c1", ("main",)),)),
        VICTIM: PodRef("v", "victim", VICTIM, grants=(ContainerGrant("main", ("GPU-victim",), 1),)),
    }
    got = {lab["pod"] for lab, _ in _samples(tmp_path, pods, claims=str(claims))}
    assert got == {"victim"}  # was {"victim", "tenant"}: 40 GiB of the claim on the victim's GPU


def test_a_gpu_listed_twice_in_a_region_is_counted_once(tmp_path):
    """libvgpu lists each device it sees once. A region that lists its one granted GPU in all 16
    device entries, each with the same usage, had 16 series on that GPU: a dashboard summing the
    GPU's containers showed the tenant's 1 GiB as 16 GiB (and its limit 16 times)."""
    kit.write(
        tmp_path / "containers" / f"{TENANT}_main" / _expected(TENANT, "main"),
        uuids=("GPU-t",) * 16,
        limits=(GiB,) * 16,
        procs=[kit.Proc(pid=1, used={d: (0, 0, GiB, GiB) for d in range(16)})],
    )
    pods = {TENANT: PodRef("t", "tenant", TENANT, grants=(ContainerGrant("main", ("GPU-t",), 1),))}
    used = _samples(tmp_path, pods)
    limits = _samples(tmp_path, pods, name="hami_vgpu_memory_limit_bytes")
    assert [(lab["vdevice_index"], v) for lab, v in used] == [("0", GiB)]  # was 16 series
    assert sum(v for _, v in limits) == GiB


def test_a_claim_without_recorded_devices_cannot_act_on_another_claims_gpu(tmp_path):
    """The feedback loop kept such a claim off the device plugin's GPUs but not off the GPUs the
    driver recorded for another claim: the old record's region counted as active on the other
    claim's GPU (throttling it, or blocking it with --priority-blocking)."""
    claims = tmp_path / "claims"
    old, new = CLAIM, "0b6f3b4e-5555-4d7e-9a8e-eeeeeeeeeeee"
    old_region = kit.write(claims / old / "r.cache", uuids=("GPU-theirs", "GPU-mine"), recent_kernel=2)
    kit.write(claims / new / "r.cache", uuids=("GPU-theirs",), recent_kernel=2)
    (claims / f"{old}.json").write_text(f'{{"namespace": "t", "name": "old", "uid": "{old}"}}')
    (claims / f"{new}.json").write_text(
        f'{{"namespace": "v", "name": "new", "uid": "{new}", "devices": ["GPU-theirs"]}}'
    )
    pods = {
        TENANT: PodRef("t", "tenant", TENANT, claims=(("old", ("main",)),)),
        VICTIM: PodRef("v", "victim", VICTIM, claims=(("new", ("main",)),)),
    }
    got = {r.key: r.uuids for r, _ in command.readings(str(tmp_path / "containers"), str(claims), pods)}
    assert got[old_region] == ("", "GPU-mine")  # was ("GPU-theirs", "GPU-mine")
