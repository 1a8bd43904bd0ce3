"""Property-based fuzzing of every input surface, at small fixed budgets (``make fuzz`` runs the
same checks with a large one): generated valid inputs get the right verdict, generated invalid
ones are refused cleanly, and nothing crashes (an exception fails the test)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import _fuzzkit as F

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ok(verdict):
    assert verdict is None, verdict


@FAST
@given(F.valid_quantities())
def test_valid_quantities_read_like_kubernetes(item):
    ok(F.check_quantity(item))


@FAST
@given(st.one_of(F.non_ascii_digit_quantities.map(lambda t: (t, None)), F.quantity_junk.map(lambda t: (t, "any"))))
def test_bad_quantities_are_refused_cleanly(item):
    ok(F.check_quantity(item))


@FAST
@given(F.registrations())
def test_registrations_decode_or_are_refused(item):
    ok(F.check_registration(item))


@SLOW
@given(F.registrations())
def test_node_watch_keeps_no_stale_gpus(item):
    ok(F.check_node_ingest(item))


@FAST
@given(F.valid_pods())
def test_webhook_valid_pods(item):
    ok(F.check_webhook_valid(item))


@FAST
@given(F.valid_pods())
def test_webhook_reinvocation_is_idempotent(item):
    ok(F.check_webhook_reinvocation(item))


@FAST
@given(st.one_of(F.broken_pods(), F.json_trees))
def test_webhook_garbage_pods(pod):
    ok(F.check_webhook_garbage(pod))


@pytest.fixture(scope="module")
def http():
    surface = F.HttpSurface()
    yield surface
    surface.close()


@pytest.mark.parametrize("path", ["/filter", "/bind", "/webhook"])
def test_http_bodies_never_500(http, path):
    @SLOW
    @given(F.http_bodies)
    def run(body):
        ok(F.check_http(http, path, body))

    run()


def test_http_valid_filters_are_answered():
    http = F.HttpSurface()  # its own: garbage Filters elsewhere may hold reservations

    @SLOW
    @given(F.valid_pods().filter(lambda item: item[1]))
    def run(item):
        ok(F.check_http_valid_filter(http, item))

    try:
        run()
    finally:
        http.close()


def test_simulate_never_a_traceback():
    surface = F.SimSurface()

    @SLOW
    @given(F.sim_inputs())
    def run(item):
        ok(F.check_simulate(surface, item))

    run()
