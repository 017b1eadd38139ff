"""Images/s of the DALI engine against the torch engine, same loader, same files, one run.

Both run ``fastload.DataLoader`` over the synthetic ImageNet-like JPEG set (500x375,
quality 90; made once under .fastload-data and reused) with the same pipeline, batch size
and seed; only ``backend=`` differs:

* torch: Pillow in torch worker processes (num_workers="auto")
* dali:  the pipeline compiled to DALI; CPU-only DALI on a machine without a GPU, "mixed"
         (nvJPEG) decoding with one

Epochs alternate between the engines (torch, dali, torch, dali, ...) so both see the same
machine state; each figure is the median of --repeats full epochs after one warm-up epoch
each. Prints medians and the ratio dali / torch.

    python benchmarks/dali_vs_torch.py                        # 2000 images, eval 224, 3 repeats
    python benchmarks/dali_vs_torch.py --train --json         # random-resized-crop + flip
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import fastload
from fastload.testing.synthetic import make_jpeg_folder
from loader_throughput import epoch_rate  # benchmarks/ is on sys.path when run as a script

DATA = Path(__file__).resolve().parent.parent / ".fastload-data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=224, help="output side, pixels")
    parser.add_argument("--train", action="store_true", help="random-resized-crop + flip")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="cuda to put batches on the GPU")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    root = make_jpeg_folder(DATA / f"jpeg-{args.images}", images=args.images, classes=10)
    dataset = fastload.ImageFolder(root, size=args.size, train=args.train, seed=0)
    loaders = {
        engine: fastload.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True, backend=engine,
            device=args.device, meter=False,
        )
        for engine in ("torch", "dali")
    }
    for loader in loaders.values():
        epoch_rate(loader)  # warm-up: worker start, imports, DALI's first allocations
    rates: dict[str, list[float]] = {engine: [] for engine in loaders}
    for _ in range(args.repeats):
        for engine, loader in loaders.items():
            rates[engine].append(epoch_rate(loader))
    medians = {engine: statistics.median(r) for engine, r in rates.items()}
    result = {
        "images": args.images,
        "size": args.size,
        "train": args.train,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "device": args.device,
        "torch_workers": loaders["torch"].settings.num_workers.value,
        "dali_reason": loaders["dali"].backend_reason,
        "images_per_s": {engine: round(m, 1) for engine, m in medians.items()},
        "all_runs": {engine: [round(r, 1) for r in rs] for engine, rs in rates.items()},
        "ratio_dali_over_torch": round(medians["dali"] / medians["torch"], 3),
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"{args.images} JPEGs 500x375 -> {args.size}px {'train' if args.train else 'eval'}, "
          f"batch {args.batch_size}, median of {args.repeats} epochs")
    print(f"  torch engine ({result['torch_workers']} workers): {medians['torch']:8.1f} images/s")
    print(f"  dali engine  ({result['dali_reason']}): {medians['dali']:8.1f} images/s")
    print(f"  ratio dali / torch: {result['ratio_dali_over_torch']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
