"""Shard files warmed whole into the shard store, where the shard datasets read them.

NOTE [warming shard files]
:class:`~fastload.TarShards` and :class:`~fastload.ParquetImages` over a remote store with a
disk cache read their files whole from the cache's shard store (NOTE [the shard store] in
:mod:`.shardstore`), under a key of the file's URL and version; they never look up the
entries a warm fills. ``fastload cache warm`` of a folder of tar shards stored each shard as
an entry that nobody read, and the first epoch downloaded every shard again (4 of 4 in a
check against moto). So a warm puts the objects named ``*.tar`` or ``*.parquet`` (the files
those datasets read) into the shard store instead: each downloaded whole with concurrent
range requests (:mod:`.shardfetch`), :data:`SHARD_JOBS` at a time, under the key a dataset
builds from its index (the file's own URL, ``fs.unstrip_protocol`` of its path, so that
``latency::s3://b/x.tar`` and ``s3://b/x.tar`` are one file; and the version of the same
listing fields), so a dataset over those URLs finds them and downloads nothing. Objects
already there are skipped, as entries are; other objects are warmed as entries, as before.
The shard store evicts the least recently used shard no process holds, so each warmed shard
is held until the warm ends: a budget smaller than the files keeps the first ones and
reports the rest as failed, naming the budget to raise, rather than evicting what it warmed
a moment before.

Local files and caches without a disk tier have no shard store (the datasets read local
files directly, and range reads otherwise): their objects are warmed as entries.

Example::

    >>> fill_shard_store(store, fs, [("b/train-000.tar", info)], jobs=4,
    ...                  breaker=Breaker(10, 20.0), finished=print, to_url=fs.unstrip_protocol)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastload.cache.shardsource import ShardRef
from fastload.cache.shardstore import ShardStore
from fastload.cache.warm_pipeline import Breaker
from fastload.errors import CacheError, FastloadError, StorageError
from fastload.io.errors import storage_error

logger = logging.getLogger(__name__)

__all__ = ["SHARD_JOBS", "SHARD_SUFFIXES", "fill_shard_store", "is_shard_file"]

SHARD_SUFFIXES = (".tar", ".parquet")
"""Objects a shard dataset reads whole: they are warmed into the shard store."""

SHARD_JOBS = 4
"""Shard files downloaded at once (each with its own concurrent range requests)."""

Finished = Callable[[str, str, dict[str, Any], str, "FastloadError | None"], None]


def is_shard_file(path: str) -> bool:
    """Whether ``path`` names a file a shard dataset reads whole (a tar shard, a Parquet file)."""
    return path.lower().endswith(SHARD_SUFFIXES)


def fill_shard_store(
    store: ShardStore, fs: Any, listing: Sequence[tuple[str, dict[str, Any]]], *, jobs: int,
    breaker: Breaker, finished: Finished, to_url: Callable[[str], str],
) -> None:
    """Download each listed ``(path, info)`` whole into ``store`` (NOTE [warming shard files]),
    ``min(jobs, SHARD_JOBS)`` at a time; ``finished(path, url, info, outcome, error)`` is
    called once per file in this thread, outcome "fetched", "hit" or "failed". Returns when
    all are done or the breaker tripped; the shards stay in the store, no longer held."""
    def one(path: str, info: dict[str, Any]) -> tuple[str, FastloadError | None]:
        url = to_url(path)
        ref = ShardRef(url, path, info["version"], int(info.get("size") or 0))
        try:
            outcome = store.ensure(fs, ref, must=False, hold=True)
        except FastloadError as exc:
            return "failed", exc
        except Exception as exc:  # noqa: BLE001 - named and classified (NOTE [storage errors])
            return "failed", storage_error(exc, "download", url)
        if outcome == "no room":
            return "failed", CacheError(
                f"the shard budget of {store.budget} bytes in {store.directory} is full of the "
                f"shards warmed before {url}; raise the cache's shard_budget (or its size) to "
                "hold every file, or warm a part of them (--shard I/N)")
        if outcome == "busy":
            return "failed", StorageError(
                f"{url}: another process held its local copy past the waits; run the warm again")
        return ("fetched" if outcome in ("fetched", "shared") else "hit"), None

    try:
        with ThreadPoolExecutor(max(1, min(jobs, SHARD_JOBS)),
                                thread_name_prefix="fastload-warm-shard") as pool:
            futures = [(path, info, pool.submit(one, path, info)) for path, info in listing]
            for path, info, future in futures:
                if breaker.tripped:
                    future.cancel()
                    continue
                outcome, error = future.result()
                if error is None:
                    breaker.success()
                else:
                    breaker.failure(error)
                finished(path, to_url(path), info, outcome, error)
    finally:
        store.release_all()
