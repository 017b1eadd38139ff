"""The read-through cache: tiers from fastest to widest, then the origin, for any fsspec path.

A read looks in each tier in turn; a hit in a lower tier is written to the tiers above it
(promotion). A miss everywhere fetches the object from the origin once: threads of one
process wait for each other per key, and processes wait on the per-key lock of the widest
tier that offers one (the disk tier's file lock), then find the object there. Keys carry the
object's version (NOTE [cache keys]). A cache made with :meth:`TieredCache.deriving` caches
a value derived from each object instead of its bytes (NOTE [derived entries]).

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import fsspec
from fsspec.implementations.local import LocalFileSystem

from fastload.cache.config import CacheConfig
from fastload.cache.forks import after_fork
from fastload.cache.keys import derived_key, make_key
from fastload.cache.tier import KeyLocking, Tier, TierStats
from fastload.errors import CacheError
from fastload.io.errors import storage_errors
from fastload.io.origin import read_local, read_whole
from fastload.io.versions import local_version, version_of, version_size

logger = logging.getLogger(__name__)

Outcome = Literal["hit", "fetched", "rejected"]


class Derivation(Protocol):
    """A named bytes -> bytes function whose values a cache stores (NOTE [derived entries]).

    ``tag`` names the function and every parameter that changes its output (it goes into
    the key); calling it raises ``ValueError`` when the bytes cannot be derived. It must
    pickle (the cache travels into worker processes).
    Example: :class:`fastload.data.transcode.Transcode`.
    """

    @property
    def tag(self) -> str: ...

    def __call__(self, data: bytes) -> bytes: ...


# NOTE [derived entries]
# A cache made with `TieredCache.deriving(derive)` reads an object from the origin as usual
# (same version checks), stores `derive(bytes)` under the derived key (keys.derived_key:
# the object's key plus derive.tag) and serves that; the original bytes are not stored under
# their own key by such a read. Every other promise holds as for plain entries, because the
# derived key simply takes the plain key's place: per-key single flight across threads and
# processes, checksummed entries, budgets and policies, the prefetcher and `cache warm`
# filling exactly the entries readers look up. Bytes the derivation rejects (ValueError: a
# corrupt image) are served as they are and not stored at all, so the reader reports them
# as it would without the derivation (ImageFolder: CorruptSampleError); this process
# remembers them, so `ensure` (prefetch, warm) does not fetch them again and raises.


@dataclass(frozen=True, slots=True)
class Fill:
    """Bytes read from the origin, checked and ready to store (:meth:`TieredCache.prepare`).

    ``key`` is where to store ``value`` (the bytes, or their derived value), or None when it
    must be served but not stored (it changed since its listing: NOTE [fetch-time version
    check]); ``underivable`` says why the derivation rejected the bytes, if it did.
    """

    key: str | None
    value: bytes
    underivable: str | None = None


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
        self._underivable: dict[str, str] = {}  # derived key -> why derive rejected its bytes
        lockers = [t for t in self.tiers if isinstance(t, KeyLocking)]
        self._locker: KeyLocking | None = lockers[-1] if lockers else None
        self._mutex = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        after_fork(self, TieredCache._reset_after_fork)  # NOTE [locks across fork]
        self.origin_reads = 0
        self.origin_bytes = 0
        self._warned: set[str] = set()  # URLs whose bytes changed since their listing

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

    def key(self, fs: fsspec.AbstractFileSystem, path: str, version: str | None = None) -> str:
        """The cache key of ``path`` on ``fs``; without ``version`` it asks the origin (``info``).

        With a derivation, the key of the derived value (NOTE [derived entries]).
        """
        return self._key(fs.unstrip_protocol(path), version or self.version(fs, path))

    def key_of(self, url: str, version: str) -> str:
        """The cache key of the object at ``url`` (``fs.unstrip_protocol(path)``) and ``version``.

        :meth:`key` for callers that already hold the URL (no filesystem call); with a
        derivation, the key of the derived value.
        """
        key = make_key(url, version)
        return key if self.derive is None else derived_key(key, self.derive.tag)

    _key = key_of

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

        With a derivation: the derived value, or the original bytes where the derivation
        rejects them (NOTE [derived entries]). A missing object raises
        :class:`~fastload.errors.ObjectNotFoundError` (a ``FileNotFoundError``) naming its URL.
        """
        version = version or self.version(fs, path)
        key = self.key(fs, path, version)
        for level, tier in enumerate(self.tiers):
            data = tier.get(key)
            if data is not None:
                self._store(key, data, self.tiers[:level])
                return data
        data, _ = self._fill(fs, path, version, self.tiers)
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
        key = self.key(fs, path, version)
        if key not in self._underivable:
            if any(t.contains(key) for t in targets):
                return "hit"
            _, outcome = self._fill(fs, path, version, targets)
            if key not in self._underivable:
                return outcome
        raise self._underivable_error(fs.unstrip_protocol(path), self._underivable[key])

    def _targets(self, shared_only: bool) -> list[Tier]:
        return [t for t in self.tiers if t.shared or not shared_only]

    def _underivable_error(self, url: str, why: str) -> CacheError:
        assert self.derive is not None
        return CacheError(
            f"cannot cache {url} as {self.derive.tag}: {why}. Nothing is stored for it and a "
            "read serves its original bytes (ImageFolder reports a corrupt image as a corrupt "
            "sample); replace or remove the object"
        )

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
        fill = self._prepare(url, version, data, read_version)
        if fill.underivable is not None:
            raise self._underivable_error(url, fill.underivable)
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
        self, fs: fsspec.AbstractFileSystem, path: str, version: str, targets: list[Tier]
    ) -> tuple[bytes, Outcome]:
        """Fetch a missed object once (per key across threads and processes) into ``targets``."""
        if self.derive is None and isinstance(fs, LocalFileSystem):
            # NOTE [no fetch lock for local files]: the lock exists so that processes download
            # an object once; a local read costs less than taking it (a lock file's open and
            # flock: 25-500 us, more than a 1 KB read), and a second read of the same file
            # stores the same entry (puts are idempotent). A derivation's CPU work keeps it.
            return self._fetch_and_store(fs, path, version, targets)
        key = self.key(fs, path, version)
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
            return self._fetch_and_store(fs, path, version, targets)
        try:
            with self._process_lock(key):
                found = self._recheck(key, targets)
                if found is not None:
                    return found, "hit"
                return self._fetch_and_store(fs, path, version, targets)
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
        self, fs: fsspec.AbstractFileSystem, path: str, version: str, targets: list[Tier]
    ) -> tuple[bytes, Outcome]:
        url = fs.unstrip_protocol(path)
        with storage_errors("read", url):  # NOTE [storage errors] in fastload.io.errors
            if isinstance(fs, LocalFileSystem):
                data, read_version = read_local(path, url)
            else:
                data, read_version = read_whole(fs, path), None
        fill = self._prepare(url, version, data, read_version)
        if fill.key is None:
            return fill.value, "fetched"
        stored = self._store(fill.key, fill.value, targets)
        return fill.value, "fetched" if stored or not targets else "rejected"

    def _prepare(self, url: str, version: str, data: bytes, read_version: str | None) -> Fill:
        with self._mutex:
            self.origin_reads += 1
            self.origin_bytes += len(data)
        # NOTE [fetch-time version check]: bytes are stored only under the version they are.
        keep: str | None = version
        if read_version is not None and read_version != version:
            self._changed(url, version, f"it is now version {read_version}")
            keep = read_version
        elif read_version is None and version_size(version) not in (None, len(data)):
            self._changed(url, version, f"{len(data)} bytes were read")
            keep = None  # served, not stored: the bytes' own version is unknown
        if self.derive is not None:  # NOTE [derived entries]
            derived = self._derived(url, version, data)
            if derived is None:
                return Fill(None, data, self._underivable[self._key(url, version)])
            data = derived
        return Fill(None if keep is None else self._key(url, keep), data)

    def _derived(self, url: str, version: str, data: bytes) -> bytes | None:
        """``derive(data)``, or None (remembered) when the derivation rejects the bytes."""
        assert self.derive is not None
        key = self._key(url, version)
        if key in self._underivable:  # known to fail: spare the work
            return None
        try:
            return self.derive(data)
        except ValueError as exc:
            with self._mutex:
                first = key not in self._underivable
                self._underivable[key] = str(exc)
            if first:
                logger.info(
                    "%s: %s rejects its bytes (%s); serving them as they are, not cached",
                    url, self.derive.tag, exc,
                )
            return None

    def _changed(self, url: str, version: str, now: str) -> None:
        with self._mutex:
            first = url not in self._warned
            self._warned.add(url)
        (logger.warning if first else logger.debug)(
            "%s changed since it was listed (version %s; %s): serving its current bytes, "
            "never cached under the listed version. The loader revalidates at the next epoch "
            "(ImageFolder.revalidate()); to stop this, do not rewrite a dataset while it is read",
            url, version, now,
        )

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


# NOTE [fetch-time version check]
# A cache key says which version of an object its bytes are (NOTE [cache keys]); an object
# rewritten after it was listed must not have its new bytes stored under the old version's
# key, where they would be served for that version forever. For a local file the version of
# the bytes read is known exactly: fstat of the open file before and after the read (equal:
# nothing wrote in between), so they are stored under their own version, and the read is
# retried when a writer was active. Remote stores answer a GET without the version fastload
# can see, so only the size is checked: a size that differs from the listed one is served
# but not cached. A same-size rewrite between the listing and the fetch is not detected
# there (docs/reliability.md says what that means).

def _rebuild(
    tiers: list[Tier], config: CacheConfig, derive: Derivation | None = None
) -> TieredCache:
    return TieredCache(tiers, config=config, derive=derive)
