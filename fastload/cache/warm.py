"""Warming a cache ahead of training: fetch every object below a URL into the shared tiers.

``fastload cache warm`` is a thin layer over :func:`warm`. Warming is resumable: objects
already cached (a complete entry) are skipped, so a second run after a failure or an
interrupted one fetches only what is missing. With ``shard=(i, n)`` node ``i`` of ``n``
warms every n-th object, so n nodes (each with its own disk) split a dataset. With
``derive`` (a transcoded tier: ``derive=Transcode(max_side=256)`` from
:mod:`fastload.data.transcode`) it fills the derived entries, under the keys the readers of a
cache with that derivation look up (NOTE [derived entries] in :mod:`fastload.cache.fills`).

Reads run concurrently the way the storage serves them fastest and downloads are stored in
batches (NOTE [warm pipeline] in :mod:`fastload.cache.warm_pipeline`). Remote tar shards and
Parquet files go whole into the cache's shard store, where ``TarShards`` and
``ParquetImages`` read them (NOTE [warming shard files] in
:mod:`fastload.cache.warm_shards`). A warm stops early when the origin looks down (NOTE
[warm circuit breaker]) and raises :class:`~fastload.errors.OriginUnavailableError` with the
counts, instead of failing every remaining object one timeout at a time.

Example::

    >>> report = warm("s3://bucket/train", "/nvme/fastload", jobs=32)
    >>> report.fetched, report.skipped, report.failed
    (1281167, 0, [])
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastload.cache.build import open_cache, open_shard_store
from fastload.cache.disk import DiskTier
from fastload.cache.warm_pipeline import Breaker, fill_shared
from fastload.cache.warm_report import GIVE_UP_AFTER_S, MAX_FAILURES, WarmReport
from fastload.cache.warm_shards import fill_shard_store, is_shard_file
from fastload.errors import (
    CacheError,
    ConfigError,
    FastloadError,
    ObjectNotFoundError,
    OriginUnavailableError,
)
from fastload.io.fetch import default_jobs
from fastload.io.file_urls import files_named, folder_of, named_paths
from fastload.io.origin import READ_DEADLINE_S, is_unavailable
from fastload.io.storage import Storage

if TYPE_CHECKING:
    from fastload.cache.tiered import Derivation, TieredCache

logger = logging.getLogger(__name__)

def warm(
    url: str,
    cache: Any,
    *,
    jobs: int | None = None,
    shard: tuple[int, int] = (0, 1),
    storage_options: dict[str, Any] | None = None,
    max_failures: int = MAX_FAILURES,
    give_up_after: float = GIVE_UP_AFTER_S,
    on_start: Callable[[int, int], None] | None = None,
    on_file: Callable[[str, int, str], None] | None = None,
    derive: Derivation | None = None,
    read_timeout: float = READ_DEADLINE_S,
) -> WarmReport:
    """Fetch every object below ``url`` (this shard of them) into the cache's shared tiers;
    remote ``*.tar`` and ``*.parquet`` files whole into its shard store, where the shard
    datasets read them (NOTE [warming shard files] in :mod:`fastload.cache.warm_shards`).

    Args:
        url: the dataset root (any fsspec URL), or its files as :class:`~fastload.TarShards`
            takes them, a brace pattern or glob (``s3://b/train-{0000..1023}.tar``) or a wids
            shard index file (``s3://b/train/shards.json``): then only those (a file named
            that does not exist raises).
        cache: a cache spec (a directory, a dict, a CacheConfig...); needs a disk or Redis tier.
        jobs: requests in flight on a remote (async) store, at most this many objects
            between request and store; reader threads on a local or other sync one.
            Default (None): 64 on a remote store, 16 on a sync one (NOTE [default jobs] in
            :mod:`fastload.io.fetch`).
        shard: ``(i, n)``: warm objects ``i, i + n, i + 2n...`` of the sorted listing.
        storage_options: passed to fsspec (fastload adds timeouts the user left unset).
        max_failures: give up after this many objects in a row failed (the origin looks
            down); missing or forbidden objects do not count.
        give_up_after: give up when objects fail and none succeeded for this many seconds.
        on_start: called with (objects, bytes) of the shard before fetching.
        on_file: called with (url, bytes, outcome) as each object finishes, in the
            calling thread (keep it cheap: thousands a second); outcome is "hit",
            "fetched", "rejected" or "failed". A fetched object finishes when it is stored.
        derive: cache this derivation of each object instead of its bytes (the entries a
            cache with ``transcode`` reads); an object it rejects (a corrupt image) is
            reported as failed and nothing is stored for it.
        read_timeout: on an async store (s3fs, gcsfs, HTTP), seconds one object's read
            may take, retries included, before it fails: a store that stops answering is
            found only by this deadline. Other stores keep their client's own timeouts.

    Raises:
        OriginUnavailableError: the origin cannot be listed or the breaker tripped; it
            carries the counts and the partial report. Run the same warm again to resume.
    """
    store = open_cache(cache)
    if store is None or not any(t.shared for t in store.tiers):
        raise ConfigError(
            f"cache warm needs a disk or Redis tier, got cache={cache!r}; pass a directory"
        )
    stuck = [t.cannot_store for t in store.tiers if isinstance(t, DiskTier) and t.cannot_store]
    if stuck and len(stuck) == sum(t.shared for t in store.tiers):
        store.close()
        raise CacheError(f"cannot warm: {stuck[0]}, so nothing could be stored; give a cache "
                         "directory this process can write")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"jobs must be at least 1, got {jobs}")
    if max_failures < 1:
        raise ConfigError(f"max_failures must be at least 1, got {max_failures}")
    if not read_timeout > 0:
        raise ConfigError(f"read_timeout must be a positive number of seconds, got {read_timeout}")
    if derive is not None:
        store = store.deriving(derive)
    elif store.config.transcode is not None and store.derive is None:
        # The cache layer cannot re-encode images; warming originals would fill entries
        # that a transcoding reader never looks up.
        raise ConfigError(
            f"cache warm got cache={cache!r} with transcode but no derivation; pass "
            "derive=Transcode.from_spec(spec['transcode']) (fastload.data.transcode), as "
            "`fastload cache warm --transcode` does"
        )
    try:
        breaker = Breaker(max_failures, give_up_after)
        return _warm(url, store, jobs, shard, storage_options, breaker, on_start, on_file,
                     read_timeout)
    finally:
        store.close()


def _warm(
    url: str,
    store: TieredCache,
    jobs: int | None,
    shard: tuple[int, int],
    storage_options: dict[str, Any] | None,
    breaker: Breaker,
    on_start: Callable[[int, int], None] | None,
    on_file: Callable[[str, int, str], None] | None,
    read_timeout: float,
) -> WarmReport:
    index, count = shard
    files = files_named(url, storage_options or {}, owner="cache warm")
    storage = Storage(url if files is None else folder_of(url, files), storage_options)
    try:
        listing = storage.find(detail=True)
    except ObjectNotFoundError:
        raise
    except FastloadError as exc:
        if not is_unavailable(exc):
            raise
        raise OriginUnavailableError(
            f"cannot warm {storage.url}: listing it failed: {exc}. Check that the store is up "
            f"and reachable, then run the same command again",
            url=storage.url, last_error=str(exc),
        ) from exc
    if files is not None:
        named = named_paths(url, files, storage.url, storage.root, listing)
        listing = {p: listing[p] for p in named}
    mine = list(listing.items())[index::count]
    nbytes = sum(int(info.get("size") or 0) for _, info in mine)
    report = WarmReport(url=storage.url if files is None else url, files=len(mine), bytes=nbytes)
    if on_start is not None:
        on_start(report.files, report.bytes)
    last: BaseException | None = None
    local = storage.protocol == "file"  # plain paths in the report, as Storage.to_url names them

    def finished(
        path: str, url: str, info: dict[str, Any], outcome: str, error: FastloadError | None
    ) -> None:
        nonlocal last
        file_url = path if local else url
        if outcome == "fetched":
            report.fetched += 1
        elif outcome == "hit":
            report.skipped += 1
        elif outcome == "rejected":
            report.rejected += 1
        else:
            last = error
            report.failed.append((file_url, str(error)))
        if on_file is not None:
            on_file(file_url, int(info.get("size") or 0), outcome)

    if jobs is None:
        jobs = default_jobs(storage.fs)
    shards = None if storage.is_local else open_shard_store(store)
    if shards is not None:  # NOTE [warming shard files]
        whole = [(path, info) for path, info in mine if is_shard_file(path)]
        mine = [(path, info) for path, info in mine if not is_shard_file(path)]
        fill_shard_store(shards, storage.fs, whole, jobs=jobs, breaker=breaker,
                         finished=finished, to_url=storage.to_url)
    if not breaker.tripped:
        fill_shared(store, storage.fs, iter(mine), jobs=jobs, breaker=breaker,
                    finished=finished, deadline=read_timeout)
    report.failed.sort()
    if breaker.tripped:
        assert last is not None
        raise OriginUnavailableError(
            f"gave up warming {report.url}: the origin looks unavailable ({breaker.reason}); "
            f"last error: {last}. {report.done}/{report.files} objects done, {report.cached} "
            f"cached, {len(report.failed)} failed. Run the same command again to resume: cached "
            f"objects are skipped",
            url=report.url, files=report.files, done=report.done, cached=report.cached,
            failed=len(report.failed), last_error=str(last), report=report,
        ) from last
    return report
