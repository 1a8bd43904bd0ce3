"""The CI skip gate of tests/conftest.py: its allow-list reader and its filter, and the gate
itself on a planted suite run in a subprocess under CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import allowed_prefixes, unexpected

ROOT = Path(__file__).resolve().parents[2]


def test_allow_list_reads_prefixes_and_demands_a_reason():
    assert allowed_prefixes("# header\n\ntests/gpu/x.py::test_a  # needs a GPU\n") == ["tests/gpu/x.py::test_a"]
    with pytest.raises(pytest.UsageError, match="no reason"):
        allowed_prefixes("tests/unit/test_x.py::test_y\n")


def test_only_unlisted_skips_are_unexpected():
    skipped = [("tests/gpu/x.py::test_a", "no GPU"), ("tests/integration/test_images.py::test_b", "no ctr")]
    assert unexpected(skipped, ["tests/gpu/"]) == [("tests/integration/test_images.py::test_b", "no ctr")]
    assert unexpected(skipped, []) == skipped


PLANTED = {
    "in_test": """
        import pytest
        def test_runs():
            assert True
        def test_skips():
            pytest.skip("planted: nothing installs this")
    """,
    # found by review, 1 Dec: a skip at import time is a collection skip and passed the gate silently
    "module_level": """
        import pytest
        pytest.skip("planted: nothing installs this", allow_module_level=True)
        def test_never_collected():
            assert False
    """,
    "importorskip": """
        import pytest
        pytest.importorskip("hami_planted_missing_module", reason="planted: nothing installs this")
        def test_never_collected():
            assert False
    """,
}


@pytest.mark.parametrize("where", sorted(PLANTED))
def test_a_skip_fails_the_run_under_ci_and_not_outside(tmp_path, where):
    """A skip inside a test, a module-level ``pytest.skip`` and a module-level ``importorskip``
    each fail a CI=true run and leave a local run green."""
    planted = tmp_path / "test_planted_skip.py"
    planted.write_text(textwrap.dedent(PLANTED[where]))
    (tmp_path / "test_planted_pass.py").write_text("def test_passes():\n    assert True\n")

    def run(ci: str) -> subprocess.CompletedProcess[str]:
        # the suite's conftest loaded as a plugin on a file outside the tree: nothing is written there
        env = {**os.environ, "CI": ci, "HAMI_NO_SKIPS": "", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "tests.conftest",
                "--rootdir",
                str(tmp_path),
                str(tmp_path),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    strict_run, local_run = run("true"), run("")
    assert strict_run.returncode == 1, strict_run.stdout
    assert "planted: nothing installs this" in strict_run.stdout
    assert "1 unexpected skip(s)" in strict_run.stdout
    assert local_run.returncode == 0, local_run.stdout
