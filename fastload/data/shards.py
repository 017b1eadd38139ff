"""``TarShards``: WebDataset tar shards as a declared, map-style image dataset.

Each sample is a range of one shard: its image member's bytes, found once by the shards'
headers (NOTE [the shard index] in :mod:`.shard_index`), read with one range request through
the cache and decoded by whichever engine runs the loader (threads with ROI decode, torch
workers, DALI where it runs), exactly as :class:`~fastload.ImageFolder`'s files are (NOTE [a
declared dataset] in :mod:`.declared`). ``fastload.DataLoader`` reads it in a shard-aware
order (NOTE [shard-aware order] in :mod:`.shard_order`). docs/shards.md has the whole story.

Example::

    >>> from fastload import DataLoader, TarShards
    >>> ds = TarShards("s3://bucket/train-{000000..000146}.tar", size=224, train=True,
    ...                cache="~/.cache/fastload")
    >>> image, label = ds[0]
    >>> loader = DataLoader(ds, batch_size=256, shuffle=True)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastload.data import batchinfo
from fastload.data.declared import OnError
from fastload.data.pipeline import ImagePipeline, Normalize
from fastload.data.shard_build import shard_index
from fastload.data.shard_cache_use import CachedShards, cached_range, shard_refs, store_range
from fastload.data.shard_index import ShardIndex
from fastload.data.shard_order import ShardOrder
from fastload.data.sharded import ShardedImages
from fastload.data.stored_listing import DEFAULT_MAX_AGE_S
from fastload.errors import EmptyDatasetError
from fastload.io.errors import storage_error
from fastload.io.origin import read_local_range
from fastload.io.versions import version_size
from fastload.io.wids_index import is_shard_index, read_shard_index

logger = logging.getLogger(__name__)

__all__ = ["TarShards"]


class TarShards(ShardedImages):
    """WebDataset-format tar shards (``key.jpg`` + ``key.cls`` members) as a map-style dataset.

    Takes :class:`~fastload.ImageFolder`'s arguments where they mean the same.

    Args:
        shards: a brace pattern (``"s3://b/train-{000000..000146}.tar"``), a glob
            (``"s3://b/train-*.tar"``, sorted), one URL or local path, or a list of them; or
            a wids shard index file (``"s3://b/train/shards.json"``, as ``fastload pack``
            writes it: NOTE [a shard index file]); any fsspec URL. All on one filesystem.
        transform: a torchvision transform, compiled into the decode as ImageFolder's.
        target_transform: called on each label, on every engine.
        size, train, normalize, pipeline: the declared steps, as ImageFolder's.
        cache: where member bytes are cached (a directory, dict or CacheConfig; docs/cache.md),
            and the shard index with them; None reads the origin every time. Local shards
            are read directly (the index is still kept).
        on_error: "raise" (default) or "skip", as ImageFolder's.
        seed: seed of the random augmentations and of the epoch order; None follows torch.
        storage_options: passed to fsspec.
        listing_max_age: seconds a shard index stored in the cache is reused.
        shuffle_window: shards whose samples an epoch shuffles together (NOTE [shard-aware
            order]); more mixes better and reads more shards at once.

    Attributes:
        index: the :class:`~fastload.data.shard_index.ShardIndex` (numpy arrays).
        classes, class_to_idx, targets: as ImageFolder's (``targets`` a numpy array).
        urls: the shard URLs, expanded.
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        size: int | tuple[int, int] = 224,
        train: bool = False,
        normalize: bool | Normalize = False,
        pipeline: ImagePipeline | None = None,
        cache: Any = None,
        on_error: OnError = "raise",
        seed: int | None = None,
        storage_options: dict[str, Any] | None = None,
        listing_max_age: float = DEFAULT_MAX_AGE_S,
        shuffle_window: int = 4,
    ) -> None:
        max_age = self._take_arguments(
            "TarShards", transform, target_transform, size=size, train=train, normalize=normalize,
            pipeline=pipeline, cache=cache, on_error=on_error, seed=seed,
            storage_options=storage_options, listing_max_age=listing_max_age,
            shuffle_window=shuffle_window)
        listed = read_shard_index(os.fspath(shards), self.storage_options) if is_shard_index(
            shards) else None  # NOTE [a shard index file]
        fs = self._open_files("TarShards", shards if listed is None else
                              [u for u, _ in listed.shards], kind="tar shard", suffix=".tar")
        self.index: ShardIndex = shard_index(fs, self.urls, self.paths, cache=self._cache,
                                             storage_options=self.storage_options, max_age=max_age)
        if len(self.index) == 0:
            raise EmptyDatasetError(
                "no samples with an image member (jpg, jpeg, png, webp) in "
                f"{len(self.urls)} shard(s) starting {self.urls[0]}"
            )
        self.classes = self.index.classes
        if listed is not None:
            _check_counts(os.fspath(shards), listed.shards, self.index.shard_sizes())
            self.classes = _named_classes(self.index, listed.classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self._say_unlabelled("no label member (cls, txt or json, next to the image in the tar)",
                             if_all=logging.INFO)
        self._order = ShardOrder(self.index.shard_sizes(), self.shuffle_window)
        refs = shard_refs(self._store_urls, self.paths, self.index.versions,
                          [version_size(v) for v in self.index.versions])
        self._shards = CachedShards.open(self._cache, refs, shuffle_window=self.shuffle_window,
                                         owner="TarShards", reads="shards", local=self.local)

    @property
    def fs(self) -> Any:
        """The shards' filesystem (opened again in a new process)."""
        if self._fs is None or self._pid != os.getpid():
            self._fs, self._pid = self._url_to_fs(self.urls[0])[0], os.getpid()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fs=None, _pid=-1)
        return state

    def __repr__(self) -> str:
        more = " ..." if len(self.urls) > 1 else ""
        return (f"TarShards({self.urls[0]!r}{more}, {len(self.urls)} shards, "
                f"{len(self)} images, {len(self.classes)} classes, on_error={self.on_error!r})")

    def sample_name(self, index: int) -> str:
        shard = self.urls[int(self.index.shards[int(index)])]
        return f"{os.path.basename(shard)}:{self.index.key(int(index))}"

    def sample_url(self, index: int) -> str:
        return f"{self.urls[int(self.index.shards[int(index)])]}#{self.index.key(int(index))}"

    def _where(self, index: int) -> tuple[int, str, int, int]:
        i = int(index)
        shard = int(self.index.shards[i])
        return shard, self.paths[shard], int(self.index.offsets[i]), int(self.index.lengths[i])

    def _key(self, index: int) -> str | None:
        """The cache key of sample ``index``'s bytes (None: read directly)."""
        if self._cache is None or self.local:
            return None
        shard, _, offset, length = self._where(index)
        member = f"{self.urls[shard]}#{offset}+{length}"
        return self._cache.key_of(member, self.index.versions[shard])

    def _origin(self, index: int) -> bytes:
        _, path, offset, length = self._where(index)
        if self.local:
            data = read_local_range(path, offset, length)
        else:
            data = self.fs.cat_file(path, start=offset, end=offset + length)
        if len(data) != length:
            raise OSError(f"read {len(data)} of the member's {length} bytes at byte {offset} "
                          "(the shard changed since it was indexed?)")
        return data

    def _from_store(self, index: int) -> bytes:
        """Sample ``index``'s bytes from the local copy of its shard (downloaded if needed);
        from the origin when another process holds the shard too long."""
        assert self._shards is not None
        shard, _, offset, length = self._where(index)
        return self._shards.read(self.fs, shard, offset, length, lambda *_: self._origin(index))

    def _files_of(self, samples: np.ndarray) -> np.ndarray:
        return self.index.shards[samples]

    def read_bytes(self, index: int) -> bytes:
        """The encoded bytes of sample ``index``: a read of the local copy of its shard (a
        remote dataset with a disk cache), else one range read of its shard (or the cache).
        A failed read raises :class:`~fastload.errors.UnreadableSampleError` naming the shard,
        the key and the index."""
        if self._shards is not None:
            try:
                return self._from_store(index)
            except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
                error = storage_error(exc, "read", self.sample_url(index))
                raise self.unreadable(index, error) from exc
        key = self._key(index)
        try:
            data = cached_range(self._cache, key)
            if data is None:
                data = self._origin(index)
                store_range(self._cache, key, data)
            return data
        except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
            error = storage_error(exc, "read", self.sample_url(index))
            raise self.unreadable(index, error) from exc

    def read_batch(self, indices: Sequence[int]) -> list[bytes | Exception | None]:
        """A remote batch's bytes at once: cached ones from the cache, the rest in one
        concurrent ``cat_ranges`` call; local shards: Nones (each load reads its own)."""
        if self.local:
            return [None] * len(indices)
        start = time.perf_counter()
        if self._shards is not None:
            out_local: list[bytes | Exception | None] = []
            for i in indices:
                try:
                    out_local.append(self._from_store(i))
                except Exception:  # noqa: BLE001 - load() reads it again and names what failed
                    out_local.append(None)
            batchinfo.record(time.perf_counter() - start, 0.0, 0)
            return out_local
        keys = [self._key(i) for i in indices]
        out: list[bytes | Exception | None] = [cached_range(self._cache, k) for k in keys]
        missing = [k for k, data in enumerate(out) if data is None]
        if missing:
            where = [self._where(indices[k]) for k in missing]
            try:
                got = self.fs.cat_ranges([w[1] for w in where], [w[2] for w in where],
                                         [w[2] + w[3] for w in where], on_error="return")
            except Exception as exc:  # noqa: BLE001 - the whole call failed: each reads its own
                got = [exc] * len(missing)
            for k, w, data in zip(missing, where, got):
                if isinstance(data, bytes) and len(data) == w[3]:
                    out[k] = data
                    store_range(self._cache, keys[k], data)
                else:
                    out[k] = None  # load() reads it again and names what failed
        batchinfo.record(time.perf_counter() - start, 0.0, 0)
        return out


def _check_counts(where: str, listed: list[tuple[str, int]], sizes: Sequence[int]) -> None:
    """Warn when the shard index file ``where`` counts a shard's samples otherwise than its
    headers do (a stale index file: wids would read past or short of the shard)."""
    wrong = [(url, n, int(m)) for (url, n), m in zip(listed, sizes) if n >= 0 and n != m]
    if wrong:
        url, said, found = wrong[0]
        logger.warning(
            "%s says %s holds %d samples, and its headers hold %d (%d shard(s) differ): the "
            "index file is older than the shards; fastload reads what the shards hold, wids "
            "would not. Write it again (`fastload pack` rewrites shards.json)",
            where, url, said, found, len(wrong))


def _named_classes(index: ShardIndex, names: list[str] | None) -> list[str]:
    """The class names of a shard index file for numeric labels (``fastload pack``'s), where
    every label has one; else the index's own."""
    numeric = index.classes == [str(i) for i in range(len(index.classes))]
    if names is None or not numeric or len(index.classes) > len(names):
        return index.classes
    return list(names)
