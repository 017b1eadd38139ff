"""What every downloader ahead of a reader shares: the reader's position, stop, follow.

:class:`~fastload.cache.prefetcher.Prefetcher` (objects) and
:class:`~fastload.cache.shardahead.ShardAhead` (whole shards) run daemon threads that fetch
ahead of a reader; the reader says how far it got with :meth:`Ahead.advance` (or iterates
through :meth:`Ahead.follow`), and :meth:`Ahead.stop` ends them. A subclass writes ``_run``
(each thread's loop, waiting on ``_cond``) and ``_summary`` (the line logged at the end).

Example::

    >>> for batch in Prefetcher(cache, fs, paths).start().follow(batches, per_item=256):
    ...     train(batch)
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["Ahead"]


class Ahead(abc.ABC):
    """Threads fetching ahead of a reader that is at sample ``start`` (NOTE in the module)."""

    thread_name = "fastload-ahead"

    def __init__(self, start: int = 0) -> None:
        self._consumed = start
        self._stopped = False
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    @abc.abstractmethod
    def _run(self) -> None:
        """One thread's work, until there is none or :meth:`stop`."""

    @abc.abstractmethod
    def _summary(self) -> str:
        """What was done, for the log line at :meth:`stop`."""

    def _advanced(self) -> None:
        """Called under ``_cond`` after the reader moved on."""

    def _start_threads(self, count: int) -> Self:
        for i in range(count):
            t = threading.Thread(target=self._run, name=f"{self.thread_name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def advance(self, consumed: int) -> None:
        """The reader has read ``consumed`` more samples: the window moves on."""
        with self._cond:
            self._consumed += consumed
            self._advanced()
            self._cond.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop fetching and wait (up to ``timeout`` seconds) for what is in flight."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
        if self._threads:
            logger.debug("%s stopped: %s", type(self).__name__, self._summary())

    def follow(self, source: Iterator[Any], per_item: int) -> Iterator[Any]:
        """Yield from ``source``, moving the window ``per_item`` samples per item; stop at the end."""
        try:
            for item in source:
                yield item
                self.advance(per_item)
        finally:
            self.stop()
