"""The ``shards/`` directory of a cache directory: whole shard files, their records, their
locks and the byte budget that evicts them (NOTE [the shard store] in :mod:`.shardstore`).

Layout, every name one component below ``shards/``, opened without following a symlink
(NOTE [a cache directory holds only fastload's files] in :mod:`.cachedir`)::

    <digest>.data     the shard's bytes (digest: xxh3-128 of its key, URL + version)
    <digest>.json     its record: key, size, xxh3-64 of the bytes; written after the data
    <digest>.lock     its flock: shared while a process reads it, exclusive to fill or evict
    budget.lock       held while space is made for a new shard
    .fastload-tmp-download-*  a shard being downloaded (counted in the budget from its start;
                      flocked by its downloader: NOTE [downloads of a killed process])
    .fastload-tmp-*   a record being written (a few hundred bytes, not counted)

Example::

    >>> files = ShardFiles(CacheDir(Path("/nvme/fastload"), create=True))
    >>> files.used()
    0
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import xxhash

from fastload.cache.cachedir import SHARDS, CacheDir
from fastload.cache.safefs import (
    FILE_FLAGS,
    TEMP_PREFIX,
    flock,
    listing,
    open_file,
    take_lock,
    write_temp,
)

logger = logging.getLogger(__name__)

__all__ = ["ShardFiles", "StoredShard", "file_checksum"]

_READ_CHUNK = 1 << 20
"""Bytes hashed per read: one buffer, reused, that stays in the CPU's cache between the copy
and the hash (fresh 8 MiB reads cost 5-7x the CPU: 0.41-0.45 s against 0.06-0.08 s for
21 shards of 16 MB from the page cache, measured on the 2-core test machine)."""
RECORD_MAGIC = "fastload shard"
DOWNLOAD_PREFIX = TEMP_PREFIX + "download-"
"""A download in progress, counted in the budget; other temporary files (a record being
written) are not: counted, a record's brief temporary file took a store filled to its budget
233 bytes past it."""

# NOTE [downloads of a killed process]
# A download counts in the budget from its first byte, so a process killed mid-download (a
# preempted job, the OOM killer) left a file that counted until `fastload cache clear` found
# it an hour old; a job preempted again and again filled its budget with them. A download's
# file is now flocked (exclusive) by its downloader from creation until its descriptor
# closes, after the rename (the lock goes with the process, however it ends). When a shard
# needs room, download files that no process holds and that have not been written for
# RECLAIM_AFTER_S are deleted first (`reclaim_downloads`, under budget.lock, as downloads
# are created, so a new one is never taken for dead before its lock).
RECLAIM_AFTER_S = 60.0
"""Seconds a download file must have gone unwritten before it may be reclaimed."""


def file_checksum(fd: int, size: int) -> str:
    """The xxh3-64 of the first ``size`` bytes of ``fd``, as 16 hex characters (of fewer
    bytes when the file is shorter: its record then does not match)."""
    h = xxhash.xxh3_64()
    view = memoryview(bytearray(min(_READ_CHUNK, max(size, 1))))
    offset = 0
    while offset < size:
        got = os.preadv(fd, [view[:min(len(view), size - offset)]], offset)
        if got <= 0:
            break
        h.update(view[:got])
        offset += got
    return h.hexdigest()


def _allocate(fd: int, size: int) -> None:
    """Give the file its blocks at once: a full disk fails the download before it starts,
    and the blocks of a shard are allocated together rather than as 8 parts land in turn. A
    filesystem without fallocate keeps the file sparse."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


@dataclass(frozen=True)
class StoredShard:
    """A shard file in ``shards/``: its digest, bytes and when it was last used."""

    digest: str
    size: int
    used_at: float


