"""One epoch of the same JPEGs in Parquet files: fastload.ParquetImages vs Hugging Face datasets.

The synthetic ImageNet-like JPEG set (made once under .fastload-data) is written by
``datasets`` itself (``Image()`` + ``ClassLabel`` features, ``to_parquet`` with row groups of
--group rows) into --files files. Batch --batch-size, RandomResizedCrop(--size) + flip, uint8
out, shuffled. Rows (images/s of the last of --epochs epochs):

* ParquetImages, fastload's choice: ``fastload.DataLoader(ParquetImages(files))``
  (the engine fastload measures fastest on the first batches; threads on a small machine)
* ParquetImages, torch workers: the same with ``backend="torch", num_workers=--workers``
* datasets: ``Dataset.from_parquet(files)`` (its Arrow cache built before, timed apart),
  ``with_transform`` of torchvision v2 transforms on the PIL images ``datasets`` decodes,
  in a torch DataLoader with --workers workers: the recipe of Hugging Face's image tutorials

Then the ratio of fastload's rows to datasets'. With --latency-ms > 0, the same files and
JPEGs on moto's S3 server (a process of its own) behind ``latency::`` (that many ms per
request), fastload's threads engine, first epoch each:

* ImageFolder remote, per object: one GET per image, no cache
* ParquetImages remote, cold, a range per row group: a memory-only cache (no disk tier, so
  no shard store): one range GET per row group's image chunk
* ParquetImages remote, cold: a new cache directory: the files downloaded whole into its
  shard store, ahead in the epoch's order (8 MiB range requests; the index built before it,
  timed apart); warm: a new dataset and loader over the same cache directory (the local
  copies). The pair is made --repeats times, each cold epoch in a new cache directory, and
  the medians shown with each round's ratio: the first cold epoch after the benchmark wrote
  and uploaded its files is the dearest on a VM that hands freed memory back to its host
  (docs/shards.md)

Run once, small, to check it works; the numbers mean something on a quiet machine only.

    python benchmarks/parquet.py                   # 512 images, 2 files, row groups of 100
    python benchmarks/parquet.py --images 2000 --workers 2
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.utils.data
from torchvision.transforms import v2 as T

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cache_epoch import served_folder  # benchmarks/

from fastload import DataLoader, ImageFolder, ParquetImages
from fastload.testing.synthetic import make_jpeg_folder
from tests.fixtures.s3 import upload_folder


def write_parquet(root: Path, out: Path, files: int, group: int) -> list[str]:
    """The JPEGs below ``root`` as ``files`` Parquet files written by ``datasets``."""
    from datasets import ClassLabel, Dataset, Features, Image

    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    paths = sorted(root.rglob("*.jpg"))
    features = Features({"image": Image(), "label": ClassLabel(names=classes)})
    per = -(-len(paths) // files)
    urls = []
    for n in range(files):
        part = paths[n * per: (n + 1) * per]
        ds = Dataset.from_dict({"image": [{"bytes": p.read_bytes(), "path": p.name} for p in part],
                                "label": [classes.index(p.parent.name) for p in part]},
                               features=features)
        urls.append(str(out / f"train-{n:05d}.parquet"))
        ds.to_parquet(urls[-1], batch_size=group)
    return urls


def datasets_loader(files: list[str], cache: Path, size: int, batch: int, workers: int) -> Any:
    """Hugging Face datasets' own pipeline over the same files (see the module doc)."""
    from datasets import Dataset

    transform = T.Compose([T.PILToTensor(), T.RandomResizedCrop(size, antialias=True),
                           T.RandomHorizontalFlip()])

    def apply(rows: dict[str, list]) -> dict[str, list]:
        return {"image": [transform(img.convert("RGB")) for img in rows["image"]],
                "label": rows["label"]}

    def collate(samples: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.stack([s["image"] for s in samples]),
                torch.tensor([s["label"] for s in samples]))

    hf = Dataset.from_parquet(files, cache_dir=str(cache)).with_transform(apply)
    return torch.utils.data.DataLoader(hf, batch_size=batch, shuffle=True, num_workers=workers,
                                       collate_fn=collate)


