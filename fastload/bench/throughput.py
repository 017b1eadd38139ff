"""Raw storage speed: read throughput against concurrency, latency per object, random range reads.

It only reads. Each concurrency level runs a pool of threads that take the next file from a
shuffled list (continuing where the previous level stopped, wrapping around) and read it
whole: objects up to ``chunk_bytes`` with one ``cat_file`` (one GET on an object store),
larger ones streamed sequentially in ``chunk_bytes`` reads into a reused buffer. A level
ends when its time or byte budget is spent; the byte budget counts each object's listed
size when the object is started, so a level never starts reading past it.

Example::

    >>> points = read_sweep(Storage("/data/train"), inventory.entries, seconds_per_level=2)
    >>> [(p.concurrency, round(p.read_bytes_per_s / 1e6)) for p in points]
    [(1, 410), (2, 790), (4, 1500), (8, 2100), (16, 2150)]
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NoReturn

from fastload.bench.inventory import FileEntry
from fastload.bench.stats import per_second, percentiles_ms
from fastload.errors import ConfigError, StorageError
from fastload.io.errors import storage_errors
from fastload.io.origin import read_whole
from fastload.io.storage import Storage

logger = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024
"""Objects up to this size are read with one request; larger ones are streamed in reads of it."""

COPY_BYTES = 1024 * 1024
"""The window a streamed read copies through (see read_object)."""

RANGE_READ_BYTES = 4096
"""Size of one small random range read, bytes."""

PLATEAU_GAIN = 1.10
"""A level must beat the best throughput so far by 10% to count as still scaling."""

Progress = Callable[[float], None]
"""Called with the fraction (0..1) of a phase that is done."""


@dataclass(frozen=True)
class ReadPoint:
    """Whole-object reads at one concurrency: how many, how many bytes, how long each took."""

    concurrency: int
    objects: int
    bytes: int
    seconds: float
    latencies_s: tuple[float, ...] = field(repr=False)
    paths: tuple[str, ...] = field(repr=False)

    @property
    def read_bytes_per_s(self) -> float:
        return per_second(self.bytes, self.seconds)

    @property
    def objects_per_s(self) -> float:
        return per_second(self.objects, self.seconds)

    def to_json(self) -> dict[str, Any]:
        lat = percentiles_ms(self.latencies_s)
        return {
            "concurrency": self.concurrency,
            "objects": self.objects,
            "read_bytes": self.bytes,
            "seconds": self.seconds,
            "read_bytes_per_s": self.read_bytes_per_s,
            "objects_per_s": self.objects_per_s,
            "latency_ms_p50": lat["p50"],
            "latency_ms_p95": lat["p95"],
            "latency_ms_p99": lat["p99"],
        }


@dataclass(frozen=True)
class RangeReads:
    """Small random range reads (``fs.cat_file(path, start=, end=)``), or why they were skipped.

    By keyword: s3fs takes ``version_id`` as its second positional argument.
    """

    concurrency: int
    reads: int
    bytes: int
    seconds: float
    latencies_s: tuple[float, ...] = field(repr=False, default=())
    skipped_reason: str | None = None

    @property
    def reads_per_s(self) -> float:
        return per_second(self.reads, self.seconds)

    def to_json(self) -> dict[str, Any]:
        lat = percentiles_ms(self.latencies_s)
        return {
            "concurrency": self.concurrency,
            "range_reads": self.reads,
            "read_bytes": self.bytes,
            "seconds": self.seconds,
            "range_reads_per_s": self.reads_per_s,
            "latency_ms_p50": lat["p50"],
            "latency_ms_p99": lat["p99"],
            "skipped_reason": self.skipped_reason,
        }


def concurrency_levels(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_concurrency``."""
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
    levels = [1]
    while levels[-1] * 2 <= max_concurrency:
        levels.append(levels[-1] * 2)
    if levels[-1] != max_concurrency:
        levels.append(max_concurrency)
    return levels


