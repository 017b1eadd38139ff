"""MixUp / CutMix on fastload's batches: in the training loop, on the CPU or after the copy.

torchvision's v2.MixUp and v2.CutMix (and timm's Mixup) take a batch ``(images, labels)``
and mix it: they run where the batch is, so with ``DataLoader(device=...)`` they run on the
device, after the copy (and after fastload's Normalize there). They draw from torch's global
generator in the training loop, as they would with torch's DataLoader.

    python examples/mixup.py path/to/imagefolder
"""

from __future__ import annotations

import sys

import torch
from torchvision.transforms import v2

import fastload

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main(root: str) -> None:
    transform = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.TrivialAugmentWide(),
                            v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    dataset = fastload.ImageFolder(root, transform=transform)
    device = torch.device("cuda") if torch.cuda.is_available() else None  # None: batches stay on the CPU
    loader = fastload.DataLoader(dataset, batch_size=64, shuffle=True, device=device)
    mix = v2.RandomChoice([v2.MixUp(num_classes=len(dataset.classes)),
                           v2.CutMix(num_classes=len(dataset.classes))])
    for images, labels in loader:
        images, labels = mix(images, labels)  # labels become (batch, classes) soft targets
        # timm: Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=n)(images, labels), an even batch
        print(images.shape, images.device, labels.shape, loader.backend)
        break


if __name__ == "__main__":
    main(sys.argv[1])
