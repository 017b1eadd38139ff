"""A thread pool whose threads never hold up the interpreter's exit, nor a close.

``concurrent.futures.ThreadPoolExecutor`` joins its threads at interpreter exit, after
running every task still queued: a read blocked on a store that no longer answers then
keeps a Ctrl-C'd training process alive until the read returns, and the queued reads
after it too. The threaded engine's reads and pixel work run here instead
(NOTE [abandoned reads] in :mod:`fastload.engines.threads`): daemon threads, queued tasks
cancelled on :meth:`DaemonPool.shutdown`, and a shutdown that waits for running tasks
only as long as it is told. A pool dropped without a shutdown ends its idle threads when
it is collected, as ``ThreadPoolExecutor`` does.

NOTE [threads at exit]
"Never hold up the exit" is not "run on through it". When the interpreter finalizes (after
the atexit hooks), a daemon thread that comes back for the GIL is ended with
``pthread_exit``, which unwinds the thread's C++ frames by force; a pixel thread coming back
from a torch call (``permute``, ``interpolate``) then hits ``std::terminate`` and the
process dies with SIGABRT (exit code 134, "terminate called without an active exception").
It happened to 10 of 11 runs of a script that left its loop with ``break`` and returned,
and to 1 of 2 whose last epoch ended while the engine still worked ahead: the batches after
the loop's were in flight. So an atexit hook shuts every pool down (its queued tasks cancelled) and
waits up to ``EXIT_WAIT_S`` for the running tasks, a decode or a resize of a few ms; a read
still blocked on a store after that is left as before (its frames are Python's and the C
library's, which the forced unwind passes through).

Example::

    >>> pool = DaemonPool(4, "fastload-read")
    >>> future = pool.submit(fs.cat_file, path)       # a concurrent.futures.Future
    >>> future.result(timeout=10)
    >>> left = pool.shutdown(wait_s=1.0)             # threads still busy after 1 s
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)

_STOP = None  # the queue item that ends a thread
_Task = tuple[Future[Any], Callable[..., Any], tuple]

EXIT_WAIT_S = 1.0
"""How long the interpreter's exit waits for the pools' running tasks (NOTE [threads at exit])."""

_LIVE_POOLS: weakref.WeakSet[DaemonPool] = weakref.WeakSet()
_LIVE_THREADS: set[threading.Thread] = set()  # a pool's threads until they end, collected pool or not


class DaemonPool:
    """Up to ``threads`` daemon threads, started as tasks arrive, named ``name-N``; each
    calls ``initializer()`` (if given) before its first task."""

    def __init__(self, threads: int, name: str, initializer: Callable[[], None] | None = None) -> None:
        self.max_threads = max(1, int(threads))
        self.name = name
        self._initializer = initializer
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shutdown = False
        # The threads hold the queue, never the pool: collected, it stops them.
        self._stop = weakref.finalize(self, _stop, self._queue, self._threads)
        _LIVE_POOLS.add(self)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a thread of the pool; its result or exception in the Future."""
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"the {self.name} pool is shut down")
            self._queue.put((future, fn, args))
            if len(self._threads) < self.max_threads:
                thread = threading.Thread(target=_work, args=(self._queue, self._initializer), daemon=True,
                                          name=f"{self.name}-{len(self._threads)}")
                _LIVE_THREADS.add(thread)
                thread.start()
                self._threads.append(thread)
        return future

    def shutdown(self, *, wait_s: float = 0.0) -> list[threading.Thread]:
        """Cancel the queued tasks, let each thread end after its running one, and wait up
        to ``wait_s`` seconds for them; returns the threads still running then (daemon
        threads: they end when their task returns, and never hold up exit)."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item[0].cancel()
        self._stop()  # one stop per thread, once
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t for t in threads if t.is_alive()]


def _work(tasks: queue.SimpleQueue[_Task | None], initializer: Callable[[], None] | None) -> None:
    """A pool thread: runs tasks until a stop. Holds nothing of a task while it waits for
    the next (a result may lead back to the pool, which would then never be collected)."""
    if initializer is not None:
        try:
            initializer()
        except Exception:  # a set-up that failed must not leave tasks unrun
            logger.warning("%s: its initializer failed", threading.current_thread().name, exc_info=True)
    try:
        while True:
            item = tasks.get()
            if item is _STOP:
                return
            _run(*item)
            del item
    finally:
        _LIVE_THREADS.discard(threading.current_thread())


def _run(future: Future[Any], fn: Callable[..., Any], args: tuple) -> None:
    if not future.set_running_or_notify_cancel():
        return  # cancelled while queued
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the Future carries it to its reader
        future.set_exception(exc)
    else:
        future.set_result(result)


def _stop(tasks: queue.SimpleQueue[_Task | None], threads: list[threading.Thread]) -> None:
    for _ in threads:
        tasks.put(_STOP)


@atexit.register
def _shut_down_at_exit() -> None:
    """Stop every pool and wait up to EXIT_WAIT_S for their running tasks (NOTE [threads at exit])."""
    for pool in list(_LIVE_POOLS):
        pool.shutdown(wait_s=0.0)
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_LIVE_THREADS):
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in _LIVE_THREADS if t.is_alive()]
    if left:
        logger.debug("exit: %d pool threads still running after %.1f s (%s)", len(left), EXIT_WAIT_S,
                     ", ".join(left))
