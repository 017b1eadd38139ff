"""The sample index of a set of Parquet image files: (file, row group, row, label) per sample.

NOTE [the Parquet index]
:class:`ParquetIndex` holds one row per sample in numpy arrays (its row group, counted over
all files in order, its row within that group, its label): 16 bytes a sample. Per row group
it keeps the file, the group's number in its file and the byte range of the image column's
chunk in that file (``start``, ``length``): the one range a sample's read needs (NOTE [one
range per row group] in :mod:`.parquet_read`). Per file it keeps the URL, the version (ETag
or mtime+size), the size and the footer (the file's Parquet metadata, a few KB), so no
process reads a footer again. Sample ids run row group by row group in storage order, the
layout :class:`~fastload.data.shard_order.ShardOrder` expects of its shards.

It is built once (:mod:`.parquet_build`) and kept in the cache's shared tiers like a
folder's listing (NOTE [the stored listing] in :mod:`.stored_listing`).

Example::

    >>> index = ParquetIndex.from_bytes(blob)
    >>> index.file_of(5), index.group_number_of(5), int(index.rows[5]), int(index.labels[5])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload.data.index_blob import BlobIndex, pack, unpack

__all__ = ["FORMAT", "FileRows", "ParquetIndex"]

FORMAT = "fastload-parquet-1"
_MAGIC = b"FLPARQUET1\n"


@dataclass
class FileRows:
    """What one file contributes to the index: its version, size, footer and row groups."""

    version: str
    size: int
    footer: bytes
    group_rows: list[int] = field(default_factory=list)  # rows in each row group
    group_ranges: list[tuple[int, int]] = field(default_factory=list)  # image chunk (start, length)
    labels: list[int] = field(default_factory=list)  # one per row, -1 where none


class ParquetIndex(BlobIndex):
    """The samples of a list of Parquet files (NOTE [the Parquet index]); pickles as one blob."""

    def __init__(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.meta = meta
        self.groups: np.ndarray = arrays["group"]
        self.rows: np.ndarray = arrays["row"]
        self.labels: np.ndarray = arrays["label"]
        self.group_file: np.ndarray = arrays["group_file"]
        self.group_number: np.ndarray = arrays["group_number"]
        self.group_start: np.ndarray = arrays["group_start"]
        self.group_length: np.ndarray = arrays["group_length"]
        self._footers: np.ndarray = arrays["footer"]
        self._footer_ends: np.ndarray = arrays["footer_end"]

    @classmethod
    def build(
        cls, urls: Sequence[str], files: Sequence[FileRows], *, classes: list[str],
        columns: dict[str, Any], extra: dict[str, Any],
    ) -> ParquetIndex:
        """The index of ``files`` (one per URL, in ``urls`` order)."""
        sizes = [n for f in files for n in f.group_rows]
        groups = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
        rows = np.concatenate([np.arange(n, dtype=np.int32) for n in sizes] or
                              [np.zeros(0, np.int32)])
        footers = [f.footer for f in files]
        arrays = {
            "group": groups, "row": rows,
            "label": np.array([v for f in files for v in f.labels], np.int64),
            "group_file": np.repeat(np.arange(len(files), dtype=np.int32),
                                    [len(f.group_rows) for f in files]),
            "group_number": np.array([g for f in files for g in range(len(f.group_rows))],
                                     np.int32),
            "group_start": np.array([s for f in files for s, _ in f.group_ranges], np.int64),
            "group_length": np.array([n for f in files for _, n in f.group_ranges], np.int64),
            "footer": np.frombuffer(b"".join(footers), np.uint8).copy(),
            "footer_end": np.cumsum([len(b) for b in footers], dtype=np.int64),
        }
        meta = {
            "format": FORMAT, "urls": list(urls), "versions": [f.version for f in files],
            "sizes": [f.size for f in files], "classes": classes, "columns": columns,
            "listed_at": time.time(), "extra": extra,
        }
        return cls(meta, arrays)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def sizes(self) -> list[int]:
        return self.meta["sizes"]

    @property
    def columns(self) -> dict[str, Any]:
        """``image`` (the column), ``leaf`` (its bytes' path in the schema), ``label``."""
        return self.meta["columns"]

    @property
    def nbytes(self) -> int:
        """Bytes the per-sample arrays hold (per row group and per file come on top)."""
        return self.groups.nbytes + self.rows.nbytes + self.labels.nbytes

    def group_of(self, i: int) -> int:
        """The row group (counted over all files) that holds sample ``i``."""
        return int(self.groups[i])

    def file_of(self, i: int) -> int:
        """The file that holds sample ``i``."""
        return int(self.group_file[self.groups[i]])

    def group_number_of(self, i: int) -> int:
        """Sample ``i``'s row group's number within its file."""
        return int(self.group_number[self.groups[i]])

    def group_sizes(self) -> np.ndarray:
        """Samples per row group, in storage order (the "shards" of the epoch order)."""
        return np.bincount(self.groups, minlength=len(self.group_file))

    def footer(self, file: int) -> bytes:
        """File ``file``'s footer as :mod:`.parquet_read` reads it (``PAR1`` + metadata)."""
        start = int(self._footer_ends[file - 1]) if file > 0 else 0
        return self._footers[start: int(self._footer_ends[file])].tobytes()

    def to_bytes(self) -> bytes:
        """The index as one blob (:func:`~fastload.data.index_blob.pack`)."""
        return pack(_MAGIC, self.meta, {
            "group": self.groups, "row": self.rows, "label": self.labels,
            "group_file": self.group_file, "group_number": self.group_number,
            "group_start": self.group_start, "group_length": self.group_length,
            "footer": self._footers, "footer_end": self._footer_ends})

    @classmethod
    def from_bytes(cls, blob: bytes) -> ParquetIndex:
        """The index in ``blob``; ValueError for one that is damaged or of another format."""
        index = cls(*unpack(_MAGIC, FORMAT, blob, "Parquet index"))
        per_sample = {len(a) for a in (index.groups, index.rows, index.labels)}
        per_group = {len(a) for a in (index.group_file, index.group_number, index.group_start,
                                      index.group_length)}
        if len(per_sample) != 1 or len(per_group) != 1 or len(index._footer_ends) != len(
                index.urls):
            raise ValueError("the Parquet index's arrays differ in length (damaged)")
        return index
