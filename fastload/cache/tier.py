"""The contract every cache tier keeps (memory, local disk, Redis).

A tier stores immutable byte strings under string keys. Keys are built by the cache from the
origin URL *and* the origin's version (etag, mtime or size), so a changed object gets a new
key and a tier never has to detect staleness itself. A tier must:

* return ``None`` from :meth:`get` for a missing entry and for any entry that fails
  validation (size or checksum), dropping the bad entry, never serving it;
* make :meth:`put` atomic: a concurrent reader sees the whole value or nothing;
* turn its own faults (full disk, exhausted budget, server down) into ``False`` from
  :meth:`put` / ``None`` from :meth:`get` plus one logged warning, never an exception that
  stops training;
* count ``hits``/``misses`` in :meth:`get` only: :meth:`contains` is a cheap check that
  counts nothing (the cache calls it before and after waiting for another fetch).

``shared`` says whether other processes see what the tier stores (disk, Redis: yes; the
in-process memory tier: no); the prefetcher of a loader with worker processes fills only
shared tiers. A tier that can hold a per-key lock across processes also implements
:class:`KeyLocking`; the cache then fetches each missing object once, not once per process.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass
class TierStats:
    """Counters of one tier since it was opened (per process)."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    rejected: int = 0      # puts refused: over budget, policy, or a fault
    corrupt: int = 0       # entries dropped because validation failed
    forged: int = 0        # entries dropped for a missing or wrong MAC (the Redis tier)
    bytes_read: int = 0
    bytes_written: int = 0


class Tier(abc.ABC):
    """One level of the cache. Subclasses write get/put/delete/keys; see the module doc."""

    name: str = "tier"
    shared: bool = True  # other processes see the entries (False for in-process tiers)

    def __init__(self) -> None:
        self.stats = TierStats()

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """The validated value of ``key``, or None (missing, corrupt, or the tier failed)."""

    @abc.abstractmethod
    def put(self, key: str, value: bytes) -> bool:
        """Store ``value`` atomically; False if the tier declined or failed (never raises)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Drop ``key`` if present."""

    @abc.abstractmethod
    def keys(self) -> Iterator[str]:
        """Every key currently stored (for stats, verify and clear)."""

    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored; cheap and uncounted. Override the default (a full get)."""
        return self.get(key) is not None

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> list[bool]:
        """Store many entries, each as :meth:`put` would; one result per item, in order.

        Tiers whose cost is per write (a transaction, a round trip) override it to store the
        whole batch at once; ``cache warm`` hands them its downloads in batches.
        """
        return [self.put(key, value) for key, value in items]

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """:meth:`get` of each key, in order; the disk tier reads a batch in one transaction."""
        return [self.get(key) for key in keys]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """:meth:`contains` of each key, in order (one transaction or round trip if overridden)."""
        return [self.contains(key) for key in keys]

    def close(self) -> None:
        """Release connections and handles; the tier may not be used afterwards."""


@runtime_checkable
class KeyLocking(Protocol):
    """A tier that can lock one key across processes (the disk tier: a file lock).

    ``lock(key, timeout)`` is a context manager yielding True when the lock was taken and
    False when ``timeout`` seconds passed first (the caller then fetches anyway).
    """

    def lock(self, key: str, timeout: float) -> AbstractContextManager[bool]: ...
