"""One shard downloaded into a file with concurrent range requests (NOTE [the shard store]).

A shard of ``size`` bytes is cut into parts of :data:`PART_BYTES`; :data:`PARTS_IN_FLIGHT`
of them are requested at once. On an async filesystem (s3fs, HTTP, ``latency::``) the parts
are coroutines on the filesystem's own event loop, each written at its offset in pieces as
they arrive (NOTE [streamed ranges]) and bounded by a wait for its next bytes (NOTE [a stall,
not a slow part]); on any other, threads, each part written whole. Transient failures are
retried as every origin read is (:mod:`fastload.io.origin`), and a part whose stream broke
off midway is asked for its rest (NOTE [a range that broke off] in :mod:`fastload.io.streams`);
a part that comes back short raises, naming the shard. What has landed is told to a
:class:`~fastload.cache.shardlanding.Landing` as it lands, for the readers of the file (NOTE
[reads from a download in progress]).

NOTE [a stall, not a slow part]
A part used to have a deadline of its own (30 s, retries included). On a slow or shared link
a part that is still arriving takes longer: six shards downloading at once, 8 parts each,
share 100 Mbit/s at ~260 KB/s a connection, 32 s for 8 MiB, and every download failed at the
start of an epoch. What the deadline is for is a store or a connection that stopped
answering, so it now bounds the wait for a part's next bytes (its first included): a part
that waits longer than ``deadline`` for them is asked for its rest on a new connection, like
one whose connection broke (NOTE [a range that broke off] in :mod:`fastload.io.streams`), and
the download fails with a ``TimeoutError`` naming the bytes once that happened
:data:`RESUMES` + 1 times. A slow part that keeps sending is never cut.

Example::

    >>> fd = os.open("/nvme/x.tar", os.O_RDWR | os.O_CREAT)
    >>> landing = Landing(fd, 256 << 20)
    >>> download_ranges(fs, "bucket/train-000000.tar", 256 << 20, fd, landing=landing)  # 32 x 8 MiB
    >>> landing.read(1536, 110_000)      # meanwhile, in another thread: bytes once they landed
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec.asyn
from fsspec.exceptions import FSTimeoutError

from fastload.cache.shardlanding import PART_BYTES, PARTS_IN_FLIGHT, Landing
from fastload.io.fetch import is_async
from fastload.io.origin import (
    READ_DEADLINE_S,
    DeadlinePassed,
    attempts_here,
    backoff,
    is_unavailable,
    within,
)
from fastload.io.streams import StreamCutError, range_chunks

logger = logging.getLogger(__name__)

__all__ = ["PARTS_IN_FLIGHT", "PART_BYTES", "RESUMES", "download_ranges"]

RESUMES = 3
"""Times a part whose stream broke off is asked for its rest before the download fails."""


def _short(path: str, start: int, end: int, got: int) -> OSError:
    return OSError(
        f"bytes {start}-{end} of {path} came back as {got} bytes: the object is shorter than "
        "its indexed size (changed at the origin?); build the dataset again to re-index it"
    )


def download_ranges(
    fs: Any, path: str, size: int, fd: int, *, part: int = PART_BYTES,
    in_flight: int = PARTS_IN_FLIGHT, deadline: float = READ_DEADLINE_S,
    landing: Landing | None = None, version: str | None = None,
) -> int:
    """Write bytes ``[0, size)`` of ``path`` on ``fs`` into ``fd`` at their offsets; the
    number of range requests made. Raises the backend's error (or OSError for a short part,
    ``TimeoutError`` for a part whose bytes stopped coming for ``deadline`` seconds each time
    it was asked for: NOTE [a stall, not a slow part]).
    ``landing`` (its parts stand for ``part``) is told what has landed as it lands; each
    range asks for ``version`` where the store can check it (NOTE [the version asked with
    each range]: S3, :class:`~fastload.io.versions.ObjectChangedError` if rewritten)."""
    if size == 0:
        return 0
    landing = landing or Landing(fd, size, part, in_flight)
    parts = landing.parts
    if is_async(fs):
        try:
            return fsspec.asyn.sync(fs.loop, _download_async, fs, path, landing, in_flight,
                                    deadline, version)
        except FSTimeoutError as exc:  # fsspec's sync drops the message of a TimeoutError
            cause = exc.__cause__
            raise TimeoutError(str(cause) or f"{path}: a part stalled over {deadline:g} s") from cause
    with ThreadPoolExecutor(max_workers=min(in_flight, len(parts)),
                            thread_name_prefix="fastload-shard-part") as pool:
        for _ in pool.map(lambda k: _part_sync(fs, path, landing, k), range(len(parts))):
            pass
    return len(parts)


def _part_sync(fs: Any, path: str, landing: Landing, k: int) -> None:
    start, end = landing.parts[k]
    landing.begin(k)
    attempts = attempts_here(fs)
    for attempt in range(1, attempts + 1):
        try:
            data = fs.cat_file(path, start=start, end=end)
            break
        except Exception as exc:
            if attempt == attempts or not is_unavailable(exc):
                raise
            time.sleep(backoff(attempt))
    if len(data) != end - start:
        raise _short(path, start, end, len(data))
    os.pwrite(landing.fd, data, start)
    landing.landed(k, end)


async def _download_async(fs: Any, path: str, landing: Landing, in_flight: int,
                          deadline: float, version: str | None) -> int:
    gate = asyncio.Semaphore(in_flight)
    attempts = attempts_here(fs)

    async def one(k: int, start: int, end: int) -> None:
        async with gate:
            landing.begin(k)
            for attempt in range(1, attempts + 1):
                try:
                    got, requests = await _write_part(fs, path, landing, k, version, deadline)
                    break
                except Exception as exc:
                    if attempt == attempts or not is_unavailable(exc):
                        raise
                    await asyncio.sleep(backoff(attempt))
        if got != end - start:
            raise _short(path, start, end, got)
        return requests

    parts = landing.parts
    tasks = [asyncio.ensure_future(one(k, s, e)) for k, (s, e) in enumerate(parts)]
    try:
        return sum(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _write_part(fs: Any, path: str, landing: Landing, k: int, version: str | None,
                      stall: float) -> tuple[int, int]:
    """Write part ``k`` of ``path`` at its offsets in the landing's file as it arrives (NOTE
    [streamed ranges]), telling the landing, and ask for the rest of it where its stream
    broke off or waited over ``stall`` seconds for its next bytes (NOTE [a range that broke
    off], NOTE [a stall, not a slow part]); the bytes the store sent, up to one piece past the
    part's end, and the requests made."""
    start, end = landing.parts[k]
    offset, resumes = start, 0
    while True:
        try:
            async with contextlib.aclosing(range_chunks(fs, path, offset, end, version)) as pieces:
                while (piece := await _next_piece(pieces, stall, path, offset, end)) is not None:
                    os.pwrite(landing.fd, piece[: max(end - offset, 0)], offset)
                    offset += len(piece)
                    if offset > end:
                        break  # a store that sent more than asked: reported as a wrong length
                    landing.landed(k, offset)
            return offset - start, resumes + 1
        except StreamCutError as exc:
            if resumes == RESUMES:
                if isinstance(exc, _Stalled):
                    raise TimeoutError(f"{exc}, {RESUMES + 1} times: the store is down or "
                                       "stalled") from exc
                raise StreamCutError(f"{exc}; it broke off {RESUMES + 1} times, the last "
                                     "one given up: the store or the network is failing") from exc
            resumes += 1
            logger.info("%s; asking for bytes %d-%d again", exc, offset, end)
            await asyncio.sleep(backoff(resumes))


class _Stalled(StreamCutError):
    """No byte of a range came for the stall's seconds (NOTE [a stall, not a slow part])."""


async def _next_piece(pieces: AsyncIterator[bytes], stall: float, path: str, offset: int,
                      end: int) -> bytes | None:
    """The next piece of ``pieces`` (None at their end), waiting ``stall`` seconds at most."""
    try:
        return await within(anext(pieces, None), stall)
    except DeadlinePassed as exc:
        raise _Stalled(f"bytes {offset}-{end} of {path}: no byte came for {stall:g} s") from exc
