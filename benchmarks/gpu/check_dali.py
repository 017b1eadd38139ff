"""GPU check of the DALI engine: mixed (nvJPEG) decoding vs the torch engine, and GPU wait.

For a GPU machine (one command, about 2-4 minutes including making 3000 JPEGs):

    python benchmarks/gpu/check_dali.py

On the synthetic ImageNet-like JPEG set (3000 images 500x375, made once, reused), with the
same fastload.DataLoader, pipeline (eval: resize + center crop 224, uint8), batch size 128,
device="cuda" and seed, it prints:

1. images/s of the DALI engine (``backend="dali"``: "mixed" decoding on the GPU) and of the
   torch engine (``backend="torch"``: Pillow in auto-tuned worker processes), the median of
   3 epochs each, and their ratio;
2. the starvation meter's GPU wait per batch (p50, p95, share of the step) for a
   ResNet-50-sized training step (torchvision's resnet50 if installed, else an equivalent
   conv stack of about 4 GFLOPs/image, forward + backward, bf16 autocast) on each engine.

On a machine without CUDA (or without nvidia-dali) it prints that it skipped and exits 0.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent.parent.parent / ".fastload-data"
IMAGES, BATCH, SIZE, REPEATS, STEPS = 3000, 128, 224, 3, 15


def model_step():
    """A ResNet-50-sized training step: forward + backward + SGD, bf16 autocast."""
    try:
        import torchvision

        model = torchvision.models.resnet50()
        name = "torchvision resnet50"
    except ImportError:
        layers, ch = [], 3
        for out, stride in [(64, 2), (128, 2), (256, 2), (512, 2), (1024, 2), (2048, 1)]:
            layers += [torch.nn.Conv2d(ch, out, 3, stride, 1), torch.nn.BatchNorm2d(out), torch.nn.ReLU()]
            ch = out
        model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(ch, 1000))
        name = "conv stack (torchvision not installed)"
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, name


def epoch_rate(loader) -> float:
    start = time.perf_counter()
    n = 0
    for images, _ in loader:
        n += images.shape[0]
    torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def gpu_wait(loader, step) -> str:
    """Train STEPS batches under the loader's meter; its report of the GPU wait per batch."""
    loader.meter.reset()
    for i, (images, labels) in enumerate(loader):
        step(images, labels % 1000)
        if i + 1 == STEPS:
            break
    s = loader.meter.summary()
    return (f"wait p50 {s.wait_p50_s * 1e3:.1f} ms, p95 {s.wait_p95_s * 1e3:.1f} ms, "
            f"waiting {s.wait_share:.0%} of the step, verdict: {s.verdict.value}")


def cannot_run() -> str | None:
    """Why a DALI GPU check cannot run on this machine, or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as exc:
        return f"nvidia-dali does not import: {exc}; pip install 'fastload[dali]'"
    return None


def main() -> int:
    if why := cannot_run():
        print(f"check_dali: skipped ({why})")
        return 0
    import fastload
    from fastload.testing.synthetic import make_jpeg_folder

    root = make_jpeg_folder(DATA / f"jpeg-{IMAGES}", images=IMAGES, classes=10)
    dataset = fastload.ImageFolder(root, size=SIZE, seed=0)
    loaders = {
        engine: fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True, device="cuda", backend=engine)
        for engine in ("dali", "torch")
    }
    for engine, loader in loaders.items():
        print(f"{engine}: {loader.backend_reason}; workers={loader.settings.num_workers.value}")
        epoch_rate(loader)  # warm-up
    rates = {engine: [] for engine in loaders}
    for _ in range(REPEATS):
        for engine, loader in loaders.items():
            rates[engine].append(epoch_rate(loader))
    medians = {engine: statistics.median(r) for engine, r in rates.items()}
    for engine, m in medians.items():
        print(f"{engine:5s} engine: {m:9.1f} images/s  (runs: {', '.join(f'{r:.0f}' for r in rates[engine])})")
    print(f"ratio dali / torch: {medians['dali'] / medians['torch']:.2f}x")

    step, name = model_step()
    print(f"GPU wait per batch, {name}, batch {BATCH}, {STEPS} steps:")
    for engine, loader in loaders.items():
        print(f"  {engine:5s}: {gpu_wait(loader, step)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
