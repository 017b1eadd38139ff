"""Many whole-object reads in flight at once, for callers that fetch a whole listing.

:func:`open_fetcher` picks how, by the filesystem (NOTE [fetch paths]):

* an async filesystem (s3fs, HTTP, ``latency::``: ``fs.async_impl``): one coroutine per
  object on the filesystem's own event loop, ``jobs`` requests in flight under a semaphore,
  each an :func:`~fastload.io.origin.aread_whole` (one GET, deadline, bounded retry);
* a local directory: ``jobs`` reader threads taking chunks of paths (``jobs=1`` reads in the
  caller's thread), each file read with its version (:func:`~fastload.io.origin.read_local`);
* any other (sync) filesystem: ``jobs`` reader threads calling
  :func:`~fastload.io.origin.read_whole`.

The caller submits paths (never more than it can hold: it is the caller's window that keeps
a listing from being queued whole) and collects :class:`Fetched` results as they finish.
Every failure is already a fastload error naming the URL (NOTE [storage errors]).

Example::

    >>> with open_fetcher(fs, jobs=64) as fetcher:
    ...     fetcher.submit(paths[:64])
    ...     for got in fetcher.results(timeout=1.0):
    ...         print(got.path, len(got.data) if got.error is None else got.error)
"""

from __future__ import annotations

import abc
import asyncio
import collections
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsspec.implementations.local import LocalFileSystem

from fastload.errors import FastloadError
from fastload.io.errors import storage_error
from fastload.io.origin import READ_DEADLINE_S, aread_whole, read_local, read_whole

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["REMOTE_JOBS", "SYNC_JOBS", "Fetched", "Fetcher", "default_jobs", "open_fetcher"]

REMOTE_JOBS = 64
"""Default ``jobs`` on an async (remote) filesystem: requests in flight (NOTE [default jobs])."""

SYNC_JOBS = 16
"""Default ``jobs`` on a local or other sync filesystem: reader threads (NOTE [default jobs])."""

CLOSE_WAIT_S = 5.0
"""Seconds :meth:`Fetcher.close` waits for cancelled requests and reader threads to end."""

_CHUNK = 32  # most paths one reader thread takes at a time (fewer hand-overs per object)
_INLINE_WINDOW = 256  # paths read in a row by InlineFetcher.results


@dataclass(slots=True)
class Fetched:
    """One finished read: the bytes, or the error (a fastload error naming the URL).

    ``version`` is the version of the bytes read where the read knows it (local files:
    NOTE [fetch-time version check] in :mod:`fastload.cache.fills`), else None.
    """

    path: str
    data: bytes | None
    version: str | None = None
    error: FastloadError | None = None


# NOTE [fetch paths]
# Measured on the 2-core development VM, 10k 1-KB local files in the page cache: a loop in
# one thread reads about 41,000 files/s; one ThreadPoolExecutor task per file tops out near
# 9,000/s (each hand-over costs more than the read), and more threads only fight for the
# GIL; chunks of 16-32 paths per reader thread read 30,000-50,000/s. So local reads go in
# chunks, `jobs=1` in the caller's own thread (fastest while the files are cached), and
# more threads pay where reads wait: with the files evicted from the page cache a whole
# warm ran at 3,200 objects/s with jobs=1 and 4,400 with 32 reader threads. Remote stores
# answer in milliseconds, so there the cost is the wait: an event loop keeps hundreds of
# requests in flight for the price of a few coroutines, where a thread each would spend the
# two cores switching. `jobs` therefore means requests in flight on an async filesystem and
# reader threads on a sync one.


