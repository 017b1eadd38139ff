"""What a crash can do to the packed store, and how a process notices it.

NOTE [packed durability]
The packed store (:mod:`.packed`, its environment in :mod:`.lmdbenv`) commits without
flushing (LMDB ``sync=False, metasync=False``): a flush costs an fdatasync per commit, 25x
fewer single puts per second on the development VM (``benchmarks/cache_store.py``: 2,081/s
against 53,311/s at 1 KB), and the store is a cache. What each fault does:

* A process killed (SIGKILL, OOM, a crash in a worker) loses nothing committed: LMDB
  writes into the page cache and writes the meta page last, so a commit the process did not
  finish simply did not happen. The writer lock is a robust mutex: the next writer goes on.
* An OS crash or a power loss may lose recent commits and, because pages reach the disk in
  any order when nothing is flushed, may leave the B-tree inconsistent. So a process marks
  the store before its first commit after a flush: it creates ``packed/unsynced-<boot
  id>-<pid>`` and fsyncs it and the directory. SYNC_EVERY_S seconds after a commit (checked
  at its next write) and when it closes, it flushes (``env.sync``) and removes its mark.
* Every process, before it opens the store and under the directory's index lock, looks at
  the marks (:func:`check_marks`). A mark of another boot means the system went down with
  commits not on disk: LMDB's two files are deleted and a new store is made (every entry
  is fetched again; the large objects' files in entries/ are indexed again). A mark of this
  boot whose process is gone is flushed and removed (its commits are sound, only not yet
  flushed). The cost of the rule: a machine that reboots while a process still runs (one
  that never closed the cache) also loses the packed store, flushed or not.
* Whatever reaches a reader is still checked (size, xxh64: :mod:`.entry`), so a record a
  crash tore is a miss, never served.

Example::

    >>> marks = SyncMarks(cache_dir.packed_fd, cache_dir.packed_path())
    >>> marks.before_commit()      # creates packed/unsynced-<boot>-<pid> once
    >>> marks.flushed()            # after env.sync(): removes it
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import stat
import time
from pathlib import Path

from fastload.cache.cachedir import DAMAGED_NAME, PACKED_FILES, PACKED_NAME, UNSYNCED, CacheDir
from fastload.cache.safefs import Foreign, Found, listing, open_dir, open_file

logger = logging.getLogger(__name__)

SYNC_EVERY_S = 5.0
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
BOOT_ID_ENV = "FASTLOAD_BOOT_ID"
"""For tests only: a boot id (36 hex digits and dashes) that stands for this boot's, to
make a process believe the machine rebooted since another one ran."""
_BOOT_ID_FORM = re.compile(r"[0-9a-f-]{36}")


def boot_id() -> str:
    """This boot's id (Linux's random boot id; elsewhere the boot time, as 36 hex digits)."""
    override = os.environ.get(BOOT_ID_ENV, "")
    if _BOOT_ID_FORM.fullmatch(override):
        return override
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return f"{int(time.time() - time.monotonic()) // 10:036x}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_files(packed_fd: int, where: Path) -> list[tuple[int, int]]:
    """Create LMDB's files in packed/ if missing; check they are regular files with one link
    (never a symlink: ``O_NOFOLLOW``). Their (device, inode), to compare with :func:`file_ids`
    after LMDB opened them by name. Foreign when one is not fastload's (not opened then)."""
    ids = []
    for name in PACKED_FILES:
        fd = open_file(packed_fd, name, os.O_RDWR | os.O_CREAT, where)
        try:
            st = os.fstat(fd)
            if st.st_nlink != 1:
                raise Foreign(where / name, "a hard link to another file")
            ids.append((st.st_dev, st.st_ino))
        finally:
            os.close(fd)
    return ids


