"""`--event-loop` and `--kube-connections`: how hami scheduler runs its loop and reaches the API server."""

from __future__ import annotations

import argparse
import asyncio

import pytest
import uvloop

from hami.scheduler import options as O
from hami.scheduler.command import _loop_factory


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_uvloop_is_the_default_and_asyncio_can_be_chosen():
    assert O.options_from_args(_args()).event_loop == "uvloop"
    assert O.options_from_args(_args("--event-loop=asyncio")).event_loop == "asyncio"
    with asyncio.Runner(loop_factory=_loop_factory("uvloop")) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)
    with asyncio.Runner(loop_factory=_loop_factory("asyncio")) as runner:
        assert not isinstance(runner.get_loop(), uvloop.Loop)


def test_an_unknown_event_loop_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        _args("--event-loop=trio")
    assert "--event-loop" in capsys.readouterr().err


def test_kube_connections_defaults_to_the_pool_and_refuses_too_few(capsys):
    from hami.kube.client import POOL

    assert O.options_from_args(_args()).kube_connections == POOL == 32
    assert O.options_from_args(_args("--kube-connections=64")).kube_connections == 64
    for bad, why in (("4", "at least 8"), ("many", "whole number")):
        with pytest.raises(SystemExit):
            _args(f"--kube-connections={bad}")
        err = capsys.readouterr().err
        assert "--kube-connections" in err and why in err


def test_success_event_pacing_flags_reach_the_recorder_and_refuse_bad_values(capsys):
    from hami.scheduler.server import SchedulerService

    opts = O.options_from_args(_args())
    assert (opts.success_event_rate, opts.success_event_burst) == (10.0, 50)
    opts = O.options_from_args(_args("--success-event-rate=0", "--success-event-burst=7"))
    assert (opts.success_event_rate, opts.success_event_burst) == (0.0, 7)
    events = SchedulerService(opts, kube=None).events
    assert (events.success_rate, events.success_burst) == (0.0, 7)
    for flag, bad, why in (
        ("--success-event-rate", "-1", "0 (not paced) or a positive"),
        ("--success-event-rate", "nan", "0 (not paced) or a positive"),
        ("--success-event-rate", "inf", "0 (not paced) or a positive"),
        ("--success-event-rate", "often", "number of events a second"),
        ("--success-event-burst", "0", "at least 1"),
        ("--success-event-burst", "2.5", "whole number"),
    ):
        with pytest.raises(SystemExit):
            _args(f"{flag}={bad}")
        err = capsys.readouterr().err
        assert flag in err and why in err, (flag, bad, err)
