"""Is my training input-bound? A small CNN trained on a synthetic JPEG set, measured twice.

The same model, data and number of steps run first on the stock torch DataLoader (measured
with ``fastload.meter.measure``), then on ``fastload.DataLoader`` (whose meter is built in),
and each prints the starvation meter's summary: how long the loop waited per batch, the
share of step time that is, the verdict, the bottleneck and the fix. CPU is fine.

    python examples/train_small_cnn.py                    # 256 images, 1 epoch each
    python examples/train_small_cnn.py --images 2000 --epochs 2 --plot meter.png
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.utils.data
from torch import nn

import fastload
from fastload.meter import measure
from fastload.testing.synthetic import make_jpeg_folder


def small_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )


def train(batches, classes: int, epochs: int, device: torch.device) -> float:
    """Train a fresh model for ``epochs`` passes over ``batches``; returns seconds taken."""
    torch.manual_seed(0)
    model = small_cnn(classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = time.perf_counter()
    for _ in range(epochs):
        for images, labels in batches:
            images, labels = images.to(device), labels.to(device)
            if images.dtype == torch.uint8:  # the stock path gets uint8 too: same work
                images = images.float().div_(255)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=64, help="training image side in pixels")
    parser.add_argument("--plot", default=None, help="write fastload's meter plot to this PNG")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)

    with tempfile.TemporaryDirectory() as tmp:
        root = make_jpeg_folder(tmp, images=args.images, classes=4, size=(320, 240))
        data = fastload.ImageFolder(root, size=args.size, train=True, seed=0)
        classes = len(data.classes)

        stock = measure(torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True))
        took = train(stock, classes, args.epochs, device)
        print(f"== stock torch DataLoader (its defaults), {took:.1f} s")
        print(stock.meter.summary())

        loader = fastload.DataLoader(data, batch_size=args.batch_size, shuffle=True)
        took = train(loader, classes, args.epochs, device)
        print(f"\n== fastload.DataLoader (auto settings), {took:.1f} s")
        print(f"settings:\n{loader.settings}")
        print(loader.meter.summary())
        if args.plot:
            loader.meter.plot(args.plot)
            print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
