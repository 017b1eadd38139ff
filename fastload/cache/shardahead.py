"""Shards downloaded ahead of need, in the order a reader will read them.

A :class:`ShardAhead` is given the shards of an epoch in the order of their first use and the
sample position of each first use (an epoch's order is known before it starts, NOTE
[shard-aware order]). It keeps the next ``ahead`` shards past the one the reader is in
downloading into a :class:`~fastload.cache.shardstore.ShardStore`, ``jobs`` shards at a
time (each with its own concurrent range requests), and only where the budget has room
(``ensure(must=False)``): when it has none it waits for the reader to move on and free a
shard. Readers then find their shard whole, or wait on its lock while it completes.
The cache knows nothing of loaders: the loader calls :meth:`advance` (or :meth:`follow`).

Example::

    >>> ahead = ShardAhead(store, fs, refs, first_use=[0, 1000, 2000], ahead=2).start()
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
        ahead: shards downloaded past the one the reader is in (at least 1).
        jobs: shards downloaded at once.
        start: the reader's first sample position (a resumed epoch).

    Attributes:
        fetched, hits, failed: outcomes so far (a failed download is left to the reader,
        which downloads again or raises the error naming its sample).
    """

    thread_name = "fastload-shard-ahead"

    def __init__(
        self, store: ShardStore, fs: Any, refs: Sequence[ShardRef], first_use: Sequence[int], *,
        ahead: int = 2, jobs: int = 2, start: int = 0,
    ) -> None:
        self.store, self.fs = store, fs
        self.refs, self.first_use = list(refs), list(first_use)
        self.ahead, self.jobs = max(1, ahead), max(1, jobs)
        self.fetched = self.hits = self.failed = 0
        super().__init__(start)
        self._next = max(0, bisect.bisect_right(self.first_use, start) - 1)

    def start(self) -> ShardAhead:
        """Start the download threads; returns self."""
        return self._start_threads(min(self.jobs, len(self.refs) - self._next))

    def _summary(self) -> str:
        return f"{self.fetched} shards fetched, {self.hits} already there, {self.failed} failed"

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
                try:
                    outcome = self.store.ensure(self.fs, self.refs[k], must=False)
                except Exception as exc:  # noqa: BLE001 - the reader downloads again, or raises it
                    logger.debug("downloading %s ahead failed: %s", self.refs[k].url, exc)
                    with self._cond:
                        self.failed += 1
                    break
                if outcome != "no room":
                    with self._cond:
                        if outcome == "hit":
                            self.hits += 1
                        else:
                            self.fetched += 1
                    break
                with self._cond:  # the budget is full of shards in use: wait for the reader
                    if self._stopped or self._current() >= k:
                        break  # the reader is there already and downloads it itself
                    if self._consumed == seen:
                        self._cond.wait(_NO_ROOM_WAIT_S)
                    seen = self._consumed
