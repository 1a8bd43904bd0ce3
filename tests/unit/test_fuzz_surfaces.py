"""Property-based fuzzing of the surfaces added with the DRA front end and the web UI, at small
fixed budgets (``make fuzz`` runs the same checks on thousands of inputs each): the UI's read API
over a loopback listener, the DRA kubelet plugin's gRPC prepare/unprepare with the CDI directory
and checkpoint checked after every batch, a damaged CDI file, the webhook's DRA translation, the
scheduler's claim and slice watches, and damaged DRA and MIG checkpoints. Generators and oracles:
tests/unit/_fuzzkit_ui.py and tests/unit/_fuzzkit_dra.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from . import _fuzzkit_dra as D
from . import _fuzzkit_ui as U

FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def ok(verdict):
    assert verdict is None, verdict


def test_ui_read_api_over_a_listener():
    surface = U.UiSurface()

    @SLOW
    @given(U.ui_requests())
    def run(item):
        ok(U.check_ui(surface, item))

    try:
        run()
    finally:
        surface.close()


@pytest.fixture(scope="module")
def plugin():
    surface = D.PluginSurface()
    yield surface
    surface.close()


def test_dra_grpc_prepare_and_unprepare(plugin):
    @SLOW
    @given(D.plugin_batches())
    def run(steps):
        ok(D.check_plugin(plugin, steps))

    run()


def test_dra_damaged_cdi_file(plugin):
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    @given(D.cdi_damage())
    def run(item):
        ok(D.check_cdi_damage(plugin, item))

    run()


@FAST
@given(D.dra_pods())
def test_dra_webhook_translation(item):
    ok(D.check_translation(item))


@FAST
@given(D.watch_events())
def test_claim_and_slice_watches(events):
    ok(D.check_watch(events))


def test_damaged_checkpoints():
    surface = D.CheckpointSurface()

    @FAST
    @given(D.damaged_files())
    def run(item):
        ok(D.check_checkpoint(surface, item))

    try:
        run()
    finally:
        surface.close()
