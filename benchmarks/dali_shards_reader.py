"""DALI on local tar shards: fastload's byte feed vs DALI's own webdataset reader.

The measurement behind docs/engines.md's "DALI and tar shards" (NOTE [DALI's reader,
exactly] in fastload/engines/dali_reader.py). The same loader's epochs, storage order
(``shuffle=False``, where the reader path applies), once with the engine's reader path and
once with ``engine.shard_reader = False`` (the byte feed); the batches are compared for
equality. Synthetic ImageNet-like JPEGs (500x375) packed by ``fastload.data.pack.pack``,
RandomResizedCrop + flip, uint8 out. Run once, small:

    python benchmarks/dali_shards_reader.py                       # CPU DALI, 256 images
    python benchmarks/dali_shards_reader.py --gpu --images 4096   # where a CUDA GPU is
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastload import DataLoader, TarShards  # noqa: E402
from fastload.data.pack import pack  # noqa: E402
from fastload.testing.synthetic import make_jpeg_folder  # noqa: E402
from tests.contracts.resume import same_batches  # noqa: E402


def epoch(ds: TarShards, reader: bool, args: argparse.Namespace) -> tuple[float, list, str]:
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=False, backend="dali",
                        meter=False, device="cuda" if args.gpu else None)
    loader.engine.shard_reader = reader
    start = time.perf_counter()
    batches = [(x.cpu(), y) for x, y in loader]
    return time.perf_counter() - start, batches, loader.engine.reads


def main(argv: list[str] | None = None) -> bool:
    """Run the comparison; True when every round's batches were identical both ways."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--gpu", action="store_true", help="DALI on CUDA GPU 0 (mixed decode)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    src = make_jpeg_folder(ROOT / ".fastload-data" / f"pack-bench-{args.images}",
                           images=args.images, classes=10, size=(500, 375))
    with tempfile.TemporaryDirectory(prefix="fastload-dali-reader-") as work:
        tars = [u.removeprefix("file://") for u in pack(str(src), work, shard_size=4e6).urls]
        ds = TarShards(tars, size=args.size, train=True, seed=0)
        n = len(ds)
        print(f"{n} JPEGs (500x375) in {len(tars)} local shards, batch {args.batch_size}, "
              f"RandomResizedCrop {args.size} + flip, storage order, DALI on "
              f"{'GPU 0' if args.gpu else 'CPU'}")
        identical = True
        for _ in range(args.repeats):
            fed_s, fed, _ = epoch(ds, False, args)
            read_s, read, how = epoch(ds, True, args)
            same = same_batches(fed, read)
            identical &= same
            print(f"  byte feed {n / fed_s:8.1f} img/s   {how}: {n / read_s:8.1f} img/s   "
                  f"({fed_s / read_s:.2f}x)   batches identical: {same}")
    return identical


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
