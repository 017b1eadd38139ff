"""A user's own datasets: stock torch.utils.data.DataLoader against fastload.DataLoader.

Only the import changes: both loaders get the same arguments (batch_size, shuffle), and
fastload's probe (NOTE [the dataset probe] in fastload/tuning/probe.py) chooses the rest.

* jpeg:   a plain Pillow dataset over make_jpeg_folder's 500x375 JPEGs: decode, a
          RandomResizedCrop-like crop (scale 0.08-1, ratio 3/4-4/3, drawn from torch's global
          RNG) resized to 224, a flip, and a ToTensor-like float conversion. CPU-bound.
* sleep:  a dataset that waits 10 ms per sample (time.sleep) and returns a small tensor;
          also against a hand-written workers=cores rule:
          torch.utils.data.DataLoader(ds, num_workers=os.cpu_count(), ...).
* tensor: an in-memory TensorDataset (fastload keeps it in-process).

Each figure is the median of --epochs full epochs (worker start-up included, as users pay
it), the loaders' epochs interleaved; the loader's construction (fastload's probe) is timed
apart ("build s"). torch warns when a loader starts more workers than cores; that warning
is silenced here.

    python benchmarks/user_dataset.py                 # 1000 JPEGs, 5 epochs each
    python benchmarks/user_dataset.py --images 200 --epochs 1 --sleep-samples 96   # quick
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.utils.data
from PIL import Image

import fastload
from fastload.testing.synthetic import make_jpeg_folder

DATA = Path(__file__).resolve().parent.parent / ".fastload-data"


class JpegFiles(torch.utils.data.Dataset):
    """What a user writes: Pillow, a random-resized crop to 224, a flip, to a float tensor."""

    def __init__(self, root: Path, size: int = 224) -> None:
        self.files = sorted(str(p) for p in root.rglob("*.jpg"))
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as im:
            im = im.convert("RGB")
            w, h = im.size
            box = (0, 0, w, h)
            for _ in range(10):
                area = w * h * float(torch.empty(1).uniform_(0.08, 1.0))
                ratio = math.exp(float(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3))))
                cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
                if 0 < cw <= w and 0 < ch <= h:
                    x = int(torch.randint(0, w - cw + 1, (1,)))
                    y = int(torch.randint(0, h - ch + 1, (1,)))
                    box = (x, y, x + cw, y + ch)
                    break
            im = im.resize((self.size, self.size), Image.BILINEAR, box=box)
            if float(torch.rand(1)) < 0.5:
                im = im.transpose(Image.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
        return pixels, i % 10


class Waits(torch.utils.data.Dataset):
    """Waits ``sleep_s`` per sample (a remote read) and returns a small tensor."""

    def __init__(self, n: int, sleep_s: float = 0.01) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return torch.full((16,), float(i))


def one_epoch(loader) -> float:
    start = time.perf_counter()
    for _batch in loader:
        pass
    return time.perf_counter() - start


def epoch_seconds(loaders: list, epochs: int) -> list[float]:
    """Median epoch seconds of each loader, their epochs interleaved (the order alternating
    from one round to the next), so a drift in the machine's speed hits them alike."""
    times: list[list[float]] = [[] for _ in loaders]
    for round_ in range(epochs):
        order = list(range(len(loaders)))
        for i in order if round_ % 2 == 0 else reversed(order):
            times[i].append(one_epoch(loaders[i]))
    return [statistics.median(t) for t in times]


def build(make, *args, **kwargs):
    start = time.perf_counter()
    loader = make(*args, **kwargs)
    return loader, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--sleep-samples", type=int, default=640)
    parser.add_argument("--tensor-samples", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    root = DATA / f"synthetic-{args.images}"
    make_jpeg_folder(root, images=args.images, classes=10, size=(500, 375), quality=90)
    cores = os.cpu_count() or 1
    datasets = {
        "jpeg": JpegFiles(root),
        "sleep": Waits(args.sleep_samples),
        "tensor": torch.utils.data.TensorDataset(
            torch.randn(args.tensor_samples, 16), torch.arange(args.tensor_samples) % 10
        ),
    }
    targets = {"jpeg": 1.7, "sleep": 5.0, "tensor": 0.98}
    common = dict(batch_size=args.batch_size, shuffle=True)
    print(f"{cores} CPUs, torch {torch.__version__}, batch_size {args.batch_size}, "
          f"median of {args.epochs} epoch(s) per loader")
    print(f"{'dataset':<8}{'samples':>8}{'stock s':>9}{'fastload s':>12}{'ratio':>8}{'target':>8}"
          f"{'build s':>9}  workers")
    reasons = []
    for name, ds in datasets.items():
        stock, _ = build(torch.utils.data.DataLoader, ds, **common)
        fast, build_s = build(fastload.DataLoader, ds, **common)
        loaders = [stock, fast]
        if name == "sleep":
            loaders.append(torch.utils.data.DataLoader(ds, num_workers=cores, **common))
        t_stock, t_fast, *t_rule = epoch_seconds(loaders, args.epochs)
        n = fast.settings.num_workers.value
        print(f"{name:<8}{len(ds):>8}{t_stock:>9.2f}{t_fast:>12.2f}{t_stock / t_fast:>7.2f}x"
              f"{targets[name]:>7.2f}x{build_s:>9.2f}  {n}")
        if t_rule:
            print(f"{'  rule':<8}{'':>8}{t_rule[0]:>9.2f}{t_fast:>12.2f}{t_rule[0] / t_fast:>7.2f}x"
                  f"{2.0:>7.2f}x{'':>9}  {cores} (num_workers=os.cpu_count())")
        reasons.append((name, fast.settings.num_workers.reason))
        fast.engine.close()
    print()
    for name, reason in reasons:
        print(f"{name}: {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
