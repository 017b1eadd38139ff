"""What the shard datasets share: :class:`ShardedImages`, the base of ``TarShards`` and
``ParquetImages``.

Both are declared datasets (NOTE [a declared dataset]) over a list of files of one fsspec
filesystem, indexed once (``index``: labels, per-file versions), read in a shard-aware order
(``_order``: NOTE [shard-aware order]) and, when remote with a disk cache, through the
cache's shard store (``_shards``: NOTE [the shard store]). A subclass's ``__init__`` takes
the arguments both share (:meth:`ShardedImages._take_arguments`: ImageFolder's, the cache,
``shuffle_window``) and its files (:meth:`ShardedImages._open_files`: ``urls``, ``paths``,
``local``), then sets ``index``, ``_order`` and ``_shards``; it keeps its own filesystem per
process (``fs``) and says which file a sample lies in (``_files_of``, for
:meth:`ShardedImages.follow_epoch`).

NOTE [samples without a label]
A tar shard's sample may lack a label member (``cls``/``txt``/``json``), and a Parquet label
column may hold nulls; such a sample gets label -1, which a classification loss rejects only
when its batch comes (``CrossEntropyLoss``: "Target -1 is out of bounds"; on a GPU a
device-side assert), or, with ``ignore_index=-1``, trains on without it. So when some samples
of a dataset have a label and others do not, building it warns, with the count and the first
few samples (:meth:`ShardedImages._say_unlabelled`). Tar shards where no sample has one (a
set without labels, for self-supervised training) get an info line; a Parquet label column
that is null throughout, a warning; a Parquet dataset without labels is asked for by
``label_column=None`` and says nothing.

NOTE [shards are checked every epoch]
A sample is a byte range of its file at the version the index recorded. A file rewritten at
the origin (local or remote, cached or not) leaves every range of it meaningless, and a
local copy in the shard store would go on serving the old bytes. So before every epoch
after the first the loader calls :meth:`ShardedImages.revalidate`: one stat per file
(``REVALIDATE_THREADS`` at a time, each with the filesystem's timeouts), and a file whose
version changed, or that is gone, stops the loop there with
:class:`~fastload.cache.shardstore.ShardChangedError` (or the storage error) naming it and
saying to build the dataset again, rather than serve the old bytes or misread the new.

Example::

    >>> ds = TarShards("s3://b/train-{000..009}.tar", cache="~/.cache/fastload")
    >>> len(ds), ds.targets[:3], ds.shard_store
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import numpy as np

from fastload.arguments import (
    check_bool,
    check_choice,
    check_int,
    check_mapping,
    check_number,
    check_optional_int,
    check_size,
)
from fastload.cache import TieredCache, open_cache
from fastload.cache.shardahead import ShardAhead
from fastload.cache.shardsource import check_version
from fastload.cache.shardstore import ShardRef, ShardStore
from fastload.data.declared import DeclaredImages, OnError
from fastload.data.fetch_advice import cache_dir, shards_fix, smaller_shards_fix
from fastload.data.folder_args import check_callables, check_steps, decode_steps
from fastload.data.folder_rules import default_loader
from fastload.data.pipeline import ImagePipeline, Normalize
from fastload.data.shard_order import ShardOrder
from fastload.data.transforms import CompiledTransform
from fastload.errors import ConfigError
from fastload.io.file_urls import expand_urls
from fastload.io.origin import with_timeouts

logger = logging.getLogger(__name__)

__all__ = ["REVALIDATE_THREADS", "ShardedImages"]

REVALIDATE_THREADS = 16
"""Files stat'ed at once by :meth:`ShardedImages.revalidate` (a request each when remote)."""


