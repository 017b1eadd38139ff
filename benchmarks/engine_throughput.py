"""Images/s of fastload's engines against torchvision, DALI and the physical limit (issue 13).

One run, side by side, on two synthetic sets (made once under .fastload-data, reused):
``imagenet`` (500x375 JPEGs, quality 90, like ImageNet) and ``photos`` (larger photos,
width and height each drawn from 320..1280 px). Every row does the same work: batch 64,
random-resized-crop to 224 + horizontal flip, uint8 CHW batches, a shuffled full epoch.

  stock torch          torchvision ImageFolder + v2 on PIL, torch DataLoader defaults (0 workers)
  torchvision PIL      the same with num_workers = cores, persistent workers
  torchvision tensor   read_file + torchvision.io.decode_jpeg + v2 on uint8 tensors, cores workers
  fastload torch       fastload.DataLoader(ImageFolder(...), backend="torch")
  fastload threads     backend="threads"
  DALI (CPU here)      backend="dali"
  fastload auto        backend="auto" (the default)
  FFCV full-size JPEG  only where ``import ffcv`` works
  transcoded, epoch 2+ ImageFolder(cache={"disk": ..., "transcode": {"max_side": 256}}), auto;
                       the warm-up epoch fills the tier
  physical limit       the best one-core decode + crop + resize rate of any decoder here,
                       times the usable cores (measured first, before any workers start)

Each loader row: one warm-up epoch (worker start-up, imports, a cache fill), then --epochs
timed epochs; the table shows the best and the median images/s and the best's ratio to the
torchvision PIL row. Every batch is touched (one element read) so lazy work is counted; each
loader is closed before the next row starts. Rows that cannot run say why.

    python benchmarks/engine_throughput.py                      # both sets, 3 epochs a row
    python benchmarks/engine_throughput.py --set photos --images 600 --json out.json
    python benchmarks/engine_throughput.py --quick              # smoke run: tiny sets, 1 epoch
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _baselines import (  # benchmarks/ is on sys.path when run as a script
    ffcv_loader,
    limit_candidates,
    torchvision_pil,
    torchvision_tensor,
)
from PIL import Image

import fastload
from fastload.data.pipeline import ImagePipeline
from fastload.errors import FastloadError
from fastload.testing.synthetic import make_jpeg_folder

DATA = Path(__file__).resolve().parent.parent / ".fastload-data"
SIZE = 224
REFERENCE = "tv_pil"  # the row every ratio is taken against
SETS = {  # name: (default images, --quick images, what it is)
    "imagenet": (2000, 128, "500x375 JPEGs, quality 90"),
    "photos": (600, 48, "photos 320..1280 px a side, quality 90"),
}


def make_set(name: str, images: int, data: Path) -> Path:
    if name == "imagenet":  # the same folder as dali_vs_torch.py's
        return make_jpeg_folder(data / f"jpeg-{images}", images=images, classes=10)
    return make_jpeg_folder(
        data / f"photos-{images}", images=images, classes=10, size_range=(320, 1280)
    )


def timed_epoch(loader) -> tuple[int, float]:
    """(images, seconds) of one full epoch; each batch's last element is read."""
    start = time.perf_counter()
    n = 0
    for images, _labels in loader:
        n += images.shape[0]
        int(images[-1, -1, -1, -1])  # touch: a batch that is still lazy gets materialised
    return n, time.perf_counter() - start


def close(loader) -> None:
    """Stop a loader's workers and threads before the next row starts."""
    if isinstance(loader, fastload.DataLoader):
        loader.engine.close()
    elif hasattr(loader, "close"):  # FFCV
        loader.close()
    # torch's persistent workers stop when the loader and its iterator are collected


def measure(make: Callable[[], Any], epochs: int) -> dict[str, Any]:
    """One row: build, warm up one epoch, time ``epochs`` epochs, close."""
    try:
        loader = make()
    except (FastloadError, ImportError) as exc:
        return {"status": f"not available: {type(exc).__name__}: {exc}"}
    row: dict[str, Any] = {"status": "ok"}
    row["workers"] = getattr(loader, "num_workers", None)
    try:
        timed_epoch(loader)  # warm-up (and, for auto, the epoch that measures the engines)
        if isinstance(loader, fastload.DataLoader):  # what ran, known after the first epoch
            row.update(backend=loader.backend, backend_reason=loader.backend_reason,
                       workers=loader.settings.num_workers.value)
        runs = [timed_epoch(loader) for _ in range(epochs)]
    except Exception as exc:  # noqa: BLE001 - the row reports it; the other rows still run
        row["status"] = f"failed: {type(exc).__name__}: {exc}"
        return row
    finally:
        close(loader)
        del loader
        gc.collect()
    rates = [n / s for n, s in runs]
    row.update(
        images=runs[0][0],
        epochs_images_per_s=rates,
        best=max(rates),
        median=statistics.median(rates),
    )
    return row


