"""Suite-wide rule: under CI (``CI=true``, or ``HAMI_NO_SKIPS=1`` by hand) a skipped test fails
the run unless ``tests/skips-allowed.txt`` lists it with its reason. Locally, skips stay skips
(a laptop without root or Chromium still runs the rest)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ALLOW_LIST = Path(__file__).with_name("skips-allowed.txt")


def allowed_prefixes(text: str) -> list[str]:
    """The node-id prefixes of the allow-list; a line without a reason after ``#`` is an error."""
    prefixes = []
    for number, line in enumerate(text.splitlines(), 1):
        entry, _, reason = line.partition("#")
        if not entry.strip():
            continue
        if not reason.strip():
            raise pytest.UsageError(f"{ALLOW_LIST}:{number}: {entry.strip()!r} has no reason after '#'")
        prefixes.append(entry.strip())
    return prefixes


def unexpected(skipped: list[tuple[str, str]], prefixes: list[str]) -> list[tuple[str, str]]:
    return [(nodeid, why) for nodeid, why in skipped if not any(nodeid.startswith(p) for p in prefixes)]


def strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("HAMI_NO_SKIPS") == "1"


_skipped: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        why = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skipped.append((report.nodeid, why))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module-level skip (``pytest.skip(..., allow_module_level=True)``, a module-level
    ``importorskip``) happens at collection and never reaches pytest_runtest_logreport."""
    if report.skipped:
        longrepr = report.longrepr
        why = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skipped.append((report.nodeid, why))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not strict():
        return
    bad = unexpected(_skipped, allowed_prefixes(ALLOW_LIST.read_text()))
    if bad:
        session.config.stash[_BAD] = bad
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BAD = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    bad = config.stash.get(_BAD, [])
    if bad:
        terminalreporter.section("skipped under CI, not in tests/skips-allowed.txt", red=True)
        for nodeid, why in bad:
            terminalreporter.line(f"{nodeid}: {why}")
        terminalreporter.line(
            f"{len(bad)} unexpected skip(s): install what they name (make test) or list them "
            "with a reason in tests/skips-allowed.txt"
        )
