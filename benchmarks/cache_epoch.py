"""One epoch over emulated-remote S3: no cache (stock torch DataLoader) vs cold vs warm cache.

The synthetic ImageNet-like JPEG set (500x375, quality 90; made once under .fastload-data)
is uploaded to moto's S3 server on 127.0.0.1, read through ``latency::`` (fastload.testing.latency)
which adds --latency-ms to every request, as from a remote object store. Per repeat:

* stock:  ``torch.utils.data.DataLoader`` over ``ImageFolder(url)`` without a cache
* cold:   ``fastload.DataLoader`` over ``ImageFolder(url, cache=<new dir>)``, first epoch
          (the clairvoyant prefetcher on, as by default)
* warm:   the same loader's second epoch, every object on the disk tier

Prints the median epoch time of each and the ratios. Target: warm >= 10x faster than stock.

    python benchmarks/cache_epoch.py                               # 256 images, 15 ms, 3 repeats
    python benchmarks/cache_epoch.py --images 512 --latency-ms 20 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch.utils.data

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastload import DataLoader, ImageFolder
from fastload.testing.synthetic import make_jpeg_folder
from tests.fixtures.s3 import DUMMY_ENV, S3Server, upload_folder


def _serve_s3(conn) -> None:
    server = S3Server().start()
    conn.send((server.port, server.storage_options()))
    conn.recv()  # until the benchmark is done
    server.stop()


@contextlib.contextmanager
def remote_dataset(images: int, latency_ms: float, origin: str = "s3") -> Iterator[tuple[str, dict]]:
    """(URL, storage options) of the synthetic JPEG set on moto S3 behind ``latency::``.

    moto runs in a process of its own, so its CPU time (the emulated store's) is not spent
    under the loader process's GIL, as with a real remote store. ``origin="file"`` puts the
    latency in front of the local files instead: latency without moto's CPU cost per request
    (on a small, busy machine moto's request rate, not the latency, can be the bound).
    """
    os.environ.update(DUMMY_ENV)
    local = make_jpeg_folder(ROOT / ".fastload-data" / f"cache-bench-{images}", images=images, classes=10)
    if origin == "file":
        yield f"latency::file://{local}", {"latency": {"latency": latency_ms / 1000}}
        return
    with served_folder(local, f"s3://cache-bench-{images}/train", latency_ms) as served:
        yield served


@contextlib.contextmanager
def served_folder(local: Path, bucket_url: str, latency_ms: float) -> Iterator[tuple[str, dict]]:
    """``local`` uploaded to ``bucket_url`` on moto S3 (in a process of its own) behind
    ``latency::``: the URL and its storage options."""
    os.environ.update(DUMMY_ENV)
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_serve_s3, args=(there,), daemon=True)
    proc.start()
    _, options = here.recv()
    try:
        url = upload_folder(options, local, bucket_url)
        yield f"latency::{url}", {"latency": {"latency": latency_ms / 1000}, "s3": options}
    finally:
        here.send("stop")
        proc.join(10)


def epoch_seconds(loader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=64, help="output pixels (square)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--origin", choices=["s3", "file"], default="s3",
                        help="s3: moto on loopback; file: local files (latency only)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    times: dict[str, list[float]] = {"stock": [], "cold": [], "warm": []}
    with remote_dataset(args.images, args.latency_ms, args.origin) as (url, options):
        plain = ImageFolder(url, size=args.size, seed=0, storage_options=options)
        for _ in range(args.repeats):
            stock = torch.utils.data.DataLoader(
                plain, batch_size=args.batch_size, shuffle=True, num_workers=args.workers
            )
            times["stock"].append(epoch_seconds(stock))
            with tempfile.TemporaryDirectory(prefix="fastload-cache-") as cache_dir:
                ds = ImageFolder(url, size=args.size, seed=0, storage_options=options, cache=cache_dir)
                loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
                times["cold"].append(epoch_seconds(loader))
                times["warm"].append(epoch_seconds(loader))

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"one epoch, {args.images} JPEGs on {args.origin} + {args.latency_ms:g} ms per request, "
          f"{args.workers} workers, batch {args.batch_size}, median of {args.repeats}:")
    for name, label in [("stock", "no cache (torch DataLoader)"), ("cold", "cache, cold (1st epoch)"),
                        ("warm", "cache, warm (disk tier)")]:
        print(f"  {label:30s} {med[name]:7.3f} s   {args.images / med[name]:8.1f} images/s")
    print(f"  warm vs no cache: {med['stock'] / med['warm']:.1f}x faster (target >= 10x)")
    print(f"  cold vs no cache: {med['stock'] / med['cold']:.1f}x faster")


if __name__ == "__main__":
    main()
