"""Shards downloaded ahead of need, in the order a reader will read them.

A :class:`ShardAhead` is given the shards of an epoch in the order of their first use and the
sample position of each first use (an epoch's order is known before it starts, NOTE
[shard-aware order]). It keeps the next ``ahead`` shards past the one the reader is in
downloading into a :class:`~fastload.cache.shardstore.ShardStore`, ``jobs`` shards at a
time (each with its own concurrent range requests), and only where the budget has room
(``ensure(must=False)``): when it has none it waits for the reader to move on and free a
shard. Readers then find their shard whole, or wait on its lock while it completes.
The cache knows nothing of loaders: the loader calls :meth:`advance` (or :meth:`follow`).

NOTE [downloads ahead are held until read]
A shard downloaded ahead is not yet pinned by any reader, and eviction takes the least
recently used shard no process holds: with a budget smaller than the dataset, the next
download ahead (or a reader's own) evicted the shards downloaded ahead a moment before,
and the reader downloaded them again when it got there. So each shard downloaded ahead is
held (its lock, shared: ``ShardStore.ensure(hold=True)``) until the reader has passed its
*last* sample: not its first, since a reader's pin does not cover it (the reads of a shard
still downloading go to the origin and pin nothing, and torch's workers pin in their own
processes), and a shard let go of at its first sample was evicted under the reader and
downloaded again. A download ahead that finds no room waits for the reader to move on
instead of evicting what comes next; the holds are at most the shuffle window and the shards
ahead, which the budget holds (``CachedShards.follow`` sets ``ahead`` so). Once the reader
has reached a shard the downloader fetches it as the reader would (past the budget if it
must) and holds it, or waits for the reader's download and holds that.

``benchmarks/shard_budget.py`` (20 shards of 40 JPEGs, budgets of 5-10 shards, one epoch in
fastload's order) counts whole-shard downloads per shard: 1.00-1.50 on threads and 1.15-2.05
on two torch workers before, 1.00 at every budget on threads now; on the workers 1.00 from
``2 x shuffle_window + 1`` shards and 1.00-1.40 below (NOTE [torch workers at a window's
end] in :mod:`fastload.data.shard_cache_use`).
tests/test_shard_cache.py counts them on threads; on workers it checks every sample is read.

Example::

    >>> ahead = ShardAhead(store, fs, refs, first_use=[0, 1000, 2000],
    ...                    last_use=[1499, 2999, 3999], ahead=2).start()
    >>> for batch in ahead.follow(batches, per_item=256):
    ...     train(batch)
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Any

from fastload.cache.ahead import Ahead
from fastload.cache.shardstore import ShardRef, ShardStore

logger = logging.getLogger(__name__)

__all__ = ["ShardAhead"]

_NO_ROOM_WAIT_S = 0.5


class ShardAhead(Ahead):
    """Downloads ``refs`` in order into ``store``, ``ahead`` shards past the reader.

    Args:
        store: the shard store to fill.
        fs: the shards' filesystem.
        refs: the shards in the order of their first use.
        first_use: for each of ``refs``, the sample position of its first use (ascending).
        last_use: for each of ``refs``, the position of its last use (default: its first);
            a shard downloaded ahead is held until the reader has passed it.
        ahead: shards downloaded past the one the reader is in (at least 1).
        jobs: shards downloaded at once.
        start: the reader's first sample position (a resumed epoch).

    Attributes:
        fetched, hits, failed: outcomes so far (a hit is a shard already there, or one
        another process held past the waits, not held then; a failed download is left to the
        reader, which downloads again or raises the error naming its sample).
    """

    thread_name = "fastload-shard-ahead"

    def __init__(
        self, store: ShardStore, fs: Any, refs: Sequence[ShardRef], first_use: Sequence[int], *,
        last_use: Sequence[int] | None = None, ahead: int = 2, jobs: int = 2, start: int = 0,
    ) -> None:
        self.store, self.fs = store, fs
        self.refs, self.first_use = list(refs), list(first_use)
        self.last_use = list(first_use if last_use is None else last_use)
        self.ahead, self.jobs = max(1, ahead), max(1, jobs)
        self.fetched = self.hits = self.failed = 0
        self._held: dict[int, ShardRef] = {}  # downloaded ahead, held until the reader is there
        super().__init__(start)
        self._next = max(0, bisect.bisect_right(self.first_use, start) - 1)

    def start(self) -> ShardAhead:
        """Start the download threads; returns self."""
        return self._start_threads(min(self.jobs, len(self.refs) - self._next))

    def _summary(self) -> str:
        return f"{self.fetched} shards fetched, {self.hits} already there, {self.failed} failed"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop downloading, wait for what is in flight, and let go of the shards held."""
        super().stop(timeout)
        with self._cond:
            held, self._held = list(self._held.values()), {}
        for ref in held:
            self.store.release_hold(ref)

    def _advanced(self) -> None:
        for k in [k for k in self._held if self.last_use[k] < self._consumed]:
            self.store.release_hold(self._held.pop(k))  # the reader is done with it

    def _current(self) -> int:
        """The position in ``refs`` of the shard the reader has started last."""
        return bisect.bisect_right(self.first_use, self._consumed) - 1

    def _claim(self) -> tuple[int, int] | None:
        with self._cond:
            while not self._stopped and self._next < len(self.refs):
                if self._next <= self._current() + self.ahead:
                    k = self._next
                    self._next += 1
                    return k, self._consumed
                self._cond.wait()
            return None

    def _run(self) -> None:
        while (claimed := self._claim()) is not None:
            k, seen = claimed
            while True:
                with self._cond:  # the reader is there: it downloads it now, or has (held too)
                    must = self._current() >= k
                try:
                    outcome = self.store.ensure(self.fs, self.refs[k], must=must, hold=True)
                except Exception as exc:  # noqa: BLE001 - the reader downloads again, or raises it
                    logger.debug("downloading %s ahead failed: %s", self.refs[k].url, exc)
                    with self._cond:
                        self.failed += 1
                    break
                if outcome != "no room":
                    with self._cond:
                        if outcome in ("hit", "busy"):  # busy: another process has it, not held
                            self.hits += 1
                        else:
                            self.fetched += 1
                        if outcome != "busy":
                            if self._stopped or self.last_use[k] < self._consumed:
                                self.store.release_hold(self.refs[k])
                            else:
                                self._held[k] = self.refs[k]
                    break
                with self._cond:  # the budget is full of shards in use: wait for the reader
                    if self._stopped:
                        break
                    if self._consumed == seen:
                        self._cond.wait(_NO_ROOM_WAIT_S)
                    seen = self._consumed
