"""The pipeline of ``cache warm``: listed objects in, cached entries out, ``jobs`` at a time.

NOTE [warm pipeline]
One thread drives it; the reads run where the storage is fastest (:mod:`fastload.io.fetch`:
coroutines on the filesystem's event loop for remote stores, reader threads or this thread
for local files). For each chunk of the listing:

1. resume: the chunk's keys are looked up with one ``contains_many`` per shared tier
   (:meth:`TieredCache.missing`); cached objects are done ("hit") without a request;
2. the missing ones are submitted to the fetcher, never more than its window: at most
   ``jobs`` objects are between their request and their store on a remote store (so a
   warm holds at most ``jobs`` objects in memory, and ``--jobs 1`` reads one object at a
   time, storing it before the next request starts), a few per reader thread locally;
3. each download is checked and derived (:meth:`TieredCache.prepare`; a derivation runs in
   a small thread pool, never on the event loop);
4. downloads are stored in batches (:meth:`TieredCache.store_many`: one ``put_many`` per
   tier) of up to BATCH entries or BATCH_BYTES, at least every FLUSH_AFTER_S seconds,
   and whenever no download is waiting (nothing gained by holding a batch back: under load
   batches grow by themselves, as in a group commit).

A failed read counts in the circuit breaker (NOTE [warm circuit breaker]); once it trips,
the paths not yet started are dropped and the reads in flight finish.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from fastload.errors import CacheError, FastloadError
from fastload.io.fetch import Fetched, Fetcher, open_fetcher
from fastload.io.origin import READ_DEADLINE_S, is_unavailable

if TYPE_CHECKING:
    from fastload.cache.tiered import Fill, Outcome, TieredCache

logger = logging.getLogger(__name__)

BATCH = 256
"""Most entries stored with one ``put_many`` per tier."""

BATCH_BYTES = 64 * 2**20
"""Most bytes held back for one batch."""

FLUSH_AFTER_S = 0.2
"""Seconds a download may wait in a batch before the batch is stored."""

WINDOW_BYTES = 256 * 2**20
"""Most bytes (listed sizes) between request and store; one larger object still goes."""

Finished = Callable[[str, str, dict[str, Any], str, "FastloadError | None"], None]
"""Called with (path, URL, listing info, outcome, error) as each object is done; the URL is
``fs.unstrip_protocol(path)``; outcome is "hit", "fetched", "rejected" or "failed" (then
with the error)."""


# NOTE [warm circuit breaker]
# Against a dead or stalled origin every object fails only after its own timeouts and
# retries (NOTE [origin timeouts]), so failing them one by one takes hours. The breaker
# counts failures since the last success; it trips after `max_failures` of them, or after
# one or more when nothing has succeeded for `give_up_after` seconds (with few jobs, failures
# arrive slowly: a stalled store fails each read only at its read deadline). A success is
# a read from the origin; objects found cached say nothing about the origin and do not
# reset the count. Missing and forbidden objects are the object's own problem: they neither
# count nor reset the count. Once tripped no new object starts, what was downloaded is
# stored, and the reads still in flight are abandoned (cancelled as the fetcher closes; a
# rerun fetches them): waiting for them cost a second full read deadline, since a read that
# ended let a queued one start before the breaker saw the failure (a warm with 16 jobs
# against a stalled store gave up after 20 s with a 10 s deadline).


class Breaker:
    """The circuit breaker of a warm (NOTE [warm circuit breaker]).

    Example::

        >>> breaker = Breaker(max_failures=10, give_up_after=20.0)
        >>> breaker.failure(StorageError("cannot read s3://b/a: connection refused"))
        >>> breaker.tripped
        False
    """

    def __init__(self, max_failures: int, give_up_after: float) -> None:
        self.max_failures, self.give_up_after = max_failures, give_up_after
        self.streak = 0
        self.last_success = time.monotonic()
        self.tripped = False
        self.reason = ""

    def success(self) -> None:
        self.streak, self.last_success = 0, time.monotonic()

    def failure(self, exc: BaseException) -> None:
        if not is_unavailable(exc):
            return
        self.streak += 1
        quiet = time.monotonic() - self.last_success
        if self.streak >= self.max_failures:
            self.tripped, self.reason = True, f"{self.streak} objects in a row failed"
        elif quiet >= self.give_up_after:
            self.tripped = True
            self.reason = f"{self.streak} object(s) failed and none succeeded for {quiet:.0f} s"


class _Batch:
    """Downloads waiting to be stored together."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Fill]] = []
        self.nbytes = 0
        self.since = 0.0

    def add(self, path: str, fill: Fill) -> None:
        if not self.items:
            self.since = time.monotonic()
        self.items.append((path, fill))
        self.nbytes += len(fill.value)

    def full(self) -> bool:
        return len(self.items) >= BATCH or self.nbytes >= BATCH_BYTES

    def take(self) -> list[tuple[str, Fill]]:
        items, self.items, self.nbytes = self.items, [], 0
        return items