class ShardFiles:
    """The ``shards/`` directory of ``cache_dir`` (created on first use)."""

    def __init__(self, cache_dir: CacheDir) -> None:
        self.cache_dir = cache_dir
        self.path = cache_dir.path / SHARDS
        self.fd = cache_dir.shards_fd()

    def open_lock(self, digest: str) -> int:
        """A descriptor of ``<digest>.lock`` (never truncated), for flock."""
        return open_file(self.fd, f"{digest}.lock", os.O_RDWR | os.O_CREAT, self.path)

    @contextlib.contextmanager
    def budget_lock(self, timeout: float) -> Iterator[bool]:
        """Hold ``budget.lock``: True when taken within ``timeout`` seconds."""
        with flock(self.fd, "budget.lock", timeout, self.path) as got:
            yield got

    def record(self, digest: str) -> dict[str, Any] | None:
        """The record of ``digest``; None when missing, unreadable or not fastload's."""
        try:
            with os.fdopen(open_file(self.fd, f"{digest}.json", os.O_RDONLY, self.path), "rb") as f:
                record = json.loads(f.read(1 << 16))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("magic") == RECORD_MAGIC else None

    def open_checked(self, digest: str, key: str, size: int, *,
                     verify: bool) -> tuple[int | None, str | None]:
        """A read descriptor of the shard's data if it matches its record and ``key`` and
        holds ``size`` bytes (and, with ``verify``, the record's checksum; call with its lock
        held), else None and why (None: there is no file)."""
        record = self.record(digest)
        data_fd = self.open_data(digest)
        if data_fd is None:
            return None, None
        problem = None
        actual = os.fstat(data_fd).st_size
        if record is None:
            problem = "it has no record"
        elif record.get("key") != key:
            problem = "its record names another shard"
        elif not actual == record.get("size") == size:
            problem = f"it holds {actual} bytes, its record {record.get('size')}, the index {size}"
        elif verify and file_checksum(data_fd, actual) != record.get("xxh3"):
            problem = "its checksum does not match its record (a damaged file)"
        if problem is None:
            return data_fd, None
        os.close(data_fd)
        return None, problem

    def open_data(self, digest: str) -> int | None:
        """A read descriptor of ``<digest>.data``; None when missing (or foreign)."""
        try:
            return open_file(self.fd, f"{digest}.data", os.O_RDONLY, self.path)
        except OSError:
            return None

    def new_temp(self, size: int) -> tuple[str, int]:
        """A new temporary file of ``size`` bytes (sparse) for a download: its name and a
        read-write descriptor, which holds the file's flock until it is closed (call under
        :meth:`budget_lock`). It counts in :meth:`used` from now on."""
        name = DOWNLOAD_PREFIX + secrets.token_hex(8)
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o666, dir_fd=self.fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # NOTE [downloads of a killed process]
            os.ftruncate(fd, size)
            _allocate(fd, size)
        except BaseException:
            os.close(fd)
            self.remove_temp(name)
            raise
        return name, fd

    def reserve(self, size: int, budget: int, keep: str, *, must: bool, timeout: float,
                let_go: Callable[[], bool]) -> tuple[tuple[str, int] | None, int, int]:
        """Room for a shard of ``size`` bytes in ``budget`` and its temporary file
        (:meth:`new_temp`), made under :meth:`budget_lock` so that two downloads never count
        the same free bytes: shards are evicted (:meth:`evict`, never ``keep``), and while it
        does not fit and ``must``, ``let_go()`` lets go of one of the caller's own shards
        (False: none left) and eviction goes on. Returns the file (None: no room and not
        ``must``; with ``must`` it is made beyond the budget), the bytes in use besides it
        (0 when the lock was not had in ``timeout`` s) and the shards evicted."""
        with self.budget_lock(timeout) as got:
            used, evicted = self.evict(size, budget, keep) if got else (0, 0)
            while got and must and used + size > budget and let_go():
                used, more = self.evict(size, budget, keep)
                evicted += more
            fits = used + size <= budget if got else must
            # the file counts in the budget before the lock goes
            return (self.new_temp(size) if fits or must else None), used, evicted

    def remove_temp(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def publish(self, temp: str, digest: str, record: dict[str, Any]) -> None:
        """Move the finished ``temp`` to ``<digest>.data``, then write its record (call with
        the shard's lock held exclusively: a reader sees both or neither)."""
        os.replace(temp, f"{digest}.data", src_dir_fd=self.fd, dst_dir_fd=self.fd)
        body = json.dumps({"magic": RECORD_MAGIC, **record}).encode()
        name = write_temp(self.fd, [body])
        os.replace(name, f"{digest}.json", src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def touch(self, digest: str) -> None:
        """Mark ``digest`` used now (its record's mtime orders eviction, least recent first)."""
        with contextlib.suppress(OSError):
            os.utime(f"{digest}.json", dir_fd=self.fd, follow_symlinks=False)

    def remove(self, digest: str) -> None:
        """Delete the shard's data and record (call with its lock held exclusively)."""
        for name in (f"{digest}.json", f"{digest}.data"):
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=self.fd)

    def stored(self) -> tuple[int, list[StoredShard]]:
        """Bytes the shard files and downloads in progress take, and the finished shards."""
        for _ in range(8):  # then, with files finishing all the time, a count that may be short
            scan, whole = self._scan()
            if whole:
                break
        return scan

    def _scan(self) -> tuple[tuple[int, list[StoredShard]], bool]:
        """One pass of :meth:`stored`, and False when a download was renamed into place during
        it (its bytes were under neither name: the pass counts less than the disk holds)."""
        used, shards, whole = 0, [], True
        for name in listing(self.fd):
            if not (name.endswith(".data") or name.startswith(DOWNLOAD_PREFIX)):
                continue
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                whole = whole and not name.startswith(DOWNLOAD_PREFIX)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            used += st.st_size
            if name.endswith(".data"):
                digest = name[: -len(".data")]
                try:
                    used_at = os.stat(f"{digest}.json", dir_fd=self.fd, follow_symlinks=False).st_mtime
                except FileNotFoundError:
                    used_at = 0.0  # no record: not servable, the first to go
                shards.append(StoredShard(digest, st.st_size, used_at))
        return (used, shards), whole

    def used(self) -> int:
        """Bytes the shard files and downloads in progress take."""
        return self.stored()[0]

    def reclaim_downloads(self, grace: float = RECLAIM_AFTER_S) -> int:
        """Delete the download files of processes that are gone (NOTE [downloads of a killed
        process]): no process holds their lock and none was written for ``grace`` seconds.
        Call under :meth:`budget_lock`; the bytes freed."""
        freed = 0
        for name in listing(self.fd):
            if not name.startswith(DOWNLOAD_PREFIX):
                continue
            try:
                fd = open_file(self.fd, name, os.O_RDONLY, self.path)
            except OSError:  # gone meanwhile, or not fastload's (Foreign): left alone
                continue
            try:
                st = os.fstat(fd)
                if time.time() - st.st_mtime < grace or not take_lock(fd, fcntl.LOCK_EX, 0):
                    continue
                self.remove_temp(name)
                freed += st.st_size
                logger.info("deleted %s/%s (%d bytes): the download of a process that is gone",
                            self.path, name, st.st_size)
            finally:
                os.close(fd)
        return freed

    def evict(self, need: int, budget: int, keep: str) -> tuple[int, int]:
        """Delete least recently used shards no process holds until ``need`` more bytes fit
        in ``budget`` (call under :meth:`budget_lock`); never ``keep``. Downloads of processes
        that are gone go first (:meth:`reclaim_downloads`). Returns the bytes in use after it
        and the shards deleted."""
        used, shards = self.stored()
        if used + need > budget:
            used -= self.reclaim_downloads()
        evicted = 0
        for shard in sorted(shards, key=lambda s: s.used_at):
            if used + need <= budget:
                break
            if shard.digest == keep:
                continue
            try:
                fd = self.open_lock(shard.digest)
            except OSError:
                continue
            try:
                if not take_lock(fd, fcntl.LOCK_EX, 0):
                    continue  # a process reads it or fills it: never evicted under a reader
                self.remove(shard.digest)
                used -= shard.size
                evicted += 1
            finally:
                os.close(fd)  # releases the flock
        return used, evicted

    def clear(self) -> tuple[int, int]:
        """Delete every shard no process holds, every download of a process that is gone
        (NOTE [downloads of a killed process]) and any other temporary file an hour old (a
        record a crashed process was writing); (shards deleted, bytes freed)."""
        with self.budget_lock(30.0):
            before = self.used()
            _, evicted = self.evict(before + 1, 0, keep="")
            for name in listing(self.fd):
                if name.startswith(TEMP_PREFIX) and not name.startswith(DOWNLOAD_PREFIX):
                    with contextlib.suppress(OSError):
                        if time.time() - os.stat(name, dir_fd=self.fd).st_mtime > 3600:
                            self.remove_temp(name)
            return evicted, before - self.used()
