"""What torchrun runs for the DDP tests of tests/test_shards.py and tests/test_parquet.py: a
TarShards (or, for a ``.parquet`` pattern, a ParquetImages) loader on each rank.

Each rank writes ``<out>/rank<R>.json``: the loader's seed and, per epoch, the sample keys and
shards (row groups) it received, in order.

    torchrun --standalone --nproc_per_node=2 tests/dist_scripts/shards_ranks.py SHARDS --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from fastload import DataLoader, ParquetImages, TarShards


def open_dataset(pattern: str):
    """The dataset, a sample's key and a sample's shard (a Parquet file's row group)."""
    if pattern.endswith(".parquet"):
        ds = ParquetImages(pattern, size=16, shuffle_window=1)
        return ds, ds.sample_name, ds.index.group_of
    ds = TarShards(pattern, size=16, shuffle_window=1)
    return ds, ds.index.key, lambda i: int(ds.index.shards[i])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shards")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # deliberately different: the loader agrees on rank 0's
    ds, key, shard = open_dataset(args.shards)
    loader = DataLoader(ds, batch_size=4, shuffle=True, backend="threads")
    epochs = []
    for epoch in range(args.epochs):
        order = [int(i) for i in loader.epoch_sampler.indices(epoch)]
        labels = [int(y) for _, ys in loader for y in ys]
        epochs.append({"keys": [key(i) for i in order],
                       "shards": [shard(i) for i in order],
                       "labels": labels, "expected": [ds.label(i) for i in order]})
    (args.out / f"rank{rank}.json").write_text(json.dumps({"seed": loader.epoch_sampler.seed,
                                                           "epochs": epochs}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
