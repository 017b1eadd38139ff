"""Images/s of fastload.DataLoader against stock and hand-tuned torch DataLoaders.

One run, side by side, on a synthetic ImageNet-like JPEG set (made once, reused):

* stock torch:  torch.utils.data.DataLoader with its defaults (num_workers=0)
* hand-tuned:   torch DataLoader, num_workers = usable cores, pin_memory (if CUDA),
                persistent workers, prefetch_factor 4 — the folklore settings
* fastload:     fastload.DataLoader with its defaults ("auto")
* decode limit: one process's decode+transform rate x usable cores (the ceiling when
                decoding is the bottleneck)

All loaders run the same Pillow pipeline (fastload.ImageFolder, train=True: random-resized
crop to 224 + flip). Each figure is the median of --repeats full epochs.

    python benchmarks/loader_throughput.py            # 2000 images, 3 repeats
    python benchmarks/loader_throughput.py --json     # one JSON document on stdout
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.utils.data

import fastload
from fastload.settings import usable_cpu_cores
from fastload.testing.synthetic import make_jpeg_folder

DATA = Path(__file__).resolve().parent.parent / ".fastload-data"


def epoch_rate(loader) -> float:
    """Images per second over one full epoch (worker start-up included, as users pay it).

    Batches on a GPU are waited for at the end, so queued copies and decodes are counted.
    Shared by the other image-loader benchmarks (``from loader_throughput import epoch_rate``).
    """
    start = time.perf_counter()
    n = 0
    for images, _labels in loader:
        n += images.shape[0]
    if n and images.is_cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def decode_rate(dataset, samples: int) -> float:
    """Images per second of one process running the pipeline in a loop (no loader)."""
    indices = range(min(samples, len(dataset)))
    dataset[0]  # warm Pillow's lazy imports
    start = time.perf_counter()
    for i in indices:
        dataset[i]
    return len(indices) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", type=Path, default=None, help="where the synthetic set lives")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    root = args.root or DATA / f"synthetic-{args.images}"
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    log(f"dataset: {args.images} JPEGs, 500x375, quality 90, 10 classes in {root}")
    make_jpeg_folder(root, images=args.images, classes=10, size=(500, 375), quality=90)
    dataset = fastload.ImageFolder(root, size=224, train=True)
    cores = usable_cpu_cores()
    cuda = torch.cuda.is_available()

    loaders = {
        "stock torch (defaults)": lambda: torch.utils.data.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True
        ),
        f"hand-tuned torch ({cores} workers)": lambda: torch.utils.data.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True, num_workers=cores,
            pin_memory=cuda, persistent_workers=True, prefetch_factor=4,
        ),
        "fastload (defaults)": lambda: fastload.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True
        ),
    }
    fl = fastload.DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    log("fastload's settings:\n" + "\n".join("  " + line for line in str(fl.settings).splitlines()))
    del fl

    one_core = statistics.median(decode_rate(dataset, 200) for _ in range(args.repeats))
    results: dict[str, float] = {}
    for name, make in loaders.items():
        loader = make()
        rates = [epoch_rate(loader) for _ in range(args.repeats)]
        results[name] = statistics.median(rates)
        log(f"  {name:<32} {results[name]:8.1f} images/s  (epochs: {', '.join(f'{r:.0f}' for r in rates)})")
        del loader
    limit = one_core * cores
    stock = results["stock torch (defaults)"]
    fast = results["fastload (defaults)"]
    report = {
        "images": args.images,
        "batch_size": args.batch_size,
        "usable_cores": cores,
        "repeats": args.repeats,
        "images_per_s": results,
        "decode_images_per_s_one_core": one_core,
        "decode_bound_limit_images_per_s": limit,
        "fastload_vs_stock": fast / stock,
        "fastload_vs_decode_limit": fast / limit,
        "fastload_vs_hand_tuned": fast / results[f"hand-tuned torch ({cores} workers)"],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"  {'decode-bound limit':<32} {limit:8.1f} images/s  ({one_core:.1f}/s on one core x {cores} cores)")
    print()
    print(f"fastload / stock torch defaults : {report['fastload_vs_stock']:.2f}x   (target >= 1.5x)")
    print(f"fastload / decode-bound limit   : {report['fastload_vs_decode_limit']:.2f}x   (target >= 0.9x)")
    print(f"fastload / hand-tuned torch     : {report['fastload_vs_hand_tuned']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
