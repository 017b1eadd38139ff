"""The disk tier: a size-bounded cache directory that many processes share and restarts keep.

Layout of a cache directory (opened through :class:`~fastload.cache.cachedir.CacheDir`)::

    fastload-cache.json     marks the directory as fastload's (magic, format, version, budget)
    packed/                 format "packed" (new directories): the LMDB store of every object
                            below 1 MiB, the index of all and ``used`` (NOTE [packed store])
    entries/ab/<hash>       one file per object, named by the xxh3-128 of its key (format
                            "files": every object; "packed": objects of 1 MiB and more)
    locks/<stripe>.lock     per-key fetch locks, 4096 stripes (bounded number of files)
    tmp/                    files being written; moved into entries/ by os.replace
    used                    format "files": bytes in entries/ (updated under .index.lock)
    stats.json              hits, misses, puts... recorded by every process that used it

NOTE [disk tier across processes]
* Writes are atomic: an entry is written to tmp/ and ``os.replace``d into place, so a reader
  sees a whole entry or none. Each read validates size and xxh64 (:mod:`.entry`); a corrupt or
  truncated entry (a crash, a bad disk) is deleted and reported as a miss.
* Format "packed": a put is one LMDB write transaction that checks the budget and updates
  ``used`` with the record; a get one read transaction (:mod:`.packed`). Format "files":
  the byte budget is kept in ``used``, read and written under ``.index.lock`` together with
  the entry's rename, so concurrent writers never overshoot it. ``fastload cache stats`` and
  ``verify`` recount it from the files (:mod:`.maintenance`).
* ``lock(key)`` is a file lock per key stripe: the cache holds it while it fetches a missing
  object, so processes on a node download each object once.
* A full disk (ENOSPC, EDQUOT, EFBIG) or, under policy "keep", an exhausted budget makes the
  tier pass-through in that process: one warning, reads go to the origin, training goes on.
* Nothing is read, written or deleted through a symlink or in a directory fastload did not
  make (NOTE [a cache directory holds only fastload's files]); such names are misses here.

Example::

    >>> tier = DiskTier("/nvme/fastload", size="500GB")
    >>> tier.put("s3://b/a.jpg#v=3", b"abc")
    True
    >>> tier.get("s3://b/a.jpg#v=3")
    b'abc'
"""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing.util
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fastload.cache import entry, maintenance
from fastload.cache.cachedir import CacheDir, Foreign, Found, LockTimeout
from fastload.cache.config import DISK_FORMATS, POLICIES, DiskFormat, Policy, parse_size
from fastload.cache.diskstats import StatsRecorder
from fastload.cache.keys import digest
from fastload.cache.packed import (
    FILE_MIN,
    IN_FILE,
    PackedStore,
    StoreFault,
    accounted,
    pointer,
    record_key,
)
from fastload.cache.tier import Tier, TierStats
from fastload.errors import ConfigError

logger = logging.getLogger(__name__)

LOCK_STRIPES = 4096
INDEX_TIMEOUT_S = 30.0
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_LRU_LOW_WATER = 0.9  # an LRU eviction frees down to 90% of the budget, so scans are rare

