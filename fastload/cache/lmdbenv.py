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

Every open, a reopen in a forked child included, checks ``data.mdb`` before LMDB maps it,
and every transaction checks that it was not cut since (NOTE [a store is checked before it
is mapped] in :mod:`.lmdbfile`). A damaged store found when a process opens it with
``repair`` is moved aside whole (:func:`~fastload.cache.packedsync.set_aside`, under the
index lock) and an empty one made, with one warning; otherwise, and for a store fastload
did not make, :class:`~fastload.cache.lmdbfile.StoreDamaged` is raised and the disk tier
reads the origin. Each process flushes its commits and removes its crash mark when it exits
(``multiprocessing.util.Finalize``, which torch's workers run too), so a run that ends
normally leaves a store that survives a reboot.

Example::

    >>> env, remade = open_env(cache_dir, check=True)
    >>> env.commit(lambda txn: txn.put(b"k", b"v", db=env.entries))
    True
    >>> env.flush()
"""

from __future__ import annotations

import errno
import logging
import multiprocessing.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import lmdb

from fastload.cache.cachedir import INDEX_TIMEOUT_S, CacheDir
from fastload.cache.lmdbfile import (
    OWN_DATABASES,
    Header,
    SizeGuard,
    StoreDamaged,
    StoreFault,
    lmdb_fault,
    read_header,
    walk,
)
from fastload.cache.packedsync import (
    SyncMarks,
    check_marks,
    clear_marks,
    file_ids,
    prepare_files,
    remove_files,
    set_aside,
)
from fastload.cache.safefs import Foreign, open_file
from fastload.errors import CacheError

logger = logging.getLogger(__name__)

_MAP_MIN, _MAP_MAX = 1 << 30, 1 << 46
T = TypeVar("T")

__all__ = ["Env", "StoreDamaged", "StoreFault", "open_env", "remake"]


@dataclass
class Env:
    """One process's LMDB environment of one directory, shared by its PackedStores.

    ``entries`` (records by digest), ``atimes`` (policy "lru": last read, ns) and ``meta``
    (``used``) are its databases; ``mutex`` serialises this process's write transactions;
    ``guard`` checks the mapped file's size before each transaction.
    """

    env: lmdb.Environment
    path: Path
    entries: object
    atimes: object
    meta: object
    marks: SyncMarks
    guard: SizeGuard
    read_only: bool = False
    mutex: threading.Lock = field(default_factory=threading.Lock)
    inherited: bool = False
    """True in a forked child: the parent's, closed or abandoned there; open this process's own."""

    def commit(self, write: Callable[[lmdb.Transaction], T], *, flush: bool = False) -> T:
        """Run ``write(txn)`` in one write transaction; its result. The store is marked before
        (NOTE [packed durability]) and flushed after when ``flush`` or a flush is due.

        Raises StoreFault (ENOSPC when the map is full; StoreDamaged when the file is) when
        LMDB fails.
        """
        with self.mutex:
            try:
                self.marks.before_commit()
                with self.env.begin(write=True) as txn:
                    result = write(txn)
                if flush or self.marks.due():
                    self.env.sync(True)
                    self.marks.flushed()
            except lmdb.Error as exc:
                raise lmdb_fault(exc, self.path, "write") from exc
        return result

    def flush(self) -> None:
        """Put every commit of this process on disk (and remove its mark)."""
        if self.marks.marked:
            with self.mutex:
                self.env.sync(True)
                self.marks.flushed()


_ENVS: dict[tuple[int, int], Env] = {}
_ABANDONED: list[object] = []  # never closed (see NOTE): a write was in flight at a fork
_exit_flush_pid = 0


def _close_after_fork() -> None:
    """In a forked child: close the parent's environments (NOTE [one LMDB environment per process])."""
    for held in _ENVS.values():
        held.inherited = True
        held.guard.close()  # this process's copy of the descriptor
        if held.mutex.acquire(blocking=False):
            try:
                held.env.close()
            except lmdb.Error as exc:
                logger.debug("closing an inherited packed store failed: %s", exc)
        else:
            _ABANDONED.append(held)
    _ENVS.clear()


os.register_at_fork(after_in_child=_close_after_fork)


def flush_all() -> None:
    """Flush every packed store this process wrote and remove its crash marks (at exit)."""
    for held in list(_ENVS.values()):
        try:
            held.flush()
        except (OSError, lmdb.Error) as exc:  # an exit hook must not fail the exit
            logger.debug("packed store %s: could not flush at exit: %s", held.path, exc)


def _flush_at_exit() -> None:
    """Register :func:`flush_all` for this process's exit, once per process. Priority 5: after
    the write-behind buffers (20) and the counters (10) were committed."""
    global _exit_flush_pid
    if _exit_flush_pid != os.getpid():
        _exit_flush_pid = os.getpid()
        multiprocessing.util.Finalize(None, flush_all, exitpriority=5)


def open_env(cache_dir: CacheDir, *, check: bool, repair: bool = True) -> tuple[Env, bool]:
    """This process's environment of ``cache_dir``'s packed store, opened if needed; and
    whether the store was made anew (after an OS crash or damage: its large objects need
    pointers again).

    ``check``: look at the crash marks first (NOTE [packed durability]); a forked child that
    reopens skips it. ``repair``: set a damaged store aside and make an empty one (never for
    a read-only directory or a store fastload did not make); without it (the maintenance
    commands) every page is checked before the store is mapped (:func:`~.lmdbfile.walk`). Raises CacheError when a name
    in packed/ is not fastload's, StoreDamaged when the store is damaged and not repaired,
    StoreFault when LMDB cannot open it.
    """
    try:
        if cache_dir.read_only is not None:
            return _open_read_only(cache_dir, pages=not repair), False
        return _open(cache_dir, check=check, repair=repair)
    except Foreign as exc:
        raise CacheError(
            f"cache directory {cache_dir.path}: {exc.path} is {exc.why}. fastload never "
            f"follows or replaces a name it did not make there: remove {exc.path} or give "
            "the cache a new directory"
        ) from None
    except StoreFault:
        raise
    except OSError as exc:  # its files cannot be opened (permissions...): the tier fails open
        raise StoreFault(exc.errno, f"cannot open the packed store {cache_dir.packed_path()}: "
                                    f"{exc.strerror or exc}") from exc


def _open(cache_dir: CacheDir, *, check: bool, repair: bool) -> tuple[Env, bool]:
    fd = cache_dir.packed_fd
    if fd is None:
        raise ValueError(f"{cache_dir.path} is not of format 'packed'")
    if not check:  # a forked child: no lock, no repair
        return _checked_env(cache_dir, repair=False)
    with cache_dir.index_lock(INDEX_TIMEOUT_S):
        crashed, dead = check_marks(fd)
        if crashed:
            logger.warning(
                "disk cache %s: the system went down while commits of its packed store "
                "were not on disk, so the store may be damaged; it is made anew and its "
                "objects are fetched again", cache_dir.path)
            remove_files(fd)
            clear_marks(fd)
        held, remade = _checked_env(cache_dir, repair=repair, pages=not repair)
    if dead:  # their commits are sound, only not flushed yet
        held.env.sync(True)
        clear_marks(fd, dead)
    return held, crashed or remade


def _checked_env(cache_dir: CacheDir, *, repair: bool, pages: bool = False) -> tuple[Env, bool]:
    """The environment, opened after its file was checked; a damaged store set aside and
    made anew when ``repair`` (whether it was)."""
    fd, path = cache_dir.packed_fd, cache_dir.packed_path()
    assert fd is not None
    ids = prepare_files(fd, path)
    try:
        held = _ENVS.get(ids[0])
        if held is None:
            return _new_env(fd, path, ids, pages=pages), False
        held.guard.check()
        return held, False
    except StoreDamaged as exc:
        if not repair or exc.foreign:
            raise
        try:
            return _remade(cache_dir, exc.why, warn=True)[0], True
        except OSError as err:  # cannot be moved (permissions...): it is not used
            logger.debug("disk cache %s: cannot set the damaged store aside: %s", cache_dir.path, err)
            raise exc from None


def remake(cache_dir: CacheDir) -> tuple[Env, Path]:
    """Set the packed store aside (found damaged by ``fastload cache verify``) and open an
    empty one, under the index lock; the new environment and where the old files went."""
    with cache_dir.index_lock(INDEX_TIMEOUT_S):
        return _remade(cache_dir, "", warn=False)


def _remade(cache_dir: CacheDir, why: str, *, warn: bool) -> tuple[Env, Path]:
    fd, path = cache_dir.packed_fd, cache_dir.packed_path()
    assert fd is not None
    ids = file_ids(fd)
    damaged = _ENVS.pop(ids[0], None) if ids[0] is not None else None
    if damaged is not None:  # still mapped by this process's stores: they stop using it
        _ABANDONED.append(damaged)
    where = set_aside(cache_dir)
    if warn:
        logger.warning(
            "disk cache %s: its packed store was damaged (%s); it was moved to %s and an empty "
            "store made, so its objects are fetched again. Delete the damaged copy with "
            "`fastload cache verify %s --drop` (or empty the cache: `fastload cache clear %s`)",
            cache_dir.path, why, where, cache_dir.path, cache_dir.path)
    return _new_env(fd, path, prepare_files(fd, path)), where


def _new_env(fd: int, path: Path, ids: list[tuple[int, int]], *, read_only: bool = False,
             pages: bool = False) -> Env:
    data = open_file(fd, "data.mdb", os.O_RDONLY, path)
    try:
        st = os.fstat(data)
        if (st.st_dev, st.st_ino) != ids[0]:
            raise Foreign(path / "data.mdb", "changed while it was opened (a file swapped for another)")
        header = read_header(data, path / "data.mdb")
        if pages:
            walk(data, path / "data.mdb")
        if read_only and header is None:
            raise StoreFault(errno.ENOENT, f"the packed store {path} is empty")
        env = _lmdb_open(fd, path, ids, header, read_only=read_only)
        guard = SizeGuard(data, path / "data.mdb", header)
    except BaseException:
        os.close(data)
        raise
    try:
        dbs = [env.open_db(name, create=not read_only) for name in (b"entries", b"atimes", b"meta")]
    except lmdb.Error as exc:
        env.close()  # ours alone: this process has no other environment of this file
        guard.close()
        raise lmdb_fault(exc, path, "open") from exc
    held = Env(env, path, *dbs, SyncMarks(fd, path), guard, read_only=read_only)
    _ENVS[ids[0]] = held
    _flush_at_exit()
    return held


def _lmdb_open(fd: int, path: Path, ids: list[tuple[int, int]], header: Header | None, *,
               read_only: bool) -> lmdb.Environment:
    """LMDB's environment of files already checked; StoreDamaged for one not fastload's."""
    st = os.fstatvfs(fd)
    map_size = min(max(st.f_blocks * st.f_frsize, _MAP_MIN), _MAP_MAX)
    try:
        env = lmdb.open(str(path), map_size=map_size, subdir=True, sync=False, readonly=read_only,
                        metasync=False, readahead=False, max_dbs=3, max_readers=1024)
    except lmdb.Error as exc:
        raise lmdb_fault(exc, path, "open") from exc
    if file_ids(fd) != ids:  # swapped while LMDB opened them by name
        _ABANDONED.append(env)  # never closed: its locks may be shared (see NOTE)
        raise Foreign(path, "changed while it was opened (a file swapped for another)")
    if header is not None:
        try:
            with env.begin() as txn:
                names = {bytes(k) for k, _ in txn.cursor()}
        except lmdb.Error as exc:
            env.close()
            raise lmdb_fault(exc, path, "open") from exc
        if names - OWN_DATABASES:
            env.close()
            shown = ", ".join(sorted(repr(n.decode(errors="replace")) for n in names - OWN_DATABASES))
            raise StoreDamaged(path / "data.mdb", f"it holds databases fastload never makes ({shown})",
                               foreign=True)
    return env


def _open_read_only(cache_dir: CacheDir, *, pages: bool) -> Env:
    """The store of a directory this process cannot write, opened to read what it holds."""
    fd, path = cache_dir.packed_fd, cache_dir.packed_path()
    assert fd is not None
    crashed, _ = check_marks(fd)
    if crashed:
        raise StoreDamaged(path / "data.mdb", "the system went down while it was written, and it "
                                              "cannot be made anew in a read-only directory")
    ids = file_ids(fd)
    if ids[0] is None:
        raise StoreFault(errno.ENOENT, f"the packed store {path} is missing")
    held = _ENVS.get(ids[0])
    if held is not None:
        held.guard.check()
        return held
    return _new_env(fd, path, ids, read_only=True, pages=pages)  # type: ignore[arg-type]
