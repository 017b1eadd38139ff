"""The read-through cache: tiers from fastest to widest, then the origin, for any fsspec path.

A read looks in each tier in turn; a hit in a lower tier is written to the tiers above it
(promotion). A miss everywhere fetches the object from the origin once: threads of one
process wait for each other per key, and processes wait on the per-key lock of the widest
tier that offers one (the disk tier's file lock), then find the object there. Keys carry the
object's version (NOTE [cache keys]). A cache made with :meth:`TieredCache.deriving` caches
a value derived from each object instead of its bytes. What is stored for bytes read from
the origin is decided in :mod:`.fills` (NOTE [fetch-time version check], NOTE [derived
entries]); puts made without a fetch lock are written behind (NOTE [write-behind] in
:mod:`.writebehind`).

Example::

    >>> import fsspec
    >>> cache = open_cache({"memory": "1GB", "disk": "/nvme/fastload"})
    >>> fs = fsspec.filesystem("s3")
    >>> data = cache.read(fs, "bucket/train/a.jpg")      # origin, then disk and memory
    >>> data = cache.read(fs, "bucket/train/a.jpg")      # memory
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import fsspec
from fsspec.implementations.local import LocalFileSystem

from fastload.cache.config import CacheConfig
from fastload.cache.fills import Derivation, Fill, FillRules
from fastload.cache.forks import after_fork
from fastload.cache.tier import KeyLocking, Tier, TierStats
from fastload.cache.writebehind import DefersPuts
from fastload.io.errors import raise_storage_error, storage_errors
from fastload.io.origin import read_local, read_whole
from fastload.io.versions import local_version, version_of

logger = logging.getLogger(__name__)

Outcome = Literal["hit", "fetched", "rejected"]

__all__ = ["Derivation", "Fill", "Outcome", "TieredCache"]


class TieredCache:
    """Reads objects through ``tiers`` (fastest first) and fills them from the origin.

    Build one with :func:`fastload.cache.open_cache`; it pickles into worker processes,
    where each tier reopens itself (the memory tier starts empty there).

    Attributes:
        tiers: the tier stack, fastest first.
        config: the :class:`CacheConfig` it was built from.
        origin_reads: objects this process fetched from the origin.
        origin_bytes: bytes this process fetched from the origin.
        derive: the :class:`Derivation` whose values it caches, or None (the bytes).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        config: CacheConfig | None = None,
        derive: Derivation | None = None,
    ) -> None:
        self.tiers = list(tiers)
        self.config = config or CacheConfig(tiers=tuple(self.tiers))
        self.derive = derive
        self._rules = FillRules(derive)
        lockers = [t for t in self.tiers if isinstance(t, KeyLocking)]
        self._locker: KeyLocking | None = lockers[-1] if lockers else None
        # NOTE [write-behind]: how a put without a fetch lock reaches each tier
        self._puts_later: list[Callable[[str, bytes], object]] = [
            t.put_later if isinstance(t, DefersPuts) else t.put for t in self.tiers
        ]
        self._mutex = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        after_fork(self, TieredCache._reset_after_fork)  # NOTE [locks across fork]

    def _reset_after_fork(self) -> None:
        """In a forked child: no fetch of the parent's threads is in flight here."""
        self._mutex = threading.Lock()
        self._inflight = {}

    def __reduce__(self):
        return (_rebuild, (self.tiers, self.config, self.derive))

    def __repr__(self) -> str:
        derive = "" if self.derive is None else f", derive={self.derive.tag!r}"
        return f"TieredCache({self.tiers!r}{derive})"

    def deriving(self, derive: Derivation) -> TieredCache:
        """A cache over the same tiers that caches and serves ``derive(bytes)`` of each object.

        Entries are keyed by the object's key plus ``derive.tag`` (NOTE [derived entries]);
        this cache is left as it is. Example::

            >>> from fastload.data.transcode import Transcode
            >>> small = open_cache("/nvme/fastload").deriving(Transcode(max_side=256))
            >>> small.read(fs, "bucket/train/a.jpg")     # a JPEG at most 256 px a side
        """
        return TieredCache(self.tiers, config=self.config, derive=derive)

    @property
    def stats(self) -> dict[str, TierStats]:
        """Each tier's counters in this process, by tier name."""
        return {t.name: t.stats for t in self.tiers}

    @property
    def origin_reads(self) -> int:
        """Objects this process fetched from the origin."""
        return self._rules.reads

    @property
    def origin_bytes(self) -> int:
        """Bytes this process fetched from the origin."""
        return self._rules.bytes

    def key(self, fs: fsspec.AbstractFileSystem, path: str, version: str | None = None) -> str:
        """The cache key of ``path`` on ``fs``; without ``version`` it asks the origin (``info``).

        With a derivation, the key of the derived value (NOTE [derived entries]).
        """
        return self.key_of(fs.unstrip_protocol(path), version or self.version(fs, path))

    def key_of(self, url: str, version: str) -> str:
        """The cache key of the object at ``url`` (``fs.unstrip_protocol(path)``) and ``version``.

        :meth:`key` for callers that already hold the URL (no filesystem call); with a
        derivation, the key of the derived value.
        """
        return self._rules.key_of(url, version)

    @staticmethod
    def version(fs: fsspec.AbstractFileSystem, path: str) -> str:
        """The origin's current version of ``path`` (one ``info`` request; ``os.stat`` locally)."""
        # NOTE [storage errors] in fastload.io.errors: any backend failure names the URL.
        with storage_errors("read the version of", fs.unstrip_protocol(path)):
            if isinstance(fs, LocalFileSystem):
                return local_version(os.stat(path))
            return version_of(fs.info(path))

    def read(self, fs: fsspec.AbstractFileSystem, path: str, version: str | None = None) -> bytes:
        """The bytes of ``path``, from the fastest tier that has them, else from the origin.

        ``version``: the object's listed version, which keys a remote object's read; a local
        file's version is read at every read instead (NOTE [a stat per local read]).

        With a derivation: the derived value, or the original bytes where the derivation
        rejects them (NOTE [derived entries]). A missing object raises
        :class:`~fastload.errors.ObjectNotFoundError` (a ``FileNotFoundError``) naming its URL.
        """
        url = url_of(fs, path)
        if isinstance(fs, LocalFileSystem):  # NOTE [a stat per local read]
            try:
                version = local_version(os.stat(path))
            except Exception as exc:  # NOTE [storage errors], inline: per object
                raise_storage_error(exc, "read", url)
        else:
            version = version or self.version(fs, path)
        key = self.key_of(url, version)
        for level, tier in enumerate(self.tiers):
            data = tier.get(key)
            if data is not None:
                for put in self._puts_later[:level]:  # promotion: no lock held, written behind
                    put(key, data)
                return data
        data, _ = self._fill(fs, path, url, version, self.tiers, later=True)
        return data

    def ensure(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        version: str | None = None,
        *,
        shared_only: bool = False,
    ) -> Outcome:
        """Make sure ``path`` is cached, without returning it (prefetch and ``cache warm``).

        With ``shared_only`` only tiers other processes see are filled. Returns "hit" (it
        was there), "fetched" (read from the origin and stored) or "rejected" (read, but no
        tier would store it: full). Raises :class:`~fastload.errors.CacheError` when the
        cache's derivation rejects the object's bytes (nothing is stored for it).
        """
        targets = self._targets(shared_only)
        version = version or self.version(fs, path)
        url = url_of(fs, path)
        key = self.key_of(url, version)
        why = self._rules.underivable(key)
        if why is None:
            if any(t.contains(key) for t in targets):
                return "hit"
            _, outcome = self._fill(fs, path, url, version, targets)
            why = self._rules.underivable(key)
            if why is None:
                return outcome
        raise self._rules.error(url, why)

    def _targets(self, shared_only: bool) -> list[Tier]:
        return [t for t in self.tiers if t.shared or not shared_only]

    # NOTE [batched fills]: `cache warm` fills the shared tiers a batch at a time, not with
    # `ensure` per object: one `contains_many` per tier for a batch of keys (resume), then
    # `prepare` of each download (the same fetch-time version check and derivation as a
    # read), then one `put_many` per tier. It takes no per-key lock: a batch holds objects
    # nobody had cached a moment before, and an object two processes fetch at once is stored
    # twice with the same bytes (puts are atomic), never served corrupt.

    def missing(self, keys: Sequence[str], *, shared_only: bool = False) -> list[bool]:
        """For each key, whether no tier holds it (one ``contains_many`` per tier, uncounted).

        With ``shared_only`` only tiers other processes see are asked (NOTE [batched fills]).
        Example::

            >>> keys = [cache.key(fs, p, listing[p]["version"]) for p in paths]
            >>> todo = [p for p, gone in zip(paths, cache.missing(keys)) if gone]
        """
        missing = [True] * len(keys)
        for tier in self._targets(shared_only):
            asked = [i for i, gone in enumerate(missing) if gone]
            if not asked:
                break
            for i, found in zip(asked, tier.contains_many([keys[i] for i in asked])):
                if found:
                    missing[i] = False
        return missing

    def prepare(
        self, url: str, version: str, data: bytes, read_version: str | None = None
    ) -> Fill:
        """What to store for ``data``, the bytes of ``url`` read from the origin.

        ``version`` is the listed version, ``read_version`` the version of the bytes where
        the read knew it (local files). Applies NOTE [fetch-time version check] and the
        derivation (CPU work: call it off any event loop); counts an origin read. Raises
        :class:`~fastload.errors.CacheError` when the derivation rejects the bytes.
        """
        fill = self._rules.prepare(url, version, data, read_version)
        if fill.underivable is not None:
            raise self._rules.error(url, fill.underivable)
        return fill

    def store_many(self, fills: Sequence[Fill], *, shared_only: bool = False) -> list[Outcome]:
        """Store prepared fills, one ``put_many`` per tier; "fetched" or "rejected" for each.

        A fill with no key (its bytes changed since the listing) is "fetched" and not stored,
        as :meth:`ensure` reports it (NOTE [batched fills]).
        """
        targets = self._targets(shared_only)
        keyed = [i for i, fill in enumerate(fills) if fill.key is not None]
        items = [(fills[i].key, fills[i].value) for i in keyed]
        stored = [False] * len(items)
        for tier in targets:
            for j, ok in enumerate(tier.put_many(items)):  # type: ignore[arg-type]
                stored[j] = stored[j] or ok
        outcomes: list[Outcome] = ["fetched"] * len(fills)
        for i, ok in zip(keyed, stored):
            if not ok and targets:
                outcomes[i] = "rejected"
        return outcomes

    def _fill(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        url: str,
        version: str,
        targets: list[Tier],
        *,
        later: bool = False,
    ) -> tuple[bytes, Outcome]:
        """Fetch a missed object once (per key across threads and processes) into ``targets``.

        ``later``: the caller ignores the outcome, so a put without a fetch lock may be
        written behind (NOTE [write-behind]); under a fetch lock it never is.
        """
        if self.derive is None and isinstance(fs, LocalFileSystem):
            # NOTE [no fetch lock for local files]: the lock exists so that processes download
            # an object once; a local read costs less than taking it (a lock file's open and
            # flock: 25-500 us, more than a 1 KB read), and a second read of the same file
            # stores the same entry (puts are idempotent). A derivation's CPU work keeps it.
            return self._fetch_and_store(fs, path, url, version, targets, later=later)
        key = self.key_of(url, version)
        with self._mutex:
            event = self._inflight.get(key)
            owner = event is None
            if owner:
                event = self._inflight[key] = threading.Event()
        if not owner:
            event.wait(self.config.lock_timeout)
            found = self._recheck(key, targets)
            if found is not None:
                return found, "hit"
            return self._fetch_and_store(fs, path, url, version, targets)
        try:
            with self._process_lock(key):
                found = self._recheck(key, targets)
                if found is not None:
                    return found, "hit"
                # stored at once (not later): the lock's waiters must find it when it is released
                return self._fetch_and_store(fs, path, url, version, targets)
        finally:
            with self._mutex:
                del self._inflight[key]
            event.set()

    def _recheck(self, key: str, targets: list[Tier]) -> bytes | None:
        """The object if another thread or process stored it while we waited."""
        for level, tier in enumerate(targets):
            if tier.contains(key):
                data = tier.get(key)
                if data is not None:
                    self._store(key, data, targets[:level])
                    return data
        return None

    @contextlib.contextmanager
    def _process_lock(self, key: str) -> Iterator[None]:
        if self._locker is None:
            yield
            return
        with self._locker.lock(key, self.config.lock_timeout) as got:
            if not got:
                logger.info(
                    "waited %.0f s for another process to fetch %s; fetching it here too",
                    self.config.lock_timeout, key,
                )
            yield

    def _fetch_and_store(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        url: str,
        version: str,
        targets: list[Tier],
        *,
        later: bool = False,
    ) -> tuple[bytes, Outcome]:
        try:  # NOTE [storage errors] in fastload.io.errors (as storage_errors, inline: per object)
            if isinstance(fs, LocalFileSystem):
                data, read_version = read_local(path, url, expect=version)
            else:
                data, read_version = read_whole(fs, path), None
        except Exception as exc:
            raise_storage_error(exc, "read", url)
        key, value, _ = self._rules.check(url, version, data, read_version)
        if key is None:
            return value, "fetched"
        if later and targets is self.tiers:  # NOTE [write-behind]: no fetch lock is held
            for put in self._puts_later:
                put(key, value)
            return value, "fetched"
        stored = self._store(key, value, targets)
        return value, "fetched" if stored or not targets else "rejected"

    @staticmethod
    def _store(key: str, data: bytes, tiers: Sequence[Tier]) -> bool:
        stored = False
        for tier in tiers:
            stored = tier.put(key, data) or stored
        return stored

    def close(self) -> None:
        """Flush counters and release every tier's handles."""
        for tier in self.tiers:
            tier.close()


# NOTE [a stat per local read]
# A local file's version is read at every read (one os.stat, about 2 us), not taken from the
# listing: a file rewritten or deleted at any time is read as it is then, through every tier,
# so a cached local dataset needs no listing per epoch to stay consistent (at 1M files that
# listing took about 17 s before every epoch; ``fastload.DataLoader`` no longer makes it for a
# local root). A remote object's version costs a request, more than a small object's GET, so
# remote reads keep the listed version and the loader revalidates them once per epoch
# (docs/reliability.md, "Consistency model").


def url_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """``fs.unstrip_protocol(path)``, without its path normalisation for an absolute POSIX
    path of the local filesystem (already normal: the read path's case, once per read)."""
    if type(fs) is LocalFileSystem and path[:1] == "/" and path[-1:] != "/" and os.sep == "/":
        return "file://" + path
    return fs.unstrip_protocol(path)


def _rebuild(
    tiers: list[Tier], config: CacheConfig, derive: Derivation | None = None
) -> TieredCache:
    return TieredCache(tiers, config=config, derive=derive)
