"""What ``make demo`` runs: fastload's defaults beside what a user runs instead, in one run.

On a synthetic ImageNet-like JPEG set (made once, reused), every row runs the same training
transform, torchvision's ``v2.Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
PILToTensor()])``:

* stock torch:        torchvision's ImageFolder on torch's DataLoader with its defaults
                      (num_workers=0)
* hand-tuned torch:   the same, num_workers = usable cores, persistent workers,
                      prefetch_factor 4, pinned memory when CUDA is there (the folklore)
* torchvision tensor: file bytes -> torchvision.io.decode_jpeg -> the v2 steps on the uint8
                      tensor, cores workers
* fastload:           ``fastload.ImageFolder(root, transform)`` + ``fastload.DataLoader``
                      with nothing set: the engine it chooses (and why) is printed

Each loader runs one warm-up epoch (fastload's measures its engines there), then the rows'
epochs alternate, so a machine that drifts drifts for all; each figure is the median.

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
import torchvision
from torchvision.transforms import v2

import fastload
from fastload.settings import usable_cpu_cores
from fastload.testing.synthetic import make_jpeg_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _baselines import torchvision_tensor  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / ".fastload-data"
STOCK, TUNED, TENSOR, FASTLOAD = "stock torch", "hand-tuned torch", "torchvision decode_jpeg", "fastload"


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


def recipe() -> v2.Compose:
    return v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor()])


def loaders(root: Path, batch_size: int, cores: int) -> dict[str, torch.utils.data.DataLoader]:
    folder = torchvision.datasets.ImageFolder(str(root), transform=recipe())
    return {
        STOCK: torch.utils.data.DataLoader(folder, batch_size=batch_size, shuffle=True),
        TUNED: torch.utils.data.DataLoader(
            folder, batch_size=batch_size, shuffle=True, num_workers=cores,
            pin_memory=torch.cuda.is_available(), persistent_workers=True, prefetch_factor=4,
        ),
        TENSOR: torchvision_tensor(root, batch_size=batch_size, workers=cores),
        FASTLOAD: fastload.DataLoader(  # one changed import: the same arguments, nothing set
            fastload.ImageFolder(root, transform=recipe()), batch_size=batch_size, shuffle=True
        ),
    }


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
    cores = usable_cpu_cores()
    rows = loaders(root, args.batch_size, cores)
    fast = rows[FASTLOAD]
    log("fastload's settings, as `print(loader.settings)` shows them before the first epoch:")
    log("\n".join("  " + line for line in str(fast.settings).splitlines()))

    rates: dict[str, list[float]] = {name: [] for name in rows}
    for name, loader in rows.items():  # warm-up: workers start, fastload measures its engines
        epoch_rate(loader)
    log(f"\nfastload runs the {fast.backend} engine: {fast.backend_reason}\n")
    for _ in range(args.repeats):
        for name, loader in rows.items():
            rates[name].append(epoch_rate(loader))
    fast.engine.close()
    results = {name: statistics.median(r) for name, r in rates.items()}
    for name, rate in results.items():
        label = f"{name} ({cores} workers)" if name in (TUNED, TENSOR) else name
        log(f"  {label:<34} {rate:8.1f} images/s  (epochs: {', '.join(f'{r:.0f}' for r in rates[name])})")
    report = {
        "images": args.images,
        "batch_size": args.batch_size,
        "usable_cores": cores,
        "repeats": args.repeats,
        "images_per_s": results,
        "fastload_engine": fast.backend,
        "fastload_engine_reason": fast.backend_reason,
        "fastload_vs_stock": results[FASTLOAD] / results[STOCK],
        "fastload_vs_hand_tuned": results[FASTLOAD] / results[TUNED],
        "fastload_vs_torchvision_tensor": results[FASTLOAD] / results[TENSOR],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print()
    print(f"fastload / stock torch defaults        : {report['fastload_vs_stock']:.2f}x")
    print(f"fastload / hand-tuned torch            : {report['fastload_vs_hand_tuned']:.2f}x")
    print(f"fastload / torchvision decode_jpeg     : {report['fastload_vs_torchvision_tensor']:.2f}x")
    print("(medians of alternating epochs; run with nothing else on the machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
