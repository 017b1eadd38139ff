"""Real training recipes: torchvision's loaders against fastload's (issue 22).

Rows (all at 224, torchvision v2 unless said):

  reference   RandomResizedCrop, flip, TrivialAugmentWide, PILToTensor, ToDtype, Normalize,
              RandomErasing (torchvision's reference classification recipe)
  timm-rand   timm's create_transform(224, is_training=True, auto_augment=--timm-aa, re_prob=0.25);
              --timm-aa is "rand-m9-inc1" by default: with Pillow >= 12 the issue's
              "rand-m9-mstd0.5-inc1" raises on ~1% of images in timm itself (a magnitude drawn
              above 10 gives PosterizeIncreasing 0 bits, which Pillow refuses), so no epoch ends
  simclr      RandomResizedCrop, flip, RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
              RandomGrayscale(0.2), GaussianBlur(23), ToImage, ToDtype
  crop-flip   RandomResizedCrop, flip, PILToTensor

Columns:

  tv-pil      torchvision.datasets.ImageFolder(root, transform=t) (PIL), torch DataLoader with
              one worker per usable core, persistent
  tv-tensor   the same with decode_jpeg as the loader: t's steps on uint8 tensors (timm's
              PIL-only steps cannot: n/a)
  fastload    fastload.DataLoader(fastload.ImageFolder(root, transform=t)), everything "auto"
  aug us      the augmentations alone (the steps after the crop and flip), per 224x224 image:
              fastload's compiled rest (``compiled.apply_rest``) / torchvision's steps on a PIL
              image (as its ImageFolder runs them)

Each loader is built and warmed up one epoch, then timed --repeats epochs (median); each
recipe's last line gives the cores each loader kept busy over those epochs (CPU seconds of the
process and its workers / wall seconds): on a quiet machine, how well it uses the cores. Batches
of 64, shuffled. The set is engine_throughput.py's (--set imagenet or photos).

    python benchmarks/recipes.py --quick          # smoke run, not a measurement
    python benchmarks/recipes.py --set photos
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.utils.data
import torchvision
from engine_throughput import DATA, SETS, close, make_set, timed_epoch  # benchmarks/ is on sys.path
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2

import fastload
from fastload.data.sampling import SampleIndex

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def recipes(timm_aa: str = "rand-m9-inc1") -> dict[str, Any]:
    from timm.data import create_transform

    crop = [v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()]
    floats = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return {
        "reference": v2.Compose([*crop, v2.TrivialAugmentWide(), v2.PILToTensor(), *floats, v2.RandomErasing(0.25)]),
        "timm-rand": create_transform(224, is_training=True, auto_augment=timm_aa, re_prob=0.25),
        "simclr": v2.Compose([*crop, v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                              v2.RandomGrayscale(0.2), v2.GaussianBlur(23, (0.1, 2.0)), v2.ToImage(),
                              v2.ToDtype(torch.float32, scale=True)]),
        "crop-flip": v2.Compose([*crop, v2.PILToTensor()]),
    }


def _jpeg(path: str) -> torch.Tensor:
    return decode_jpeg(torchvision.io.read_file(path), mode=ImageReadMode.RGB)


def loaders(root: Path, t: Any, batch: int, workers: int) -> dict[str, Any]:
    def torch_loader(**folder: Any) -> torch.utils.data.DataLoader:
        dataset = torchvision.datasets.ImageFolder(os.fspath(root), transform=t, **folder)
        return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                           persistent_workers=workers > 0)

    ds = fastload.ImageFolder(root, transform=t)
    return {"tv-pil": torch_loader(), "tv-tensor": torch_loader(loader=_jpeg),
            "fastload": fastload.DataLoader(ds, batch_size=batch, shuffle=True)}


def _cpu_seconds() -> float:
    """CPU seconds of this process and its live children (torch's persistent workers)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def epochs(loader: Any, repeats: int) -> tuple[float, float] | None:
    """Median images/s over ``repeats`` epochs after a warm-up, and the cores the loader kept
    busy meanwhile (CPU seconds / wall seconds); None if the loader cannot run."""
    try:
        timed_epoch(loader)
    except Exception as exc:  # noqa: BLE001 - timm's PIL-only steps given a tensor fail in many ways
        print(f"    n/a: {type(exc).__name__}: {exc}"[:160], file=sys.stderr)
        return None
    rates, cpu, wall = [], 0.0, 0.0
    for _ in range(repeats):
        before = _cpu_seconds()
        n, seconds = timed_epoch(loader)
        cpu, wall = cpu + _cpu_seconds() - before, wall + seconds
        rates.append(n / seconds)
    return statistics.median(rates), cpu / wall


def augment_us(root: Path, t: Any, samples: int) -> tuple[float, float]:
    """Per image: fastload's compiled rest on the 224x224 tensor; torchvision's same steps on PIL."""
    ds = fastload.ImageFolder(root, transform=t, seed=0)
    compiled = ds.compiled
    images = [ds.pipeline.run(ds.read_bytes(i % len(ds)), i) for i in range(16)]
    if compiled is None or compiled.rest is None:
        return 0.0, 0.0
    tail = v2.Compose(list(t.transforms)[2:])  # the steps after the crop and flip
    pils = [Image.fromarray(im.permute(1, 2, 0).numpy()) for im in images]
    start = time.perf_counter()
    for k in range(samples):
        compiled.apply_rest(images[k % 16].clone(), ds.sample_seed(SampleIndex(k % 16, k)), seeded=False)
    ours = (time.perf_counter() - start) / samples * 1e6
    start = time.perf_counter()
    for k in range(samples):
        tail(pils[k % 16])
    return ours, (time.perf_counter() - start) / samples * 1e6


def fmt(value: float | None) -> str:
    return f"{value:8.0f}" if value is not None else f"{'n/a':>8}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:5.2f}x" if a and b else f"{'n/a':>6}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=list(SETS), default="imagenet")
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--timm-aa", default="rand-m9-inc1", help="timm's auto_augment for the timm row")
    parser.add_argument("--only", nargs="*", default=None, help="rows to run (default all)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="smoke run: few images, 1 repeat")
    args = parser.parse_args(argv)
    default, quick, what = SETS[args.set]
    images = args.images or (quick if args.quick else default)
    repeats = 1 if args.quick else args.repeats
    root = make_set(args.set, images, args.data)
    print(f"{images} JPEGs ({what}); {args.workers} torch workers; batch {args.batch_size}; median of "
          f"{repeats} epochs" + (" -- SMOKE RUN, not a measurement" if args.quick else ""))
    print(f"  {'recipe':<10} {'tv-pil':>8} {'tv-tensor':>9} {'fastload':>8} {'x pil':>6} {'x tensor':>8}"
          f"  {'aug us fastload/tv':>18}  engine")
    report: dict[str, Any] = {"images": images, "set": args.set, "rows": {}}
    for name, t in recipes(args.timm_aa).items():
        if args.only and name not in args.only:
            continue
        made = loaders(root, t, args.batch_size, args.workers)
        measured = {key: epochs(loader, repeats) for key, loader in made.items()}
        rates = {key: m[0] if m else None for key, m in measured.items()}
        cores = {key: m[1] for key, m in measured.items() if m}
        ours = made["fastload"]
        engine, reason = ours.backend, ours.backend_reason
        for loader in made.values():
            close(loader)
        made.clear()
        gc.collect()
        aug = augment_us(root, t, 32 if args.quick else 400)
        report["rows"][name] = {"images_per_s": rates, "cores": cores, "augment_us": aug, "engine": engine,
                                "reason": reason}
        fl, pil, ten = rates["fastload"], rates["tv-pil"], rates["tv-tensor"]
        print(f"  {name:<10} {fmt(pil)} {fmt(ten):>9} {fmt(fl)} {ratio(fl, pil)} {ratio(fl, ten):>8}"
              f"  {aug[0]:8.0f}/{aug[1]:<9.0f}  {engine}")
    for name, row in report["rows"].items():
        busy = ", ".join(f"{key} {value:.2f}" for key, value in row["cores"].items())
        print(f"{name}: cores kept busy: {busy}; backend_reason = {row['reason']!r}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