class ShardedImages(DeclaredImages):
    """The declared-dataset contract over indexed shard files (see the module's docstring)."""

    urls: list[str]
    paths: list[str]
    storage_options: dict[str, Any]
    index: Any  # ShardIndex or ParquetIndex: ``labels`` and more
    local: bool
    _cache: TieredCache | None
    _order: ShardOrder
    _shards: Any  # shard_cache_use.CachedShards, or None
    _warned_of: frozenset[str] = frozenset()  # what check_order / check_workers said once

    fs: Any  # each subclass keeps one per process
    _fs: Any
    _pid: int
    _store_urls: list[str]
    compiled: CompiledTransform | None

    def _take_arguments(
        self, where: str, transform: Callable[[Any], Any] | None,
        target_transform: Callable[[Any], Any] | None, *, size: int | tuple[int, int], train: bool,
        normalize: bool | Normalize, pipeline: ImagePipeline | None, cache: Any, on_error: OnError,
        seed: int | None, storage_options: dict[str, Any] | None, listing_max_age: float,
        shuffle_window: int,
    ) -> float:
        """Check and keep the arguments both shard datasets take (``where`` names the class in
        the errors), as ImageFolder does; opens the cache. Returns ``listing_max_age``."""
        self.on_error: OnError = check_choice(  # type: ignore[assignment]
            where, "on_error", on_error, ("raise", "skip"))
        size = check_size(where, "size", size)
        train = check_bool(where, "train", train)
        check_steps(normalize, pipeline)
        self.seed = check_optional_int(where, "seed", seed)
        self.storage_options = check_mapping(where, "storage_options", storage_options)
        max_age = check_number(where, "listing_max_age", listing_max_age, low=0)
        self.shuffle_window = check_int(where, "shuffle_window", shuffle_window, minimum=1)
        check_callables(target_transform=target_transform)
        self.transform, self.target_transform = transform, target_transform
        self.pipeline, self.compiled = decode_steps(
            default_loader, transform, pipeline, size, train, normalize, cache)
        self._cache = open_cache(cache)
        if self._cache is not None and self._cache.config.transcode is not None:
            self._cache.close()
            raise ConfigError(
                f"{where}(cache={{..., 'transcode': ...}}): the transcoded tier re-encodes the "
                f"images an ImageFolder caches one by one, and {where} keeps its files whole, so "
                "it would do nothing. To decode fewer pixels, pack the original images with "
                "smaller sides once (`fastload pack SRC DST --transcode 256`; it changes pixels: "
                "pick a side at least the size you crop to) and read DST; or drop 'transcode'")
        return max_age

    def _open_files(self, where: str, files: Any, *, kind: str, suffix: str) -> Any:
        """Keep the URLs ``files`` names (:func:`~fastload.io.file_urls.expand_urls`; ``kind``
        and ``suffix`` word its errors), their paths and whether all are local; returns the
        one filesystem they are on."""
        urls = expand_urls(files, self.storage_options, owner=where, kind=kind, suffix=suffix)
        opened = [self._url_to_fs(u) for u in urls]
        if len({type(fs) for fs, _ in opened}) > 1:
            protocols = sorted({type(fs).__name__ for fs, _ in opened})
            raise ConfigError(
                f"{where} reads {kind}s of one filesystem, and these mix {', '.join(protocols)} "
                f"(first {urls[0]}, last {urls[-1]}): put them all on one store (copy the "
                "others to it) and give their URLs there")
        self.urls, self.paths = urls, [p for _, p in opened]
        self._fs, self._pid = opened[0][0], os.getpid()
        # The shard store's keys: each file's own URL, as `cache warm` names it (a chained
        # URL such as latency::s3://b/x.tar is the file s3://b/x.tar; NOTE [warming shard files])
        self._store_urls = [fs.unstrip_protocol(p) for fs, p in opened]
        self.local = all(fsspec.core.split_protocol(u)[0] in (None, "file", "local") for u in urls)
        return self._fs

    def _say_unlabelled(self, lacking: str, *, if_all: int | None) -> None:
        """Log the samples whose label is -1 (they have ``lacking``): a warning when others have
        one; when all lack one, at level ``if_all`` (None: not at all). NOTE [samples without
        a label]."""
        missing = np.flatnonzero(np.asarray(self.index.labels) < 0)
        name, total = type(self).__name__, len(self.index)
        if len(missing) == 0:
            return
        if len(missing) == total:
            if if_all is not None:
                logger.log(if_all, "%s: all %d samples of %s ... have %s: every label is -1",
                           name, total, self.urls[0], lacking)
            return
        first = "; ".join(self.sample_url(int(i)) for i in missing[:3])
        logger.warning(
            "%s: %d of %d samples have %s, so their label is -1, which a classification loss "
            "rejects when their batch comes; the first: %s. Give every sample a label (or drop "
            "those without one) and build the dataset again", name, len(missing), total, lacking,
            first)

    def _url_to_fs(self, url: str) -> tuple[Any, str]:
        return fsspec.core.url_to_fs(url, **with_timeouts(url, self.storage_options))

    @property
    def shard_store(self) -> ShardStore | None:
        """Where a remote dataset with a disk cache keeps its files whole (NOTE [the shard
        store]); None: each read is a range read (cached as an entry with a cache)."""
        return None if self._shards is None else self._shards.store

    @property
    def cache(self) -> TieredCache | None:
        return self._cache

    @property
    def targets(self) -> np.ndarray:
        return self.index.labels

    @property
    def epoch_order(self) -> ShardOrder:
        return self._order

    @property
    def reads_local_files(self) -> bool:
        return self.local

    def fetch_fix(self) -> str:
        """The fix the meter prints when reading these files holds the loop up (NOTE [the
        source's own fix])."""
        return shards_fix(type(self).__name__, list(self.urls), local=self.local,
                          cache_dir=cache_dir(self._cache), cached=self._cache is not None,
                          downloads=self._shards is not None)

    def smaller_fix(self) -> str:
        """How to decode fewer pixels: shards are read whole, so re-pack them smaller."""
        return smaller_shards_fix(type(self).__name__)

    def __len__(self) -> int:
        return len(self.index)

    def label(self, index: int) -> int:
        return int(self.index.labels[int(index)])

    def follow_epoch(self, order: Sequence[int], start: int = 0) -> ShardAhead | None:
        """Download the files of an epoch read in ``order`` ahead of need, in the order the
        epoch first reads them (NOTE [a dataset on the shard store]); the loader calls it with
        its rank's order. None without a shard store (no disk cache, local files)."""
        if self._shards is None:
            return None
        return self._shards.follow(self.fs, self._files_of(np.asarray(order, dtype=np.int64)), start)

    @abc.abstractmethod
    def _files_of(self, samples: np.ndarray) -> np.ndarray:
        """The file each of ``samples`` lies in (a subclass's index knows)."""

    def check_order(self, sampler: str) -> None:
        """Warn once when a loader reads this dataset in the order of a sampler of the
        user's own (named ``sampler``) that would download files again (NOTE [a sampler of
        one's own over shards] in :mod:`fastload.data.shard_cache_use`); the loader calls it."""
        self._warn_once("order", lambda shards: shards.foreign_order(sampler, type(self).__name__))

    def check_workers(self, workers: int) -> None:
        """Warn once when ``workers`` torch worker processes read this dataset through a shard
        budget that makes them download some files twice an epoch (NOTE [torch workers at a
        window's end] in :mod:`fastload.data.shard_cache_use`); the loader calls it."""
        self._warn_once("workers", lambda shards: shards.workers_ahead(workers, type(self).__name__))

    def _warn_once(self, what: str, why: Callable[[Any], str | None]) -> None:
        """Log ``why(shards)`` once per dataset for ``what``: not without a shard store, nor
        when it says None."""
        if self._shards is None or what in self._warned_of:
            return
        message = why(self._shards)
        if message is not None:
            self._warned_of = self._warned_of | {what}
            logger.warning("%s", message)

    def revalidate(self) -> int:
        """Check that every file is still the version the index was built from (NOTE [shards
        are checked every epoch]); ``fastload.DataLoader`` calls it before each later epoch.
        Returns 0 (no sample changed); a changed file raises
        :class:`~fastload.cache.shardstore.ShardChangedError` naming it. Example::

            >>> ds.revalidate()     # after train-003.tar was rewritten at the origin
            ShardChangedError: s3://b/train-003.tar changed at the origin since it was indexed ...
        """
        fs = self.fs
        refs = [ShardRef(u, p, v, -1) for u, p, v in zip(self.urls, self.paths, self.index.versions)]

        def check(ref: ShardRef) -> None:
            fs.invalidate_cache(ref.path)  # a listing's cached info would hide a rewrite
            check_version(fs, ref)

        with ThreadPoolExecutor(min(REVALIDATE_THREADS, len(refs)) or 1) as pool:
            list(pool.map(check, refs))  # the first error, in file order, is raised
        return 0
