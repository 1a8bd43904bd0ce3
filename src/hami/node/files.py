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

It also owns :func:`read_small`, the one way a node program reads such a file back: only a
regular file, opened without blocking (a FIFO or a device planted at a checkpoint path would
otherwise hang the program's start for ever), and only up to a bound (a huge file is refused
instead of read into memory).

And it owns :func:`remove_tree`, the one way a node program removes a directory a container
wrote into (a region or claim directory): without following a link and without recursion.

What it does not own: what the files contain, their versions and how an old version is read
(each checkpoint module), and files written in place on purpose (``ld.so.preload`` in
:mod:`hami.node.layout`, which containers bind-mount by inode).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


class WriteError(OSError):
    """A file could not be replaced; the message names the file and the reason."""


#: the largest node file :func:`read_small` reads (checkpoints, CDI specs, config.json)
MAX_READ_BYTES = 64 << 20


class NotRegularFileError(OSError):
    """The path exists but is not a regular file (a FIFO, socket, device or directory)."""


def read_small(path: str | os.PathLike, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises ``FileNotFoundError`` when it does not exist, :class:`NotRegularFileError` (an
    ``OSError``, ``EINVAL``; ``IsADirectoryError`` for a directory) when it is not a regular file, and
    ``OSError`` (``EFBIG``) when it is larger than ``limit``; the message names the path. Opening
    never blocks: the file is opened ``O_NONBLOCK`` and checked with ``fstat`` before any read.
    """
    target = os.fspath(path)
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a regular file", target)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", target)
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes ({info.st_size})", target)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # it grew while being read
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", target)
        return data
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # filesystems that cannot sync a directory
            raise
    finally:
        os.close(fd)


def write_atomic(
    path: str | os.PathLike, data: str | bytes, mode: int = 0o644, tmp_dir: str | os.PathLike | None = None
) -> Path:
    """Replace ``path`` with ``data`` (text is UTF-8) atomically and durably, file mode ``mode``;
    the parent directories are created. ``tmp_dir``: where the temporary file is made (default
    the target's directory; the same file system), e.g. one no one else writes when the target's
    directory is a container's. Returns the path. Raises :class:`WriteError` (an ``OSError``)
    naming the path; the temporary file is removed on any failure."""
    target = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=tmp_dir or target.parent, prefix=f".{target.name}.")
    except OSError as exc:
        raise WriteError(f"{target}: cannot write ({exc.strerror or exc})") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            # the mode through the descriptor: by name, a link put in the temporary file's place
            # (its directory may be a container's to write) had its target's mode changed
            os.fchmod(f.fileno(), mode)
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise WriteError(f"{target}: cannot write ({exc.strerror or exc})") from exc
        raise
    return target


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: times one directory is gone through again because something was written into it meanwhile
_REREADS = 3


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _empty_of_files(fd: int) -> list[str]:
    """Unlink what the directory ``fd`` holds but directories (links included, never followed);
    returns its directories' names. One read of the directory."""
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            else:
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
    return subdirs


def remove_tree(path: str | os.PathLike) -> None:
    """Remove ``path`` and everything under it; a link (in it or in its place) is removed, never
    followed. Depth first with one open directory at a time, each directory read once, no
    recursion: a container can nest directories thousands deep in what it is given
    (``shutil.rmtree`` recursed once per level and raised RecursionError past ~1000, which the DRA
    agent did not catch; found by review). Going back up, each parent is checked to be the
    directory it came down from (a container still running could move the directory being
    emptied up a level and have the walk climb out of ``path``): otherwise it stops with an
    error. Absent: nothing to do. Raises OSError (EACCES, EBUSY...) for what cannot be removed,
    the tree partly removed."""
    path = os.fspath(path)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(path)  # a file or a link where the directory was
        return
    # the directories from ``path`` down to the one open: (name in its parent, identity, its
    # subdirectories still to remove)
    stack: list[tuple[str, tuple[int, int], list[str]]] = []
    rereads = 0
    try:
        root = _ident(fd)
        stack.append(("", root, _empty_of_files(fd)))
        while True:
            name, ident, pending = stack[-1]
            if pending:
                child = pending.pop()
                try:
                    inner = os.open(child, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    os.unlink(child, dir_fd=fd)  # replaced by a file or a link meanwhile
                    continue
                os.close(fd)
                fd = inner
                stack.append((child, _ident(fd), _empty_of_files(fd)))
                continue
            if len(stack) == 1:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            if _ident(parent) != stack[-2][1]:
                os.close(parent)
                raise OSError(errno.ESTALE, f"{path}: a directory in it was moved while it was being removed; stopped")
            os.close(fd)
            fd = parent
            stack.pop()
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY or rereads >= _REREADS:
                    raise
                rereads += 1  # written into meanwhile: through it again
                stack[-1][2].append(name)
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) != root:
            raise OSError(errno.ESTALE, f"{path}: replaced while it was being removed; stopped")
    finally:
        os.close(fd)
    os.rmdir(path)
