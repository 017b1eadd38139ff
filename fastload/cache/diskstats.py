"""The counters of a disk cache directory: every process that used it adds its hits, misses,
puts... to the directory's ``stats.json``, every few seconds and at exit, for
``fastload cache stats``.

Example::

    >>> recorder = StatsRecorder(cache_dir, tier.stats)
    >>> tier.stats.hits += 1
    >>> recorder.flush()
    >>> load_stats(cache_dir).hits
    1
"""

from __future__ import annotations

import dataclasses
import logging
import time

from fastload.cache.cachedir import CacheDir, LockTimeout
from fastload.cache.tier import TierStats

logger = logging.getLogger(__name__)

STATS_FILE = "stats.json"
FLUSH_EVERY_S = 5.0
_LOCK_TIMEOUT_S = 5.0


def load_stats(cache_dir: CacheDir) -> TierStats:
    """The counters recorded in ``cache_dir`` (zeros when none are, or they are unreadable)."""
    data = cache_dir.read_json(STATS_FILE)
    try:
        return TierStats(**{k: int(v) for k, v in data.items() if k in TierStats.__dataclass_fields__})
    except (AttributeError, TypeError, ValueError):
        return TierStats()


class StatsRecorder:
    """Adds one process's counters (``stats``, a live TierStats) to ``cache_dir``'s stats.json."""

    def __init__(self, cache_dir: CacheDir, stats: TierStats) -> None:
        self.cache_dir = cache_dir
        self.stats = stats
        self.flushed = TierStats()
        self.last = time.monotonic()

    def maybe_flush(self) -> None:
        """Flush if the last flush is more than FLUSH_EVERY_S seconds old (the hot path)."""
        if time.monotonic() - self.last > FLUSH_EVERY_S:
            self.flush()

    def reset(self) -> None:
        """Count from now on: what this process counted so far is not recorded (after a clear)."""
        self.flushed = dataclasses.replace(self.stats)

    def flush(self) -> None:
        """Add what this process counted since the last flush to stats.json."""
        self.last = time.monotonic()
        now = dataclasses.replace(self.stats)
        delta = {f: getattr(now, f) - getattr(self.flushed, f) for f in TierStats.__dataclass_fields__}
        if not any(delta.values()):
            return
        try:
            with self.cache_dir.index_lock(_LOCK_TIMEOUT_S):
                total = load_stats(self.cache_dir)
                for f, d in delta.items():
                    setattr(total, f, getattr(total, f) + d)
                self.cache_dir.write_json(STATS_FILE, dataclasses.asdict(total))
            self.flushed = now
        except (OSError, LockTimeout) as exc:
            logger.debug("could not record cache counters in %s: %s", self.cache_dir.path, exc)
