"""Clairvoyant prefetch: the epoch's order is known from the sampler's seed, so fetch ahead.

A :class:`Prefetcher` walks the epoch's paths in the order the loader will read them and
fills the cache with the next ones, at most ``ahead`` samples past what the training loop
has consumed, with ``jobs`` requests in flight (threads; s3fs and other async filesystems run
them concurrently on their event loop). Workers then find their objects in the cache, or
wait on the per-key lock while the prefetcher's request completes, instead of paying the
store's latency one object at a time. With worker processes it fills only the tiers they
share (disk, Redis); with ``num_workers=0`` the memory tier too.

:class:`fastload.DataLoader` starts one per epoch for an ``ImageFolder`` with a cache (see
:mod:`fastload.loader.prefetch`, which knows the epoch's order); it stops when the epoch ends
or its iterator is dropped. The cache knows nothing of loaders: it gets paths in order.

Example::

    >>> p = Prefetcher(cache, fs, paths_in_epoch_order, ahead=512, jobs=16).start()
    >>> for i, batch in enumerate(batches):
    ...     p.advance(len(batch))
    >>> p.stop()
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import fsspec

from fastload.cache.ahead import Ahead
from fastload.cache.tiered import TieredCache

logger = logging.getLogger(__name__)


class Prefetcher(Ahead):
    """Fetches ``paths`` in order into ``cache``, ahead of a consumer, on daemon threads.

    Args:
        cache: the cache to fill.
        fs: the filesystem of the paths.
        paths: the objects in the order they will be read.
        versions: known versions by path (from the listing), to spare a request each.
        ahead: how many samples past the consumer it may fetch.
        jobs: requests in flight.
        shared_only: fill only tiers other processes see (the loader has worker processes).
        start: position (in ``paths``) the consumer starts at (a resumed epoch).

    Attributes:
        fetched, hits, rejected, failed: outcomes so far (a failed fetch is left to the
        reader, which raises the error with the sample's index).
    """

    thread_name = "fastload-prefetch"

    def __init__(
        self,
        cache: TieredCache,
        fs: fsspec.AbstractFileSystem,
        paths: Sequence[str],
        *,
        versions: Mapping[str, str] | None = None,
        ahead: int = 256,
        jobs: int = 16,
        shared_only: bool = False,
        start: int = 0,
    ) -> None:
        self.cache = cache
        self.fs = fs
        self.paths = paths
        self.versions = versions or {}
        self.ahead = max(1, ahead)
        self.jobs = max(1, jobs)
        self.shared_only = shared_only
        self.fetched = self.hits = self.rejected = self.failed = 0
        super().__init__(start)
        self._next = start

    def start(self) -> Prefetcher:
        """Start the threads; returns self."""
        return self._start_threads(min(self.jobs, max(0, len(self.paths) - self._next)))

    def _advanced(self) -> None:
        self._next = max(self._next, self._consumed)

    def _summary(self) -> str:
        return (f"{self.fetched} fetched, {self.hits} already cached, {self.rejected} not stored, "
                f"{self.failed} failed")

    def _claim(self) -> str | None:
        with self._cond:
            while not self._stopped and self._next < len(self.paths):
                if self._next < self._consumed + self.ahead:
                    path = self.paths[self._next]
                    self._next += 1
                    return path
                self._cond.wait()
            return None

    def _run(self) -> None:
        while (path := self._claim()) is not None:
            try:
                outcome = self.cache.ensure(
                    self.fs, path, self.versions.get(path), shared_only=self.shared_only
                )
            except Exception as exc:  # the reader raises it with the sample's index
                logger.debug("prefetch of %s failed: %s", path, exc)
                with self._cond:
                    self.failed += 1
                continue
            with self._cond:
                if outcome == "hit":
                    self.hits += 1
                elif outcome == "fetched":
                    self.fetched += 1
                else:  # the cache is full: fetching more would only double the reads
                    self.rejected += 1
                    if not self._stopped:
                        logger.info("cache full: prefetching stops for this epoch")
                    self._stopped = True
                    self._cond.notify_all()
