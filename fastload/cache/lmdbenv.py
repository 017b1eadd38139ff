"""The packed store's LMDB environment: one per process and directory, checked when opened,
reopened after a fork, its write transactions marked and flushed (:mod:`.packedsync`).

NOTE [one LMDB environment per process]
LMDB forbids opening the same files twice in a process (closing one releases the other's
POSIX locks; py-lmdb refuses it), so the :class:`~fastload.cache.packed.PackedStore`
instances of a process share one :class:`Env` per directory (``_ENVS``, keyed by the
device and inode of ``data.mdb``) and never close it. A forked child must not use its
parent's, and py-lmdb lets it open its own only once the inherited one is closed: the fork
hook closes it in the child, which touches only the child's copies (descriptors, maps) and
the reader slots of transactions open at the fork. Ours are a get's few microseconds, and
what such a read returns is still checked by its xxh64. If a thread of the parent was
inside a write transaction at the fork (its mutex is held), closing would wait for a thread
that does not exist in the child: the environment is then abandoned, the child cannot open
the store and its disk tier is pass-through (one warning); fork-started workers are made
between epochs, when such a window is rare.

Example::

    >>> env, remade = open_env(cache_dir, check=True)
    >>> env.commit(lambda txn: txn.put(b"k", b"v", db=env.entries))
    True
    >>> env.flush()
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import lmdb

from fastload.cache.cachedir import INDEX_TIMEOUT_S, CacheDir
from fastload.cache.packedsync import (
    SyncMarks,
    check_marks,
    clear_marks,
    file_ids,
    prepare_files,
    remove_files,
)
from fastload.cache.safefs import Foreign
from fastload.errors import CacheError

logger = logging.getLogger(__name__)

_MAP_MIN, _MAP_MAX = 1 << 30, 1 << 46
T = TypeVar("T")

__all__ = ["Env", "StoreFault", "open_env"]


class StoreFault(OSError):
    """The packed store failed (LMDB's error is the cause); ENOSPC when its map is full."""


@dataclass
class Env:
    """One process's LMDB environment of one directory, shared by its PackedStores.

    ``entries`` (records by digest), ``atimes`` (policy "lru": last read, ns) and ``meta``
    (``used``) are its databases; ``mutex`` serialises this process's write transactions.
    """

    env: lmdb.Environment
    path: Path
    entries: object
    atimes: object
    meta: object
    marks: SyncMarks
    mutex: threading.Lock = field(default_factory=threading.Lock)
    inherited: bool = False
    """True in a forked child: the parent's, closed or abandoned there; open this process's own."""

    def commit(self, write: Callable[[lmdb.Transaction], T], *, flush: bool = False) -> T:
        """Run ``write(txn)`` in one write transaction; its result. The store is marked before
        (NOTE [packed durability]) and flushed after when ``flush`` or a flush is due.

        Raises StoreFault (ENOSPC when the map is full, else EIO) when LMDB fails.
        """
        with self.mutex:
            try:
                self.marks.before_commit()
                with self.env.begin(write=True) as txn:
                    result = write(txn)
                if flush or self.marks.due():
                    self.env.sync(True)
                    self.marks.flushed()
            except lmdb.MapFullError as exc:
                raise StoreFault(errno.ENOSPC, f"the packed store {self.path} is full: {exc}") from exc
            except lmdb.Error as exc:
                raise StoreFault(errno.EIO, f"cannot write the packed store {self.path}: {exc}") from exc
        return result

    def flush(self) -> None:
        """Put every commit of this process on disk (and remove its mark)."""
        if self.marks.marked:
            with self.mutex:
                self.env.sync(True)
                self.marks.flushed()


_ENVS: dict[tuple[int, int], Env] = {}
_ABANDONED: list[object] = []  # never closed (see NOTE): a write was in flight at a fork


def _close_after_fork() -> None:
    """In a forked child: close the parent's environments (NOTE [one LMDB environment per process])."""
    for held in _ENVS.values():
        held.inherited = True
        if held.mutex.acquire(blocking=False):
            try:
                held.env.close()
            except lmdb.Error as exc:
                logger.debug("closing an inherited packed store failed: %s", exc)
        else:
            _ABANDONED.append(held)
    _ENVS.clear()


os.register_at_fork(after_in_child=_close_after_fork)


def open_env(cache_dir: CacheDir, *, check: bool) -> tuple[Env, bool]:
    """This process's environment of ``cache_dir``'s packed store, opened if needed; and
    whether the store was made anew (after an OS crash: its large objects need pointers again).

    ``check``: look at the crash marks first (NOTE [packed durability]); a forked child that
    reopens skips it. Raises CacheError when a name in packed/ is not fastload's, StoreFault
    when LMDB cannot open the store.
    """
    try:
        return _open(cache_dir, check=check)
    except Foreign as exc:
        raise CacheError(
            f"cache directory {cache_dir.path}: {exc.path} is {exc.why}. fastload never "
            f"follows or replaces a name it did not make there: remove {exc.path} or give "
            "the cache a new directory"
        ) from None


def _open(cache_dir: CacheDir, *, check: bool) -> tuple[Env, bool]:
    fd = cache_dir.packed_fd
    if fd is None:
        raise ValueError(f"{cache_dir.path} is not of format 'packed'")
    path = cache_dir.packed_path()
    crashed, dead = False, []
    if check:
        with cache_dir.index_lock(INDEX_TIMEOUT_S):
            crashed, dead = check_marks(fd)
            if crashed:
                logger.warning(
                    "disk cache %s: the system went down while commits of its packed store "
                    "were not on disk, so the store may be damaged; it is made anew and its "
                    "objects are fetched again", cache_dir.path)
                remove_files(fd)
                clear_marks(fd)
            ids = prepare_files(fd, path)
            held = _ENVS.get(ids[0])
            held = held if held is not None else _new_env(fd, path, ids)
    else:
        ids = prepare_files(fd, path)
        held = _ENVS.get(ids[0]) or _new_env(fd, path, ids)
    if dead:  # their commits are sound, only not flushed yet
        held.env.sync(True)
        clear_marks(fd, dead)
    return held, crashed


def _new_env(fd: int, path: Path, ids: list[tuple[int, int]]) -> Env:
    st = os.fstatvfs(fd)
    map_size = min(max(st.f_blocks * st.f_frsize, _MAP_MIN), _MAP_MAX)
    try:
        env = lmdb.open(str(path), map_size=map_size, subdir=True, sync=False,
                        metasync=False, readahead=False, max_dbs=3, max_readers=1024)
    except lmdb.Error as exc:
        raise StoreFault(errno.EIO, f"cannot open the packed store {path}: {exc}") from exc
    if file_ids(fd) != ids:  # swapped while LMDB opened them by name: not ours to write
        _ABANDONED.append(env)  # never closed: its locks may be shared (see NOTE)
        raise Foreign(path, "changed while it was opened (a file swapped for another)")
    held = Env(env, path, env.open_db(b"entries"), env.open_db(b"atimes"), env.open_db(b"meta"),
               SyncMarks(fd, path))
    _ENVS[ids[0]] = held
    return held