def rate(n: int, loader: Any, epochs: int) -> float:
    """Images/s of the last of ``epochs`` epochs (the first pays worker start-up and, for
    fastload's choice, the engines' measurement)."""
    for _ in range(epochs):
        start = time.perf_counter()
        seen = sum(len(y) for _, y in loader)
        assert seen == n, f"an epoch gave {seen} of {n} samples"
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--group", type=int, default=100, help="rows per row group")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=2, help="the last one is timed")
    parser.add_argument("--latency-ms", type=float, default=15.0, help="0: no remote rows")
    parser.add_argument("--repeats", type=int, default=3,
                        help="cold/warm rounds of the shard cache rows (medians shown)")
    args = parser.parse_args()
    logging.getLogger("datasets").setLevel(logging.WARNING)
    local = make_jpeg_folder(ROOT / ".fastload-data" / f"parquet-bench-{args.images}",
                             images=args.images, classes=10, size=(500, 375))
    work = Path(tempfile.mkdtemp(prefix="fastload-parquet-bench-"))
    (work / "files").mkdir()
    files = write_parquet(local, work / "files", args.files, args.group)
    n, batch = args.images, args.batch_size
    rows: dict[str, float] = {}
    start = time.perf_counter()
    ds = ParquetImages(files, size=args.size, train=True, seed=0)
    index_s = time.perf_counter() - start
    auto = DataLoader(ds, batch_size=batch, shuffle=True)
    rows[f"ParquetImages, fastload's choice ({auto.backend})"] = rate(n, auto, args.epochs)
    workers = DataLoader(ds, batch_size=batch, shuffle=True, backend="torch",
                         num_workers=args.workers)
    rows[f"ParquetImages, {args.workers} torch workers"] = rate(n, workers, args.epochs)
    start = time.perf_counter()
    hf = datasets_loader(files, work / "hf-cache", args.size, batch, args.workers)
    arrow_s = time.perf_counter() - start
    rows[f"datasets + torchvision, {args.workers} workers"] = baseline = rate(n, hf, args.epochs)
    print(f"one epoch of {n} JPEGs (500x375) in {args.files} Parquet files (row groups of "
          f"{args.group}, written by datasets), batch {batch}, RandomResizedCrop {args.size} "
          f"+ flip, shuffled; epoch {args.epochs} of {args.epochs}")
    for name, value in rows.items():
        print(f"  {name:44s} {value:8.1f} images/s  {value / baseline:5.2f}x datasets")
    print(f"  ParquetImages index: {index_s:.2f} s, {ds.index.nbytes / len(ds):.0f} bytes/sample; "
          f"datasets' Arrow cache: {arrow_s:.2f} s")
    if args.latency_ms > 0:
        remote_rows(local, work, args)


def remote_rows(local: Path, work: Path, args: argparse.Namespace) -> None:
    """The remote rows (see the module doc), printed."""
    n, rows = args.images, {}
    common = {"size": args.size, "train": True, "seed": 0}
    run = {"batch_size": args.batch_size, "shuffle": True, "backend": "threads"}
    bucket = f"s3://parquet-bench-{n}"
    with served_folder(local, f"{bucket}/folder", args.latency_ms) as (url, options):
        files = upload_folder(options["s3"], work / "files", f"{bucket}/parquet")
        pattern = f"latency::{files}/train-*.parquet"
        start = time.perf_counter()
        ds = ParquetImages(pattern, storage_options=options, cache={"disk": str(work / "cache")},
                           **common)
        index_s = time.perf_counter() - start
        folder = ImageFolder(url, storage_options=options, **common)
        rows["ImageFolder remote, per object"] = rate(n, DataLoader(folder, **run), 1)
        ranges = ParquetImages(pattern, storage_options=options, cache={"memory": "1GB"}, **common)
        rows[f"ParquetImages remote, cold, a range per row group ({len(ranges.index.group_file)})"
             ] = rate(n, DataLoader(ranges, **run), 1)
        pairs: list[tuple[float, float]] = []
        for repeat in range(args.repeats):  # each cold epoch in a new cache directory
            cache = {"disk": str(work / ("cache" if repeat == 0 else f"cache-{repeat}"))}
            cold_ds = ds if repeat == 0 else ParquetImages(
                pattern, storage_options=options, cache=cache, **common)
            cold = rate(n, DataLoader(cold_ds, **run), 1)
            store = cold_ds.shard_store
            warm_ds = ParquetImages(pattern, storage_options=options, cache=cache, **common)
            pairs.append((cold, rate(n, DataLoader(warm_ds, **run), 1)))
        rows[f"ParquetImages remote, cold ({store.downloads} files, {store.requests} requests)"
             ] = statistics.median(c for c, _ in pairs)
        rows["ParquetImages remote, warm (local copies)"] = statistics.median(w for _, w in pairs)
    print(f"remote: moto + {args.latency_ms:g} ms/request, threads engine, first epochs of new "
          f"loaders; cold/warm: medians of {args.repeats} rounds")
    per_object = rows["ImageFolder remote, per object"]
    for name, value in rows.items():
        print(f"  {name:60s} {value:8.1f} images/s  {value / per_object:5.2f}x per object")
    cold, warm = (statistics.median(p[k] for p in pairs) for k in (0, 1))
    print(f"  cold vs warm cache: {cold / warm:.2f}x (rounds: "
          + ", ".join(f"{c / w:.2f}x" for c, w in pairs) + ")")
    print(f"  remote ParquetImages index: {index_s:.2f} s")


if __name__ == "__main__":
    main()
