"""A sharded dataset's index as one blob, and that blob kept in the cache's shared tiers.

:class:`~fastload.data.shard_index.ShardIndex` (tar shards) and
:class:`~fastload.data.parquet_index.ParquetIndex` (Parquet files) are numpy arrays and a JSON
header. :func:`pack` makes them one blob (a magic line, a blake2b checksum, the header, the
arrays as npz) and :func:`unpack` checks and opens it. :func:`load_stored` and :func:`store`
keep it in the shared tiers (disk, Redis) under :func:`stored_key`, like a folder's listing
(NOTE [the stored listing] in :mod:`.stored_listing`): it is reused while it was made for the
same URLs and is at most ``listing_max_age`` seconds old.

Example::

    >>> blob = pack(b"MYINDEX1\\n", {"format": "my-1"}, {"row": np.arange(3)})
    >>> meta, arrays = unpack(b"MYINDEX1\\n", "my-1", blob, "my index")
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from fastload.cache.keys import digest
from fastload.cache.tiered import TieredCache
from fastload.data.stored_listing import KEY_PREFIX

logger = logging.getLogger(__name__)

__all__ = ["BlobIndex", "load_stored", "pack", "store", "stored_key", "unpack"]

Index = TypeVar("Index")

_CLOCK_SKEW_S = 300.0  # an index "from the future" by more than this is not trusted


class BlobIndex(abc.ABC):
    """What a blob-kept index shares: its ``meta`` header (``urls``, ``versions``, ``classes``,
    ``listed_at``), and pickling as its blob (one bytes object crosses to worker processes)."""

    meta: dict[str, Any]

    @abc.abstractmethod
    def to_bytes(self) -> bytes:
        """The index as one blob (:func:`pack`)."""

    @classmethod
    @abc.abstractmethod
    def from_bytes(cls, blob: bytes) -> BlobIndex:
        """The index in ``blob``; ValueError for one that is damaged or of another format."""

    def __reduce__(self):
        return (type(self).from_bytes, (self.to_bytes(),))

    @property
    def urls(self) -> list[str]:
        return self.meta["urls"]

    @property
    def versions(self) -> list[str]:
        return self.meta["versions"]

    @property
    def classes(self) -> list[str]:
        return self.meta["classes"]

    @property
    def listed_at(self) -> float:
        return float(self.meta["listed_at"])


def pack(magic: bytes, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """``meta`` and ``arrays`` as one blob (magic, checksum, JSON meta, npz arrays)."""
    out = io.BytesIO()
    np.savez(out, **arrays)
    header = json.dumps(meta).encode()
    body = len(header).to_bytes(8, "little") + header + out.getvalue()
    return magic + hashlib.blake2b(body, digest_size=16).digest() + body


def unpack(magic: bytes, fmt: str, blob: bytes, what: str) -> tuple[dict[str, Any],
                                                                   dict[str, np.ndarray]]:
    """The meta and arrays of a :func:`pack` blob whose meta has ``"format": fmt``;
    ValueError (naming ``what``) for one that is damaged or of another format."""
    if not blob.startswith(magic):
        raise ValueError(f"not a fastload {what}")
    checksum, body = blob[len(magic): len(magic) + 16], blob[len(magic) + 16:]
    if hashlib.blake2b(body, digest_size=16).digest() != checksum:
        raise ValueError(f"the {what}'s checksum does not match (damaged)")
    size = int.from_bytes(body[:8], "little")
    meta = json.loads(body[8: 8 + size])
    if meta.get("format") != fmt:
        raise ValueError(f"a {what} of format {meta.get('format')!r}, not {fmt!r}")
    with np.load(io.BytesIO(body[8 + size:]), allow_pickle=False) as arrays:
        return meta, {name: arrays[name] for name in arrays.files}


def stored_key(fmt: str, made_of: Any, storage_options: dict[str, Any] | None) -> str:
    """The cache key of an index of format ``fmt`` made of ``made_of`` (JSON: the URLs and
    whatever else decides its rows) with these storage options (a digest: no secret in a key)."""
    options = json.dumps(storage_options or {}, sort_keys=True,
                         default=lambda o: type(o).__qualname__)
    return f"{KEY_PREFIX}{fmt}:{digest(json.dumps(made_of))}#opts={digest(options)[:16]}"


def load_stored(cache: TieredCache, key: str, parse: Callable[[bytes], Index],
                urls: Sequence[str], max_age: float) -> Index | None:
    """The index stored under ``key`` (``parse`` opens a blob; its ``urls`` and
    ``listed_at`` are checked), if one was made for ``urls`` at most ``max_age`` s ago."""
    for tier in (t for t in cache.tiers if t.shared):
        blob = tier.get(key) if tier.contains(key) else None
        if blob is None:
            continue
        try:
            index = parse(blob)
        except ValueError as exc:
            logger.debug("ignoring the stored index %s in the %s tier: %s", key, tier.name, exc)
            continue
        age = time.time() - index.listed_at  # type: ignore[attr-defined]
        if index.urls == list(urls) and -_CLOCK_SKEW_S <= age <= max_age:  # type: ignore[attr-defined]
            return index
    return None


def store(cache: TieredCache, key: str, blob: bytes) -> None:
    """Put ``blob`` under ``key`` in every shared tier, replacing what was there (tiers keep
    the first value put under a key)."""
    for tier in (t for t in cache.tiers if t.shared):
        tier.delete(key)
        tier.put(key, blob)
