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
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from fastload.cache.shardstore import ShardRef, ShardStore

logger = logging.getLogger(__name__)

__all__ = ["ShardAhead"]

_NO_ROOM_WAIT_S = 0.5


class ShardAhead:
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

    def __init__(
        self, store: ShardStore, fs: Any, refs: Sequence[ShardRef], first_use: Sequence[int], *,
        ahead: int = 2, jobs: int = 2, start: int = 0,
    ) -> None:
        self.store, self.fs = store, fs
        self.refs, self.first_use = list(refs), list(first_use)
        self.ahead, self.jobs = max(1, ahead), max(1, jobs)
        self.fetched = self.hits = self.failed = 0
        self._consumed = start
        self._next = max(0, bisect.bisect_right(self.first_use, start) - 1)
        self._stopped = False
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    def start(self) -> ShardAhead:
        """Start the download threads; returns self."""
        for i in range(min(self.jobs, len(self.refs) - self._next)):
            t = threading.Thread(target=self._run, name=f"fastload-shard-ahead-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def advance(self, consumed: int) -> None:
        """The reader has read ``consumed`` more samples."""
        with self._cond:
            self._consumed += consumed
            self._cond.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop starting downloads and wait (up to ``timeout`` s) for those in progress."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
        if self._threads:
            logger.debug("shards ahead stopped: %d fetched, %d already there, %d failed",
                         self.fetched, self.hits, self.failed)

    def follow(self, source: Iterator[Any], per_item: int) -> Iterator[Any]:
        """Yield from ``source``, the reader ``per_item`` samples further per item; stop at the end."""
        try:
            for item in source:
                yield item
                self.advance(per_item)
        finally:
            self.stop()

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
