"""Shards downloaded from S3 into a local file: the shard store's download against s3fs's own.

--shards objects of --mb MB of random bytes on moto's S3 server (a process of its own), behind
``latency::`` (--latency-ms per request). Each row downloads every object into a new file in
one directory, one object after the other, and reports the wall seconds and this process's CPU
seconds (user + system: the client's HTTP, copies and the kernel's writes; moto's CPU is its
own process's), medians of --repeats rounds, the rows interleaved in each round:

* ``s3fs get_file``: ``fs.get_file(url, path)``, what a user downloading a shard writes
* ``joined 8 MiB parts``: fastload's download as it was before NOTE [streamed ranges]: 8 MiB
  ranges, 8 in flight, each read whole with ``_cat_file`` and ``pwrite`` into a sparse file
* ``shard store download``: ``ShardFiles.new_temp`` (its blocks allocated at once) and
  ``download_ranges``, what a cold epoch runs (8 MiB ranges streamed into the file in 1 MiB
  pieces)

The ratios are the shard store's against each other row (> 1: it took less). Run with nothing
else running.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import fsspec
import fsspec.asyn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cache_epoch import served_folder  # noqa: E402  (benchmarks/)

from fastload.cache.cachedir import CacheDir  # noqa: E402
from fastload.cache.shardfetch import PART_BYTES, PARTS_IN_FLIGHT, download_ranges  # noqa: E402
from fastload.cache.shardfiles import ShardFiles  # noqa: E402
from fastload.io.origin import with_timeouts  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _joined(fs, path: str, size: int, fd: int) -> None:
    gate = asyncio.Semaphore(PARTS_IN_FLIGHT)

    async def one(start: int) -> None:
        async with gate:
            data = await fs._cat_file(path, start=start, end=min(start + PART_BYTES, size))
        os.pwrite(fd, data, start)

    await asyncio.gather(*(one(s) for s in range(0, size, PART_BYTES)))


def joined_parts(fs, path: str, size: int, out: Path) -> None:
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        os.ftruncate(fd, size)
        fsspec.asyn.sync(fs.loop, _joined, fs, path, size, fd)
    finally:
        os.close(fd)


def store_download(files: ShardFiles) -> Callable:
    def run(fs, path: str, size: int, out: Path) -> None:
        name, fd = files.new_temp(size)
        try:
            download_ranges(fs, path, size, fd)
        finally:
            os.close(fd)
        os.replace(files.path / name, out)
    return run


def s3fs_get(fs, path: str, size: int, out: Path) -> None:
    fs.get_file(path, str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=21)
    parser.add_argument("--mb", type=float, default=16.0, help="bytes of each object, in MB")
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="fastload-download-bench-"))
    size = int(args.mb * 1e6)
    for i in range(args.shards):
        (work / "objects").mkdir(exist_ok=True)
        (work / "objects" / f"shard-{i:04d}.bin").write_bytes(os.urandom(size))
    files = ShardFiles(CacheDir(work / "cache", create=True))
    rows = {"s3fs get_file": s3fs_get, "joined 8 MiB parts": joined_parts,
            "shard store download": store_download(files)}
    wall: dict[str, list[float]] = {k: [] for k in rows}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    served = served_folder(work / "objects", "s3://download-bench/objects", args.latency_ms)
    with served as (url, options):
        fs, root = fsspec.core.url_to_fs(url, **with_timeouts(url, options))
        paths = sorted(fs.find(root))
        for _ in range(args.repeats):
            for name, download in rows.items():
                out = work / "out"
                out.mkdir()
                start_cpu, start = cpu_seconds(), time.perf_counter()
                for i, path in enumerate(paths):
                    download(fs, path, size, out / f"{i}")
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(cpu_seconds() - start_cpu)
                for done in out.iterdir():
                    if done.stat().st_size != size:
                        raise RuntimeError(f"{name}: {done} holds {done.stat().st_size} "
                                           f"bytes, not {size}")
                    done.unlink()
                out.rmdir()
    total_mb = args.shards * size / 1e6
    print(f"{args.shards} objects of {args.mb:g} MB ({total_mb:.0f} MB) from moto + "
          f"{args.latency_ms:g} ms/request, medians of {args.repeats} rounds")
    print(f"{'row':<24}{'wall s':>8}{'MB/s':>8}{'CPU s':>8}{'CPU ms/MB':>11}")
    for name in rows:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:<24}{w:>8.2f}{total_mb / w:>8.0f}{c:>8.2f}{1000 * c / total_mb:>11.2f}   "
              f"CPU s by round: {' '.join(f'{x:.2f}' for x in cpu[name])}")
    ours = "shard store download"
    for name in rows:
        if name != ours:
            w = statistics.median(wall[name]) / statistics.median(wall[ours])
            c = statistics.median(cpu[name]) / statistics.median(cpu[ours])
            print(f"{ours} vs {name}: wall {w:.2f}x, CPU {c:.2f}x")


if __name__ == "__main__":
    main()
