"""Durable node files: the one way a node program replaces a file that others read or that must
survive a crash.

What this module owns: :func:`write_atomic`, used by every checkpoint (the DRA agent's prepared
claims, the device plugin's MIG instances), every CDI spec (the device plugin's, the DRA claims')
and every DRA claim record. The steps, always all of them: a temporary file in the target's own
directory (so the rename never crosses a filesystem), write, flush, fsync of the file, the mode
set, rename over the target, fsync of the directory (so the rename itself survives a power
loss). A reader therefore sees the old content or the new, never half of one; a crash leaves at
most a dot-named temporary file, which no reader of these directories picks up (CDI runtimes
read ``*.json``/``*.yaml``; checkpoints are read by name).

What it does not own: what the files contain, their versions and how an old version is read
(each checkpoint module), and files written in place on purpose (``ld.so.preload`` in
:mod:`hami.node.layout`, which containers bind-mount by inode).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


class WriteError(OSError):
    """A file could not be replaced; the message names the file and the reason."""


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # filesystems that cannot sync a directory
            raise
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> Path:
    """Replace ``path`` with ``data`` (text is UTF-8) atomically and durably, file mode ``mode``;
    the parent directories are created. Returns the path. Raises :class:`WriteError` (an
    ``OSError``) naming the path; the temporary file is removed on any failure."""
    target = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as exc:
        raise WriteError(f"{target}: cannot write ({exc.strerror or exc})") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise WriteError(f"{target}: cannot write ({exc.strerror or exc})") from exc
        raise
    return target
