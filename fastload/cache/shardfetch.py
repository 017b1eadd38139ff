"""One shard downloaded into a file with concurrent range requests (NOTE [the shard store]).

A shard of ``size`` bytes is cut into parts of :data:`PART_BYTES`; :data:`PARTS_IN_FLIGHT`
of them are requested at once. On an async filesystem (s3fs, HTTP, ``latency::``) the parts
are coroutines on the filesystem's own event loop, each bounded by a deadline and written at
its offset in pieces as they arrive (NOTE [streamed ranges]); on any other, threads, each
part written whole. Transient failures are retried as every origin read is
(:mod:`fastload.io.origin`); a part that comes back short raises, naming the shard.

Example::

    >>> fd = os.open("/nvme/x.tar", os.O_RDWR | os.O_CREAT)
    >>> download_ranges(fs, "bucket/train-000000.tar", 256 << 20, fd)   # 32 requests of 8 MiB
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec.asyn
from fsspec.exceptions import FSTimeoutError

from fastload.io.fetch import is_async
from fastload.io.origin import READ_DEADLINE_S, attempts_here, backoff, is_unavailable
from fastload.io.streams import range_chunks

logger = logging.getLogger(__name__)

__all__ = ["PARTS_IN_FLIGHT", "PART_BYTES", "download_ranges"]

PART_BYTES = 8 << 20
"""Bytes of one range request."""

PARTS_IN_FLIGHT = 8
"""Range requests of one shard in flight at once."""


def _parts(size: int, part: int) -> list[tuple[int, int]]:
    return [(start, min(start + part, size)) for start in range(0, size, part)] or [(0, 0)]


def _short(path: str, start: int, end: int, got: int) -> OSError:
    return OSError(
        f"bytes {start}-{end} of {path} came back as {got} bytes: the object is shorter than "
        "its indexed size (changed at the origin?); build the dataset again to re-index it"
    )


def download_ranges(
    fs: Any, path: str, size: int, fd: int, *, part: int = PART_BYTES,
    in_flight: int = PARTS_IN_FLIGHT, deadline: float = READ_DEADLINE_S,
) -> int:
    """Write bytes ``[0, size)`` of ``path`` on ``fs`` into ``fd`` at their offsets; the
    number of range requests made. Raises the backend's error (or OSError for a short part)."""
    parts = _parts(size, part)
    if size == 0:
        return 0
    if is_async(fs):
        try:
            return fsspec.asyn.sync(fs.loop, _download_async, fs, path, parts, fd, in_flight,
                                    deadline)
        except FSTimeoutError as exc:  # fsspec's sync drops the message of a TimeoutError
            cause = exc.__cause__
            raise TimeoutError(str(cause) or f"{path}: a part took over {deadline:g} s") from cause
    with ThreadPoolExecutor(max_workers=min(in_flight, len(parts)),
                            thread_name_prefix="fastload-shard-part") as pool:
        for _ in pool.map(lambda p: _part_sync(fs, path, p, fd), parts):
            pass
    return len(parts)


def _part_sync(fs: Any, path: str, part: tuple[int, int], fd: int) -> None:
    start, end = part
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
    os.pwrite(fd, data, start)


async def _download_async(
    fs: Any, path: str, parts: list[tuple[int, int]], fd: int, in_flight: int, deadline: float,
) -> int:
    gate = asyncio.Semaphore(in_flight)
    attempts = attempts_here(fs)

    async def one(start: int, end: int) -> None:
        async with gate:
            for attempt in range(1, attempts + 1):
                try:
                    got = await asyncio.wait_for(_write_part(fs, path, start, end, fd), deadline)
                    break
                except asyncio.TimeoutError as exc:
                    raise TimeoutError(
                        f"bytes {start}-{end} of {path} took over {deadline:g} s (retries "
                        "included); the store is down or stalled") from exc
                except Exception as exc:
                    if attempt == attempts or not is_unavailable(exc):
                        raise
                    await asyncio.sleep(backoff(attempt))
        if got != end - start:
            raise _short(path, start, end, got)

    tasks = [asyncio.ensure_future(one(s, e)) for s, e in parts]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return len(parts)


async def _write_part(fs: Any, path: str, start: int, end: int, fd: int) -> int:
    """Write bytes ``[start, end)`` of ``path`` at their offsets in ``fd`` as they arrive
    (NOTE [streamed ranges]); the bytes the store sent, up to one piece past ``end``."""
    offset = start
    async with contextlib.aclosing(range_chunks(fs, path, start, end)) as pieces:
        async for piece in pieces:
            os.pwrite(fd, piece[: max(end - offset, 0)], offset)
            offset += len(piece)
            if offset > end:
                break  # a store that sent more than asked: reported as a wrong length
    return offset - start
