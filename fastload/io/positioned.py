"""A read-only raw file of a known size whose bytes come from elsewhere, at a position.

The file objects fastload hands to readers that want one (pyarrow over a Parquet row group's
ranges, webdataset over a shard being downloaded) share what makes them files: their size,
a position that ``seek`` and ``tell`` move and read, and nothing to write. A subclass reads
``readinto`` from :attr:`PositionedFile.pos` and moves it.

Example::

    >>> class Zeros(PositionedFile):
    ...     def readinto(self, buffer):
    ...         n = min(len(buffer), self.size() - self.pos)
    ...         buffer[:n] = bytes(n); self.pos += n
    ...         return n
    >>> io.BufferedReader(Zeros(100)).read()[:4]
    b'\\x00\\x00\\x00\\x00'
"""

from __future__ import annotations

import io

__all__ = ["PositionedFile"]


class PositionedFile(io.RawIOBase):
    """A readable, seekable raw file of ``size`` bytes at position :attr:`pos`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.pos = base + offset
        return self.pos
