"""Reading pack's source ahead of its writer, in the source's order, within a memory budget.

Two ways, by what the shard writer needs:

- :func:`open_files`: local files, copied by the kernel without entering Python (copy-through
  of a local folder). Each is opened :data:`OPEN_AHEAD` files before the writer needs it, and
  the kernel is asked to start reading it then (``posix_fadvise(WILLNEED)``, which does not
  wait), so a cold disk or a network mount reads ahead while the writer copies, without a
  thread.
- :func:`read_ahead`: the bytes of each sample, through the dataset's storage (any fsspec URL,
  its cache) by a pool of :data:`READERS` threads, re-encoded there with ``transcode``
  (Pillow releases the GIL). At most :data:`READ_AHEAD` samples and about
  :data:`READ_AHEAD_BYTES` bytes are read ahead of the writer.

Example::

    >>> for sample in read_ahead(folder, range(len(folder)), None):
    ...     writer.add(..., sample.data)
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from fastload.data.images import ImageFolder
from fastload.data.transcode import Transcode

__all__ = [
    "OPEN_AHEAD",
    "READERS",
    "READ_AHEAD",
    "READ_AHEAD_BYTES",
    "Sample",
    "open_files",
    "read_ahead",
]

READERS = 16
"""Threads reading (and re-encoding) the source's samples."""
READ_AHEAD = 64
"""Most samples read ahead of the writer."""
READ_AHEAD_BYTES = 256 << 20
"""About the most bytes read ahead of the writer (large images: fewer samples ahead)."""
OPEN_AHEAD = 64
"""Local files opened (and being read by the kernel) ahead of the writer."""


@dataclass(slots=True)
class Sample:
    """One sample for the shard writer: ``data`` (its bytes), or ``fd`` and ``size`` (an open
    local file to copy; it is closed when the next sample is asked for)."""

    index: int
    path: str
    """Its path in the source's storage."""
    data: bytes | None = None
    fd: int = -1
    size: int = 0
    ext: str | None = None
    """The extension its bytes now have (``jpg`` when re-encoded); None: the file's own."""
    failed: str | None = None
    """Why ``transcode`` could not decode it (it is written as it is)."""

    @property
    def nbytes(self) -> int:
        return self.size if self.data is None else len(self.data)


def open_files(source: ImageFolder, indices: range) -> Generator[Sample, None, None]:
    """The samples of local ``source`` as open files, each opened :data:`OPEN_AHEAD` files
    before it is yielded with the kernel asked to read it meanwhile; a file that cannot be
    opened, or that changed while it was copied, raises the source's
    :class:`~fastload.errors.UnreadableSampleError` naming it."""
    path_of, todo = source.index.path, iter(indices)
    advise = getattr(os, "posix_fadvise", None)
    ahead: deque[tuple[int, str, int | OSError]] = deque()

    def open_next() -> None:
        i = next(todo, None)
        if i is None:
            return
        path = path_of(i)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:  # raised when its turn comes
            ahead.append((i, path, exc))
            return
        ahead.append((i, path, fd))
        if advise is not None:
            try:
                advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)  # starts the read, does not wait
            except OSError:
                pass

    try:
        for _ in range(OPEN_AHEAD):
            open_next()
        while ahead:
            i, path, fd = ahead.popleft()
            if isinstance(fd, OSError):
                raise source.unreadable(i, fd) from fd
            try:
                before = os.fstat(fd)
                yield Sample(i, path, fd=fd, size=before.st_size)
                after = os.fstat(fd)
            finally:
                os.close(fd)
            if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                raise source.unreadable(i, OSError(
                    f"it changed while it was packed ({before.st_size} -> {after.st_size} "
                    "bytes); pack again once it is written"))
            open_next()
    finally:
        for _, _, fd in ahead:
            if not isinstance(fd, OSError):
                os.close(fd)


def read_ahead(source: ImageFolder, indices: range,
               transcode: Transcode | None) -> Generator[Sample, None, None]:
    """The samples of ``source`` with their bytes (re-encoded by ``transcode`` where it makes
    them smaller), read by a thread pool ahead of the caller, in ``indices``' order."""

    def read(i: int) -> Sample:
        path, data = source.index.path(i), source.read_bytes(i)
        if transcode is None:
            return Sample(i, path, data)
        try:
            small = transcode(data)
        except ValueError as exc:  # not a decodable image: packed as it is
            return Sample(i, path, data, failed=f"{path}: {exc}")
        return Sample(i, path, data) if small is data else Sample(i, path, small, ext="jpg")

    with ThreadPoolExecutor(READERS, thread_name_prefix="fastload-pack") as pool:
        reading: deque[Future[Sample]] = deque()
        ahead, seen, seen_bytes = iter(indices), 0, 0
        try:
            while True:
                # The window: READ_AHEAD samples, fewer where samples are large (the mean so far).
                window = READ_AHEAD if not seen else max(
                    1, min(READ_AHEAD, READ_AHEAD_BYTES * seen // max(1, seen_bytes)))
                while len(reading) < window:
                    i = next(ahead, None)
                    if i is None:
                        break
                    reading.append(pool.submit(read, i))
                if not reading:
                    return
                sample = reading.popleft().result()
                seen, seen_bytes = seen + 1, seen_bytes + sample.nbytes
                yield sample
        finally:
            for future in reading:
                future.cancel()
