"""Whole shards in the cache directory, read by offset: the cache at shard granularity.

NOTE [the shard store]
A dataset packed into shards (tar, Parquet) reads many small ranges of few large objects. A
range request per sample makes a remote epoch request-bound, so a :class:`ShardStore` keeps
*whole shards* as files in the disk tier's directory (``shards/``, :mod:`.shardfiles`) and
serves each sample with one ``pread`` of its (offset, length) there:

* **Keyed by version.** A shard is a :class:`ShardRef`: URL, the version its index recorded
  (ETag / mtime + size, NOTE [object versions]) and size. Its file is named by the digest of
  URL + version, so a shard rewritten at the origin is a new file, never the old one served.
  Before a download the origin's version is asked once (``info``); a shard that changed
  since it was indexed raises :class:`ShardChangedError` instead of bytes of another version.
* **Downloaded once per node**, with concurrent range requests (:mod:`.shardfetch`: parts
  of 8 MiB, 8 in flight) into a temporary file, renamed into place when whole, then its
  record (size, xxh3-64) written beside it. Each shard has a lock file: a process reading it
  holds it shared (a *pin*), the one filling it exclusive, so the other processes of a node
  wait for the download (``lock_timeout``) and then read the file; one that waits too long
  gets :class:`ShardBusyError` and its caller reads its range from the origin instead.
* **Validated as entries are**: a file whose size differs from its record and ref, or (the
  first time a process opens it) whose checksum does not match, is deleted and downloaded
  again, never served.
* **A byte budget** (``CacheConfig.shard_budget``, else the disk tier's): before a download,
  the least recently used shards that no process pins are deleted until it fits (under
  ``budget.lock``, which is let go only once the download's file exists: downloads in
  progress count from their start, and two never take the same free bytes). A shard some
  process pins is never evicted, and nothing fastload did not write is touched. A read that
  finds no room downloads anyway (the epoch must go on, one warning); a download ahead of need
  (:meth:`ShardStore.ensure` with ``must=False``) waits for room instead.
* **Pins per process**: a process keeps at most ``keep_open`` shards pinned (the least
  recently read one is released first), so a reader moving through the shards in order
  frees the ones behind it for eviction: streaming from a store larger than the budget works
  (:mod:`.shardpins`).
* **Shared across nodes** through the cache's shared tiers other than the disk (Redis): a
  shard downloaded from the origin is published there whole under ``make_key(url,
  version)`` when it is at most ``publish_max`` bytes (the Redis tier chunks it and checks
  it), and a node that misses locally looks there before the origin.

Example::

    >>> store = open_shard_store(open_cache("/nvme/fastload"))
    >>> ref = ShardRef("s3://b/train-000000.tar", "b/train-000000.tar", '104857600:"9a.."', 104857600)
    >>> store.read(fs, ref, offset=1536, length=110_000)    # downloads the shard, then preads
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import Any

from fastload.cache.cachedir import CacheDir
from fastload.cache.config import parse_size
from fastload.cache.forks import after_fork
from fastload.cache.keys import digest
from fastload.cache.safefs import lock_to_fill, take_lock
from fastload.cache.shardfetch import download_ranges
from fastload.cache.shardfiles import ShardFiles, file_checksum
from fastload.cache.shardlanding import Downloads
from fastload.cache.shardpins import Holds, Pins, ShardPin
from fastload.cache.shardsource import (
    ShardBusyError,
    ShardChangedError,
    ShardFillingError,
    ShardRef,
    changed_while,
    check_version,
    from_shared,
    publish,
)
from fastload.cache.tier import Tier

logger = logging.getLogger(__name__)

__all__ = [
    "ShardBusyError", "ShardChangedError", "ShardFillingError", "ShardRef", "ShardStore",
]

PUBLISH_MAX = 256 << 20
"""Largest shard published whole to a shared tier (Redis) by default."""

_AROUND_POLL_S = 0.005
"""How often a read waiting to open a shard looks whether this process downloads it."""


class _Downloading(Exception):
    """Raised to a read waiting to open a shard that this process has begun to download."""


class ShardStore:
    """Whole shards below ``directory``/shards, at most ``budget`` bytes (NOTE [the shard store]).

    Args:
        directory: a fastload cache directory (the disk tier's).
        budget: bytes of shard files; a size such as ``"200GB"``.
        shared: tiers other nodes see (Redis), where shards are published and looked up.
        keep_open: shards this process pins at most (a reader's window of shards, plus one).
        lock_timeout: seconds to wait for another process filling or holding a shard.
        publish_max: largest shard published to ``shared`` tiers, in bytes.

    Attributes:
        downloads, requests, from_shared, evicted, early, around: this process's counts
            (shards fetched from the origin, range requests made, shards copied from a
            shared tier, shards it evicted, samples read from a download in progress as
            their bytes landed, samples read from the origin while their shard downloaded).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        budget: int | str,
        shared: list[Tier] | None = None,
        keep_open: int = 8,
        lock_timeout: float = 60.0,
        publish_max: int = PUBLISH_MAX,
    ) -> None:
        self.directory = Path(directory)
        self.budget = parse_size(budget, name="shard_budget")
        self.shared = list(shared or [])
        self.keep_open = max(1, int(keep_open))
        self.lock_timeout = float(lock_timeout)
        self.publish_max = int(publish_max)
        self.downloads = self.requests = self.from_shared = self.evicted = 0
        self._files: ShardFiles | None = None
        self._setup()
        after_fork(self, ShardStore._after_fork)  # NOTE [locks across fork]

    def _after_fork(self) -> None:
        """In a forked child: close the parent's pins (the parent's own descriptors keep its
        locks) so that they go when the parent lets go of them, and pin anew."""
        self._pins.close_inherited()
        self._holds.close_inherited()
        self._setup()

    def _setup(self) -> None:
        self._mutex = threading.Lock()
        self._pins = Pins(self.keep_open)
        self._holds = Holds()
        self._opening: dict[str, threading.Lock] = {}
        self._verified: set[str] = set()
        self._held_damaged: set[str] = set()
        self._downloads = Downloads()  # shards this process is downloading now
        self._warned = False
        self._files = None  # a forked child opens its own descriptors

    def __reduce__(self):
        return (_reopen, (str(self.directory), self.budget, self.shared, self.keep_open,
                          self.lock_timeout, self.publish_max))

    @property
    def early(self) -> int:
        """Reads this process answered from a download in progress as their bytes landed."""
        return self._downloads.early

    @property
    def around(self) -> int:
        """Reads this process sent to the origin while it downloaded their shard."""
        return self._downloads.around

    def __repr__(self) -> str:
        return f"ShardStore({str(self.directory)!r}, budget={self.budget} bytes)"

    @property
    def files(self) -> ShardFiles:
        """The ``shards/`` directory (:mod:`.shardfiles`), opened in this process."""
        if self._files is None:
            self._files = ShardFiles(CacheDir(self.directory, create=False))
        return self._files

    # -- reading ---------------------------------------------------------------------------

    def read(self, fs: Any, ref: ShardRef, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of the shard, from its local file (downloaded
        first if needed), or from a download of it in progress in this process as they land
        (NOTE [reads from a download in progress] in :mod:`.shardlanding`). Raises
        :class:`ShardBusyError` (:class:`ShardFillingError` when this process downloads it
        now and the range's part has not begun: NOTE [reads around a download] in
        :mod:`fastload.data.shard_cache_use`), :class:`ShardChangedError` or the download's
        error."""
        d = digest(ref.key)
        while True:
            data = self._downloads.read(d, ref.url, offset, length)
            if data is not None:
                return data
            try:
                pin = self._pin(fs, ref, d, use=True)
                break
            except _Downloading:
                continue  # the download began while this read waited: read from it
        try:
            data = os.pread(pin.data_fd, length, offset)
        finally:
            self._pins.done(pin)
        if len(data) != length:
            raise OSError(f"{ref.url}: {len(data)} of {length} bytes at {offset} in its local copy "
                          f"{self.files.path} (the range lies past the shard's end)")
        return data

    def local_path(self, fs: Any, ref: ShardRef) -> Path:
        """The local file of the shard (downloaded if needed), pinned while this store keeps
        it open (the ``keep_open`` most recently read): for readers that open it themselves."""
        self._pin(fs, ref, digest(ref.key))
        return self.files.path / f"{digest(ref.key)}.data"

    def ensure(self, fs: Any, ref: ShardRef, *, must: bool = False, hold: bool = False) -> str:
        """Make sure the shard is in the store without pinning it (a download ahead of need);
        with ``hold``, hold it (:meth:`release_hold`) so that no download evicts it before its
        reader comes (NOTE [downloads ahead are held until read] in :mod:`.shardahead`).

        Returns "hit", "fetched", "shared" (copied from a shared tier), "no room" (the
        budget is taken by shards in use and ``must`` is False: nothing was downloaded) or
        "busy" (another process held the shard past the waits, filling or reading it: it was
        not seen whole, and is not held)."""
        d = digest(ref.key)
        with self._mutex:
            gate = self._opening.setdefault(d, threading.Lock())
        with gate:  # after a reader of this process that opens it, if one does
            if d in self._pins:
                return "hit"
            lock_fd: int | None = self.files.open_lock(d)
            try:
                outcome = self._ensure_locked(fs, ref, d, lock_fd, must=must)
                if hold and outcome in ("hit", "fetched", "shared"):
                    fcntl.flock(lock_fd, fcntl.LOCK_SH)  # from exclusive after a fill
                    self._holds.add(d, lock_fd)
                    lock_fd = None
                return outcome
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)

    def _ensure_locked(self, fs: Any, ref: ShardRef, d: str, lock_fd: int, *, must: bool) -> str:
        """:meth:`ensure` on the shard's lock: shared first (a shard other readers hold is
        there; a download of another process is waited for), then exclusive, briefly, unless
        another process fills it meanwhile (NOTE [waiting for another's download] in
        :mod:`.safefs`). On "hit" the lock is held shared, after a fill exclusively; on
        "busy" or "no room" as it is."""
        if not take_lock(lock_fd, fcntl.LOCK_SH, self.lock_timeout):
            return "busy"  # filled elsewhere for too long: its reader sees to it
        if self._filled(d, ref):
            return "hit"
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        got = lock_to_fill(lock_fd, min(1.0, self.lock_timeout), lambda: self._filled(d, ref))
        if got is None:
            return "busy"
        if not got:  # another process filled it meanwhile
            return "hit" if take_lock(lock_fd, fcntl.LOCK_SH, 0) and self._filled(d, ref) else "busy"
        return "hit" if self._filled(d, ref) else self._fill(fs, ref, d, must=must)

    def release_hold(self, ref: ShardRef) -> None:
        """Let go of a shard held by :meth:`ensure` (``hold``): it may be evicted from now on
        unless a reader pins it."""
        self._holds.release(digest(ref.key))

    def release_all(self) -> None:
        """Unpin every shard this process pins or holds (they may be evicted from now on)."""
        self._pins.release_all()
        self._holds.release_all()

    close = release_all

    def _pin(self, fs: Any, ref: ShardRef, d: str, *, use: bool = False) -> ShardPin:
        pin = self._pins.use(d, use=use)
        if pin is not None:
            return pin
        with self._mutex:
            gate = self._opening.setdefault(d, threading.Lock())
        self._enter(gate, ref, d, around=use)
        try:  # threads of this process open a shard once
            pin = self._pins.use(d, use=use)
            if pin is None:
                pin = self._pins.add(d, self._open(fs, ref, d), use=use)
        finally:
            gate.release()
        return pin

    def _enter(self, gate: threading.Lock, ref: ShardRef, d: str, *, around: bool) -> None:
        """Take the shard's gate. A read (``around``) that finds another thread of this process
        downloading the shard meanwhile raises :class:`_Downloading` instead of waiting for
        the whole download: it reads from the download (NOTE [reads around a download])."""
        if not around:
            gate.acquire()
            return
        while not gate.acquire(timeout=_AROUND_POLL_S):
            if d in self._downloads:
                raise _Downloading(ref.url)

    def _open(self, fs: Any, ref: ShardRef, d: str) -> ShardPin:
        if d in self._held_damaged:
            raise ShardBusyError(f"the local copy of {ref.url} is damaged and held by another "
                                 "process; reading its ranges from the origin")
        files = self.files
        lock_fd = files.open_lock(d)
        try:
            for _ in range(3):
                if not take_lock(lock_fd, fcntl.LOCK_SH, self.lock_timeout):
                    raise self._busy(ref, f"held by another process for over {self.lock_timeout:g} "
                                          "s (lock_timeout)")
                data_fd, problem = self._valid(d, ref)
                if data_fd is not None:
                    files.touch(d)
                    return ShardPin(lock_fd, data_fd)
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
                # Missing: another process may be downloading it, wait for it. Damaged: the
                # processes that read it do not let go soon; the origin serves this one.
                wait = self.lock_timeout if problem is None else min(self.lock_timeout, 1.0)
                got = lock_to_fill(lock_fd, wait, lambda: self._filled(d, ref))
                if got is False:
                    continue  # another process filled it meanwhile: read it shared
                if got is None:
                    if problem is None:
                        raise self._busy(ref, f"held by another process for over "
                                              f"{self.lock_timeout:g} s (lock_timeout)")
                    self._held_damaged.add(d)
                    raise self._busy(ref, f"damaged ({problem}) and still read by another process")
                data_fd, problem = self._valid(d, ref)
                if data_fd is None:
                    if problem is not None:
                        logger.warning("the local copy of %s (%s) is not served: %s; it is "
                                       "downloaded again", ref.url, files.path / f"{d}.data", problem)
                    self._fill(fs, ref, d, must=True)
                else:
                    os.close(data_fd)
                fcntl.flock(lock_fd, fcntl.LOCK_SH)  # downgrade, then look again
            raise self._busy(ref, "evicted three times while it was opened")
        except BaseException:
            os.close(lock_fd)
            raise

    def _busy(self, ref: ShardRef, why: str) -> ShardBusyError:
        error = ShardBusyError(f"the local copy of {ref.url} in {self.files.path} was {why}; "
                               "its samples are read by range from the origin")
        logger.warning("%s", error)
        return error

    def _valid(self, d: str, ref: ShardRef) -> tuple[int | None, str | None]:
        """A descriptor of the shard's file if it is whole and checks out (call with its lock
        held; its checksum the first time this process opens it), else None and why (None:
        there is no file); the caller removes it under its exclusive lock, then downloads."""
        data_fd, problem = self.files.open_checked(d, ref.key, ref.size,
                                                   verify=d not in self._verified)
        if data_fd is not None:
            self._verified.add(d)
        return data_fd, problem

    def _filled(self, d: str, ref: ShardRef) -> bool:
        """Whether the shard's file is whole and checks out (call with its lock held)."""
        data_fd, _ = self._valid(d, ref)
        if data_fd is None:
            return False
        os.close(data_fd)
        return True

    # -- filling ---------------------------------------------------------------------------

    def _fill(self, fs: Any, ref: ShardRef, d: str, *, must: bool) -> str:
        """Download the shard into the store (its lock held exclusively); what happened."""
        files = self.files
        files.remove(d)  # a damaged copy, if any
        reserved = self._reserve(ref, d, must=must)
        if reserved is None:
            return "no room"
        temp, fd = reserved
        try:
            source = from_shared(self.shared, ref, fd)
            if source is not None:
                self._keep(ref, d, temp, fd, source, requests=0)
                return source
            check_version(fs, ref)
            with self._downloads.begun(d, fd, ref.size) as landing, changed_while(ref):
                requests = download_ranges(fs, ref.path, ref.size, fd, landing=landing,
                                           version=ref.version)  # read as it lands
                self._keep(ref, d, temp, fd, "fetched", requests=requests)
            return "fetched"
        except BaseException:
            files.remove_temp(temp)
            raise
        finally:
            os.close(fd)

    def _keep(self, ref: ShardRef, d: str, temp: str, fd: int, source: str, *,
              requests: int) -> None:
        """Count the shard written into ``fd`` and publish it: its file and record in the
        store, its bytes to the shared tiers when it came from the origin."""
        with self._mutex:
            self.requests += requests
            self.downloads += source == "fetched"
            self.from_shared += source == "shared"
        self.files.publish(temp, d, {"key": ref.key, "url": ref.url, "size": ref.size,
                                     "xxh3": file_checksum(fd, ref.size)})
        self._verified.add(d)
        if source == "fetched" and ref.size <= self.publish_max:
            publish(self.shared, ref, fd)

    def _reserve(self, ref: ShardRef, d: str, *, must: bool) -> tuple[str, int] | None:
        """Room for the shard and its temporary file (:meth:`ShardFiles.reserve`; a read that
        needs room first lets go of this process's own older shards); None when there is no
        room and ``must`` is False."""
        files = self.files
        temp, used, evicted = files.reserve(ref.size, self.budget, d, must=must,
                                            timeout=self.lock_timeout,
                                            let_go=self._pins.release_oldest)
        with self._mutex:
            self.evicted += evicted
        if must and used + ref.size > self.budget and not self._warned:
            self._warned = True
            logger.warning(
                "shard budget of %d bytes in %s is taken by %d bytes of shards in use; %s "
                "(%d bytes) is downloaded beyond it. Raise shard_budget to at least a few "
                "shards per reading process, or lower shuffle_window",
                self.budget, files.path, used, ref.url, ref.size)
        return temp


def _reopen(directory: str, budget: int, shared: list[Tier], keep_open: int,
            lock_timeout: float, publish_max: int) -> ShardStore:
    return ShardStore(directory, budget=budget, shared=shared, keep_open=keep_open,
                      lock_timeout=lock_timeout, publish_max=publish_max)
