"""Reading Parquet column chunks from byte ranges, and a small per-process LRU of row groups.

NOTE [one range per row group]
A sample of a Parquet file is a value of its row group's image column, and pyarrow decodes a
column chunk as a whole (pages, compression, the dictionary). So a sample's read is its row
group's image chunk: one byte range, ``(start, length)`` from the file's metadata, that the
index keeps (NOTE [the Parquet index]). pyarrow is given the footer the index stored
(``ParquetFile(..., metadata=...)``) and a file object, :class:`RangeFile`, that serves
reads from the ranges it was handed, so it reads nothing else: one range per row group and
file, read through whatever gave those bytes (the origin, the cache's entries, or the local
copy of the whole file in the shard store). A read outside the ranges (pyarrow pads old
parquet-mr files' chunks) goes to a fallback read of the file.

The decoded column (an Arrow binary array) is kept in :class:`GroupLRU`, a per-process LRU
of row groups (at least the ``2 x shuffle_window`` the order reads at once, more up to
:data:`GROUP_BUDGET_BYTES`) with one load per group at a time (read threads that want the
same group wait for the first), so the shard-aware epoch order (row groups as shards, NOTE
[shard-aware order]) reads each row group once per process.

Example::

    >>> metadata = read_metadata(footer_bytes)
    >>> values = decode_column(metadata, size, {start: chunk}, group=0, leaf="image.bytes")
    >>> values[3].as_py()[:2]
    b'\\xff\\xd8'
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from fastload.errors import MissingDependencyError
from fastload.io.positioned import PositionedFile

logger = logging.getLogger(__name__)

__all__ = ["GroupLRU", "RangeFile", "decode_column", "footer_of", "pyarrow_parquet",
           "read_metadata"]

FOOTER_READ = 64 * 1024
"""Bytes read from a file's end to find its footer (most footers fit: one request)."""

GROUP_BUDGET_BYTES = 256 * 2**20
"""Bytes of decoded row groups a process keeps beyond the few its order needs at once: the
threads engine's read threads run a few batches ahead, over more than one window of groups."""


def pyarrow_parquet() -> Any:
    """``pyarrow.parquet``, or an error that says what to install."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError(
            "reading Parquet files needs pyarrow: pip install 'fastload[parquet]' "
            "(or pip install 'pyarrow>=14')"
        ) from exc
    return pq


def footer_of(read_at: Callable[[int, int], bytes], size: int, where: str) -> bytes:
    """A Parquet file's footer as ``PAR1`` + metadata + its length + ``PAR1`` (what
    :func:`read_metadata` reads), from ``read_at(offset, length)`` of a file of ``size`` bytes.
    ValueError (naming ``where``) for a file that is not Parquet."""
    if size < 12:
        raise ValueError(f"{where} has {size} bytes: too short for a Parquet file")
    start = max(0, size - FOOTER_READ)
    tail = read_at(start, size - start)
    if tail[-4:] != b"PAR1":
        raise ValueError(f"{where} does not end in Parquet's magic bytes 'PAR1' (not Parquet, "
                         "or cut short)")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise ValueError(f"{where}: its footer claims {length} bytes of a {size}-byte file")
    if length + 8 > len(tail):
        tail = read_at(size - length - 8, length + 8)
    return b"PAR1" + tail[-(length + 8):]


def read_metadata(footer: bytes) -> Any:
    """The ``pyarrow.parquet.FileMetaData`` of a footer from :func:`footer_of`."""
    import pyarrow as pa

    return pyarrow_parquet().read_metadata(pa.BufferReader(footer))


class RangeFile(PositionedFile):
    """A read-only file of ``size`` bytes whose reads come from ``ranges`` ({start: bytes});
    a read outside them calls ``fallback(offset, length)`` (NOTE [one range per row group])."""

    def __init__(self, size: int, ranges: Mapping[int, bytes],
                 fallback: Callable[[int, int], bytes]) -> None:
        super().__init__(size)
        self._starts = sorted(ranges)
        self._ranges = dict(ranges)
        self._fallback = fallback

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), max(0, self.size() - self.pos))
        k = bisect.bisect_right(self._starts, self.pos) - 1
        data: bytes | None = None
        if k >= 0:
            start = self._starts[k]
            chunk = self._ranges[start]
            if self.pos + want <= start + len(chunk):
                data = chunk[self.pos - start: self.pos - start + want]
        if data is None:
            logger.debug("Parquet read of %d bytes at %d outside the indexed ranges", want,
                         self.pos)
            data = self._fallback(self.pos, want)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def decode_column(metadata: Any, size: int, ranges: Mapping[int, bytes], group: int, leaf: str,
                  fallback: Callable[[int, int], bytes] | None = None) -> Any:
    """Row group ``group``'s column ``leaf`` (``"image.bytes"``, ``"label"``) as one Arrow
    array, decoded from ``ranges`` of the file's bytes (a struct's only field taken out,
    with the struct's nulls)."""
    def outside(offset: int, length: int) -> bytes:
        raise OSError(f"pyarrow asked for bytes {offset}-{offset + length} outside the column "
                      "chunk's range")

    source = RangeFile(size, ranges, fallback or outside)
    table = pyarrow_parquet().ParquetFile(source, metadata=metadata).read_row_group(
        group, columns=[leaf])
    column = table.column(0).combine_chunks()
    for _ in leaf.split(".")[1:]:
        column = column.flatten()[0]
    return column


class GroupLRU:
    """This process's last-used row groups' decoded columns, by group number: at least
    ``keep`` of them, more while they hold at most ``budget`` bytes; one load of a group at a
    time (NOTE [one range per row group])."""

    def __init__(self, keep: int, budget: int = GROUP_BUDGET_BYTES) -> None:
        self.keep = max(1, int(keep))
        self.budget = int(budget)
        self._values: OrderedDict[int, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._loading: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.loads = 0  # groups loaded (a test and a benchmark read it)

    def __contains__(self, group: int) -> bool:
        with self._lock:
            return group in self._values

    def get(self, group: int, load: Callable[[int], Any]) -> Any:
        """Group ``group``'s value, from ``load(group)`` unless kept; its errors propagate
        (to every thread that waited for that load, each of which then loads again)."""
        while True:
            with self._lock:
                if group in self._values:
                    self._values.move_to_end(group)
                    return self._values[group][0]
                waiting = self._loading.get(group)
                if waiting is None:
                    done = self._loading[group] = threading.Event()
                    break
            waiting.wait()
        try:
            value = load(group)
            size = int(getattr(value, "nbytes", 0))
            with self._lock:
                self.loads += 1
                self._values[group] = (value, size)
                self._bytes += size
                while len(self._values) > self.keep and self._bytes > self.budget:
                    self._bytes -= self._values.popitem(last=False)[1][1]
            return value
        finally:
            with self._lock:
                del self._loading[group]
            done.set()