class DiskTier(Tier):
    """Objects in files below ``directory``, at most ``size`` bytes, under ``policy``.

    Args:
        directory: the cache directory; created if missing. A non-empty directory without
            fastload's marker is refused (CacheError), so a user's directory is never adopted.
        size: byte budget ("500GB"), recorded in the directory for ``fastload cache stats``
            and later opens; None = the budget recorded there, else the default (half the
            free space when the directory was created).
        policy: "keep" (admit until full) or "lru" (evict least recently read).
        create: False to open only an existing cache (the command line's stats/verify/clear).
        format: "packed" or "files" (NOTE [cache formats]); None = the directory's, and
            "packed" for a new one. Another format than the directory's is a ConfigError.

    Attributes:
        cache_dir: the opened directory (:class:`~fastload.cache.cachedir.CacheDir`).
        recorder: adds this process's counters to the directory's stats.json.
        budget: the byte budget in effect.
        budget_source: "disk_size" when some process gave one, else "default".
    """

    name = "disk"
    shared = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        size: int | str | None = None,
        policy: Policy = "keep",
        create: bool = True,
        format: DiskFormat | None = None,
    ) -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ConfigError(f"cache policy must be 'keep' or 'lru', got {policy!r}")
        if format is not None and format not in DISK_FORMATS:
            raise ConfigError(f"disk_format must be 'packed' or 'files', got {format!r}")
        budget = parse_size(size, name="disk_size") if size is not None else None
        self.directory = Path(os.path.expanduser(os.fspath(directory))).absolute()
        self.policy: Policy = policy
        self._size_arg = size
        self.cache_dir = CacheDir(self.directory, create=create, format=format)
        self.format: DiskFormat = self.cache_dir.format  # type: ignore[assignment]
        if format is not None and format != self.format:
            raise ConfigError(
                f"{self.directory} holds a disk cache of format {self.format!r}, not {format!r}; "
                f"leave disk_format unset to use the directory as it is, or give a new directory "
                f"for a cache of format {format!r}"
            )
        self.packed = PackedStore(self.cache_dir, lru=policy == "lru") if self.format == "packed" else None
        if budget is not None:
            self._record_budget(budget)
        recorded = self.cache_dir.marker.get("budget")
        self.budget_source = "default" if budget is None and recorded is None else "disk_size"
        if budget is None:
            budget = recorded if recorded is not None else self.cache_dir.marker["default_size"]
        self.budget: int = budget
        self._passthrough = False
        self._warned: set[str] = set()
        self.recorder = StatsRecorder(self.cache_dir, self.stats)
        multiprocessing.util.Finalize(self, self.recorder.flush, exitpriority=10)

    def __reduce__(self):  # reopened in each process (workers), with fresh counters
        return (_reopen_disk_tier, (str(self.directory), self._size_arg, self.policy, self.format))

    def __repr__(self) -> str:
        return (f"DiskTier({str(self.directory)!r}, budget={self.budget} bytes, policy={self.policy!r}, "
                f"format={self.format!r})")

    def _record_budget(self, budget: int) -> None:
        """Remember the budget in the marker, so `cache stats` shows the one the loader used."""
        if self.cache_dir.marker.get("budget") == budget:
            return
        try:
            with self.cache_dir.index_lock(INDEX_TIMEOUT_S):
                self.cache_dir.update_marker(budget=budget)
        except (OSError, LockTimeout) as exc:
            logger.debug("could not record disk_size=%d in %s: %s", budget, self.directory, exc)

    def path_of(self, key: str) -> Path:
        """The entry file of ``key`` (inside the directory whatever the key holds)."""
        return self.cache_dir.entry_path(digest(key))

    # -- the Tier contract ----------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        if self.packed is None:
            return self._get_file(key)
        d = entry.packed_digest(key)
        try:
            value = self.packed.get(d, key)
        except entry.KeyMismatch as other:
            if entry.packed_digest(other.args[0]) == d:
                return self._miss()  # a true xxh3-128 collision: another key's record
            why = f"its header names key {other.args[0]!r}, not stored under this digest"
        except entry.CorruptEntry as exc:
            why = str(exc)
        except OSError as exc:
            self._warn_once("read", "disk cache %s cannot be read (%s); reading the origin", self.directory, exc)
            return self._miss()
        else:
            if value is None:
                return self._miss()
            if value is IN_FILE:
                return self._get_file(key)
            self.stats.hits += 1
            self.stats.bytes_read += len(value)  # type: ignore[arg-type]
            self.recorder.maybe_flush()
            return value  # type: ignore[return-value]
        self.stats.corrupt += 1
        logger.warning("dropping corrupt cache entry %s (%s) in %s; it is fetched again", key, why, self.cache_dir.packed_path())
        self.delete(key)
        return self._miss()

    def _get_file(self, key: str) -> bytes | None:
        name = digest(key)
        try:
            with self.cache_dir.open_entry(name) as f:
                blob = f.read()
        except FileNotFoundError:
            return self._miss()
        except OSError as exc:  # Foreign too: a symlink is never read through
            self._warn_once("read", "disk cache %s cannot be read (%s); reading the origin", self.directory, exc)
            return self._miss()
        try:
            value = entry.decode(blob, expect_key=key)
        except entry.KeyMismatch as other:
            if digest(other.args[0]) == name:
                return self._miss()  # a true xxh3-128 collision: another key's entry
            why = f"its header names key {other.args[0]!r}, not stored under this name"
        except entry.CorruptEntry as exc:
            why = str(exc)
        else:
            if self.policy == "lru" and self.packed is None:
                with contextlib.suppress(OSError):
                    self.cache_dir.touch_entry(name)
            self.stats.hits += 1
            self.stats.bytes_read += len(value)
            self.recorder.maybe_flush()
            return value
        self.stats.corrupt += 1
        logger.warning("dropping corrupt cache entry %s (%s) at %s; it is fetched again", key, why, self.path_of(key))
        if self.packed is not None:
            self.delete(key)
        else:
            self.drop_entry(name)
        return self._miss()

    def _miss(self) -> None:
        self.stats.misses += 1
        self.recorder.maybe_flush()

    def contains(self, key: str) -> bool:
        """Whether a complete entry of ``key`` is there: header and file size, no checksum."""
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """:meth:`contains` of each key; format "packed": one read transaction for all."""
        if self.packed is None:
            return [self._file_complete(key) for key in keys]
        try:
            found = self.packed.contains([entry.packed_digest(k) for k in keys])
        except OSError as exc:
            self._warn_once("read", "disk cache %s cannot be read (%s); reading the origin", self.directory, exc)
            return [False] * len(keys)
        return [self._file_complete(k) if f is IN_FILE else bool(f) for k, f in zip(keys, found)]

    def _file_complete(self, key: str) -> bool:
        try:
            with self.cache_dir.open_entry(digest(key)) as f:
                header, start = entry.read_file_header(f)
                return header["key"] == key and os.fstat(f.fileno()).st_size == start + header["size"]
        except (OSError, entry.CorruptEntry):
            return False

    def put(self, key: str, value: bytes) -> bool:
        if self.packed is None:
            return self._put_file(key, value)
        return self.put_many([(key, value)])[0]

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> list[bool]:
        """Store many entries, each as :meth:`put`; format "packed": one write transaction for
        the objects below 1 MiB (larger ones: a file each, then their pointers)."""
        items = list(items)
        if self.packed is None:
            return [self._put_file(key, value) for key, value in items]
        if self._passthrough:
            self.stats.rejected += len(items)
            return [False] * len(items)
        small = [i for i, (_, v) in enumerate(items) if len(v) < FILE_MIN]
        results = [False] * len(items)
        try:
            records = [(entry.packed_digest(items[i][0]), entry.encode_packed(*items[i])) for i in small]
            for i, status, (_, rec) in zip(small, self.packed.put_many(records, self.budget), records):
                results[i] = self._admitted(status, len(items[i][1]), len(rec))
            for i in sorted(set(range(len(items))) - set(small)):
                results[i] = not self._passthrough and self._put_large(*items[i])
        except OSError as exc:
            self._fault(exc)
            return results
        self.recorder.maybe_flush()
        return results

    def _admitted(self, status: str, value_bytes: int, n: int) -> bool:
        if status == "stored":
            self.stats.puts += 1
            self.stats.bytes_written += value_bytes
            return True
        if status == "exists":
            return True
        if status == "full" and not self._passthrough:
            self._exhausted(self.read_used(), n)
        else:
            self.stats.rejected += 1
        return False

    def _put_large(self, key: str, value: bytes) -> bool:
        """A large object in packed format: its file first, then its pointer (budget, used)."""
        assert self.packed is not None
        name, d = digest(key), entry.packed_digest(key)
        if self.packed.contains([d])[0] is IN_FILE and self._file_complete(key):
            return True
        header = entry.encode_header(key, value)
        n = len(header) + len(value)
        if n > self.budget:
            self.stats.rejected += 1
            return False
        self.cache_dir.store_entry(name, (header, value))
        status = self.packed.put_many([(d, pointer(key, n))], self.budget)[0]
        if status in ("full", "oversized"):
            self.cache_dir.remove_entry(name)  # the file this put wrote, never another's
        return self._admitted(status, len(value), n)

    def _put_file(self, key: str, value: bytes) -> bool:
        if self._passthrough:
            self.stats.rejected += 1
            return False
        header = entry.encode_header(key, value)
        n = len(header) + len(value)
        name = digest(key)
        try:
            with self.cache_dir.index_lock(INDEX_TIMEOUT_S):
                if self.cache_dir.entry_stat(name) is not None:
                    return True
                used = self.read_used()
                if used + n > self.budget and self.policy == "lru":
                    used = self._evict(n)
                if used + n > self.budget:
                    self._exhausted(used, n)
                    return False
                self.cache_dir.store_entry(name, (header, value))
                self.cache_dir.write_used(used + n)
        except LockTimeout:
            self._warn_once("lock", "disk cache %s: index lock busy for %ss; entry not stored", self.directory, INDEX_TIMEOUT_S)
            self.stats.rejected += 1
            return False
        except OSError as exc:
            self._fault(exc)
            return False
        self.stats.puts += 1
        self.stats.bytes_written += len(value)
        self.recorder.maybe_flush()
        return True

    def _evict(self, need: int) -> int:
        """Delete least recently read entries (LRU) until ``need`` more bytes fit; new ``used``."""
        files = sorted(self.entries(), key=lambda f: f.mtime)
        used = sum(f.size for f in files)
        target = min(self.budget - need, int(self.budget * _LRU_LOW_WATER))
        for f in files:
            if used <= target:
                break
            if self.misnamed(f.name) is None:
                with contextlib.suppress(OSError):
                    used -= self.cache_dir.remove_entry(f.name) or 0
        return used

    def _exhausted(self, used: int, n: int) -> None:
        self.stats.rejected += 1
        if n > self.budget:
            return  # one oversized object; the tier stays useful for the others
        self._passthrough = True
        self._warn_once(
            "full",
            "disk cache %s is full (%d of %d bytes used); policy 'keep' keeps what it has and "
            "reads of other objects go to the origin. Raise disk_size to cache more",
            self.directory, used, self.budget,
        )

    def _fault(self, exc: OSError) -> None:
        self.stats.rejected += 1
        if exc.errno in _FULL_ERRNOS or isinstance(exc, StoreFault):
            self._passthrough = True
            self._warn_once(
                "nospace",
                "disk cache %s cannot write (%s); it is now pass-through: reads go to the "
                "origin and training goes on. Free space or lower disk_size",
                self.directory, exc,
            )
        elif isinstance(exc, Foreign):
            self._warn_once(
                "foreign", "disk cache %s: %s; entry not stored (see `fastload cache verify %s`)",
                self.directory, exc, self.directory,
            )
        else:
            self._warn_once("write", "disk cache %s cannot write (%s); entry not stored", self.directory, exc)

    def _warn_once(self, what: str, msg: str, *args: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(msg, *args)

    def delete(self, key: str) -> None:
        if self.packed is None:
            self.drop_entry(digest(key))
            return
        try:
            rec = self.packed.delete(entry.packed_digest(key))
            if rec is not None and rec[:4] == b"FLPF":
                self.cache_dir.remove_entry(digest(key))
        except OSError as exc:
            self._warn_once("drop", "disk cache %s: cannot delete %s (%s)", self.directory, key, exc)

    def keys(self) -> Iterator[str]:
        if self.packed is not None:
            for _, rec in self.packed.records():
                with contextlib.suppress(entry.CorruptEntry):
                    yield record_key(rec)
            return
        for f in self.entries():
            try:
                with self.cache_dir.open_entry(f.name) as fh:
                    yield entry.read_file_header(fh)[0]["key"]
            except (OSError, entry.CorruptEntry):
                continue

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        """A cross-process lock on ``key``'s stripe (see :class:`~fastload.cache.tier.KeyLocking`)."""
        stripe = int(digest(key)[:3], 16) % LOCK_STRIPES
        return self._stripe_lock(f"{stripe:03x}.lock", timeout)

    @contextlib.contextmanager
    def _stripe_lock(self, name: str, timeout: float) -> Iterator[bool]:
        with contextlib.ExitStack() as held:
            try:
                got = held.enter_context(self.cache_dir.lock(name, timeout))
            except OSError as exc:  # a foreign lock file: fetch without the lock
                self._warn_once("lockfile", "disk cache %s: cannot use a lock file (%s); fetching without it", self.directory, exc)
                got = False
            yield got

    def close(self) -> None:
        self.recorder.flush()
        if self.packed is not None:
            try:
                self.packed.flush()
            except OSError as exc:
                logger.debug("disk cache %s: could not flush the packed store: %s", self.directory, exc)

    # -- what maintenance (fastload.cache.maintenance) uses ------------------------------

    def entries(self) -> Iterator[Found]:
        """fastload's entries: format "files": its entry files; "packed": one per record
        (the large objects' pointers included), named by the digest's hex."""
        if self.packed is not None:
            where = self.cache_dir.packed_path() / "data.mdb"
            return (Found(where, d.hex(), accounted(rec)) for d, rec in self.packed.records())
        return (f for f in self.cache_dir.walk_entries() if f.foreign is None)

    def read_used(self) -> int:
        """Bytes of the entries (format "files": call under the index lock; recounted if the
        counter is unreadable)."""
        if self.packed is not None:
            return self.packed.used()
        used = self.cache_dir.read_used()
        return used if used is not None else sum(f.size for f in self.entries())

    def misnamed(self, name: str) -> str | None:
        """Why the entry file ``name`` is not provably its key's (its header key digests to
        another name); None when it is, or when its header is unreadable (a damaged entry)."""
        try:
            with self.cache_dir.open_entry(name) as f:
                key = entry.read_file_header(f)[0]["key"]
        except (OSError, entry.CorruptEntry):
            return None
        if isinstance(key, str) and digest(key) == name:
            return None
        return f"its header names key {key!r}, which is not stored under this file name"

    def drop_entry(self, name: str) -> None:
        """Delete the entry file ``name`` (a digest) and count its bytes out of ``used``."""
        try:
            with self.cache_dir.index_lock(INDEX_TIMEOUT_S):
                size = self.cache_dir.remove_entry(name)
                if size is not None:
                    self.cache_dir.write_used(self.read_used() - size)
        except (OSError, LockTimeout) as exc:
            self._warn_once("drop", "disk cache %s: cannot delete %s (%s)", self.directory, name, exc)

    # -- the `fastload cache` commands (see fastload.cache.maintenance) -----------------

    def rescan(self) -> tuple[int, int]:
        """Recount entries and bytes from the files, store the count; (entries, bytes)."""
        return maintenance.rescan(self)

    def verify(self, *, drop: bool = False) -> maintenance.CorruptReport:
        """Check every entry; name the corrupt ones (deleted if ``drop``) and the foreign names."""
        return maintenance.verify(self, drop=drop)

    def clear(self) -> maintenance.ClearReport:
        """Delete every entry and stale temporary file of fastload's; report what was left alone."""
        return maintenance.clear(self)

    def summary(self) -> dict[str, Any]:
        """Entries, bytes, budget and the counters recorded by every process (for ``cache stats``)."""
        return maintenance.summary(self)

    def recorded_stats(self) -> TierStats:
        """The counters every process has recorded in ``stats.json`` (plus this one's unflushed)."""
        return maintenance.recorded_stats(self)


def _reopen_disk_tier(directory: str, size: int | str | None, policy: Policy, format: DiskFormat) -> DiskTier:
    return DiskTier(directory, size=size, policy=policy, format=format)
