"""Tar shards staged before training: `fastload cache warm` against s3fs's recursive get.

The same JPEGs (the synthetic ImageNet-like set made once under .fastload-data) packed into
--shards tar shards by ``fastload pack``, on moto's S3 server (a process of its own) behind
``latency::`` (--latency-ms per request). Each round, in a new directory:

* ``s3fs get``: ``fs.get(url, dir, recursive=True)``, what a user staging shards to local disk
  writes (then trains on local shards);
* ``fastload cache warm``: :func:`fastload.cache.warm.warm` into a new cache directory, the
  shards whole into its shard store (NOTE [warming shard files]), 4 at a time with 8 range
  requests in flight each;

then the first epoch of ``TarShards(urls, cache=<that directory>)`` (threads engine, batch
64, RandomResizedCrop 224 + flip) after the warm, against one over a new, cold cache
directory, and the epoch's GET count on the shards (0 after a warm). Wall seconds and MB/s,
medians of --repeats rounds; ratios > 1 favour fastload's warm. Run with nothing else
running: these are timings.

    python benchmarks/shard_warm.py                       # 2,000 images, 10 shards, 3 rounds
    python benchmarks/shard_warm.py --images 5000 --shards 20
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fsspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cache_epoch import served_folder  # noqa: E402  (benchmarks/)

from fastload import DataLoader, TarShards  # noqa: E402
from fastload.cache.warm import warm  # noqa: E402
from fastload.data.pack import pack  # noqa: E402
from fastload.io.origin import with_timeouts  # noqa: E402
from fastload.testing.synthetic import make_jpeg_folder  # noqa: E402
from tests.fixtures.s3 import upload_folder  # noqa: E402


def epoch_seconds(urls: list[str], options: dict, cache: Path) -> tuple[float, int]:
    """A first epoch of TarShards over ``urls`` with ``cache``: seconds and shard downloads."""
    ds = TarShards(urls, storage_options=options, cache=str(cache), size=224, train=True, seed=0)
    start = time.perf_counter()
    for _ in DataLoader(ds, batch_size=64, shuffle=True, backend="threads"):
        pass
    elapsed = time.perf_counter() - start
    assert ds.shard_store is not None
    return elapsed, ds.shard_store.downloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    local = make_jpeg_folder(ROOT / ".fastload-data" / f"shard-warm-{args.images}",
                             images=args.images, classes=10, size=(500, 375))
    work = Path(tempfile.mkdtemp(prefix="fastload-shard-warm-"))
    total = sum(p.stat().st_size for p in local.rglob("*.jpg"))
    packed = pack(str(local), str(work / "shards"), shard_size=total / args.shards + 20_000)
    names = sorted(Path(u.replace("file://", "")).name for u in packed.urls)
    rows: dict[str, list[float]] = {"s3fs get": [], "fastload cache warm": [],
                                    "epoch, cold cache": [], "epoch after the warm": []}
    downloads_after_warm = []
    with served_folder(local / "class_00", "s3://shard-warm/x", args.latency_ms) as (_, options):
        root = upload_folder(options["s3"], work / "shards", "s3://shard-warm/shards")
        url = f"latency::{root}"
        urls = [f"{url}/{n}" for n in names]
        fs, path = fsspec.core.url_to_fs(url, **with_timeouts(url, options))
        nbytes = sum(info["size"] for info in fs.ls(path, detail=True)
                     if info["name"].endswith(".tar"))
        for r in range(args.repeats):
            staged = work / f"get-{r}"
            start = time.perf_counter()
            fs.get(path, str(staged), recursive=True)
            rows["s3fs get"].append(time.perf_counter() - start)
            shutil.rmtree(staged)
            cache = work / f"warm-{r}"
            start = time.perf_counter()
            report = warm(url, str(cache), storage_options=options)
            rows["fastload cache warm"].append(time.perf_counter() - start)
            if report.failed or report.fetched != report.files:  # pack's .idx/.labels too
                raise RuntimeError(f"the warm did not fetch every file: {report}")
            seconds, downloads = epoch_seconds(urls, options, cache)
            rows["epoch after the warm"].append(seconds)
            downloads_after_warm.append(downloads)
            rows["epoch, cold cache"].append(epoch_seconds(urls, options, work / f"cold-{r}")[0])
            shutil.rmtree(cache)
            shutil.rmtree(work / f"cold-{r}")
    mb = nbytes / 1e6
    print(f"{args.images} JPEGs of 500x375 in {len(names)} tar shards ({mb:.0f} MB) on moto + "
          f"{args.latency_ms:g} ms/request; medians of {args.repeats} rounds")
    for name in ("s3fs get", "fastload cache warm"):
        s = statistics.median(rows[name])
        print(f"  {name:<22}{s:8.2f} s {mb / s:8.0f} MB/s   rounds: "
              + " ".join(f"{x:.2f}" for x in rows[name]))
    for name in ("epoch, cold cache", "epoch after the warm"):
        s = statistics.median(rows[name])
        print(f"  {name:<22}{s:8.2f} s {args.images / s:8.0f} images/s   rounds: "
              + " ".join(f"{x:.2f}" for x in rows[name]))
    warm_s, get_s = (statistics.median(rows[k]) for k in ("fastload cache warm", "s3fs get"))
    cold_e, warm_e = (statistics.median(rows[k]) for k in ("epoch, cold cache", "epoch after the warm"))
    print(f"  fastload cache warm vs s3fs get: {get_s / warm_s:.2f}x; first epoch after the "
          f"warm vs cold: {cold_e / warm_e:.2f}x; shard downloads in the epochs after the "
          f"warm: {downloads_after_warm}")


if __name__ == "__main__":
    main()
