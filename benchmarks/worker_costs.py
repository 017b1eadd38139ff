"""What a torch worker process costs on this machine: the constants of fastload/tuning/workers.py.

* IPC per sample: the main process's CPU time (``time.thread_time`` of the loop's thread;
  torch's pin thread is not involved on CPU) per sample received from one worker, for a
  small sample (16 floats) at batch_size 1 and 32, and for an image-sized one (3x224x224
  float32, 588 KB) at batch_size 32: the difference gives the cost per byte.
* In-process per sample: the same loop without workers (fetch + collate in the main process).
* Start-up: seconds from ``iter(loader)`` to the first batch with 2 workers, per start method.
* Memory: a worker's private memory (USS: Private_Clean + Private_Dirty of smaps_rollup)
  right after it starts, read inside the worker, per start method.

    python benchmarks/worker_costs.py           # about 15 s on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.utils.data


class Zeros(torch.utils.data.Dataset):
    def __init__(self, n: int, numel: int) -> None:
        self.n, self.numel = n, numel

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(self.numel)


class OwnMemory(torch.utils.data.Dataset):
    """Each sample is the private memory (bytes) of the process that fetched it."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        fields = {}
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
        return fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def main_cpu_per_sample(dataset, *, workers: int, batch_size: int) -> float:
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers)
    it = iter(loader)
    next(it)  # start-up is not IPC
    n, c0 = 0, time.thread_time()
    for batch in it:
        n += batch.shape[0]
    return (time.thread_time() - c0) / n


def first_batch_s(context: str) -> float:
    loader = torch.utils.data.DataLoader(Zeros(64, 16), batch_size=8, num_workers=2,
                                         multiprocessing_context=context)
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    seconds = time.perf_counter() - start
    del it
    return seconds


def worker_memory(context: str) -> int:
    loader = torch.utils.data.DataLoader(OwnMemory(), batch_size=None, num_workers=1,
                                         multiprocessing_context=context)
    return max(int(x) for x in loader)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    small, image = Zeros(args.samples, 16), Zeros(args.samples // 8, 3 * 224 * 224)
    rows = [
        ("small, batch 1, 1 worker", small, 1, 1),
        ("small, batch 32, 1 worker", small, 1, 32),
        ("small, batch 1, in-process", small, 0, 1),
        ("small, batch 32, in-process", small, 0, 32),
        ("image, batch 32, 1 worker", image, 1, 32),
    ]
    got = {}
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}; median of {args.repeats}")
    for name, ds, workers, bs in rows:
        got[name] = statistics.median(main_cpu_per_sample(ds, workers=workers, batch_size=bs)
                                      for _ in range(args.repeats))
        print(f"  main-process CPU per sample, {name:<28} {got[name] * 1e6:8.1f} us")
    extra_bytes = (3 * 224 * 224 - 16) * 4
    per_byte = (got["image, batch 32, 1 worker"] - got["small, batch 32, 1 worker"]) / extra_bytes
    print(f"  per pickled byte received (image - small, batch 32): {per_byte * 1e9:.3f} ns")
    for context in ("fork", "forkserver", "spawn"):
        start = statistics.median(first_batch_s(context) for _ in range(2))
        print(f"  first batch from 2 {context} workers: {start:.3f} s; "
              f"one worker's private memory: {worker_memory(context) / (1 << 20):.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
