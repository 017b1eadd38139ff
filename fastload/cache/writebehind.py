"""Write-behind: a process's puts from the read path, buffered and committed in batches.

NOTE [write-behind]
A cold epoch over small local files stores every object it reads, one put each. On the
packed disk tier a put is one LMDB write transaction (``packed.py``), about 45 us of CPU at
1 KB, half of it the commit; in a batch of 64 it is about 10 us an entry
(``benchmarks/cache_store.py``, ``put`` against ``put_many``). So a put from a *read that
holds no fetch lock* (a local file: NOTE [no fetch lock for local files] in
:mod:`.misses`; a promotion from a lower tier) goes into this process's
:class:`PendingPuts` of the directory (``DiskTier.put_later``) and is committed with the
others by one ``put_many``:

* when FLUSH_ENTRIES (256) entries or FLUSH_BYTES (8 MiB) are pending, or the oldest has waited
  FLUSH_AGE_S seconds (checked at the next put, get or contains of the directory's tiers),
* when a tier of the directory closes, before this process forks (``os.register_at_fork``),
  and when it exits (``multiprocessing.util.Finalize``, which torch's worker processes run
  as they end),
* before anything that lists or counts the directory (``keys``, ``entries``,
  ``read_used``, ``cache stats``/``verify``/``clear``).

What the Tier contract promises still holds. This process sees a pending entry at once:
``get`` and ``contains`` of every DiskTier of the directory look at the buffer first (the
buffer is one per process and directory). Other processes see it after the flush, and a
reader there sees the whole entry or none (one LMDB transaction); a process killed before a
flush loses only its unflushed entries, never the store's consistency. The budget and the
policy are applied by the flush's transaction as by any put (a deferred put that does not
fit is counted ``rejected`` then, and under "keep" the tier turns pass-through as before).
Objects of 1 MiB and more, and format "files", are not buffered (their cost is the file).
A fetch made under a key's fetch lock (remote origins, derivations) is stored at once,
before the lock is released: the processes waiting on that lock must find the entry, so
one download per object holds; write-behind is never used there.

Example::

    >>> tier.put_later("file:///d/a.jpg#v=1397:17644:53:17644", data)   # buffered
    >>> tier.get("file:///d/a.jpg#v=1397:17644:53:17644") == data       # seen here at once
    True
    >>> tier.flush_puts()                  # one transaction: other processes see it now
"""

from __future__ import annotations

import logging
import multiprocessing.util
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from fastload.cache.forks import after_fork

logger = logging.getLogger(__name__)

FLUSH_ENTRIES = 256
FLUSH_BYTES = 8 << 20
FLUSH_AGE_S = 0.2

Commit = Callable[[list[tuple[str, bytes]]], object]
"""Stores a batch of (key, value) (the deferring tier's ``put_many``)."""

__all__ = ["FLUSH_AGE_S", "FLUSH_BYTES", "FLUSH_ENTRIES", "DefersPuts", "PendingPuts", "pending_puts"]


@runtime_checkable
class DefersPuts(Protocol):
    """A tier that can buffer a put and commit it later with others (NOTE [write-behind]).

    ``put_later(key, value)`` stores like ``put`` but may commit later; this process sees
    the entry at once, other processes once it is flushed. The cache uses it only for puts
    made while it holds no fetch lock.
    """

    def put_later(self, key: str, value: bytes) -> None: ...


class PendingPuts:
    """One process's buffered puts into one cache directory (shared by its DiskTiers).

    Readers look up :meth:`get` without a lock (a dict lookup is atomic); adding and
    flushing take :attr:`lock`. While a flush commits, its entries stay visible to
    :meth:`get` until the commit is done.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.values: dict[str, tuple[bytes, Commit]] = {}
        self.flushing: dict[str, tuple[bytes, Commit]] = {}
        self.bytes = 0
        self.since = 0.0
        after_fork(self, PendingPuts._reset_after_fork)

    def _reset_after_fork(self) -> None:
        """In a forked child: the parent's pending entries are the parent's to commit."""
        self.lock = threading.RLock()
        self.values = {}
        self.flushing = {}
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self.values or self.flushing)

    def __len__(self) -> int:
        return len(self.values)

    def add(self, key: str, value: bytes, commit: Commit) -> None:
        """Buffer ``(key, value)``, to be stored by ``commit``; flushes when a flush is due."""
        if not _exit_registered:
            _exit_flush_registered()
        now = time.monotonic()
        with self.lock:
            values = self.values
            if not values:
                self.since = now
            if key not in values:
                self.bytes += len(value)
            values[key] = (value, commit)
            due = len(values) >= FLUSH_ENTRIES or self.bytes >= FLUSH_BYTES or now - self.since >= FLUSH_AGE_S
        if due:
            self.flush()

    def get(self, key: str) -> bytes | None:
        """The pending value of ``key``, or None; flushes first when the oldest is due."""
        item = self.values.get(key) or self.flushing.get(key)
        if self.values and time.monotonic() - self.since >= FLUSH_AGE_S:
            self.flush()
        return None if item is None else item[0]

    def discard(self, key: str) -> None:
        """Forget ``key``'s pending put (the tier deletes the entry)."""
        with self.lock:
            item = self.values.pop(key, None)
            if item is not None:
                self.bytes -= len(item[0])

    def flush(self) -> None:
        """Commit every pending entry: one ``commit`` call per deferring tier."""
        with self.lock:
            if not self.values:
                return
            self.flushing, self.values = self.values, {}
            self.bytes = 0
            try:
                batches: dict[Commit, list[tuple[str, bytes]]] = {}
                for key, (value, commit) in self.flushing.items():
                    batches.setdefault(commit, []).append((key, value))
                for commit, items in batches.items():
                    commit(items)
            finally:
                self.flushing = {}


_BUFFERS: dict[str, PendingPuts] = {}
_BUFFERS_LOCK = threading.Lock()
_exit_registered = False


def pending_puts(directory: str) -> PendingPuts:
    """This process's buffer of the cache directory ``directory`` (an absolute path)."""
    with _BUFFERS_LOCK:
        buffer = _BUFFERS.get(directory)
        if buffer is None:
            buffer = _BUFFERS[directory] = PendingPuts(directory)
        return buffer


def flush_all() -> None:
    """Commit every buffered put of this process (before a fork, at exit)."""
    for buffer in list(_BUFFERS.values()):
        try:
            buffer.flush()
        except Exception:  # a hook must not fail the fork or the exit; the entries are lost
            logger.exception("disk cache %s: could not store buffered entries", buffer.name)


def _exit_flush_registered() -> None:
    """Flush at this process's exit: multiprocessing runs its finalizers then (torch workers
    too); a forked child does not inherit the parent's, so each process registers its own."""
    global _exit_registered
    if not _exit_registered:
        _exit_registered = True
        multiprocessing.util.Finalize(None, flush_all, exitpriority=20)


def _forked() -> None:
    global _exit_registered
    _exit_registered = False


os.register_at_fork(before=flush_all, after_in_child=_forked)
