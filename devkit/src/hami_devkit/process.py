"""Child processes of the harness: start with a log file, die with the parent, stop a whole group.

Also the small probes every component's readiness check uses (:func:`free_port`,
:func:`http_get`).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Runs as the child's first program (a fresh interpreter, so no state inherited from a
# threaded parent): PR_SET_PDEATHSIG (1) = SIGKILL, give up if the parent is already gone,
# then exec the real program (the setting survives execve).
_TRAMPOLINE = (
    "import ctypes,os,sys;"
    "ctypes.CDLL(None,use_errno=True).prctl(1,9);"
    "os.getppid()==int(sys.argv[1]) or os._exit(1);"
    "os.execv(sys.argv[2],sys.argv[2:])"
)


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` wrapped so that the process is SIGKILLed when the calling *thread* ends.

    The setting is made after exec, in a fresh interpreter: setting it from a ``preexec_fn``
    (Python code between fork and exec) can crash or hang the child when the parent has other
    threads, which a test session always has. Linux only; elsewhere ``argv`` is returned as is.
    """
    if not sys.platform.startswith("linux") or not argv:
        return list(argv)
    program = shutil.which(argv[0]) or argv[0]
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), program, *argv[1:]]


@dataclass
class Component:
    """One control-plane process and its log file."""

    name: str
    argv: list[str]
    log_path: Path
    die_with_parent: bool = True
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # the environment (None: this process's)

    def start(self) -> None:
        # PR_SET_PDEATHSIG fires when the *thread* that started the child ends: only use it from
        # the main thread (a worker thread of asyncio.to_thread would take the process with it).
        wrap = self.die_with_parent and threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                die_with_parent(self.argv) if wrap else self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the process group, then SIGKILL it if it is still there after ``timeout``."""
        process, self.process = self.process, None
        if process is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
            if process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(wait)
        # Whatever it forked in its group goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def http_get(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return 0, str(exc)


def insecure_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
