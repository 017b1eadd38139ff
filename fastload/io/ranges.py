"""Many small byte ranges of one file in few requests: reading through the gaps between them.

NOTE [reading through small gaps]
A request to an object store costs its first-byte latency (10-30 ms on S3, plus the
server's CPU per request) whatever it asks for; in that time one stream moves 1-3 MB. Small
ranges with small gaps between them (a shard's label members, one every image; a Parquet
file's label column chunks, one every row group) are therefore cheaper read through: on a
remote store, ranges less than :data:`READ_THROUGH` (1 MiB) apart are merged into reads of
at most :data:`MERGED_READ` bytes, which run concurrently. Asked for one by one, indexing
``fastload pack``'s 15 MB shards of 74 KB JPEGs took ~240 requests a shard (5,000 requests,
40 s, for 21 shards against moto's server on this machine). A local file pays no latency:
its ranges are read exactly.

Example::

    >>> read_ranges(fs, "bucket/train-000.tar", [(1536, 2), (78848, 3)])
    [b'17', b'412']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import merge_offset_ranges

__all__ = ["MERGED_READ", "READ_THROUGH", "read_ranges", "read_through"]

READ_THROUGH = 1 << 20
"""Unwanted bytes worth reading rather than starting another request to a remote store."""

MERGED_READ = 8 << 20
"""The most bytes one merged read takes."""


def read_through(fs: Any) -> int:
    """Unwanted bytes worth reading through on ``fs``: none on a local disk."""
    return 0 if isinstance(fs, LocalFileSystem) else READ_THROUGH


def read_ranges(fs: Any, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of the ``(offset, length)`` ranges of the file at ``path``, in their order:
    one concurrent ``cat_ranges`` call over the ranges merged as NOTE [reading through small
    gaps] says. Raises the storage's exception for a read that fails, and OSError for a range
    past the file's end."""
    if not ranges:
        return []
    starts = [offset for offset, _ in ranges]
    ends = [offset + length for offset, length in ranges]
    _, block_starts, block_ends = merge_offset_ranges(
        [path] * len(ranges), starts, ends, max_gap=read_through(fs), max_block=MERGED_READ)
    blocks = fs.cat_ranges([path] * len(block_starts), block_starts, block_ends,
                           on_error="raise")
    out: list[bytes] = [b""] * len(ranges)
    block = 0
    for i in sorted(range(len(ranges)), key=lambda i: (starts[i], ends[i])):
        while not (block_starts[block] <= starts[i] and ends[i] <= block_ends[block]):
            block += 1
        at = block_starts[block]
        out[i] = blocks[block][starts[i] - at: ends[i] - at]
        if len(out[i]) != ends[i] - starts[i]:
            raise OSError(
                f"bytes {starts[i]}-{ends[i]} of {path} came back as {len(out[i])} bytes: the "
                "file is shorter than its index says (changed since?); build the dataset again")
    return out
