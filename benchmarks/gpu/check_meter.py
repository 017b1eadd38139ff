"""GPU check of the starvation meter's CUDA-event path (NOTE [GPU idle from two events]).

For a GPU machine (one command, well under a minute):

    python benchmarks/gpu/check_meter.py

A ResNet-50-sized step (torchvision's resnet50 when installed, else a plain conv stack of
similar cost) trains on batches of 64 x 3 x 224 x 224 fed by ``fastload.DataLoader(...,
device="cuda")`` from an in-memory uint8 dataset, in two cases:

* compute-bound: batches are ready at once: the GPU should barely idle;
* input-bound:   every batch takes ``--produce-ms`` (sleep in the collate, main process),
                 longer than the step: the GPU should idle about produce - step per batch.

It prints, per case, host wait and GPU idle per batch (p50, mean), their share of step
time and the verdict, and checks that every batch got a GPU idle reading (read back lazily,
no synchronize on the hot path), that the input-bound case idles far longer than the
compute-bound one, and that the compute-bound case is not judged input-bound. Exit status
1 if a check fails. On a machine without CUDA it prints "no CUDA device: skipped", exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset
from torch.utils.data.dataloader import default_collate

import fastload
from fastload.meter import Verdict


class Frames(Dataset):
    """uint8 images already in memory: reading costs nothing."""

    def __init__(self, n: int, side: int) -> None:
        self.images = torch.randint(0, 256, (16, 3, side, side), dtype=torch.uint8)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i % 16], i % 10


class Produce:
    """Collate taking ``seconds`` per batch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, samples: list) -> object:
        if self.seconds:
            time.sleep(self.seconds)
        return default_collate(samples)


def resnet50_sized() -> nn.Module:
    try:
        import torchvision

        return torchvision.models.resnet50(num_classes=10)
    except ImportError:
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.ReLU()]
        width = 64
        for out in (256, 512, 1024, 2048):
            layers += [nn.Conv2d(width, out, 3, stride=2, padding=1), nn.BatchNorm2d(out), nn.ReLU(),
                       nn.Conv2d(out, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            width = out
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def run(model, optimizer, produce_ms: float, batches: int, batch_size: int) -> fastload.meter.Summary:
    loader = fastload.DataLoader(
        Frames(batches * batch_size, 224), batch_size=batch_size, num_workers=0,
        collate_fn=Produce(produce_ms / 1000), device="cuda",
    )
    for images, labels in loader:
        x = images.float().div_(255)
        loss = nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    summary = loader.meter.summary()
    records = loader.meter.records()
    missing = [r["batch"] for r in records if r["gpu_idle_s"] is None]
    if missing:
        raise SystemExit(f"FAIL: no GPU idle reading for batches {missing}")
    idle = [r["gpu_idle_s"] * 1e3 for r in records[1:]]
    wait = [r["wait_s"] * 1e3 for r in records[1:]]
    print(
        f"  produce {produce_ms:5.1f} ms: host wait p50 {statistics.median(wait):7.2f} ms "
        f"mean {statistics.fmean(wait):7.2f} ms | GPU idle p50 {statistics.median(idle):7.2f} ms "
        f"mean {statistics.fmean(idle):7.2f} ms | step {summary.step_mean_s * 1e3:7.2f} ms | "
        f"GPU idle {summary.gpu_idle_share:.1%} of step | {summary.verdict.value}"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--produce-ms", type=float, default=200.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    torch.backends.cudnn.benchmark = True
    model = resnet50_sized().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"{torch.cuda.get_device_name()}: ResNet-50-sized step, batch {args.batch_size}")
    run(model, optimizer, 0.0, 5, args.batch_size)  # warm-up: cuDNN autotune, allocator
    fed = run(model, optimizer, 0.0, args.batches, args.batch_size)
    starved = run(model, optimizer, args.produce_ms, args.batches // 2, args.batch_size)
    print("\n" + str(starved))
    failures = []
    if fed.verdict is Verdict.HIGHLY:
        failures.append(f"compute-bound case judged {fed.verdict.value}")
    if starved.verdict is not Verdict.HIGHLY:
        failures.append(f"input-bound case judged {starved.verdict.value}")
    if not (starved.gpu_idle_p50_s or 0) > 10 * (fed.gpu_idle_p50_s or 0) + 0.005:
        failures.append("input-bound GPU idle is not clearly above the compute-bound one")
    for f in failures:
        print(f"FAIL: {f}")
    print("ok" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
