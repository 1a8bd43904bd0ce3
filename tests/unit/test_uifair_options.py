"""``--ui-token-audiences``: parsed into the options, refused in one line when it cannot be an
audience, and handed to the UI's TokenReviews."""

from __future__ import annotations

import argparse

import pytest

from hami.core.errors import ConfigError
from hami.scheduler.options import add_arguments, options_from_args


def _opts(*argv: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return options_from_args(parser.parse_args(list(argv)))


def test_audiences_are_a_comma_separated_list_default_none():
    assert _opts().ui_token_audiences == ()
    ui = ("--ui-bind", "0.0.0.0:8443", "--ui-plain-http")
    assert _opts(*ui, "--ui-token-audiences", "hami-ui, https://kubernetes.default.svc,").ui_token_audiences == (
        "hami-ui",
        "https://kubernetes.default.svc",
    )


def test_an_audience_with_a_space_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="--ui-token-audiences: 'hami ui' is not an audience"):
        _opts("--ui-bind", "0.0.0.0:8443", "--ui-plain-http", "--ui-token-audiences", "hami ui")


def test_audiences_need_the_ui_with_tokens():
    with pytest.raises(ConfigError, match="--ui-token-audiences: 'hami-ui' is only used with --ui-bind"):
        _opts("--ui-token-audiences", "hami-ui")
    with pytest.raises(ConfigError, match="only used with --ui-auth=token"):
        _opts("--ui-bind", "127.0.0.1:8443", "--ui-auth", "none", "--ui-token-audiences", "hami-ui")
