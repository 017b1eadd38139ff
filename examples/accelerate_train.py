"""Accelerate with fastload: the one changed import, prepare() as usual, and the faster way.

A small CNN on a synthetic JPEG set with Hugging Face Accelerate, two ways:

* ``--mode prepare`` (default): the loader goes through ``accelerator.prepare`` like any
  DataLoader. Accelerate re-creates it as torch's own class and splits it by rank; fastload
  makes sure the batches are the user's and the split is the only one, and says in
  ``backend_reason`` that its engine does not run inside Accelerate's loader.
* ``--mode fastload``: the loader stays out of ``prepare`` and gets ``device=
  accelerator.device``: fastload splits by rank itself and its engine and meter run.

It also saves the state mid-epoch and resumes with ``skip_first_batches`` when asked
(``--resume-demo``), checking that the resumed batches are the ones the first run had next.
docs/integrations.md says what Accelerate does to a loader and what fastload does about it.

    python examples/accelerate_train.py
    torchrun --standalone --nproc_per_node 2 examples/accelerate_train.py --mode fastload
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn

from fastload import DataLoader, ImageFolder  # was: from torch.utils.data import DataLoader
from fastload.testing.synthetic import make_jpeg_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("prepare", "fastload"), default="prepare")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--resume-demo", action="store_true", help="save mid-epoch, resume, compare")
    args = parser.parse_args()
    set_seed(0)
    accelerator = Accelerator()
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_jpeg_folder(tmp, images=args.images, classes=4, size=(160, 120))
        train = ImageFolder(root, size=64, train=True, normalize=True)
        if args.mode == "prepare":
            loader = DataLoader(train, batch_size=16, shuffle=True)
            model, optimizer, train_dl = accelerator.prepare(model, optimizer, loader)
        else:
            model, optimizer = accelerator.prepare(model, optimizer)
            loader = train_dl = DataLoader(train, batch_size=16, shuffle=True, device=accelerator.device)
        for epoch in range(args.epochs):
            if args.mode == "prepare":
                train_dl.set_epoch(epoch)
            seen = 0
            for images, labels in train_dl:
                loss = nn.functional.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                seen += len(labels)
            accelerator.print(f"epoch {epoch}: rank 0 trained on {seen} samples")
        accelerator.print(f"engine: {loader.backend_reason}")
        if args.mode == "fastload":
            accelerator.print(str(loader.meter.summary()).splitlines()[0])
        if args.resume_demo and args.mode == "prepare":
            resume_demo(accelerator, train_dl, tmp)


def resume_demo(accelerator: Accelerator, train_dl, tmp: str) -> None:
    """Save after 3 batches of epoch 0, resume with skip_first_batches: the same next batches."""
    train_dl.set_epoch(0)
    expected = [labels.tolist() for _, labels in train_dl][3:]
    accelerator.save_state(f"{tmp}/state")
    accelerator.load_state(f"{tmp}/state")
    train_dl.set_epoch(0)
    resumed = [labels.tolist() for _, labels in accelerator.skip_first_batches(train_dl, 3)]
    assert resumed == expected, "the resumed batches differ from the uninterrupted run's"
    accelerator.print(f"resume: the {len(resumed)} batches after the 3rd are the uninterrupted run's")


if __name__ == "__main__":
    main()