def fill_shared(
    store: TieredCache,
    fs: Any,
    listing: Iterator[tuple[str, dict[str, Any]]],
    *,
    jobs: int,
    breaker: Breaker,
    finished: Finished,
    deadline: float | None = READ_DEADLINE_S,
) -> None:
    """Cache every listed object that is missing from ``store``'s shared tiers.

    ``listing`` yields (path, info) with ``info["version"]`` (a :class:`Storage` listing);
    ``finished`` is called once per object, in this thread (NOTE [warm pipeline]).
    Returns when every object is done, or as soon as the breaker tripped (NOTE [warm circuit
    breaker]: reads in flight then are abandoned, neither finished nor failed).

    Example::

        >>> fill_shared(cache, fs, iter(listing.items()), jobs=64,
        ...             breaker=Breaker(10, 20.0), finished=print)
    """
    derive_pool = None
    if store.derive is not None:
        derive_pool = ThreadPoolExecutor(
            max_workers=os.cpu_count() or 1, thread_name_prefix="fastload-derive"
        )
    try:
        with open_fetcher(fs, jobs, deadline=deadline) as fetcher:
            _Run(store, fs, fetcher, breaker, finished, derive_pool).run(listing)
    finally:
        if derive_pool is not None:
            derive_pool.shutdown(wait=True, cancel_futures=True)


class _Run:
    """One pass of the pipeline (NOTE [warm pipeline]); all of it runs in the calling thread."""

    def __init__(self, store: TieredCache, fs: Any, fetcher: Fetcher, breaker: Breaker,
                 finished: Finished, derive_pool: ThreadPoolExecutor | None) -> None:
        self.store, self.fs, self.fetcher = store, fs, fetcher
        self.breaker, self.finished, self.derive_pool = breaker, finished, derive_pool
        self.pending: dict[str, tuple[str, dict[str, Any]]] = {}  # path -> (url, info)
        self.pending_bytes = 0
        self.ready: deque[tuple[str, str, dict[str, Any]]] = deque()  # missing, not submitted
        self.batch = _Batch()

    def run(self, listing: Iterator[tuple[str, dict[str, Any]]]) -> None:
        while True:
            if self.breaker.tripped:
                self._give_up()
                return
            self._feed(listing)
            if not self.pending:
                return
            got = self.fetcher.results(timeout=0)
            if not got:
                if self.batch.items:  # nothing waiting: store what there is
                    self._flush()
                    continue
                got = self.fetcher.results(timeout=FLUSH_AFTER_S)
            self._collect(got)
            if self.batch.items and (
                self.batch.full() or time.monotonic() - self.batch.since >= FLUSH_AFTER_S
            ):
                self._flush()

    def _give_up(self) -> None:
        """The breaker tripped: store what was downloaded, leave the rest for a rerun."""
        self.ready.clear()
        for path in self.fetcher.cancel_queued():
            self._forget(path)
        self._collect(self.fetcher.results(timeout=0))
        if self.batch.items:
            self._flush()
        for path in list(self.pending):  # in flight: abandoned
            self._forget(path)

    def _feed(self, listing: Iterator[tuple[str, dict[str, Any]]]) -> None:
        """Submit missing objects until the fetcher's window or WINDOW_BYTES is full."""
        window = self.fetcher.window
        while len(self.pending) < window and (
            self.pending_bytes < WINDOW_BYTES or not self.pending
        ):
            if not self.ready and not self._check(listing):
                return
            room = window - len(self.pending)
            paths = []
            while self.ready and room and (self.pending_bytes < WINDOW_BYTES or not paths):
                path, url, info = self.ready.popleft()
                self.pending[path] = url, info
                self.pending_bytes += int(info.get("size") or 0)
                paths.append(path)
                room -= 1
            self.fetcher.submit(paths)

    def _check(self, listing: Iterator[tuple[str, dict[str, Any]]]) -> bool:
        """Take the next chunk of the listing, finish its cached objects; False at the end."""
        while not self.ready:
            chunk = list(itertools.islice(listing, BATCH))
            if not chunk:
                return False
            urls = [self.fs.unstrip_protocol(path) for path, _ in chunk]
            keys = [self.store.key_of(url, info["version"]) for url, (_, info) in zip(urls, chunk)]
            missing = self.store.missing(keys, shared_only=True)
            for url, (path, info), gone in zip(urls, chunk, missing):
                if gone:
                    self.ready.append((path, url, info))
                else:
                    self.finished(path, url, info, "hit", None)
        return True

    def _collect(self, got: list[Fetched]) -> None:
        """Downloads into the batch (checked and derived); failures done at once."""
        if self.derive_pool is not None and len(got) > 1:
            prepared = list(self.derive_pool.map(self._prepare, got))
        else:
            prepared = [self._prepare(item) for item in got]
        for item, (fill, error) in zip(got, prepared):
            if item.error is not None:
                self._done(item.path, "failed", item.error)
                self.breaker.failure(item.error)
                continue
            self.breaker.success()  # the origin answered, whatever the bytes are
            if error is not None:  # the derivation rejected them: the object's own problem
                self._done(item.path, "failed", error)
            elif fill is not None:
                self.batch.add(item.path, fill)

    def _prepare(self, item: Fetched) -> tuple[Fill | None, FastloadError | None]:
        if item.error is not None:
            return None, item.error
        assert item.data is not None
        url, info = self.pending[item.path]
        try:
            return self.store.prepare(url, info["version"], item.data, item.version), None
        except CacheError as exc:  # the derivation rejected the bytes
            return None, exc

    def _flush(self) -> None:
        items = self.batch.take()
        outcomes: list[Outcome] = self.store.store_many(
            [fill for _, fill in items], shared_only=True
        )
        for (path, _), outcome in zip(items, outcomes):
            self._done(path, outcome, None)

    def _done(self, path: str, outcome: str, error: FastloadError | None) -> None:
        url, info = self._forget(path)
        self.finished(path, url, info, outcome, error)

    def _forget(self, path: str) -> tuple[str, dict[str, Any]]:
        url, info = self.pending.pop(path)
        self.pending_bytes -= int(info.get("size") or 0)
        return url, info
