"""The read-through cache: tiers from fastest to widest, then the origin, for any fsspec path.

A read looks in each tier in turn; a hit in a lower tier is written to the tiers above it
(promotion). A miss everywhere fetches the object from the origin once (:mod:`.misses`):
threads of one process wait for each other per key, and processes wait on the per-key lock
of the widest tier that offers one (the disk tier's file lock), then find the object there.
A loader's batch is looked up in one go (NOTE [batched reads]). Keys carry the
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

import os
from collections.abc import Sequence

import fsspec
from fsspec.implementations.local import LocalFileSystem

from fastload.cache.config import CacheConfig
from fastload.cache.fills import Derivation, Fill, FillRules
from fastload.cache.misses import MissFills, Outcome
from fastload.cache.tier import Tier, TierStats
from fastload.io.errors import raise_storage_error, storage_errors
from fastload.io.versions import local_version, version_of


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
        self._misses = MissFills(self.tiers, self._rules, lock_timeout=self.config.lock_timeout)
        self._puts_later = self._misses.puts_later  # NOTE [write-behind]: a promotion's puts

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
        version = self._version_now(fs, path, url, version)
        key = self.key_of(url, version)
        for level, tier in enumerate(self.tiers):
            data = tier.get(key)
            if data is not None:
                for put in self._puts_later[:level]:  # promotion: no lock held, written behind
                    put(key, data)
                return data
        data, _ = self._misses.fill(fs, path, url, version, self.tiers, later=True)
        return data

    def read_many(
        self, fs: fsspec.AbstractFileSystem, paths: Sequence[str], versions: Sequence[str | None]
    ) -> list[bytes | Exception]:
        """:meth:`read` of each path (a batch of a loader), a failed read's error in its place.

        One ``get_many`` per tier for the batch's keys (NOTE [batched reads]), then each miss
        read from the origin and stored as :meth:`read` does.

        Example::

            >>> cache.read_many(fs, ["/d/a.jpg", "/d/b.jpg"], [None, None])
            [b'\xff\xd8...', ObjectNotFoundError('cannot read file:///d/b.jpg: ...')]
        """
        out: list[bytes | Exception | None] = [None] * len(paths)
        urls = [url_of(fs, path) for path in paths]
        now: list[str] = [""] * len(paths)
        for i, (path, url, version) in enumerate(zip(paths, urls, versions)):
            try:
                now[i] = self._version_now(fs, path, url, version)
            except Exception as exc:  # a fastload error (NOTE [storage errors])
                out[i] = exc
        todo = [i for i, got in enumerate(out) if got is None]
        keys = [self.key_of(url, version) if got is None else "" for url, version, got in zip(urls, now, out)]
        for level, tier in enumerate(self.tiers):
            if not todo:
                break
            missed = []
            for i, data in zip(todo, tier.get_many([keys[i] for i in todo])):
                if data is None:
                    missed.append(i)
                    continue
                for put in self._puts_later[:level]:
                    put(keys[i], data)
                out[i] = data
            todo = missed
        for i in todo:
            try:
                out[i], _ = self._misses.fill(fs, paths[i], urls[i], now[i], self.tiers, later=True)
            except Exception as exc:  # a fastload error, or a tier's bare OSError
                out[i] = exc
        return out  # type: ignore[return-value]  # every slot is filled

    def _version_now(self, fs: fsspec.AbstractFileSystem, path: str, url: str, version: str | None) -> str:
        """The version a read keys by: a local file's from a stat now (NOTE [a stat per local
        read]), else ``version`` (the listing's) or one ``info`` request."""
        if isinstance(fs, LocalFileSystem):
            try:
                return local_version(os.stat(path))
            except Exception as exc:  # NOTE [storage errors], inline: per object
                raise_storage_error(exc, "read", url)
        return version or self.version(fs, path)

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
            _, outcome = self._misses.fill(fs, path, url, version, targets)
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

    def close(self) -> None:
        """Flush counters and release every tier's handles."""
        for tier in self.tiers:
            tier.close()


# NOTE [batched reads]
# In a loader's worker a read of a cached entry is one LMDB read transaction among decodes,
# and costs there about 20 us where a loop of them costs 4 (measured: the decode between two
# lookups leaves the CPU's caches and TLB cold, the more so in a VM). ``ImageFolder``'s
# ``__getitems__`` therefore reads its batch first, through ``read_many``: the tiers' lookups
# of the whole batch in one transaction each, then the misses one by one from the origin.
# What is served, stored and counted is what one ``read`` per sample would do.

# NOTE [a stat per local read]
# A local file's version is read at every read (one os.stat, about 4 us here), not taken from the
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
