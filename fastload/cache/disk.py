"""The disk tier: a size-bounded cache directory that many processes share and restarts keep.

Layout of a cache directory (opened through :class:`~fastload.cache.cachedir.CacheDir`)::

    fastload-cache.json     marks the directory as fastload's (magic, format, version, budget)
    packed/                 format "packed" (new directories): the LMDB store of every object
                            below 1 MiB, the index of all and ``used`` (NOTE [packed store])
    entries/ab/<hash>       one file per object, named by the xxh3-128 of its key (format
                            "files": every object; "packed": objects of 1 MiB and more)
    locks/<stripe>.lock     per-key fetch locks, 4096 stripes (bounded number of files)
    tmp/                    files being written; moved into entries/ by os.replace
    shards/                 whole shards of sharded datasets (NOTE [the shard store])
    used                    format "files": bytes in entries/ (updated under .index.lock)
    stats.json              hits, misses, puts... recorded by every process that used it

NOTE [disk tier across processes]
* Writes are atomic: an entry is written to tmp/ and ``os.replace``d into place, so a reader
  sees a whole entry or none. Each read validates size and xxh64 (:mod:`.entry`); a corrupt or
  truncated entry (a crash, a bad disk) is deleted and reported as a miss.
* The entries live in the store of the directory's format (:mod:`.entrystore`). Format
  "packed" (:mod:`.packedformat`): a put is one LMDB write transaction that checks the
  budget and updates ``used`` with the record; a get one read transaction (:mod:`.packed`).
  Format "files" (:mod:`.filestore`): the byte budget is kept in ``used``, read and written
  under ``.index.lock`` together with the entry's rename, so concurrent writers never
  overshoot it. ``fastload cache stats`` and ``verify`` recount it (:mod:`.maintenance`).
* ``lock(key)`` is a file lock per key stripe: the cache holds it while it fetches a missing
  object, so processes on a node download each object once.
* ``put_later`` (format "packed", objects below 1 MiB) buffers a put of the read path in
  this process and commits it with others in one transaction (NOTE [write-behind] in
  :mod:`.writebehind`); this process sees it at once, other processes after the flush.
* A full disk (ENOSPC, EDQUOT, EFBIG) or, under policy "keep", an exhausted budget makes the
  tier pass-through in that process: one warning, reads go to the origin, training goes on.
* A cache fails open (NOTE [a store is checked before it is mapped] in :mod:`.lmdbfile`): a
  directory this process cannot write is read as it is and nothing is stored; a packed
  store that is damaged is set aside and made anew when the tier opens, and one that cannot
  be used (damaged and not repaired, not fastload's, cut while in use) is not read: one
  warning each, naming the directory and what to do; reads go to the origin.
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
import logging
import multiprocessing.util
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fastload.cache import maintenance
from fastload.cache.cachedir import INDEX_TIMEOUT_S, CacheDir, Found, LockTimeout
from fastload.cache.config import DISK_FORMATS, POLICIES, DiskFormat, Policy, parse_size
from fastload.cache.diskhealth import Health
from fastload.cache.diskstats import StatsRecorder
from fastload.cache.entrystore import Damaged, EntryStore, Status
from fastload.cache.filestore import FileStore
from fastload.cache.keys import digest
from fastload.cache.packed import FILE_MIN
from fastload.cache.packedformat import PackedFormatStore
from fastload.cache.tier import Tier, TierStats
from fastload.cache.writebehind import pending_puts
from fastload.errors import ConfigError

logger = logging.getLogger(__name__)

LOCK_STRIPES = 4096

__all__ = ["INDEX_TIMEOUT_S", "LOCK_STRIPES", "DiskTier", "read_only"]


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
        repair: set a damaged packed store aside and make an empty one, with one warning (False:
            leave it as it is and do not use it, without a warning: ``store.problem`` and
            ``read_only`` say why, for ``fastload cache stats|verify|clear`` to report).

    Attributes:
        cache_dir: the opened directory (:class:`~fastload.cache.cachedir.CacheDir`).
        store: its entries, in the store of its format (:mod:`.entrystore`).
        read_only: why this process cannot write the directory, or None.
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
        repair: bool = True,
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
        lru = policy == "lru"
        self.store: EntryStore = (PackedFormatStore(self.cache_dir, lru=lru, repair=repair)
                                  if self.format == "packed" else FileStore(self.cache_dir, lru=lru))
        self.read_only = self.cache_dir.read_only
        if budget is not None and self.read_only is None:
            self._record_budget(budget)
        recorded = self.cache_dir.marker.get("budget")
        self.budget_source = "default" if budget is None and recorded is None else "disk_size"
        if budget is None:
            budget = recorded if recorded is not None else self.cache_dir.marker["default_size"]
        self.budget: int = budget
        self.health = Health(self.directory, self.read_only)  # NOTE [a cache fails open]
        self.health.opened(self.store.problem, warn=repair)
        # NOTE [write-behind]: one buffer per process and directory, shared by its tiers
        self._pending = pending_puts(str(self.directory))
        self._defer_below = FILE_MIN if self.format == "packed" else 0
        self.recorder = StatsRecorder(self.cache_dir, self.stats)
        multiprocessing.util.Finalize(self, self.recorder.flush, exitpriority=10)

    @property
    def cannot_store(self) -> str | None:
        """Why this tier stores nothing at all (read-only, its store unusable), or None."""
        if self.read_only is not None:
            return f"{self.directory} is read-only ({self.read_only})"
        return None if self.store.problem is None else f"{self.directory}: {self.store.problem}"

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
        return self.cache_dir.entries.path_of(digest(key))

    # -- the Tier contract ----------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        pending = self._pending
        value = pending.get(key) if pending.values or pending.flushing else None  # NOTE [write-behind]
        if value is None and self.health.reads:
            try:
                value = self.store.read(key)
            except Damaged as exc:
                self._drop(key, exc)
            except OSError as exc:  # Foreign too: a symlink is never read through
                self.health.read_failed(exc)
        return self._counted(value)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """:meth:`get` of each key; format "packed": one read transaction for all (a batch)."""
        pending = self._pending
        out = [pending.get(k) for k in keys] if pending else [None] * len(keys)
        asked = [i for i, value in enumerate(out) if value is None] if self.health.reads else []
        try:
            found = self.store.read_many([keys[i] for i in asked]) if asked else []
        except OSError as exc:
            self.health.read_failed(exc)
            found = [None] * len(asked)
        for i, value in zip(asked, found):
            out[i] = self._drop(keys[i], value) if isinstance(value, Damaged) else value
        return [self._counted(value) for value in out]

    def _counted(self, value: bytes | None) -> bytes | None:
        stats = self.stats
        if value is None:
            stats.misses += 1
        else:
            stats.hits += 1
            stats.bytes_read += len(value)
        self.recorder.maybe_flush()
        return value

    def _drop(self, key: str, exc: Damaged) -> None:
        """A damaged entry: counted, dropped with a warning (kept in a read-only directory),
        then read as a miss."""
        self.stats.corrupt += 1
        if self.health.corrupt(key, exc.why, exc.where):
            self.delete(key)

    def contains(self, key: str) -> bool:
        """Whether a complete entry of ``key`` is there: header and file size, no checksum."""
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """:meth:`contains` of each key; format "packed": one read transaction for all."""
        pending = self._pending
        buffered = [pending.get(k) is not None for k in keys] if pending else None  # looked at first
        try:
            found = self.store.contains_many(keys) if self.health.reads else [False] * len(keys)
        except OSError as exc:
            self.health.read_failed(exc)
            found = [False] * len(keys)
        return found if buffered is None else [f or b for f, b in zip(found, buffered)]

    def put(self, key: str, value: bytes) -> bool:
        return self.put_many([(key, value)])[0]

    def put_later(self, key: str, value: bytes) -> None:
        """Store ``value`` as :meth:`put` does, in a batch with other puts (NOTE [write-behind]).

        This process sees the entry at once, other processes once it is flushed (256 entries,
        0.2 s, :meth:`flush_puts`, close, fork or exit). Objects of 1 MiB and more, and
        format "files", are stored at once.
        """
        if len(value) >= self._defer_below:
            self.put(key, value)
        elif not self.health.writes:
            self.stats.rejected += 1
        else:
            self._pending.add(key, value, self._store_deferred)

    def _store_deferred(self, items: list[tuple[str, bytes]]) -> None:
        self.put_many(items)

    def flush_puts(self) -> None:
        """Commit this process's buffered puts into the directory (NOTE [write-behind])."""
        self._pending.flush()

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> list[bool]:
        """Store many entries, each as :meth:`put`; format "packed": one write transaction for
        the objects below 1 MiB (larger ones: a file each, then their pointers)."""
        items = list(items)
        results = [False] * len(items)
        for group in self.store.groups([len(value) for _, value in items]):
            if not self.health.writes:
                self.stats.rejected += len(group)
                continue
            try:
                stored = self.store.put_group([items[i] for i in group], self.budget)
            except LockTimeout:
                self.health.warn_once("lock", "disk cache %s: index lock busy for %ss; entry not "
                                      "stored", self.directory, INDEX_TIMEOUT_S)
                self.stats.rejected += len(group)
                continue
            except OSError as exc:
                self.stats.rejected += len(group)
                self.health.write_failed(exc)
                continue
            stats = self.stats
            for i, (status, n) in zip(group, stored):
                if status == "stored":  # the common case, inline: a batch of 64 at a time
                    stats.puts += 1
                    stats.bytes_written += len(items[i][1])
                    results[i] = True
                else:
                    results[i] = self._admitted(status, len(items[i][1]), n)
        self.recorder.maybe_flush()
        return results

    def _admitted(self, status: Status, value_bytes: int, n: int) -> bool:
        if status == "stored":
            self.stats.puts += 1
            self.stats.bytes_written += value_bytes
            return True
        if status == "exists":
            return True
        if status == "full" and self.health.writes:
            self._exhausted(self.store.used(), n)
        else:
            self.stats.rejected += 1
        return False

    def _exhausted(self, used: int, n: int) -> None:
        self.stats.rejected += 1
        if n <= self.budget:  # one oversized object: the tier stays useful for the others
            self.health.full(used, self.budget)

    def delete(self, key: str) -> None:
        self._pending.discard(key)
        if not self.health.writes:
            return
        try:
            self.store.drop(key)
        except (OSError, LockTimeout) as exc:
            self.health.warn_once("drop", "disk cache %s: cannot delete %s (%s)", self.directory, key, exc)

    def keys(self) -> Iterator[str]:
        self.flush_puts()
        return self.store.keys()

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        """A cross-process lock on ``key``'s stripe (see :class:`~fastload.cache.tier.KeyLocking`)."""
        stripe = int(digest(key)[:3], 16) % LOCK_STRIPES
        return self._stripe_lock(f"{stripe:03x}.lock", timeout)

    @contextlib.contextmanager
    def _stripe_lock(self, name: str, timeout: float) -> Iterator[bool]:
        with contextlib.ExitStack() as held:
            if self.read_only is not None:  # nothing is stored: nobody waits for this fetch
                yield False
                return
            try:
                got = held.enter_context(self.cache_dir.lock(name, timeout))
            except OSError as exc:  # a foreign lock file: fetch without the lock
                self.health.warn_once("lockfile", "disk cache %s: cannot use a lock file (%s); fetching without it", self.directory, exc)
                got = False
            yield got

    def close(self) -> None:
        self.flush_puts()
        if self.read_only is None:
            self.recorder.flush()
        try:
            self.store.flush()
        except OSError as exc:
            logger.debug("disk cache %s: could not flush its store: %s", self.directory, exc)

    # -- what maintenance (fastload.cache.maintenance), its commands and the tests use ----

    def entries(self) -> Iterator[Found]:
        """fastload's entries: its entry files ("files"), or one per record ("packed")."""
        self.flush_puts()
        return self.store.entries()

    def read_used(self) -> int:
        """Bytes of the entries, as counted against the budget (buffered puts committed first)."""
        self.flush_puts()
        return self.store.used()

    def rescan(self) -> tuple[int, int]:
        """Recount entries and bytes from the files, store the count; (entries, bytes)."""
        self.flush_puts()
        return maintenance.rescan(self)

    def verify(self, *, drop: bool = False) -> maintenance.CorruptReport:
        """Check every entry; name the corrupt ones (deleted if ``drop``) and the foreign names."""
        self.flush_puts()
        return maintenance.verify(self, drop=drop)

    def clear(self) -> maintenance.ClearReport:
        """Delete every entry and stale temporary file of fastload's; report what was left alone."""
        self.flush_puts()
        return maintenance.clear(self)

    def summary(self) -> dict[str, Any]:
        """Entries, bytes, budget, format and the counters recorded by every process (for ``cache stats``)."""
        self.flush_puts()
        return maintenance.summary(self)

    def recorded_stats(self) -> TierStats:
        """The counters every process has recorded in ``stats.json`` (plus this one's unflushed)."""
        self.flush_puts()
        return maintenance.recorded_stats(self)


def read_only(directory: str | os.PathLike[str]) -> str | None:
    """Why this process cannot write the cache directory (created if missing, as a tier
    would), or None; opens nothing else (``fastload cache warm`` asks before it starts)."""
    path = Path(os.path.expanduser(os.fspath(directory))).absolute()
    return CacheDir(path, create=True).read_only


def _reopen_disk_tier(directory: str, size: int | str | None, policy: Policy, format: DiskFormat) -> DiskTier:
    return DiskTier(directory, size=size, policy=policy, format=format)
