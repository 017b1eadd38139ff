"""A shard of the shard store read as a file, from its download as the bytes land.

NOTE [a shard read as a stream]
A reader that opens a shard's local file (:meth:`ShardStore.local_path`) waits for the whole
download first, then reads: a cold read takes the download's time plus the reading's. A
stream starts the download in a thread of its own (:meth:`ShardStore.ensure`) and reads
through :meth:`ShardStore.read`, which answers from the download's landing as the bytes land
(NOTE [reads from a download in progress] in :mod:`.shardlanding`), so reading overlaps the
download; once the download is over (or the shard was already whole) it reads the local copy
straight into the reader's buffer (``os.preadv``: no ``bytes`` made per read, one copy). A
sequential reader never meets a part not requested yet (every part before its position has
landed, so the download has moved on past it); should one come, or another process hold the shard past the waits, those bytes are
read from the origin by range. A stream closed after reading to (within a buffer of) the end
waits for its download to finish, which by then is the file's record and rename: a process
that exits right after would kill the download's daemon thread and leave the shard out of
the store (measured: a second epoch in a new process downloaded the last shard again). One
closed early leaves the download going on in the background: the shard is in the store for
the next reader, unless the process exits first.

Example::

    >>> with open_stream(store, fs, ref) as f:       # an io.BufferedReader
    ...     for member in tarfile.open(fileobj=f, mode="r|"):
    ...         ...
"""

from __future__ import annotations

import io
import logging
import os
import threading
from typing import Any

from fastload.cache.shardsource import ShardBusyError, ShardRef
from fastload.cache.shardstore import ShardStore
from fastload.io.positioned import PositionedFile

logger = logging.getLogger(__name__)

__all__ = ["ShardStream", "open_stream"]

BUFFER_BYTES = 1 << 20
"""Bytes the buffered reader over a stream asks for at once."""


class ShardStream(PositionedFile):
    """The shard ``ref`` as a readable, seekable raw file (NOTE [a shard read as a stream]);
    its download starts in a thread at once."""

    def __init__(self, store: ShardStore, fs: Any, ref: ShardRef) -> None:
        super().__init__(ref.size)
        self._store, self._fs, self._ref = store, fs, ref
        self._furthest = 0
        self._fd: int | None = None  # the local copy, once the download is over
        self._download = threading.Thread(target=self._fetch, name="fastload-shard-stream",
                                          daemon=True)
        self._download.start()

    @property
    def name(self) -> str:
        return self._ref.url

    @property
    def downloaded(self) -> bool:
        """Whether the stream's download is over: its reads come from the local copy now."""
        return not self._download.is_alive()

    def _fetch(self) -> None:
        try:
            self._store.ensure(self._fs, self._ref, must=True)
        except Exception as exc:  # the reads download it themselves, and raise what it raises
            logger.info("downloading %s for a stream failed (%s)", self._ref.url, exc)

    def readinto(self, buffer: Any) -> int:
        length = min(len(buffer), self.size() - self.pos)
        if length <= 0:
            return 0
        if self._fd is None and self.downloaded:
            self._fd = os.open(self._store.local_path(self._fs, self._ref), os.O_RDONLY)
        if self._fd is not None:
            got = os.preadv(self._fd, [memoryview(buffer)[:length]], self.pos)
        else:
            data = self._range(self.pos, length)
            got = len(data)
            buffer[:got] = data
        self.pos += got
        self._furthest = max(self._furthest, self.pos)
        return got

    def close(self) -> None:
        if self.closed:
            return
        if self.size() - self._furthest <= BUFFER_BYTES:
            self._download.join()  # read to the end: what is left is the file's rename
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        super().close()

    def _range(self, offset: int, length: int) -> bytes:
        try:
            return self._store.read(self._fs, self._ref, offset, length)
        except ShardBusyError:  # a part not requested yet, or held elsewhere past the waits
            return self._fs.cat_file(self._ref.path, start=offset, end=offset + length)


def open_stream(store: ShardStore, fs: Any, ref: ShardRef) -> io.BufferedReader:
    """The shard ``ref`` of ``store`` as a buffered binary file, read as its download lands
    (NOTE [a shard read as a stream])."""
    return io.BufferedReader(ShardStream(store, fs, ref), buffer_size=BUFFER_BYTES)
