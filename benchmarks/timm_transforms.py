"""timm's transforms: torchvision's ImageFolder + torch DataLoader against fastload (issue 20).

The same transform object on both sides, the one a timm training script builds:

  train   timm.data.create_transform(224, is_training=True)   RandomResizedCropAndInterpolation,
          flip, ColorJitter, MaybeToTensor, Normalize (tensor mean/std)
  eval    timm.data.create_transform(224, is_training=False)  Resize(256), CenterCrop(224),
          MaybeToTensor, Normalize (tensor mean/std)

  torchvision   torchvision.datasets.ImageFolder(root, transform=t) + torch.utils.data.DataLoader
                (--workers, 2 by default, persistent), timm's steps on PIL images
  fastload      fastload.DataLoader(fastload.ImageFolder(root, transform=t)), every setting left
                at "auto": the crop compiles into the decode; the engine is fastload's choice

Both loaders are built and warmed up (one epoch each: worker start-up, and fastload's first
epoch, which measures its engines), then their epochs alternate, --repeats times; the table
gives each one's median images/s and the median of the paired ratios (fastload / torchvision),
so a machine whose speed drifts affects both sides of a pair alike. Float32 batches of 64,
shuffled, every batch touched. The set is the synthetic ImageNet-shaped one of
engine_throughput.py (500x375 JPEGs, quality 90; made once under .fastload-data, reused).

    python benchmarks/timm_transforms.py                      # 2000 images, 5 repeats
    python benchmarks/timm_transforms.py --quick              # smoke run: 128 images, 1 repeat
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.utils.data
import torchvision
from engine_throughput import DATA, close, make_set, timed_epoch  # benchmarks/ is on sys.path
from timm.data import create_transform

import fastload


def loaders(root: Path, transform: Any, batch: int, workers: int) -> dict[str, Any]:
    """torchvision's and fastload's loader over ``root`` with the same ``transform``."""
    theirs = torch.utils.data.DataLoader(
        torchvision.datasets.ImageFolder(os.fspath(root), transform=transform),
        batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
    )
    ours = fastload.DataLoader(
        fastload.ImageFolder(root, transform=transform), batch_size=batch, shuffle=True
    )
    return {"torchvision": theirs, "fastload": ours}


def compare(root: Path, transform: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Warm both loaders up, then time their epochs alternately; rates and paired ratios."""
    made = loaders(root, transform, args.batch_size, args.workers)
    rates: dict[str, list[float]] = {name: [] for name in made}
    try:
        for loader in made.values():
            timed_epoch(loader)  # warm-up: workers start; fastload's first epoch picks its engine
        for r in range(args.repeats):
            order = list(made) if r % 2 == 0 else list(reversed(made))  # neither always goes first
            for name in order:
                n, seconds = timed_epoch(made[name])
                rates[name].append(n / seconds)
        ours = made["fastload"]
        engine = {"backend": ours.backend, "backend_reason": ours.backend_reason,
                  "workers": ours.settings.num_workers.value, "notes": list(ours.dataset.compiled.notes)}
    finally:
        for loader in made.values():
            close(loader)
        made.clear()
        gc.collect()
    ratios = [a / b for a, b in zip(rates["fastload"], rates["torchvision"])]
    return {
        "images_per_s": rates,
        "median": {name: statistics.median(v) for name, v in rates.items()},
        "ratio": statistics.median(ratios),
        **engine,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=None, help="images in the set (default 2000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs per loader, alternating")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="torch DataLoader workers (torchvision's side)")
    parser.add_argument("--data", type=Path, default=DATA, help="where the synthetic set lives")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="smoke run: 128 images, 1 repeat; not a measurement")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    images = args.images or (128 if args.quick else 2000)
    print(f"  making/reusing the imagenet set ({images} images) ...", file=sys.stderr, flush=True)
    root = make_set("imagenet", images, args.data)
    cores = len(os.sched_getaffinity(0))
    print(f"{images} JPEGs 500x375 in {root}; {cores} usable cores; batch {args.batch_size}; "
          f"torchvision with {args.workers} workers; median of {args.repeats} alternating epochs"
          + (" -- SMOKE RUN, not a measurement" if args.quick else ""))
    print(f"  {'transform':<34} {'torchvision img/s':>17} {'fastload img/s':>14} {'ratio':>6}  fastload ran on")
    settings = {**vars(args), "data": str(args.data), "json": str(args.json)}
    report: dict[str, Any] = {"images": images, "cores": cores, "settings": settings, "transforms": {}}
    for name, training in (("train", True), ("eval", False)):
        transform = create_transform(224, is_training=training)
        result = compare(root, transform, args)
        report["transforms"][name] = result
        label = f"create_transform(224, is_training={training})"
        median = result["median"]
        print(f"  {label:<34} {median['torchvision']:17.1f} {median['fastload']:14.1f} "
              f"{result['ratio']:5.2f}x  {result['backend']}"
              + (f", {result['workers']} workers" if result["backend"] == "torch" else ""))
    for name, result in report["transforms"].items():
        print(f"\n{name}: loader.backend_reason = {result['backend_reason']!r}")
        print(f"{name}: ds.compiled.notes = {result['notes']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nresults: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
