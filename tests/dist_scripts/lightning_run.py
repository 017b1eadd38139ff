"""What tests/test_lightning.py runs: a real Lightning fit over fastload loaders.

Each rank writes ``<out>/rank<R>.json``: the sample ids (labels: one image per class) of every
training and validation batch it received, per epoch, and which engine the loader Lightning
iterated ran. The ids are written after every batch, so a run killed mid-epoch leaves what it
had seen.

    python tests/dist_scripts/lightning_run.py --data D --out O --devices 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

if "--late-import" not in sys.argv:
    from fastload import DataLoader, ImageFolder, TarShards  # the import users change, at the top


def loaders(args: argparse.Namespace) -> tuple:
    if args.late_import:  # fastload first touched inside the hook, after Lightning patched
        from fastload import DataLoader, ImageFolder, TarShards  # noqa: F811
    else:
        from fastload import DataLoader, ImageFolder, TarShards  # noqa: F811 - the same classes
    if args.shards:  # the same images as tar shards: the shard-aware order, split by rank
        source = TarShards(args.shards, size=16, train=True, shuffle_window=2)
    else:
        source = ImageFolder(args.data, size=16, train=True)
    train = DataLoader(source, batch_size=args.batch, shuffle=True)
    val = DataLoader(ImageFolder(args.data, size=16), batch_size=args.batch)
    return train, val


class Recorder(pl.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(3, 4)
        self.record: dict = {"train": [], "val": []}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.float().mean(dim=(2, 3)))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.record["train"].append([self.current_epoch, labels.tolist()])
        return self(images).sum()

    def predict_step(self, batch, batch_idx):
        self.record.setdefault("predict", []).append(batch[1].tolist())
        if batch_idx == 0:
            loader = self.trainer.predict_dataloaders
            self.record["predict_loader"] = {
                "class": f"{type(loader).__module__}.{type(loader).__name__}",
                "backend": getattr(loader, "backend", None),
                "collate": getattr(getattr(loader, "collate_fn", None), "__name__", None),
                "reason": getattr(loader, "backend_reason", None),
            }
        self.write()

    def validation_step(self, batch, batch_idx):
        if self.trainer.sanity_checking:
            return
        images, labels = batch
        self.record["val"].append([self.current_epoch, labels.tolist()])

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.write()
        if self.args.stop_at and self.global_step == self.args.stop_at:
            self.trainer.save_checkpoint(self.args.ckpt)
            self.write()
            os._exit(3)  # the node dies: nothing after the checkpoint is kept

    def on_train_epoch_end(self):
        loader = self.trainer.train_dataloader
        self.record.setdefault("loaders", []).append({
            "class": f"{type(loader).__module__}.{type(loader).__name__}",
            "backend": getattr(loader, "backend", None),
            "reason": getattr(loader, "backend_reason", None),
            "len": len(loader),
            "settings": str(getattr(loader, "settings", "")),
            "batches": self.trainer.num_training_batches,
        })
        self.write()

    def write(self) -> None:
        rank = self.trainer.global_rank
        Path(self.args.out).mkdir(parents=True, exist_ok=True)
        path = Path(self.args.out) / f"rank{rank}.json"
        path.write_text(json.dumps({**self.record, "rank": rank, "world": self.trainer.world_size}))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return self.loaders()[0]

    def val_dataloader(self):
        return self.loaders()[1]

    def loaders(self):
        if not hasattr(self, "_loaders"):
            self._loaders = loaders(self.args)
        return self._loaders


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--shards", default="", help="train on these tar shards (a brace pattern)")
    parser.add_argument("--no-distributed-sampler", action="store_true")
    parser.add_argument("--late-import", action="store_true")
    parser.add_argument("--fit-with-loaders", action="store_true", help="trainer.fit(model, loaders)")
    parser.add_argument("--stop-at", type=int, default=0, help="checkpoint at this step, then die")
    parser.add_argument("--ckpt", default="")
    parser.add_argument("--resume", default="", help="trainer.fit(ckpt_path=...)")
    parser.add_argument("--predict", action="store_true", help="then trainer.predict over the val loader")
    args = parser.parse_args()
    torch.manual_seed(7)
    model = Recorder(args)
    trainer = pl.Trainer(
        accelerator="cpu", devices=args.devices, max_epochs=args.epochs,
        strategy="ddp" if args.devices > 1 else "auto",
        use_distributed_sampler=not args.no_distributed_sampler,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=1,
    )
    if args.fit_with_loaders:
        train, val = loaders(args)
        trainer.fit(model, train_dataloaders=train, val_dataloaders=val, ckpt_path=args.resume or None)
    else:
        trainer.fit(model, ckpt_path=args.resume or None)
    if args.predict:
        trainer.predict(model, dataloaders=loaders(args)[1])
    model.write()


if __name__ == "__main__":
    main()
