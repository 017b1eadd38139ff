"""What a warm is asked and what it reports, light to import (no fsspec, no storage).

The command line reads its defaults and parses ``--shard`` here before it imports the warm
itself (:mod:`fastload.cache.warm`), so ``fastload cache stats`` and ``--help`` start fast.

Example::

    >>> parse_shard("1/4")
    (1, 4)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fastload.errors import ConfigError

MAX_FAILURES = 10
"""Default of ``max_failures``: objects in a row that may fail before a warm gives up."""

GIVE_UP_AFTER_S = 20.0
"""Default of ``give_up_after``: seconds of failures with no success before a warm gives up."""


@dataclass
class WarmReport:
    """What a :func:`warm` did: objects and bytes in the shard, and each object's outcome."""

    url: str
    files: int = 0
    bytes: int = 0
    fetched: int = 0
    skipped: int = 0     # already cached
    rejected: int = 0    # fetched, but the cache was full
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (url, error)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def done(self) -> int:
        """Objects finished so far, whatever their outcome."""
        return self.fetched + self.skipped + self.rejected + len(self.failed)

    @property
    def cached(self) -> int:
        """Objects of the shard in the cache (fetched now or before)."""
        return self.fetched + self.skipped


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)`` with ``0 <= I < N``."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        i = n = -1
    if not 0 <= i < n:
        raise ConfigError(f"--shard must be I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    return i, n


__all__ = ["GIVE_UP_AFTER_S", "MAX_FAILURES", "WarmReport", "parse_shard"]
