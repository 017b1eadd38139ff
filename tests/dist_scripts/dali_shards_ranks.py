"""What torchrun runs for tests/test_dali_shards.py's DDP test: the DALI engine on each rank,
over local TarShards, once with DALI's own webdataset reader and once with the byte feed.

Each rank writes ``<out>/rank<R>.json``: per epoch, how the reader path read, the labels it
gave, the labels of the rank's order, and whether its batches equal the byte feed's.

    torchrun --standalone --nproc_per_node=2 tests/dist_scripts/dali_shards_ranks.py SHARDS... --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from fastload import DataLoader, TarShards


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shards", nargs="+")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = TarShards(args.shards, size=24, train=True, seed=5, shuffle_window=1)
    reader = DataLoader(ds, batch_size=4, shuffle=True, backend="dali", meter=False)
    feed = DataLoader(ds, batch_size=4, shuffle=True, backend="dali", meter=False)
    feed.engine.shard_reader = False
    epochs = []
    for epoch in range(2):
        order = [int(i) for i in reader.epoch_sampler.indices(epoch)]
        a, b = list(reader), list(feed)
        same = len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                        for x, y in zip(a, b))
        epochs.append({"reads": reader.engine.reads, "same": same,
                       "labels": [int(y) for _, ys in a for y in ys],
                       "expected": [ds.label(i) for i in order], "keys": [ds.index.key(i) for i in order]})
    (args.out / f"rank{rank}.json").write_text(json.dumps({"epochs": epochs}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