def physical_limit(root: Path, samples: int, repeats: int, cores: int) -> dict[str, Any]:
    """Best one-thread decode+crop+resize rate of each decoder, on the same crops; x cores."""
    paths = sorted(root.glob("*/*.jpg"))
    paths = paths[:: max(1, len(paths) // samples)][:samples]
    pipeline = ImagePipeline.standard(SIZE, train=True)
    work = []
    for i, path in enumerate(paths):  # bytes and crops first, not timed
        data = path.read_bytes()
        width, height = Image.open(io.BytesIO(data)).size
        plan = pipeline.plan(width, height, random.Random(i))
        box, flip = plan.box, plan.flip
        work.append((data, box, flip))
    candidates, skipped = limit_candidates(SIZE)
    rates: dict[str, float] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, run in candidates.items():
            try:
                for data, box, flip in work[:4]:  # warm-up, and a check of what comes out
                    out = run(data, box, flip)
                    if tuple(out.shape) != (3, SIZE, SIZE) or out.dtype != torch.uint8:
                        raise ValueError(
                            f"got {tuple(out.shape)} {out.dtype}, not (3, {SIZE}, {SIZE}) uint8"
                        )
            except Exception as exc:  # noqa: BLE001 - a decoder that cannot run is not a candidate
                skipped[name] = f"{type(exc).__name__}: {exc}"
                continue
            best = 0.0
            for _ in range(repeats):
                start = time.perf_counter()
                for data, box, flip in work:
                    run(data, box, flip)
                best = max(best, len(work) / (time.perf_counter() - start))
            rates[name] = best
    finally:
        torch.set_num_threads(threads)
    winner = max(rates, key=rates.get)
    return {
        "samples": len(work),
        "one_core_images_per_s": rates,
        "skipped": skipped,
        "best_decoder": winner,
        "cores": cores,
        "best": rates[winner] * cores,
    }


def loaders(
    root: Path, batch: int, cores: int, cache_dir: str, beton: str
) -> dict[str, tuple[str, Callable]]:
    """key: (label, make) of every loader row, in the order they run."""

    def fl(backend: str) -> Callable:
        return lambda: fastload.DataLoader(
            fastload.ImageFolder(root, size=SIZE, train=True),
            batch_size=batch,
            shuffle=True,
            backend=backend,
        )

    def transcoded():
        cache = {"disk": cache_dir, "transcode": {"max_side": 256, "quality": 90}}
        dataset = fastload.ImageFolder(root, size=SIZE, train=True, cache=cache)
        return fastload.DataLoader(dataset, batch_size=batch, shuffle=True)

    return {
        "stock_torch": (
            "stock torch (tv ImageFolder+v2 PIL, 0 workers)",
            lambda: torchvision_pil(root, batch_size=batch, workers=0),
        ),
        "tv_pil": (
            f"torchvision ImageFolder+v2 PIL ({cores} workers)",
            lambda: torchvision_pil(root, batch_size=batch, workers=cores),
        ),
        "tv_tensor": (
            f"torchvision decode_jpeg+v2 tensor ({cores} workers)",
            lambda: torchvision_tensor(root, batch_size=batch, workers=cores),
        ),
        "fl_torch": ("fastload torch-worker engine", fl("torch")),
        "fl_threads": ("fastload threaded engine", fl("threads")),
        "dali": ("DALI (CPU here)" if not torch.cuda.is_available() else "DALI", fl("dali")),
        "auto": ("fastload auto", fl("auto")),
        "ffcv": (
            "FFCV full-size JPEG",
            lambda: ffcv_loader(root, beton, batch_size=batch, workers=cores),
        ),
        "transcoded": ("fastload transcoded 256px tier, epoch 2+", transcoded),
    }


def run_set(
    name: str, root: Path, images: int, args: argparse.Namespace, cores: int
) -> dict[str, Any]:
    limit = physical_limit(root, args.limit_samples, args.limit_repeats, cores)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fastload-engine-bench-") as tmp:
        made = loaders(
            root, args.batch_size, cores, os.path.join(tmp, "cache"), os.path.join(tmp, "set.beton")
        )
        for key, (label, make) in made.items():
            print(f"  [{name}] {label} ...", file=sys.stderr, flush=True)
            rows[key] = {"label": label, **measure(make, args.epochs)}
    rows["limit"] = {
        "label": f"physical limit ({cores} cores x best decoder)",
        "status": "ok",
        "best": limit["best"],
    }
    return {
        "root": str(root),
        "images": images,
        "rows": rows,
        "limit": limit,
        "targets": targets(rows),
    }


def _rate(rows: dict[str, Any], key: str) -> float | None:
    return rows[key].get("best") if rows[key]["status"] == "ok" else None


def targets(rows: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 13's targets, from this run's numbers only."""
    checks = [
        ("auto", "tv_pil", 1.5),
        ("auto", "tv_tensor", 1.2),
        ("auto", "limit", 0.9),
        ("auto", "ffcv", 1.0),
        ("transcoded", "tv_pil", 5.0),
    ]
    found = []
    for top, bottom, want in checks:
        a, b = _rate(rows, top), _rate(rows, bottom)
        ratio = a / b if a and b else None
        missing = [rows[k]["label"] for k, v in ((top, a), (bottom, b)) if not v]
        found.append(
            {
                "what": f"{rows[top]['label']} vs {rows[bottom]['label']}",
                "ratio": ratio,
                "target": want,
                "met": None if ratio is None else ratio >= want,
                "why_none": None if ratio is not None else "not measured: " + ", ".join(missing),
            }
        )
    return found


def print_set(name: str, result: dict[str, Any]) -> None:
    rows, ref = result["rows"], _rate(result["rows"], REFERENCE)
    print(f"\n{name}: {result['images']} images ({SETS[name][2]}) in {result['root']}")
    print(f"  {'row':<48} {'best img/s':>10} {'median':>8} {'vs tv PIL':>9}  note")
    for row in rows.values():
        if row["status"] != "ok":
            print(f"  {row['label']:<48} {'-':>10} {'-':>8} {'-':>9}  {row['status']}")
            continue
        median = f"{row['median']:8.1f}" if "median" in row else f"{'':8}"
        ratio = f"{row['best'] / ref:8.2f}x" if ref else f"{'-':>9}"
        if "backend" in row:  # a fastload loader's worker count is the torch engine's
            note = f"ran on {row['backend']}" + (
                f", {row['workers']} workers" if row["backend"] == "torch" else ""
            )
        else:
            note = f"{row['workers']} workers" if row.get("workers") is not None else ""
        print(f"  {row['label']:<48} {row['best']:10.1f} {median} {ratio}  {note}")
    limit = result["limit"]
    print(
        f"  physical limit: {limit['best_decoder']} at {limit['one_core_images_per_s'][limit['best_decoder']]:.1f}"
        f" img/s on one core x {limit['cores']} cores; one core:"
    )
    for decoder, rate in limit["one_core_images_per_s"].items():
        print(f"    {decoder:<46} {rate:8.1f} img/s")
    for decoder, why in limit["skipped"].items():
        print(f"    {decoder:<46} skipped: {why}")
    auto = rows["auto"]
    if auto["status"] == "ok":
        print(
            f"  auto: loader.backend = {auto['backend']!r}; loader.backend_reason = {auto['backend_reason']!r}"
        )
    for t in result["targets"]:
        if t["ratio"] is None:
            print(f"  {t['what']}: {t['why_none']} (target >= {t['target']}x)")
        else:
            print(
                f"  {t['what']}: {t['ratio']:.2f}x (target >= {t['target']}x) {'met' if t['met'] else 'MISSED'}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--set", choices=[*SETS, "both"], default="both")
    parser.add_argument(
        "--images",
        type=int,
        default=None,
        help="images per set (default 2000 imagenet, 600 photos)",
    )
    parser.add_argument(
        "--epochs", type=int, default=3, help="timed epochs per row, after one warm-up epoch"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--limit-samples", type=int, default=200, help="images the physical limit decodes"
    )
    parser.add_argument(
        "--limit-repeats", type=int, default=3, help="passes over them (best counts)"
    )
    parser.add_argument("--data", type=Path, default=DATA, help="where the synthetic sets live")
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write the results here"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tiny sets, 1 epoch; not a measurement"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.limit_samples, args.limit_repeats = 1, 16, 1
    cores = len(os.sched_getaffinity(0))
    report: dict[str, Any] = {
        "machine": {
            "usable_cores": cores,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "fastload": fastload.__version__,
            "cuda": torch.cuda.is_available(),
        },
        "settings": {
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "size": SIZE,
            "train": True,
            "quick": args.quick,
            "limit_samples": args.limit_samples,
        },
        "sets": {},
    }
    print(
        f"{cores} usable cores, batch {args.batch_size}, RandomResizedCrop({SIZE}) + flip, uint8; "
        f"best and median of {args.epochs} epoch(s) after a warm-up"
        + (" -- SMOKE RUN, not a measurement" if args.quick else "")
    )
    for name in SETS if args.set == "both" else [args.set]:
        images = args.images or SETS[name][1 if args.quick else 0]
        print(f"  making/reusing the {name} set ({images} images) ...", file=sys.stderr, flush=True)
        root = make_set(name, images, args.data)
        report["sets"][name] = result = run_set(name, root, images, args, cores)
        print_set(name, result)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nresults: {args.json}")
    failed = [
        f"{s}/{k}"
        for s, r in report["sets"].items()
        for k, row in r["rows"].items()
        if row["status"].startswith("failed")
    ]
    if failed:
        print(f"failed rows: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
