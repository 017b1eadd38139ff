"""First-epoch host wait on emulated-remote S3, with and without the clairvoyant prefetcher.

The same moto-on-loopback dataset as benchmarks/cache_epoch.py (``latency::`` adds
--latency-ms per request). Each repeat runs one first epoch (a new, empty cache directory)
three ways and sums the time the training loop waited in ``next(loader)`` (host wait):

* stock:        ``torch.utils.data.DataLoader``, no cache
* no prefetch:  ``fastload.DataLoader`` + ``cache={"disk": dir, "prefetch": False}``
* prefetch:     ``fastload.DataLoader`` + ``cache={"disk": dir}`` (prefetch on, the default)

A fixed --step-ms of "training" per batch gives the prefetcher time to run ahead, as a
model would. Prints medians and the ratio of host wait without / with the prefetcher.

    python benchmarks/cache_prefetch.py                           # 256 images, 15 ms, 3 repeats
    python benchmarks/cache_prefetch.py --latency-ms 20 --step-ms 30 --jobs 32
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time

import torch.utils.data
from cache_epoch import remote_dataset

from fastload import DataLoader, ImageFolder


def host_wait(loader, step_s: float) -> tuple[float, float]:
    """(seconds waiting for batches, seconds for the epoch)."""
    waited = 0.0
    start = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - t
        time.sleep(step_s)  # the training step
    return waited, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--step-ms", type=float, default=20.0, help="emulated training step per batch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=16, help="prefetch requests in flight")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--origin", choices=["s3", "file"], default="s3",
                        help="s3: moto on loopback; file: local files (latency only)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    runs: dict[str, list[tuple[float, float]]] = {"stock": [], "no prefetch": [], "prefetch": []}
    step = args.step_ms / 1000
    with remote_dataset(args.images, args.latency_ms, args.origin) as (url, options):
        plain = ImageFolder(url, size=args.size, seed=0, storage_options=options)
        for _ in range(args.repeats):
            stock = torch.utils.data.DataLoader(plain, batch_size=args.batch_size, shuffle=True,
                                                num_workers=args.workers)
            runs["stock"].append(host_wait(stock, step))
            for name, prefetch in (("no prefetch", False), ("prefetch", True)):
                with tempfile.TemporaryDirectory(prefix="fastload-cache-") as cache_dir:
                    ds = ImageFolder(url, size=args.size, seed=0, storage_options=options,
                                     cache={"disk": cache_dir, "prefetch": prefetch,
                                            "prefetch_jobs": args.jobs})
                    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                        num_workers=args.workers)
                    runs[name].append(host_wait(loader, step))

    print(f"first epoch, {args.images} JPEGs on {args.origin} + {args.latency_ms:g} ms per request, "
          f"{args.workers} workers, batch {args.batch_size}, {args.step_ms:g} ms step, "
          f"median of {args.repeats}:")
    med = {}
    for name, values in runs.items():
        wait = statistics.median(v[0] for v in values)
        total = statistics.median(v[1] for v in values)
        med[name] = wait
        print(f"  {name:12s} host wait {wait:7.3f} s   epoch {total:7.3f} s")
    print(f"  host wait without / with prefetcher: {med['no prefetch'] / max(med['prefetch'], 1e-9):.1f}x")
    print(f"  host wait stock / with prefetcher:   {med['stock'] / max(med['prefetch'], 1e-9):.1f}x")


if __name__ == "__main__":
    main()
