"""hami_devkit.cluster.die_with_parent: the child runs the program, and is killed with its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hami_devkit.cluster import die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead, only unreaped
    except FileNotFoundError:
        return True


def test_wrapped_program_runs_with_its_arguments_and_exit_status():
    done = subprocess.run(
        die_with_parent(["sh", "-c", 'echo "$0 $1"; exit 3', "a", "b c"]), capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (3, "a b c\n")


def test_child_is_killed_when_its_parent_exits():
    code = (
        "import subprocess; from hami_devkit.cluster import die_with_parent; "
        "p = subprocess.Popen(die_with_parent(['sleep', '60'])); print(p.pid, flush=True)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    pid = int(out.stdout)
    deadline = time.monotonic() + 20
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _gone(pid):
        os.kill(pid, 9)
        pytest.fail(f"sleep (pid {pid}) outlived its parent")


def test_nothing_runs_when_the_parent_is_already_gone():
    argv = die_with_parent(["sh", "-c", "echo ran"])
    argv[argv.index(str(os.getpid()))] = "1"  # as if the parent had died before the child started
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (1, "")
