"""A sharded dataset's remote files read through the cache's shard store: what
:class:`~fastload.TarShards` and :class:`~fastload.ParquetImages` share.

NOTE [a dataset on the shard store]
A dataset whose samples are byte ranges of a few large remote files (tar shards, Parquet
files) keeps those files whole in the cache directory's ``shards/`` (NOTE [the shard store]
in :mod:`fastload.cache.shardstore`) when its cache has a disk tier. What a dataset must do
for that is the same for every format, so it lives here once:

* **the refs**: a file is a :class:`~fastload.cache.shardstore.ShardRef` (URL, path, the
  version its index recorded, size), so a file rewritten at the origin is never served from
  an old copy (:class:`~fastload.cache.shardstore.ShardChangedError` instead);
* **the store and its budget**, opened when the dataset is built: a process pins at most
  ``shuffle_window + 2`` files, and a budget that cannot hold the files an epoch reads at
  once (``shuffle_window + 1`` of the largest, at most all of them) is refused there with a
  :class:`~fastload.errors.ConfigError` that says what to raise;
* **a read**: ``(offset, length)`` of a file from its local copy; a copy another process
  holds too long or damaged (:class:`~fastload.cache.shardstore.ShardBusyError`) is read
  from the origin by the dataset's own range read;
* **the epoch ahead**: given the file of each sample of an epoch's order (the loader's
  ``follow_epoch``, NOTE in :mod:`fastload.loader.prefetch`), the files in the order of their
  first use are downloaded ahead of the reader by a
  :class:`~fastload.cache.shardahead.ShardAhead`, as far as the budget allows.

NOTE [reads around a download]
A shard is downloaded whole before its first pread, and an epoch's first batch draws from
``shuffle_window`` shards at once: a cold epoch waited for all of them (60 MB from 4 shards
of 15 MB) before its first image, with every read thread blocked on a download. So while
*this process* downloads a shard (the reader ahead, or a reader that got there first), a
read of one of its samples reads it from the download's file as soon as its bytes have
landed there (NOTE [reads from a download in progress] in :mod:`fastload.cache.shardlanding`;
counted in the store's ``early``), waiting only while the part that holds them is on its
way; a read whose part has not been requested yet (a shard of more than 8 parts of 8 MiB)
is one range request to the origin instead (``origin``, as for a copy another process
holds), counted in ``around``. A read that comes while another thread is still opening the
shard (its version asked before the download) waits for the download to begin, then reads
from it. A shard another process downloads is waited for whole: one download per node.

Reads went around for every sample of a shard downloading until 2026-12-07: 15-26 range
requests per cold epoch of 21 shards (5,000 JPEGs of ~67 KB, moto + 15 ms, 2 shared cores),
each a request of the client's and, on moto, a read of the whole 17 MB object it slices the
range from; the first batch was no sooner for them. Reading from the download instead, 0-2
go around (103-211 read as they landed), the first batch comes at 0.27-0.28 s against
0.32-0.39 s, and moto's CPU over the epoch fell from 0.68-0.75 to 0.57-0.63 s (a probe of
three cold/warm rounds, before and after, in one session; ``benchmarks/shards.py`` prints
both counts).

NOTE [a sampler of one's own over shards]
fastload's order reads ``shuffle_window`` files at a time and hands the loader's epoch to the
downloader ahead (above). A ``sampler`` or ``batch_sampler`` passed to the DataLoader is
honoured as torch would (its order, its split), but it is not known before it runs, so
nothing is downloaded ahead, and an order that draws each batch from many files (a
``RandomSampler``, a ``DistributedSampler``, a ``WeightedRandomSampler``) over a shard budget
that cannot hold every file evicts files it comes back to within the same epoch:
``benchmarks/shard_budget.py`` (20 files of 40 samples, budgets of 5-10 files) counted 19-27
downloads per file in one epoch through a seeded ``RandomSampler`` or a ``DistributedSampler``
on threads (19-32 on two torch workers), against 1.00 with ``shuffle=True`` (NOTE [downloads
ahead are held until read]). So a loader given such a sampler says so
once per dataset (:meth:`CachedShards.foreign_order`, with the budget's figures and the two
ways out); a ``SequentialSampler`` (the storage order) and fastload's own samplers, bare or
inside a framework's wrappers, are not warned about.

NOTE [torch workers at a window's end]
Torch's workers read ``num_workers x prefetch_factor`` batches ahead of the batch the loop
has taken, and the files downloaded ahead are held until the loop has passed their last
sample (NOTE [downloads ahead are held until read]). At the end of a shuffle window the
workers are already reading the next window, whose samples come from all of its files,
while the loop still holds the last window's: ``2 x shuffle_window + 1`` files at once with
the one downloaded ahead. A budget below that lets a worker that needs room evict a file the
other worker has yet to read (a file a worker downloaded itself is pinned only while that
worker keeps it open), which is then downloaded again: ``benchmarks/shard_budget.py``
counted 1.00-1.40 downloads per file on two workers through budgets of 5-8 files (window
4; three runs, how the workers race varies), 1.00 at 9 and 10 in every run, and 1.00 at
every budget on the threads engine (its reads and the holds are in one process); the
files on disk peaked 1-2 past the budget (7-9 at budgets of 5-8, sampled every 10 ms), as
the workers download what they need beyond a full budget. Downloading ahead from the
workers' position instead of the loop's (the batches in flight) was tried: 1.00-1.05
downloads per file at budgets of 5-8, but 9-11 files on disk, and 1-2 past budgets of 9-10
where the loop's position keeps to them; not kept, since the budget is the disk's. So a
loader that runs a sharded dataset on torch workers through such a budget says so once per
dataset, with the budget that avoids it (:meth:`CachedShards.workers_ahead`); the dataset
itself accepts ``shuffle_window + 1`` files, since it does not know its engine.

Without a disk tier (memory or Redis only), for local files, or when the store cannot be
opened, :meth:`CachedShards.open` gives None and the dataset reads ranges, cached as entries
(:func:`cached_range`, :func:`store_range`) where it has a cache.

Example::

    >>> refs = shard_refs(urls, paths, versions, sizes)
    >>> shards = CachedShards.open(cache, refs, shuffle_window=4, owner="TarShards",
    ...                            reads="shards")
    >>> data = shards.read(fs, 3, offset=1536, length=110_000, origin=read_from_origin)
    >>> ahead = shards.follow(fs, file_of_each_sample_in_order, start=0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastload.cache import TieredCache
from fastload.cache.shardahead import ShardAhead
from fastload.cache.build import open_shard_store
from fastload.cache.shardstore import ShardBusyError, ShardRef, ShardStore
from fastload.errors import ConfigError

__all__ = ["AHEAD_MAX", "CachedShards", "cached_range", "shard_refs", "store_range"]

AHEAD_MAX = 4
"""Files downloaded ahead of the one the reader is in, at most (fewer where the budget is
tight)."""


def cached_range(cache: TieredCache | None, key: str | None) -> bytes | None:
    """A range cached as an entry under ``key`` (a cache without a shard store): the first
    tier's that has it; None when none has it, or ``key`` is None (nothing cached)."""
    if cache is None or key is None:
        return None
    for tier in cache.tiers:
        data = tier.get(key)
        if data is not None:
            return data
    return None


