"""The memory tier: a size-bounded in-process store of cached objects.

It lives in one process. A loader with worker processes gives each worker its own (the
disk tier is what workers share; on Linux a disk tier in ``/dev/shm`` is a node-wide memory
tier). Thread-safe, so the prefetcher's threads and the training loop can share it.

Example::

    >>> tier = MemoryTier("512MB", policy="lru")
    >>> tier.put("s3://b/a.jpg#v=3", b"abc")
    True
    >>> tier.get("s3://b/a.jpg#v=3")
    b'abc'
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator

from fastload.cache.config import POLICIES, Policy, parse_size
from fastload.cache.tier import Tier
from fastload.errors import ConfigError

logger = logging.getLogger(__name__)


class MemoryTier(Tier):
    """Objects in this process's memory, at most ``size`` bytes, under ``policy``."""

    name = "memory"
    shared = False

    def __init__(self, size: int | str, *, policy: Policy = "keep") -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ConfigError(f"cache policy must be 'keep' or 'lru', got {policy!r}")
        self.size = parse_size(size, name="memory")
        self.policy: Policy = policy
        self.used = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._warned_full = False

    def __reduce__(self):  # a fresh, empty tier in each process
        return (_new_memory_tier, (self.size, self.policy))

    def __repr__(self) -> str:
        return f"MemoryTier({self.used}/{self.size} bytes, {len(self._items)} entries, {self.policy})"

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.stats.misses += 1
                return None
            if self.policy == "lru":
                self._items.move_to_end(key)
            self.stats.hits += 1
            self.stats.bytes_read += len(value)
            return value

    def contains(self, key: str) -> bool:
        return key in self._items

    def put(self, key: str, value: bytes) -> bool:
        n = len(value)
        with self._lock:
            if key in self._items:
                return True
            if n > self.size:
                self.stats.rejected += 1
                return False
            if self.used + n > self.size:
                if self.policy == "keep":
                    self.stats.rejected += 1
                    if not self._warned_full:
                        self._warned_full = True
                        logger.info(
                            "memory cache tier is full (%d of %d bytes); policy 'keep' admits "
                            "no more entries in this process", self.used, self.size,
                        )
                    return False
                while self.used + n > self.size:
                    _, old = self._items.popitem(last=False)
                    self.used -= len(old)
            self._items[key] = bytes(value)
            self.used += n
            self.stats.puts += 1
            self.stats.bytes_written += n
            return True

    def delete(self, key: str) -> None:
        with self._lock:
            value = self._items.pop(key, None)
            if value is not None:
                self.used -= len(value)

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._items))


def _new_memory_tier(size: int, policy: Policy) -> MemoryTier:
    return MemoryTier(size, policy=policy)