class Fetcher(abc.ABC):
    """Reads submitted paths concurrently; results come back in the order they finish.

    Use :func:`open_fetcher`; as a context manager it is closed at the end (requests still
    in flight are cancelled and reader threads stopped). A subclass writes :meth:`submit`
    and :meth:`cancel_queued` and hands each finished read to ``_finished``.
    """

    def __init__(self, fs: Any, jobs: int) -> None:
        self.fs = fs
        self.jobs = jobs
        self._done: collections.deque[Fetched] = collections.deque()
        self._ready = threading.Condition()

    @property
    def window(self) -> int:
        """How many paths to keep submitted and uncollected for the reads to keep going."""
        return self.jobs

    @abc.abstractmethod
    def submit(self, paths: Sequence[str]) -> None:
        """Start reading ``paths`` (at most ``jobs`` at a time); returns at once."""

    @abc.abstractmethod
    def cancel_queued(self) -> list[str]:
        """Drop the submitted paths no read has started on, and return them."""

    def results(self, timeout: float | None = None) -> list[Fetched]:
        """Every read finished since the last call; waits up to ``timeout`` s for one."""
        with self._ready:
            if not self._done and timeout != 0:
                self._ready.wait(timeout)
            done = list(self._done)
            self._done.clear()
        return done

    def close(self) -> None:
        """Cancel what is in flight and stop; results not yet collected are dropped."""

    def _finished(self, item: Fetched) -> None:
        with self._ready:
            self._done.append(item)
            self._ready.notify()

    def _finished_all(self, items: list[Fetched]) -> None:
        with self._ready:
            self._done.extend(items)
            self._ready.notify()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _converted(exc: BaseException, fs: Any, path: str) -> FastloadError:
    """The fastload error of a failed read (NOTE [storage errors] in fastload.io.errors)."""
    return storage_error(exc, "read", fs.unstrip_protocol(path))


class AsyncFetcher(Fetcher):
    """Reads on ``fs.loop``: a coroutine per path, at most ``jobs`` of them at a time.

    Paths wait in a queue of the loop's until a request ends; a count, not a semaphore,
    bounds the requests (no waiter object per queued path).
    """

    def __init__(self, fs: Any, jobs: int, deadline: float | None = READ_DEADLINE_S) -> None:
        super().__init__(fs, jobs)
        self.deadline = deadline
        self._loop: asyncio.AbstractEventLoop = fs.loop
        # Touched on the loop only:
        self._queued: collections.deque[str] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    def submit(self, paths: Sequence[str]) -> None:
        self._loop.call_soon_threadsafe(self._enqueue, list(paths))

    def cancel_queued(self) -> list[str]:
        async def take() -> list[str]:
            taken = list(self._queued)
            self._queued.clear()
            return taken

        return asyncio.run_coroutine_threadsafe(take(), self._loop).result(CLOSE_WAIT_S)

    def _enqueue(self, paths: list[str]) -> None:
        self._queued.extend(paths)
        self._start()

    def _start(self) -> None:
        while self._queued and len(self._tasks) < self.jobs and not self._closing:
            task = self._loop.create_task(self._one(self._queued.popleft()))
            self._tasks.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._start()

    async def _one(self, path: str) -> None:
        try:
            data = await aread_whole(self.fs, path, deadline=self.deadline)
        except Exception as exc:  # noqa: BLE001 - NOTE [storage errors]: any becomes a result
            self._finished(Fetched(path, None, None, _converted(exc, self.fs, path)))
        else:
            self._finished(Fetched(path, data))

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def cancel_all() -> None:
            self._closing = True
            self._queued.clear()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)

        future = asyncio.run_coroutine_threadsafe(cancel_all(), self._loop)
        try:
            future.result(CLOSE_WAIT_S)
        except Exception:  # noqa: BLE001 - the loop is stuck or gone: nothing to wait for
            logger.warning("reads on %s did not stop within %g s", self.fs, CLOSE_WAIT_S)