def store_range(cache: TieredCache | None, key: str | None, data: bytes) -> None:
    """Cache a range read from the origin as an entry under ``key`` in every tier (None: not)."""
    if cache is None or key is None:
        return
    for tier in cache.tiers:
        tier.put(key, data)


def shard_refs(urls: Sequence[str], paths: Sequence[str], versions: Sequence[str],
               sizes: Sequence[int | None]) -> list[ShardRef]:
    """A :class:`ShardRef` per file; a size not known is -1 (then no store is opened)."""
    return [ShardRef(u, p, v, -1 if s is None else int(s))
            for u, p, v, s in zip(urls, paths, versions, sizes)]


class CachedShards:
    """A dataset's files in a :class:`ShardStore` (NOTE [a dataset on the shard store]).

    Args:
        store: the cache's shard store.
        refs: the dataset's files, by file number.
        shuffle_window: the files an epoch's order reads at once (at most).

    Attributes:
        store, refs, shuffle_window: as given.
    """

    def __init__(self, store: ShardStore, refs: Sequence[ShardRef], shuffle_window: int) -> None:
        self.store = store
        self.refs = list(refs)
        self.shuffle_window = int(shuffle_window)

    @classmethod
    def open(cls, cache: TieredCache | None, refs: Sequence[ShardRef], *, shuffle_window: int, owner: str,
             reads: str, local: bool = False) -> CachedShards | None:
        """The files in ``cache``'s shard store, or None: no cache, local files, a size the
        index does not know, or no writable disk tier. Raises :class:`ConfigError` when the
        store's budget is too low (``owner`` names the dataset class, ``reads`` what the
        window counts: "shards", "row groups (from as many files)")."""
        if cache is None or local or not refs or any(r.size < 0 for r in refs):
            return None
        store = open_shard_store(cache, keep_open=shuffle_window + 2)
        if store is None:
            return None
        largest = max(r.size for r in refs)
        need = min(shuffle_window + 1, len(refs)) * largest
        if store.budget < need:
            raise ConfigError(
                f"the shard budget ({store.budget} bytes) is too low for {owner}: an epoch reads "
                f"shuffle_window={shuffle_window} {reads} at once and the largest of "
                f"{refs[0].url} ... is {largest} bytes. Raise the cache's shard_budget (or "
                f"disk_size) to at least {need} bytes, or lower shuffle_window"
            )
        return cls(store, refs, shuffle_window)

    def read(self, fs: Any, file: int, offset: int, length: int,
             origin: Callable[[int, int, int], bytes]) -> bytes:
        """Bytes ``[offset, offset + length)`` of file ``file`` from its local copy (downloaded
        first if needed, or read from the download as it lands); ``origin(file, offset,
        length)`` when another process holds the copy too long or damaged (the store warned
        once), or while this process downloads it and the range's part has not begun (NOTE
        [reads around a download]). Other errors propagate: the download's,
        :class:`~fastload.cache.shardstore.ShardChangedError`."""
        try:
            return self.store.read(fs, self.refs[file], offset, length)
        except ShardBusyError:
            return origin(file, offset, length)

    @property
    def largest(self) -> int:
        """The largest file's size, in bytes."""
        return max(r.size for r in self.refs)

    @property
    def room(self) -> int:
        """Files of the largest size the store's budget holds."""
        return self.store.budget // max(1, self.largest)

    def foreign_order(self, sampler: str, owner: str) -> str | None:
        """Why reading in the order of ``sampler`` (the name of a sampler of the user's own)
        costs downloads again, or None when the budget holds every file (NOTE [a sampler of
        one's own over shards]); ``owner`` names the dataset class."""
        room = self.room
        if room >= len(self.refs):
            return None
        total = sum(r.size for r in self.refs)
        return (
            f"{owner} ({self.refs[0].url} ...) is read in the order of the {sampler} given to "
            f"the DataLoader, not in fastload's shard-aware one (shuffle_window="
            f"{self.shuffle_window} files at a time), so no file is downloaded ahead, and the "
            "shard budget of "
            f"{self.store.budget} bytes holds {room} of its {len(self.refs)} files: an order "
            "that draws each batch from many files evicts files it comes back to and downloads "
            "them again within the epoch. Pass shuffle=True and no sampler (under "
            "torch.distributed fastload splits the files between ranks itself), or raise "
            f"shard_budget to {total} bytes"
        )

    def workers_ahead(self, workers: int, owner: str) -> str | None:
        """Why ``workers`` torch worker processes download some files twice an epoch through
        this budget, or None when it holds the files they read at once (NOTE [torch workers
        at a window's end]); ``owner`` names the dataset class."""
        need = min(2 * self.shuffle_window + 1, len(self.refs))
        room = self.room
        if workers < 1 or room >= need:
            return None
        return (
            f"{owner} ({self.refs[0].url} ...) is read by {workers} torch worker processes, "
            "which read batches ahead of the training loop: at the end of each shuffle window "
            f"of {self.shuffle_window} files they read the next window's files while the last "
            f"one's are still in use, up to {need} files at once with the one downloaded ahead, "
            f"and the shard budget of {self.store.budget} bytes holds {room}: some files are "
            "downloaded twice an epoch, and the budget is passed by a file or two. Raise "
            "shard_budget to at least "
            f"{need * self.largest} bytes, lower shuffle_window, or pass backend='threads' (its "
            "reads keep to this budget and download each file once)"
        )

    def follow(self, fs: Any, files: np.ndarray, start: int = 0) -> ShardAhead | None:
        """Download ahead, in the order of their first use, the files of an epoch whose
        samples lie in ``files`` (the file of each sample, in the epoch's order); the reader
        is at sample ``start``. None for an empty epoch."""
        if len(files) == 0:
            return None
        files = np.asarray(files)
        unique, first = np.unique(files, return_index=True)
        last = len(files) - 1 - np.unique(files[::-1], return_index=True)[1]
        by_use = np.argsort(first)
        ahead = ShardAhead(self.store, fs, [self.refs[int(f)] for f in unique[by_use]],
                           first[by_use].tolist(), last_use=last[by_use].tolist(),
                           ahead=max(1, min(AHEAD_MAX, self.room - self.shuffle_window)),
                           start=start)
        return ahead.start()