def best_point(points: Sequence[ReadPoint]) -> ReadPoint:
    """The level with the highest byte rate."""
    return max(points, key=lambda p: p.read_bytes_per_s)


def read_sweep(
    storage: Storage,
    entries: Sequence[FileEntry],
    *,
    levels: Sequence[int] | None = None,
    max_concurrency: int = 32,
    seconds_per_level: float = 2.0,
    bytes_per_level: int | None = None,
    one_pass: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
    stop_at_plateau: bool = True,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[ReadPoint]:
    """Read throughput at each concurrency level (default 1, 2, 4, ... ``max_concurrency``).

    With ``stop_at_plateau`` the sweep stops after two levels in a row that fail to beat the
    best byte rate so far by 10%: more threads would only queue.
    """
    if not entries:
        raise ConfigError("read_sweep needs at least one file entry")
    levels = list(levels) if levels is not None else concurrency_levels(max_concurrency)
    order = list(entries)
    random.Random(seed).shuffle(order)
    cursor = itertools.count()
    points: list[ReadPoint] = []
    flat = 0
    for i, concurrency in enumerate(levels):
        point = _read_level(
            storage, order, cursor, concurrency, seconds_per_level, bytes_per_level, chunk_bytes,
            one_pass,
        )
        logger.info(
            "reads at concurrency %d: %d objects, %.1f MB/s", concurrency, point.objects,
            point.read_bytes_per_s / 1e6,
        )
        if points and point.read_bytes_per_s < PLATEAU_GAIN * best_point(points).read_bytes_per_s:
            flat += 1
        else:
            flat = 0
        points.append(point)
        if progress is not None:
            progress((i + 1) / len(levels))
        if stop_at_plateau and flat >= 2:
            break
    if progress is not None:
        progress(1.0)
    return points


def _read_level(
    storage: Storage,
    order: Sequence[FileEntry],
    cursor: itertools.count,
    concurrency: int,
    seconds: float,
    max_bytes: int | None,
    chunk_bytes: int,
    one_pass: bool = False,
) -> ReadPoint:
    fs = storage.fs
    lock = threading.Lock()
    budget = {"reserved": 0}
    records: list[tuple[str, int, float]] = []
    deadline = time.perf_counter() + seconds

    def take() -> FileEntry | None:
        if time.perf_counter() >= deadline:
            return None
        with lock:
            if max_bytes is not None and budget["reserved"] >= max_bytes:
                return None
            position = next(cursor)
            if one_pass and position >= len(order):
                return None  # NOTE [cold means cold]: no object is read twice
            entry = order[position % len(order)]
            budget["reserved"] += entry.size
        return entry

    def worker() -> list[tuple[str, int, float]]:
        buf = bytearray(chunk_bytes)
        done = []
        while (entry := take()) is not None:
            t0 = time.perf_counter()
            n = read_object(fs, entry, buf, storage)
            done.append((entry.path, n, time.perf_counter() - t0))
        return done

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="fastload-bench-read") as pool:
        for result in [pool.submit(worker) for _ in range(concurrency)]:
            records.extend(result.result())
    elapsed = time.perf_counter() - start
    return ReadPoint(
        concurrency=concurrency,
        objects=len(records),
        bytes=sum(r[1] for r in records),
        seconds=elapsed,
        latencies_s=tuple(r[2] for r in records),
        paths=tuple(r[0] for r in records),
    )


