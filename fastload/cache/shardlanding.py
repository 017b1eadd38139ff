"""What has landed of the shard downloads in progress in this process, read as it lands.

NOTE [reads from a download in progress]
A download tells a :class:`Landing` which of its parts have been requested and how far each
has been written (a part is written in order from its start), so the threads of the process
that downloads a shard read their samples from its file as their bytes land, without a
request of their own: a read whose range lies in parts on their way waits for those bytes
(they come at the store's bandwidth, 8 MiB a part at most); a read in a part not requested
yet (a shard of more than :data:`PARTS_IN_FLIGHT` parts) is not waited for, since that part
may be seconds away: :meth:`Landing.read` answers None and the reader fetches its range from
the origin (NOTE [reads around a download] in :mod:`fastload.data.shard_cache_use`). The first
:data:`PARTS_IN_FLIGHT` parts count as requested from the start: they are, as the download
begins. A :class:`Landing` is read only while it is open: its owner closes it before the
file, and :meth:`Landing.close` waits for the reads inside it to leave, so no read ever touches
a descriptor closed or reused; a read whose bytes landed before the download ended reads them
even when the end reaches the lock first (else it would count neither early nor around, and
read the whole file after). :class:`Downloads` holds a
process's landings by shard for the store's readers (:mod:`.shardstore`).

Example::

    >>> downloads = Downloads()
    >>> with downloads.begun(digest, fd, size) as landing:      # the downloading thread
    ...     download_ranges(fs, path, size, fd, landing=landing)
    >>> downloads.read(digest, url, 1536, 110_000)            # any other thread, meanwhile
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from fastload.cache.shardsource import ShardFillingError
from fastload.io.origin import READ_DEADLINE_S

__all__ = ["Downloads", "Landing", "PARTS_IN_FLIGHT", "PART_BYTES"]

PART_BYTES = 8 << 20
"""Bytes of one range request."""

PARTS_IN_FLIGHT = 8
"""Range requests of one shard in flight at once."""


def _parts(size: int, part: int) -> list[tuple[int, int]]:
    return [(start, min(start + part, size)) for start in range(0, size, part)] or [(0, 0)]


class Landing:
    """The bytes of one download that have landed in its file so far (NOTE [reads from a
    download in progress]): the downloader calls :meth:`begin` and :meth:`landed` per part,
    the owner of the file :meth:`close` before closing it; readers call :meth:`read`.

    Args:
        fd: the file the download writes into (its owner closes it after :meth:`close`).
        size: the bytes the download writes.
        part: bytes of one range request (the download's parts).
        in_flight: parts requested at once: the first ``in_flight`` count as begun from the
            start (a read that comes before their requests go out waits for them too).
    """

    def __init__(self, fd: int, size: int, part: int = PART_BYTES,
                 in_flight: int = PARTS_IN_FLIGHT) -> None:
        self.fd, self.size, self.part = fd, size, part
        self.parts = _parts(size, part)
        self._upto: list[int | None] = [  # None: the part has not begun
            start if k < in_flight else None for k, (start, _) in enumerate(self.parts)]
        self._cond = threading.Condition()
        self._open = True
        self._readers = 0  # reads inside read(): close() waits for them to leave

    @property
    def closed(self) -> bool:
        """Whether the download is over (whole, failed or given up): read the file elsewhere."""
        with self._cond:
            return not self._open

    @property
    def readers(self) -> int:
        """Reads inside :meth:`read` now (waiting for their bytes, or reading them)."""
        with self._cond:
            return self._readers

    def begin(self, k: int) -> None:
        """Part ``k``'s request is on its way: readers of its range wait for its bytes."""
        with self._cond:
            if self._upto[k] is None:
                self._upto[k] = self.parts[k][0]

    def landed(self, k: int, upto: int) -> None:
        """Part ``k`` is written from its start up to offset ``upto`` (a retry that starts
        the part again keeps what had landed: the same bytes)."""
        with self._cond:
            self._upto[k] = max(self._upto[k] or 0, upto)
            self._cond.notify_all()

    def close(self) -> None:
        """The download is over: a read waiting whose bytes have landed reads them, the others
        give up, and none reads the file once this returns (it waits for the reads to leave)."""
        with self._cond:
            self._open = False
            self._cond.notify_all()
            while self._readers:
                self._cond.wait()

    def read(self, offset: int, length: int, timeout: float = READ_DEADLINE_S) -> bytes | None:
        """Bytes ``[offset, offset + length)`` once they have landed, waiting while every part
        they lie in is on its way (at most ``timeout`` s); None when a part has not begun, the
        download is over (:attr:`closed`), the wait ran out, or the range lies past the end."""
        end = offset + length
        if length <= 0 or offset < 0 or end > self.size:
            return None
        first, last = offset // self.part, (end - 1) // self.part
        deadline = time.monotonic() + timeout
        with self._cond:
            if not self._open:
                return None  # the file may be closed already
            self._readers += 1
            try:
                while True:
                    upto = self._upto[first:last + 1]
                    if any(u is None for u in upto):
                        return None
                    if all(u >= min(end, self.parts[k][1])
                           for k, u in enumerate(upto, start=first)):
                        return os.pread(self.fd, length, offset)  # close() waits for this
                    left = deadline - time.monotonic()
                    if not self._open or left <= 0:
                        return None
                    self._cond.wait(left)
            finally:
                self._readers -= 1
                if not self._open:
                    self._cond.notify_all()  # a close() waiting for the last read


class Downloads:
    """This process's shard downloads in progress, by shard digest (NOTE [reads from a
    download in progress]).

    Attributes:
        early, around: reads answered from a download as its bytes landed, and reads told to
            go to the origin (their part not requested yet).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._landings: dict[str, Landing] = {}
        self.early = self.around = 0

    def __contains__(self, digest: str) -> bool:
        with self._mutex:
            return digest in self._landings

    @contextlib.contextmanager
    def begun(self, digest: str, fd: int, size: int) -> Iterator[Landing]:
        """The landing of a download of ``size`` bytes into ``fd``, readable by other threads
        until the block ends (closed then, before ``fd`` may be)."""
        landing = Landing(fd, size)
        with self._mutex:
            self._landings[digest] = landing
        try:
            yield landing
        finally:
            with self._mutex:
                if self._landings.get(digest) is landing:
                    del self._landings[digest]
            landing.close()

    def read(self, digest: str, url: str, offset: int, length: int) -> bytes | None:
        """Bytes ``[offset, offset + length)`` of the shard from its download in progress, once
        they landed; None when there is none (or it ended meanwhile: read the file). Raises
        :class:`ShardFillingError` when their part has not been requested yet (or they did
        not land within :meth:`Landing.read`'s wait)."""
        with self._mutex:
            landing = self._landings.get(digest)
        if landing is None:
            return None
        data = landing.read(offset, length)
        with self._mutex:
            if data is not None:
                self.early += 1
                return data
            if landing.closed:
                return None
            self.around += 1
        raise ShardFillingError(f"{url} is being downloaded by this process; bytes {offset}-"
                                f"{offset + length} are not requested yet, or did not land "
                                "within the wait")