def file_ids(packed_fd: int) -> list[tuple[int, int] | None]:
    """(device, inode) of LMDB's files as their names are now (None: not a regular file)."""
    ids: list[tuple[int, int] | None] = []
    for name in PACKED_FILES:
        try:
            st = os.stat(name, dir_fd=packed_fd, follow_symlinks=False)
        except FileNotFoundError:
            ids.append(None)
            continue
        ids.append((st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None)
    return ids


def remove_files(packed_fd: int) -> None:
    """Delete LMDB's files if they are regular files (a store an OS crash may have damaged)."""
    for name in PACKED_FILES:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.stat(name, dir_fd=packed_fd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=packed_fd)


def _marks(packed_fd: int) -> list[str]:
    return [n for n in listing(packed_fd) if n.startswith(UNSYNCED) and PACKED_NAME.fullmatch(n)]


def _remove(packed_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISREG(os.stat(name, dir_fd=packed_fd, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=packed_fd)


def check_marks(packed_fd: int) -> tuple[bool, list[str]]:
    """(whether a mark of another boot is there, the marks of this boot's dead processes).

    Call under the directory's index lock, before opening the store.
    """
    boot = boot_id()
    crashed, dead = False, []
    for name in _marks(packed_fd):
        mark_boot, _, pid = name[len(UNSYNCED):].rpartition("-")
        if mark_boot != boot:
            crashed = True
        elif not _alive(int(pid)):
            dead.append(name)
    return crashed, dead


def clear_marks(packed_fd: int, names: list[str] | None = None) -> None:
    """Remove the marks ``names`` (all of them if None: the store they were about is gone)."""
    for name in _marks(packed_fd) if names is None else names:
        _remove(packed_fd, name)


def set_aside(cache_dir: CacheDir) -> Path:
    """Move LMDB's two files out of packed/ into a new ``packed.damaged-<time>-<hex>/`` next
    to it, and remove the marks (they were about that store); where the files are now.

    Call under the directory's index lock. Nothing is deleted: ``fastload cache verify
    --drop`` and ``clear`` delete such a copy (:func:`remove_damaged`).
    """
    name = f"packed.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"
    packed_fd = cache_dir.packed_fd
    assert packed_fd is not None and DAMAGED_NAME.fullmatch(name)
    os.mkdir(name, dir_fd=cache_dir.root_fd)
    fd = open_dir(cache_dir.root_fd, name, cache_dir.path)
    try:
        for file in PACKED_FILES:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.stat(file, dir_fd=packed_fd, follow_symlinks=False).st_mode):
                    os.rename(file, file, src_dir_fd=packed_fd, dst_dir_fd=fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(packed_fd)
    clear_marks(packed_fd)
    return cache_dir.path / name


def damaged_copies(cache_dir: CacheDir) -> list[Found]:
    """The damaged stores set aside in the cache directory, with their bytes."""
    found = []
    for name in listing(cache_dir.root_fd):
        if not DAMAGED_NAME.fullmatch(name):
            continue
        try:
            fd = open_dir(cache_dir.root_fd, name, cache_dir.path)
        except OSError:
            continue  # not a directory: walk_others lists it as foreign
        try:
            size = sum(os.stat(n, dir_fd=fd, follow_symlinks=False).st_size for n in listing(fd))
        finally:
            os.close(fd)
        found.append(Found(cache_dir.path / name, name, size))
    return found


def remove_damaged(cache_dir: CacheDir, name: str) -> list[Found]:
    """Delete the set-aside store ``name`` (LMDB's two regular files and the directory);
    anything else in it stays, returned as foreign, and so does the directory then."""
    fd = open_dir(cache_dir.root_fd, name, cache_dir.path)
    left = []
    try:
        for file in listing(fd):
            st = os.stat(file, dir_fd=fd, follow_symlinks=False)
            if file in PACKED_FILES and stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                os.unlink(file, dir_fd=fd)
            else:
                left.append(Found(cache_dir.path / name / file, file, foreign="a name fastload did not put there"))
    finally:
        os.close(fd)
    if not left:
        os.rmdir(name, dir_fd=cache_dir.root_fd)
    return left


class SyncMarks:
    """This process's mark in packed/: made before its first unflushed commit, removed after a flush.

    Not thread-safe by itself: the packed store calls it under its own write mutex.
    """

    def __init__(self, packed_fd: int, where: Path) -> None:
        # Its own descriptor: the mark lives as long as the shared environment, which
        # outlives the CacheDir that opened it (NOTE [one LMDB environment per process]).
        self.packed_fd = os.dup(packed_fd)
        self.where = where
        self.name = f"{UNSYNCED}{boot_id()}-{os.getpid()}"
        self.marked = False
        self.last_flush = time.monotonic()

    def before_commit(self) -> None:
        """Make sure the mark is on disk before a commit that will not be flushed."""
        if not self.marked:
            fd = open_file(self.packed_fd, self.name, os.O_WRONLY | os.O_CREAT, self.where)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.fsync(self.packed_fd)
            self.marked = True

    def due(self) -> bool:
        """Whether this process has commits older than SYNC_EVERY_S seconds not flushed."""
        return self.marked and time.monotonic() - self.last_flush > SYNC_EVERY_S

    def flushed(self) -> None:
        """Every commit of this process is on disk (after ``env.sync``): remove the mark."""
        self.last_flush = time.monotonic()
        if self.marked:
            _remove(self.packed_fd, self.name)
            self.marked = False
