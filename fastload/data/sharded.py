"""What the shard datasets share: :class:`ShardedImages`, the base of ``TarShards`` and
``ParquetImages``.

Both are declared datasets (NOTE [a declared dataset]) over a list of files of one fsspec
filesystem, indexed once (``index``: labels, per-file versions), read in a shard-aware order
(``_order``: NOTE [shard-aware order]) and, when remote with a disk cache, through the
cache's shard store (``_shards``: NOTE [the shard store]). A subclass sets ``urls``,
``storage_options``, ``index``, ``local``, ``_cache``, ``_order`` and ``_shards`` in its
``__init__``, and keeps its own filesystem per process (``fs``).

Example::

    >>> ds = TarShards("s3://b/train-{000..009}.tar", cache="~/.cache/fastload")
    >>> len(ds), ds.targets[:3], ds.shard_store
"""

from __future__ import annotations

from typing import Any

import fsspec
import numpy as np

from fastload.cache import TieredCache
from fastload.cache.shardstore import ShardStore
from fastload.data.declared import DeclaredImages
from fastload.data.shard_order import ShardOrder
from fastload.io.origin import with_timeouts

__all__ = ["ShardedImages"]


class ShardedImages(DeclaredImages):
    """The declared-dataset contract over indexed shard files (see the module's docstring)."""

    urls: list[str]
    storage_options: dict[str, Any]
    index: Any  # ShardIndex or ParquetIndex: ``labels`` and more
    local: bool
    _cache: TieredCache | None
    _order: ShardOrder
    _shards: Any  # shard_cache_use.CachedShards, or None

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

    def __len__(self) -> int:
        return len(self.index)

    def label(self, index: int) -> int:
        return int(self.index.labels[int(index)])
