"""What torchrun runs for tests/test_distributed.py: iterate a fastload loader, record what it saw.

Each rank writes ``<out>/rank<R>.json`` with the loader's seed and, per epoch, the sample ids
of every batch it received. Optional steps: resume from ``--resume`` (this rank's state file,
or rank 0's with ``--resume-from-rank0``), and ``--save-at K``: after K batches of the first
epoch save ``<out>/state<R>.pt``, take one more batch (work lost in the crash), then SIGKILL
the process, the way a node dies.

    torchrun --standalone --nproc_per_node=2 tests/dist_scripts/epochs.py --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from fastload import DataLoader, ImageFolder


class Ids(Dataset):
    """Sample i is the tensor [i]: what a rank saw is the ids it received."""

    fastload_worker_safe = True

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(int(i))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--resume", type=Path, default=None, help="directory with state<R>.pt files")
    p.add_argument("--resume-from-rank0", action="store_true")
    p.add_argument("--images", default=None, help="an ImageFolder URL instead of ids")
    p.add_argument("--cache", default=None, help="ImageFolder cache spec as JSON; {rank} -> rank")
    p.add_argument("--storage-options", default=None, help="fsspec options, as JSON")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # deliberately different: the loader must agree on rank 0's

    if args.images:
        dataset = ImageFolder(
            args.images, size=32,
            cache=json.loads(args.cache.replace("{rank}", str(rank))) if args.cache else None,
            storage_options=json.loads(args.storage_options) if args.storage_options else None,
        )
    else:
        dataset = Ids(args.samples)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    if args.resume is not None:
        source = 0 if args.resume_from_rank0 else rank
        loader.load_state_dict(torch.load(args.resume / f"state{source}.pt", weights_only=False))

    record = {"rank": rank, "world": dist.get_world_size(), "seed": loader.sampler.seed, "epochs": []}
    first = loader.epoch
    for epoch in range(first, args.epochs):
        seen: list[list[int]] = []
        record["epochs"].append({"epoch": epoch, "batches": seen})
        for batch in loader:
            labels = batch[1] if args.images else batch  # images: their labels
            seen.append([int(x) for x in labels])
            if args.save_at is not None and epoch == first and len(seen) == args.save_at:
                torch.save(loader.state_dict(), args.out / f"state{rank}.pt")
                _write(args.out, rank, record)
                dist.barrier()  # every rank has saved before any dies
                next(iter(loader), None)
                os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()  # DDP keeps ranks in step (its all-reduce); so does this loop
    _write(args.out, rank, record)
    dist.barrier()
    dist.destroy_process_group()


def _write(out: Path, rank: int, record: dict) -> None:
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, out / f"rank{rank}.json")


if __name__ == "__main__":
    main()