class ThreadFetcher(Fetcher):
    """Reads in ``jobs`` reader threads (daemon, named ``fastload-fetch``), chunks at a time."""

    def __init__(self, fs: Any, jobs: int) -> None:
        super().__init__(fs, jobs)
        self._local = type(fs) is LocalFileSystem
        self._work: queue.SimpleQueue[list[str] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @property
    def window(self) -> int:
        # Local reads take microseconds: chunks of them per hand-over (NOTE [fetch paths]).
        return self.jobs * 8 if self._local else self.jobs

    def cancel_queued(self) -> list[str]:
        taken: list[str] = []
        while True:
            try:
                chunk = self._work.get_nowait()
            except queue.Empty:
                return taken
            if chunk is not None:
                taken.extend(chunk)

    def submit(self, paths: Sequence[str]) -> None:
        paths = list(paths)
        if not paths:
            return
        # Chunks spread over the readers, never more than _CHUNK a hand-over.
        size = max(1, min(_CHUNK, -(-len(paths) // self.jobs)))
        for start in range(0, len(paths), size):
            self._work.put(paths[start : start + size])
        while len(self._threads) < min(self.jobs, self._work.qsize() + len(self._threads)):
            thread = threading.Thread(
                target=self._reader, name=f"fastload-fetch-{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _reader(self) -> None:
        while True:
            chunk = self._work.get()
            if chunk is None:
                return
            if self._local:  # microseconds each: one hand-over per chunk
                self._finished_all([read_one(self.fs, path, local=True) for path in chunk])
            else:
                for path in chunk:
                    self._finished(read_one(self.fs, path, local=False))

    def close(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        end = time.monotonic() + CLOSE_WAIT_S  # one wait for them all, not one each
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        if self._threads:
            logger.warning("%d reader threads of %s are still reading", len(self._threads), self.fs)


class InlineFetcher(Fetcher):
    """Reads in the caller's thread, when it collects results (``jobs=1`` on local files)."""

    def __init__(self, fs: Any) -> None:
        super().__init__(fs, 1)
        self._local = type(fs) is LocalFileSystem
        self._todo: collections.deque[str] = collections.deque()

    @property
    def window(self) -> int:
        return _INLINE_WINDOW

    def submit(self, paths: Sequence[str]) -> None:
        self._todo.extend(paths)

    def cancel_queued(self) -> list[str]:
        taken = list(self._todo)
        self._todo.clear()
        return taken

    def results(self, timeout: float | None = None) -> list[Fetched]:
        todo, self._todo = self._todo, collections.deque()
        return [read_one(self.fs, path, local=self._local) for path in todo]


def read_one(fs: Any, path: str, *, local: bool) -> Fetched:
    """One synchronous read as a :class:`Fetched` (a local file's version with it)."""
    try:
        if local:
            data, version = read_local(path, fs.unstrip_protocol(path))
            return Fetched(path, data, version)
        return Fetched(path, read_whole(fs, path))
    except Exception as exc:  # noqa: BLE001 - NOTE [storage errors]: any becomes a result
        return Fetched(path, None, None, _converted(exc, fs, path))


def is_async(fs: Any) -> bool:
    """Whether reads of ``fs`` can run as coroutines on its own loop (s3fs, HTTP, latency::)."""
    return bool(getattr(fs, "async_impl", False)) and not getattr(fs, "asynchronous", False)


# NOTE [default jobs]
# A remote store's throughput is requests in flight / latency: 16 in flight against a store
# answering in 15 ms capped a warm at ~1,066 objects/s, and an event loop keeps 64 in flight
# for the price of 64 coroutines (memory: at most 64 objects and 256 MiB between request and
# store, NOTE [warm pipeline]). Local files have no latency to hide: more reader threads only
# fight for the GIL and the cores (NOTE [fetch paths]), so sync filesystems keep 16 threads.


def default_jobs(fs: Any) -> int:
    """The ``jobs`` of a warm that names none: REMOTE_JOBS on an async filesystem, else SYNC_JOBS.

    Example::

        >>> default_jobs(fsspec.filesystem("s3")), default_jobs(fsspec.filesystem("file"))
        (64, 16)
    """
    return REMOTE_JOBS if is_async(fs) else SYNC_JOBS


def open_fetcher(fs: Any, jobs: int, *, deadline: float | None = READ_DEADLINE_S) -> Fetcher:
    """The :class:`Fetcher` for ``fs`` with ``jobs`` reads in flight (NOTE [fetch paths]).

    ``deadline`` bounds one read on an async filesystem, retries included (seconds).

    Example::

        >>> fetcher = open_fetcher(fsspec.filesystem("s3"), jobs=128)   # on s3fs's loop
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if is_async(fs):
        return AsyncFetcher(fs, jobs, deadline)
    if jobs == 1 and type(fs) is LocalFileSystem:
        return InlineFetcher(fs)
    return ThreadFetcher(fs, jobs)
