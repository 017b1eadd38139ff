"""File operations that never follow a symlink, relative to directory descriptors.

The building blocks of :mod:`.cachedir` (see NOTE [a cache directory holds only fastload's
files]): every name is one path component opened with ``O_NOFOLLOW`` below a directory
descriptor, files must be regular, lock files are never truncated.

Example::

    >>> root = os.open("/nvme/fastload", os.O_RDONLY | os.O_DIRECTORY)
    >>> with flock(root, ".index.lock", timeout=5, where=Path("/nvme/fastload")) as got:
    ...     assert got
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMP_PREFIX = ".fastload-tmp-"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Foreign(OSError):
    """A name in the cache directory is not fastload's (a symlink, a FIFO, a hard link...).

    fastload leaves it alone; ``path`` is where it is and ``why`` what it is.
    """

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} is {why}; fastload leaves what is not its own alone")
        self.path = path
        self.why = why


@dataclass(frozen=True)
class Found:
    """One name below the cache directory; ``foreign`` is None for fastload's own, else what it is."""

    path: Path
    name: str
    size: int = 0
    mtime: float = 0.0
    foreign: str | None = None


@contextlib.contextmanager
def flock(dir_fd: int, name: str, timeout: float, where: Path) -> Iterator[bool]:
    """Hold an flock on ``name`` below ``dir_fd``: True when taken, False after ``timeout`` s."""
    fd = open_file(dir_fd, name, os.O_RDWR | os.O_CREAT, where)  # never O_TRUNC
    try:
        got = take_lock(fd, fcntl.LOCK_EX, timeout)
        try:
            yield got
        finally:
            if got:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_temp(dir_fd: int, parts: Iterable[bytes]) -> str:
    """A new file below ``dir_fd`` holding ``parts``, named with TEMP_PREFIX; its name."""
    # O_EXCL never follows a symlink; 0o666 under the umask is what open() would give.
    name = TEMP_PREFIX + secrets.token_hex(8)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    return name


def classify(dir_fd: int, name: str, where: Path, own_name: Callable[[str], Any]) -> Found | None:
    """``name`` as fastload's own file (a regular file ``own_name`` accepts) or foreign; None if gone."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return Found(where / name, name, foreign=describe(dir_fd, name))
    if not own_name(name):
        return Found(where / name, name, st.st_size, st.st_mtime, "a file with a name fastload does not give")
    return Found(where / name, name, st.st_size, st.st_mtime)


def listing(dir_fd: int) -> list[str]:
    """The names in the directory ``dir_fd``, sorted."""
    # A fresh descriptor of the same directory: listdir shares the offset of the one it is given.
    fd = os.open(".", DIR_FLAGS, dir_fd=dir_fd)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def open_dir(dir_fd: int, name: str, where: Path) -> int:
    """A descriptor of the directory ``name``; Foreign if it is a symlink or not a directory."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Foreign(where / name, describe(dir_fd, name)) from None
        raise


def open_file(dir_fd: int, name: str, flags: int, where: Path) -> int:
    """A descriptor of the regular file ``name``; Foreign if it is a symlink or not a file."""
    try:
        fd = os.open(name, flags | FILE_FLAGS, 0o666, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Foreign(where / name, describe(dir_fd, name)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Foreign(where / name, describe(dir_fd, name))
    return fd


def describe(dir_fd: int, name: str) -> str:
    """What ``name`` is, for messages: 'a symlink to /x', 'a directory', ..."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            return f"a symlink to {os.readlink(name, dir_fd=dir_fd)}"
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def take_lock(fd: int, mode: int, timeout: float) -> bool:
    """``flock(fd, mode)`` (``LOCK_EX``/``LOCK_SH``) within ``timeout`` seconds (0: one
    try); whether it was taken."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


_FILL_POLL_S = 0.05
"""Seconds each try for the exclusive lock lasts in :func:`lock_to_fill`, between its looks."""


def lock_to_fill(fd: int, timeout: float, filled: Callable[[], bool]) -> bool | None:
    """``flock(fd, LOCK_EX)`` to fill what the lock guards, within ``timeout`` seconds, unless
    another process fills it meanwhile: between tries the lock is taken shared for a moment and
    ``filled()`` asked. True: held exclusively; False: filled by another (nothing held); None:
    neither within ``timeout``.

    NOTE [waiting for another's download]
    Two processes that find a shard missing (the shard store, :mod:`.shardstore`) both let go
    of its lock and wait for it exclusively; the one that gets it downloads the shard and goes
    on reading it, holding the lock shared. The other's plain wait for the exclusive lock
    could then never succeed while the first read on: it ran out ``lock_timeout`` (60 s) and
    read from the origin. Two torch workers through a small shard budget stalled so for 60 s
    in one epoch of several (tests/test_shard_cache.py's budget test, second epochs). So the
    waiter also looks, shared, whether the shard has become whole, and reads it if so. The
    download ahead's own brief wait (``ShardStore.ensure``) does the same; when its wait runs
    out it says "busy" (it said "hit", of a shard it had not seen whole, and the downloader
    ahead counted it as held when the store held nothing)."""
    deadline = time.monotonic() + timeout
    while True:
        if take_lock(fd, fcntl.LOCK_EX, min(_FILL_POLL_S, max(0.0, deadline - time.monotonic()))):
            return True
        if take_lock(fd, fcntl.LOCK_SH, 0):  # readers only: is it there now?
            try:
                if filled():
                    return False
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        if time.monotonic() >= deadline:
            return None


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