def read_object(fs: Any, entry: FileEntry, buf: bytearray, storage: Storage) -> int:
    """Read one whole object; returns the number of bytes read. Errors name the object's URL."""
    if storage.read_through is not None:  # a cached storage reads whole objects through its tiers
        return len(storage.read(entry.path))
    try:
        if entry.size <= len(buf):
            return len(read_whole(fs, entry.path))
        total = 0
        # The file object requests chunk_bytes at a time from the storage; the copy out of it
        # goes through a smaller window that stays in the CPU cache. On local disks 4 MiB
        # copies ran at half the speed of 256 KiB ones, and 256 KiB windows, paying Python's
        # per-call cost four times as often, fell behind fio at 2+ threads from the page
        # cache; 1 MiB was best of 256 KiB..4 MiB (benchmarks/bench_vs_fio.py --warm).
        view = memoryview(buf)[:COPY_BYTES]
        with fs.open(entry.path, "rb", block_size=len(buf)) as f:
            while n := f.readinto(view):
                total += n
        return total
    except FileNotFoundError as exc:  # listed a moment ago: the dataset changed under the bench
        raise StorageError(
            f"{storage.to_url(entry.path)} disappeared during the benchmark; run it again"
        ) from exc
    except Exception as exc:  # every backend's failure, not only OSError
        _raise_storage_error(exc, "read", storage.to_url(entry.path))


def _raise_storage_error(exc: Exception, action: str, url: str) -> NoReturn:
    """Raise ``exc`` converted as NOTE [storage errors] in fastload.io.errors says, naming ``url``.

    For ``except`` blocks around timed reads: the URL is built only when a read failed.
    """
    with storage_errors(action, url):
        raise exc


def range_reads(
    storage: Storage,
    entries: Sequence[FileEntry],
    *,
    concurrency: int,
    seconds: float = 1.0,
    read_bytes: int = RANGE_READ_BYTES,
    seed: int = 0,
) -> RangeReads:
    """Small random range reads per second, at ``concurrency`` threads, for ``seconds``.

    Only files of at least ``read_bytes`` bytes take part. A filesystem that cannot read
    a byte range (an HTTP server without Range support) is reported as skipped, with why.
    """
    fs = storage.fs
    candidates = [e for e in entries if e.size >= read_bytes]
    if not candidates:
        return RangeReads(concurrency, 0, 0, 0.0, skipped_reason=(
            f"no file is at least {read_bytes} bytes, too small for range reads"
        ))
    first = candidates[0]
    # A failing storage is an error (converted to StorageError naming the file), not a
    # missing feature; only a filesystem that refuses the call itself has no ranges.
    with storage_errors("read a byte range of", storage.to_url(first.path)):
        try:
            probe = fs.cat_file(first.path, start=0, end=read_bytes)
        except (NotImplementedError, ValueError, TypeError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            return RangeReads(concurrency, 0, 0, 0.0, skipped_reason=(
                f"{storage.protocol}:// does not serve range reads here: {reason}"
            ))
    if len(probe) != read_bytes:
        return RangeReads(concurrency, 0, 0, 0.0, skipped_reason=(
            f"a range read of {read_bytes} bytes returned {len(probe)} bytes"
        ))
    deadline = time.perf_counter() + seconds

    def worker(worker_seed: int) -> list[tuple[int, float]]:
        rng = random.Random(worker_seed)
        done = []
        while time.perf_counter() < deadline:
            entry = candidates[rng.randrange(len(candidates))]
            offset = rng.randrange(entry.size - read_bytes + 1)
            t0 = time.perf_counter()
            try:
                n = len(fs.cat_file(entry.path, start=offset, end=offset + read_bytes))
            except Exception as exc:
                _raise_storage_error(exc, "read a byte range of", storage.to_url(entry.path))
            done.append((n, time.perf_counter() - t0))
        return done

    start = time.perf_counter()
    records: list[tuple[int, float]] = []
    with ThreadPoolExecutor(concurrency, thread_name_prefix="fastload-bench-range") as pool:
        for result in [pool.submit(worker, seed * 1000 + i) for i in range(concurrency)]:
            records.extend(result.result())
    elapsed = time.perf_counter() - start
    return RangeReads(
        concurrency=concurrency,
        reads=len(records),
        bytes=sum(r[0] for r in records),
        seconds=elapsed,
        latencies_s=tuple(r[1] for r in records),
    )
