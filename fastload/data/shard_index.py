"""The sample index of a set of WebDataset shards: (shard, offset, length, label) per sample.

NOTE [the shard index]
:class:`ShardIndex` holds one row per sample in numpy arrays (shard number, the image
member's byte offset and length, the label) and the sample keys in one bytes blob: about
30 bytes a sample plus its key, a list of tuples would cost ~300. It is built once per
dataset from the shards' headers (or their DALI index files, :mod:`.tarfiles`), shards read
concurrently, and kept in the cache's shared tiers like a folder's listing (NOTE [the stored
listing] in :mod:`.stored_listing`): the entry's key is made of the shard URLs, the storage
options and the format; it records each shard's version and is reused for
``listing_max_age`` seconds. A sample is a key with an image member (``jpg``, ``jpeg``,
``png``, ``webp``); its label is the integer in its ``cls`` (or ``txt``/``json``) member,
or, where those hold names, the name's position among the sorted names. A sample without a
label member has label -1.

Example::

    >>> index = ShardIndex.from_bytes(blob)
    >>> index.shard_of(5), index.offset_of(5), index.length_of(5), index.label_of(5)
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.data.index_blob import BlobIndex, pack, unpack

__all__ = [
    "FORMAT", "IMAGE_EXTENSIONS", "LABEL_EXTENSIONS", "ShardIndex", "ShardRows", "parse_label",
]

FORMAT = "fastload-shards-1"
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
LABEL_EXTENSIONS = ("cls", "txt", "json")
_MAGIC = b"FLSHARDS1\n"


def parse_label(extension: str, data: bytes) -> int | str:
    """The label a ``cls``/``txt``/``json`` member holds: an int, else a class name."""
    text = data.decode("utf-8", "replace").strip()
    if extension == "json":
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, dict):
            value = next((value[k] for k in ("label", "cls", "class") if k in value), text)
        text = str(value)
    try:
        return int(text)
    except ValueError:
        return text


@dataclass
class ShardRows:
    """The samples found in one shard, before they become index rows."""

    keys: list[str]
    offsets: list[int]
    lengths: list[int]
    labels: list[int | str | None]


class ShardIndex(BlobIndex):
    """The samples of a list of shards (NOTE [the shard index]); pickles as one blob."""

    def __init__(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.meta = meta
        self.shards: np.ndarray = arrays["shard"]
        self.offsets: np.ndarray = arrays["offset"]
        self.lengths: np.ndarray = arrays["length"]
        self.labels: np.ndarray = arrays["label"]
        self._keys: np.ndarray = arrays["keys"]
        self._key_ends: np.ndarray = arrays["key_end"]

    @classmethod
    def build(
        cls, urls: Sequence[str], versions: Sequence[str], rows: Sequence[ShardRows],
        extra: dict[str, Any],
    ) -> ShardIndex:
        """The index of ``rows`` (one per shard, in ``urls`` order)."""
        raw = [label for r in rows for label in r.labels]
        names = sorted({v for v in raw if isinstance(v, str)})
        if names and any(isinstance(v, int) for v in raw):
            names = sorted(set(names) | {str(v) for v in raw if isinstance(v, int)})
        position = {name: i for i, name in enumerate(names)}
        labels = [-1 if v is None else position[str(v)] if names else v for v in raw]
        top = max([v for v in labels if v >= 0], default=-1)
        classes = names or [str(i) for i in range(top + 1)]
        keys = [k.encode("utf-8", "surrogateescape") for r in rows for k in r.keys]
        arrays = {
            "shard": np.concatenate([np.full(len(r.keys), i, np.int32) for i, r in enumerate(rows)]
                                    or [np.zeros(0, np.int32)]),
            "offset": np.array([o for r in rows for o in r.offsets], np.int64),
            "length": np.array([n for r in rows for n in r.lengths], np.int64),
            "label": np.array(labels, np.int64),
            "keys": np.frombuffer(b"".join(keys), np.uint8).copy(),
            "key_end": np.cumsum([len(k) for k in keys], dtype=np.int64),
        }
        meta = {
            "format": FORMAT, "urls": list(urls), "versions": list(versions), "classes": classes,
            "listed_at": time.time(), "extra": extra,
        }
        return cls(meta, arrays)

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def nbytes(self) -> int:
        """Bytes the per-sample arrays hold."""
        return sum(a.nbytes for a in (self.shards, self.offsets, self.lengths, self.labels,
                                      self._keys, self._key_ends))

    def key(self, i: int) -> str:
        """The sample key of row ``i`` (its members' shared name)."""
        start = int(self._key_ends[i - 1]) if i > 0 else 0
        return bytes(self._keys[start: int(self._key_ends[i])]).decode("utf-8", "surrogateescape")

    def shard_sizes(self) -> np.ndarray:
        """Samples per shard, in shard order."""
        return np.bincount(self.shards, minlength=len(self.urls))

    def to_bytes(self) -> bytes:
        """The index as one blob (:func:`~fastload.data.index_blob.pack`)."""
        return pack(_MAGIC, self.meta, {
            "shard": self.shards, "offset": self.offsets, "length": self.lengths,
            "label": self.labels, "keys": self._keys, "key_end": self._key_ends})

    @classmethod
    def from_bytes(cls, blob: bytes) -> ShardIndex:
        """The index in ``blob``; ValueError for one that is damaged or of another format."""
        index = cls(*unpack(_MAGIC, FORMAT, blob, "shard index"))
        n = len(index)
        rows = (index.shards, index.lengths, index.labels, index._key_ends)
        if not all(len(a) == n for a in rows):
            raise ValueError("the shard index's arrays differ in length (damaged)")
        return index
