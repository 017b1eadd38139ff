"""Lightning with fastload: the one changed import, under DDP too.

A small CNN on a synthetic JPEG set with `pytorch_lightning`; the loaders are built in the
LightningModule's hooks, as Lightning expects. Under DDP (`--devices 2`, CPU processes over
gloo here) each rank trains on its own half of every epoch: fastload's sampler is a
`DistributedSampler`, so Lightning leaves it alone and fastload's engine splits by rank
(docs/integrations.md). At the end each rank prints what its loader ran and the meter's verdict.

    python examples/lightning_train.py                      # one process
    python examples/lightning_train.py --devices 2          # DDP, two CPU processes
"""

from __future__ import annotations

import argparse
import tempfile

import pytorch_lightning as pl
import torch
from torch import nn

from fastload import DataLoader, ImageFolder  # was: from torch.utils.data import DataLoader
from fastload.testing.synthetic import make_jpeg_folder


class SmallCNN(pl.LightningModule):
    def __init__(self, root: str, classes: int, batch_size: int) -> None:
        super().__init__()
        self.root, self.batch_size = root, batch_size
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(8, classes),
        )
        self.samples = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.samples += len(labels)
        return nn.functional.cross_entropy(self(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val_loss", nn.functional.cross_entropy(self(images), labels), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        train = ImageFolder(self.root, size=64, train=True, normalize=True)
        return DataLoader(train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(ImageFolder(self.root, size=64, normalize=True), batch_size=self.batch_size)

    def on_train_end(self) -> None:
        loader = self.trainer.train_dataloader
        rank = self.trainer.global_rank
        print(f"[rank {rank}] trained on {self.samples} samples over {self.trainer.current_epoch} "
              f"epochs; engine: {loader.backend_reason}")
        print(f"[rank {rank}] {str(loader.meter.summary()).splitlines()[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--root", default=None, help="a folder of class folders; default: a synthetic set")
    args = parser.parse_args()
    pl.seed_everything(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or str(make_jpeg_folder(tmp, images=args.images, classes=4, size=(160, 120)))
        model = SmallCNN(root, classes=4, batch_size=16)
        trainer = pl.Trainer(
            accelerator="auto", devices=args.devices, max_epochs=args.epochs,
            strategy="ddp" if args.devices > 1 else "auto", logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )
        trainer.fit(model)


if __name__ == "__main__":
    main()
