"""Whole-shard downloads in one epoch through a shard budget smaller than the dataset.

--shards tar shards of --per-shard small JPEGs on moto's S3 server (in this process, counting
requests), read by a remote ``TarShards`` with a disk cache whose ``shard_budget`` holds
--rooms of its shards. Each row is one epoch of a new dataset over a new cache directory, in
fastload's order (``shuffle=True``: NOTE [shard-aware order], whole shards downloaded ahead
and held until read, NOTE [downloads ahead are held until read]) or in the order of a sampler
a user would pass instead (a seeded ``RandomSampler``, a ``DistributedSampler``; NOTE [a
sampler of one's own over shards]), on the threads engine and on --workers torch workers.
It prints the shards downloaded whole (GETs from byte 0, counted by the server) per shard
of the dataset: 1.00 is each shard once. A count, not a timing: the machine's load changes
how the workers race, not what is counted on threads. For fastload's order it also prints the
most bytes the shard files took on disk during the epoch (looked at every 10 ms), in shards of
the largest size, against the budget's room: a budget is the disk's, and readers that find it
full of shards in use download beyond it (NOTE [torch workers at a window's end]).

    python benchmarks/shard_budget.py
    python benchmarks/shard_budget.py --shards 40 --rooms 5 9 20
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DistributedSampler, RandomSampler

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastload import DataLoader, TarShards  # noqa: E402
from tests.contracts.shard_cache import whole_downloads  # noqa: E402
from tests.fixtures.s3 import DUMMY_ENV, S3Server, upload_folder  # noqa: E402


def write_shards(out: Path, shards: int, per_shard: int) -> None:
    rng = np.random.default_rng(0)
    out.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(out / f"train-{s:06d}.tar", "w") as tar:
            for i in range(per_shard):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
                for ext, data in (("jpg", buf.getvalue()), ("cls", str(i % 4).encode())):
                    member = tarfile.TarInfo(f"s{s:03d}_{i:04d}.{ext}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))


class PeakUse:
    """The most bytes a shard store's files take while it runs, looked at every 10 ms."""

    def __init__(self, store) -> None:
        self.store, self.peak = store, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PeakUse:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._look()

    def _look(self) -> None:
        self.peak = max(self.peak, self.store.files.used())

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self._look()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--per-shard", type=int, default=40)
    parser.add_argument("--rooms", type=int, nargs="+", default=[5, 6, 7, 8, 9, 10],
                        help="shard budgets, in shards of the largest size (shuffle_window 4: 5 at least)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("fastload").setLevel(logging.ERROR)  # the sampler warning is the subject
    os.environ.update(DUMMY_ENV)
    work = Path(tempfile.mkdtemp(prefix="fastload-shard-budget-"))
    write_shards(work / "shards", args.shards, args.per_shard)
    server = S3Server().start()
    try:
        options = server.storage_options()
        root = upload_folder(options, work / "shards", "s3://shard-budget/train")
        urls = [f"{root}/{p.name}" for p in sorted((work / "shards").glob("*.tar"))]
        largest = max(p.stat().st_size for p in (work / "shards").glob("*.tar"))
        orders = {
            "shuffle=True": lambda ds: {"shuffle": True},
            "RandomSampler": lambda ds: {"sampler": RandomSampler(
                ds, generator=torch.Generator().manual_seed(0))},
            "DistributedSampler": lambda ds: {"sampler": DistributedSampler(
                ds, num_replicas=1, rank=0, seed=0)},
        }
        print(f"{len(urls)} shards of {args.per_shard} JPEGs ({largest} bytes at most), batch "
              f"{args.batch_size}, shuffle_window 4: whole-shard downloads in one epoch per "
              "shard (1.00: each once)")
        print(f"{'engine':<10}{'order':<20}" + "".join(f"{f'room {r}':>9}" for r in args.rooms))
        peaks: dict[str, list[float]] = {}
        for engine, workers in (("threads", 0), ("torch", args.workers)):
            for name, order in orders.items():
                row = []
                for room in args.rooms:
                    cache = {"disk": str(work / f"cache-{engine}-{name}-{room}"),
                             "shard_budget": room * largest}
                    ds = TarShards(urls, size=32, seed=0, cache=cache, storage_options=options)
                    server.reset_counts()
                    loader = DataLoader(ds, batch_size=args.batch_size, backend=engine,
                                        num_workers=workers, **order(ds))
                    with PeakUse(ds.shard_store) as use:
                        seen = sum(len(y) for _, y in loader)
                    if name == "shuffle=True":
                        peaks.setdefault(engine, []).append(use.peak / largest)
                    if seen != len(ds):
                        raise RuntimeError(f"{engine} {name} room {room}: {seen} of {len(ds)} samples")
                    whole = sum(whole_downloads(server, urls))
                    row.append(whole / len(urls))
                print(f"{engine:<10}{name:<20}" + "".join(f"{x:>9.2f}" for x in row))
        print("shard files on disk at most during the epoch, in shards (shuffle=True; the "
              "budget's room above each column):")
        for engine, row in peaks.items():
            print(f"{engine:<10}{'shuffle=True':<20}" + "".join(f"{x:>9.1f}" for x in row))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
