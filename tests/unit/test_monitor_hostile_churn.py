"""`hami monitor` under churn: directories removed while a scrape reads them.

A pod's directory goes when the monitor's own sweep (or the DRA driver's unprepare) removes it,
at any moment of a scrape. That is the ordinary end of a container, not a broken region: it is
neither warned about nor counted as ``invalid`` or ``waiting``, and its series are simply gone."""

from __future__ import annotations

import logging
import shutil
import uuid as uuidlib

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.monitor import containers, exporter
from hami.monitor.exporter import ContainerGrant, MonitorCollector, PodRef

from . import _regionkit as kit

GONE = "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa"
STAYS = "0b6f3b4e-2222-4d7e-9a8e-bbbbbbbbbbbb"
CLAIM = "0b6f3b4e-4444-4d7e-9a8e-dddddddddddd"


def _expected(uid: str, container: str) -> str:
    return f"{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'hami:{uid}/{container}')}.cache"


def _setup(tmp_path):
    root = tmp_path / "containers"
    for uid in (GONE, STAYS):
        kit.write(root / f"{uid}_main" / _expected(uid, "main"), uuids=("GPU-1",))
    grant = (ContainerGrant("main", ("GPU-1",), 1),)
    pods = {GONE: PodRef("a", "gone", GONE, grants=grant), STAYS: PodRef("b", "stays", STAYS, grants=grant)}
    return root, pods


def _scrape(root, pods, claims=None) -> tuple[set[str], dict[str, float]]:
    """(pods with series, hami_monitor_regions by state)."""
    registry = CollectorRegistry()
    registry.register(MonitorCollector("n1", str(root), pods=lambda: pods, host=lambda: [], claims_dir=claims))
    shown, states = set(), {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.name == "hami_vgpu_memory_used_bytes":
                shown.add(s.labels["pod"])
            elif s.name == "hami_monitor_regions":
                states[s.labels["state"]] = s.value
    return shown, states


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_directory_removed_between_the_listing_and_the_read_is_just_gone(tmp_path, monkeypatch, caplog):
    root, pods = _setup(tmp_path)
    listed = exporter.scan

    def scan_then_sweep(path):
        out = listed(path)
        shutil.rmtree(root / f"{GONE}_main")  # the sweep, in its own thread, meanwhile
        return out

    monkeypatch.setattr(exporter, "scan", scan_then_sweep)
    with caplog.at_level(logging.WARNING):
        shown, states = _scrape(root, pods)
    assert shown == {"stays"}
    assert _warnings(caplog) == []  # was "skipping region: ...: cannot open: No such file or directory"
    assert states == {"ok": 1, "invalid": 0, "waiting": 0, "unmatched": 0, "finished": 0}  # was invalid 1


def test_a_directory_removed_while_it_is_being_listed_is_just_gone(tmp_path, monkeypatch, caplog):
    root, pods = _setup(tmp_path)
    (root / f"{GONE}_main" / _expected(GONE, "main")).unlink()  # not started yet: the directory is listed
    find = containers._region_file

    def sweep_then_find(directory, expected=None):
        if directory.name.startswith(GONE):
            shutil.rmtree(directory)
        return find(directory, expected)

    monkeypatch.setattr(containers, "_region_file", sweep_then_find)
    with caplog.at_level(logging.WARNING):
        shown, states = _scrape(root, pods)
    assert shown == {"stays"}
    assert _warnings(caplog) == []  # was "skipping region: cannot list ...: No such file or directory"
    assert states["waiting"] == 0 and states["ok"] == 1  # was waiting 1


def test_a_claim_unprepared_during_a_scrape_is_not_reported_as_an_old_drivers(tmp_path, monkeypatch, caplog):
    """The DRA driver removes the claim's record and directory: a scrape in between said the
    claim had "no record of the claim (prepared by an older hami dra?)"."""
    root, pods = _setup(tmp_path)
    claims = tmp_path / "claims"
    kit.write(claims / CLAIM / "r.cache", uuids=("GPU-2",))
    record = claims / f"{CLAIM}.json"
    record.write_text(f'{{"namespace": "b", "name": "c1", "uid": "{CLAIM}", "devices": ["GPU-2"]}}')
    pods[STAYS] = PodRef("b", "stays", STAYS, claims=(("c1", ("main",)),), grants=pods[STAYS].grants)
    assert _scrape(root, pods, str(claims))[1]["ok"] == 3
    read_record = containers._claim_record

    def unprepare_then_read(path, uid):
        record.unlink()  # after the listing found the claim's directory
        shutil.rmtree(claims / CLAIM)
        return read_record(path, uid)

    monkeypatch.setattr(containers, "_claim_record", unprepare_then_read)
    with caplog.at_level(logging.WARNING):
        shown, states = _scrape(root, pods, str(claims))
    assert _warnings(caplog) == []
    assert states["ok"] == 2 and states["invalid"] == 0 and states["waiting"] == 0


def test_a_gone_pods_directory_is_not_read_and_an_unremovable_one_is_said_once(tmp_path, monkeypatch, caplog):
    """A tenant can make its directory's removal fail for good (a subdirectory of its own, mode
    0700: the monitor holds no capability to override it). Every scrape then read its region
    again (a hostile one ~64 ms) and every period warned again (found by review). A directory of
    a pod not on the node is now counted, not read; the failure is said once."""
    root, pods = _setup(tmp_path)
    del pods[GONE]
    read = []
    real = exporter.MonitorCollector._region
    monkeypatch.setattr(
        exporter.MonitorCollector, "_region", lambda self, path, *a: read.append(path) or real(self, path, *a)
    )
    shown, states = _scrape(root, pods)
    assert shown == {"stays"} and states["unmatched"] == 1
    assert not [p for p in read if GONE in str(p)] and read

    def refuse(path, *a, **k):
        raise PermissionError(13, "Permission denied", f"{path}/x\nFAKE")

    monkeypatch.setattr(containers, "remove_tree", refuse)
    monkeypatch.setattr(containers, "_unremovable", set())
    gone = [d for d in containers.scan(str(root)) if d.pod_uid == GONE]
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            assert containers.remove(gone) == []
    (said,) = _warnings(caplog)
    assert said.isprintable() and "said once" in said
