"""What tests/test_integrations_accelerate.py runs: a real Accelerate loop over fastload loaders.

Each rank writes ``<out>/rank<R>.json``: the sample ids (labels: one image per class) of every
training and validation batch it received, per epoch, and what the loaders said about their
engine. ``--stop-at K`` saves the state (``accelerator.save_state``) after K training batches
of epoch 0 and dies; ``--resume DIR`` loads it and skips the consumed batches with
``accelerator.skip_first_batches``, the recipe of Accelerate's own examples.

    torchrun --standalone --nproc_per_node 2 tests/dist_scripts/accelerate_run.py --data D --out O
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from fastload import DataLoader, ImageFolder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--loaders-first", action="store_true", help="build loaders before Accelerator()")
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--state", default="")
    parser.add_argument("--resume", default="")
    args = parser.parse_args()

    def loaders() -> tuple[DataLoader, DataLoader]:
        train = DataLoader(ImageFolder(args.data, size=16, train=True), batch_size=args.batch, shuffle=True)
        return train, DataLoader(ImageFolder(args.data, size=16), batch_size=args.batch)

    set_seed(7)
    if args.loaders_first:
        train, val = loaders()
    accelerator = Accelerator(cpu=True)
    if not args.loaders_first:
        train, val = loaders()
    model = torch.nn.Linear(3, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, train_dl, val_dl = accelerator.prepare(model, optimizer, train, val)
    rank = accelerator.process_index
    record: dict = {"rank": rank, "world": accelerator.num_processes, "train": [], "val": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        (out / f"rank{rank}.json").write_text(json.dumps(record))

    start_epoch, skip = 0, 0
    if args.resume:
        accelerator.load_state(args.resume)
        saved = json.loads((Path(args.resume) / "position.json").read_text())
        start_epoch, skip = saved["epoch"], saved["step"]
    for epoch in range(start_epoch, args.epochs):
        train_dl.set_epoch(epoch)  # the resumed process starts counting at 0
        active = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        skip = 0
        for step, (images, labels) in enumerate(active):
            record["train"].append([epoch, labels.tolist()])
            loss = model(images.float().mean(dim=(2, 3))).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            write()
            if args.stop_at and not args.resume and epoch == 0 and step + 1 == args.stop_at:
                accelerator.save_state(args.state)
                if accelerator.is_main_process:
                    (Path(args.state) / "position.json").write_text(json.dumps({"epoch": 0, "step": step + 1}))
                accelerator.wait_for_everyone()
                os._exit(3)  # the node dies after its checkpoint
        for images, labels in val_dl:
            record["val"].append([epoch, labels.tolist()])
    record["loaders"] = [{
        "prepared": f"{type(train_dl).__module__}.{type(train_dl).__name__}",
        "len": len(train_dl),
        "original_len": len(train),
        "reason": train.backend_reason,
        "settings": str(train.settings),
    }]
    write()
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
