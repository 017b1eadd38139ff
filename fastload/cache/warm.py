"""Warming a cache ahead of training: fetch every object below a URL into the shared tiers.

``fastload cache warm`` is a thin layer over :func:`warm`. Warming is resumable: objects
already cached (a complete entry) are skipped, so a second run after a failure or an
interrupted one fetches only what is missing. With ``shard=(i, n)`` node ``i`` of ``n``
warms every n-th object, so n nodes (each with its own disk) split a dataset.

Example::

    >>> report = warm("s3://bucket/train", "/nvme/fastload", jobs=32)
    >>> report.fetched, report.skipped, report.failed
    (1281167, 0, [])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from fastload.cache.config import open_cache
from fastload.errors import ConfigError, FastloadError
from fastload.storage import Storage


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


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)`` with ``0 <= I < N``."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        i = n = -1
    if not 0 <= i < n:
        raise ConfigError(f"--shard must be I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    return i, n


def warm(
    url: str,
    cache: Any,
    *,
    jobs: int = 16,
    shard: tuple[int, int] = (0, 1),
    storage_options: dict[str, Any] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_file: Callable[[str, int, str], None] | None = None,
) -> WarmReport:
    """Fetch every object below ``url`` (this shard of them) into the cache's shared tiers.

    Args:
        url: the dataset root (any fsspec URL).
        cache: a cache spec (a directory, a dict, a CacheConfig...); needs a disk or Redis tier.
        jobs: requests in flight.
        shard: ``(i, n)``: warm objects ``i, i + n, i + 2n...`` of the sorted listing.
        storage_options: passed to fsspec.
        on_start: called with (objects, bytes) of the shard before fetching.
        on_file: called with (url, bytes, outcome) as each object finishes; outcome is
            "hit", "fetched", "rejected" or "failed".
    """
    store = open_cache(cache)
    if store is None or not any(t.shared for t in store.tiers):
        raise ConfigError(
            f"cache warm needs a disk or Redis tier, got cache={cache!r}; pass a directory"
        )
    if jobs < 1:
        raise ConfigError(f"jobs must be at least 1, got {jobs}")
    index, count = shard
    storage = Storage(url, storage_options, cache=store)
    listing = storage.find(detail=True)
    mine = list(listing.items())[index::count]
    report = WarmReport(url=storage.url, files=len(mine), bytes=sum(int(i.get("size") or 0) for _, i in mine))
    if on_start is not None:
        on_start(report.files, report.bytes)
    fs = storage.fs

    def one(path: str) -> str:
        return store.ensure(fs, path, storage.versions.get(path), shared_only=True)

    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fastload-warm") as pool:
            futures = {pool.submit(one, path): (path, info) for path, info in mine}
            for future in as_completed(futures):
                path, info = futures[future]
                try:
                    outcome = future.result()
                except (FastloadError, OSError) as exc:
                    outcome = "failed"
                    report.failed.append((storage.to_url(path), str(exc)))
                if outcome == "fetched":
                    report.fetched += 1
                elif outcome == "hit":
                    report.skipped += 1
                elif outcome == "rejected":
                    report.rejected += 1
                if on_file is not None:
                    on_file(storage.to_url(path), int(info.get("size") or 0), outcome)
    finally:
        store.close()
    report.failed.sort()
    return report
