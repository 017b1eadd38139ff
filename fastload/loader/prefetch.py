"""The loader's side of clairvoyant prefetch: which objects an epoch will read, in order.

The epoch's order is a pure function of the sampler's seed and epoch (NOTE [per-sample
seeds] in :mod:`fastload.data.sampling`), so the loader knows every object the epoch will
read before it reads one. :func:`follow_loader` turns that order into the objects' paths
(made one at a time as they are claimed: :class:`EpochPaths`) and versions (the dataset's
index, through ``storage.versions``) and hands them to a
:class:`fastload.cache.prefetcher.Prefetcher`, which fills the cache ahead of the workers. The cache itself knows nothing of loaders or samplers.

Example::

    >>> source = follow_loader(loader, source, start_batch=0)   # inside LoaderIterator
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from fastload.cache.prefetcher import Prefetcher
from fastload.cache.tiered import TieredCache
from fastload.data.index import DatasetIndex
from fastload.data.sampling import EpochSampler
from fastload.data.sharded import ShardedImages

if TYPE_CHECKING:
    from fastload.loader.dataloader import DataLoader

logger = logging.getLogger(__name__)

# One prefetcher per loader: a new epoch (or a new iterator) stops the previous one.
_running: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def follow_loader(loader: DataLoader, source: Iterator[Any], *, start_batch: int = 0) -> Iterator[Any]:
    """``source`` with a prefetcher for this epoch when ``loader`` reads a cached ImageFolder.

    Otherwise (no cache, prefetch off, a sampler other than fastload's, no shared tier for
    worker processes, a local origin) ``source`` is returned unchanged.
    """
    previous = _running.pop(loader, None)
    if previous is not None:
        previous.stop()
    dataset = loader.dataset
    storage = getattr(dataset, "storage", None)
    cache = getattr(dataset, "cache", None)  # ImageFolder.cache
    sampler = loader.epoch_sampler
    batch = loader.batch_size
    if isinstance(dataset, ShardedImages) and isinstance(sampler, EpochSampler) and batch:
        if loader.backend == "torch":  # sharded: whole files ahead
            dataset.check_workers(loader.num_workers)  # NOTE [torch workers at a window's end]
        ahead = dataset.follow_epoch(sampler.indices(), start=start_batch * batch)
        if ahead is None:
            return source
        _running[loader] = ahead
        return ahead.follow(source, batch)
    if (
        storage is None  # a declared source without per-object paths (TarShards, ParquetImages)
        or not isinstance(cache, TieredCache)
        or not cache.config.prefetch
        or not isinstance(sampler, EpochSampler)
        or not batch
    ):
        return source
    if storage.is_local:
        # NOTE [no prefetch from local files]: a local read costs the reader what the
        # prefetcher's would, so prefetching hides no latency; its threads would only take
        # the GIL and the cores from the loop and the workers (a cold epoch of 1 KB files
        # ran 2.4x slower with it on 2 cores: benchmarks/scale.py). The reads fill the cache.
        logger.debug("%s is local: no prefetch (the reads fill the cache)", storage.url)
        return source
    shared_only = loader.num_workers > 0
    if shared_only and not any(t.shared for t in cache.tiers):
        logger.debug("no cache tier is shared with the workers; prefetch is off")
        return source
    order = sampler.indices()  # this rank's, after any resumed span (NOTE [resumed epochs])
    in_flight = max(1, loader.num_workers) * (loader.prefetch_factor or 2) + 2
    index = getattr(dataset, "index", None)  # ImageFolder.index: paths made as they are claimed
    paths: Sequence[str] = (
        EpochPaths(index, order) if isinstance(index, DatasetIndex)
        else [dataset.samples[i][0] for i in order]
    )
    prefetcher = Prefetcher(
        cache,
        storage.fs,
        paths,
        versions=storage.versions,
        ahead=cache.config.prefetch_ahead or max(64, in_flight * batch),
        jobs=cache.config.prefetch_jobs,
        shared_only=shared_only,
        start=start_batch * batch,
    ).start()
    _running[loader] = prefetcher
    return prefetcher.follow(source, batch)


class EpochPaths(Sequence):
    """The paths of an epoch's samples in ``order``, each made when the prefetcher claims it.

    A list of every path of the epoch would be a million strings at ImageNet scale, made
    at each epoch start (NOTE [bounded bytes per sample] in :mod:`fastload.data.index`).

    Example::

        >>> paths = EpochPaths(ds.index, [5, 2, 9])
        >>> paths[1] == ds.samples[2][0], len(paths)
        (True, 3)
    """

    def __init__(self, index: DatasetIndex, order: Sequence[int]) -> None:
        self.index = index
        self.order = order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self.index.path(i) for i in self.order[k]]
        return self.index.path(self.order[k])
