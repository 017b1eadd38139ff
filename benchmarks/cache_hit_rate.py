"""Hit rate over shuffled epochs with a cache of half the dataset: policy "keep" vs "lru".

Every epoch reads the synthetic JPEG set (made once under .fastload-data) in a new random
order, as a shuffled training loop does, through a disk tier whose budget holds --fraction
of the dataset's entries. "keep" (fastload's default) admits until full and then keeps what
it has, so about ``fraction`` of reads hit from epoch 1 on; LRU evicts what the next epoch
needs, and under repeated shuffled scans hits far less. Both policies see the same orders.
Prints each epoch's hit rate and the median over epochs 1.. (epoch 0 is cold).
Target: keep >= 0.45 at fraction 0.5.

    python benchmarks/cache_hit_rate.py                          # 500 images, 6 epochs
    python benchmarks/cache_hit_rate.py --images 2000 --epochs 10 --fraction 0.3
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

import fsspec

from fastload.cache import open_cache
from fastload.cache.entry import encode_header
from fastload.cache.keys import make_key
from fastload.io.versions import version_of
from fastload.testing.synthetic import make_jpeg_folder

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--fraction", type=float, default=0.5, help="cache size / dataset size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    local = make_jpeg_folder(ROOT / ".fastload-data" / f"cache-bench-{args.images}",
                             images=args.images, classes=10)
    fs = fsspec.filesystem("file")
    files = sorted(str(p) for p in local.rglob("*.jpg"))
    infos = {f: fs.info(f) for f in files}
    entry_bytes = sum(
        len(encode_header(make_key(fs.unstrip_protocol(f), version_of(i)), b"")) + i["size"]
        for f, i in infos.items()
    )
    budget = int(entry_bytes * args.fraction)
    rng = random.Random(args.seed)
    orders = [rng.sample(files, len(files)) for _ in range(args.epochs)]

    rates: dict[str, list[float]] = {}
    for policy in ("keep", "lru"):
        with tempfile.TemporaryDirectory(prefix="fastload-hitrate-") as d:
            cache = open_cache({"disk": d, "disk_size": budget, "policy": policy})
            tier = cache.tiers[0]
            rates[policy] = []
            for order in orders:
                before = tier.stats.hits
                for f in order:
                    cache.read(fs, f, version_of(infos[f]))
                rates[policy].append((tier.stats.hits - before) / len(order))
            cache.close()

    print(f"{args.images} JPEGs ({entry_bytes / 1e6:.1f} MB cached size), disk tier of "
          f"{args.fraction:.0%} = {budget / 1e6:.1f} MB, {args.epochs} shuffled epochs")
    for policy, values in rates.items():
        shown = " ".join(f"{v:.2f}" for v in values)
        print(f"  {policy:5s} hit rate per epoch: {shown}   median of epochs 1..: "
              f"{statistics.median(values[1:]):.3f}")
    keep, lru = (statistics.median(rates[p][1:]) for p in ("keep", "lru"))
    print(f"  keep / lru: {keep / max(lru, 1e-9):.1f}x   (target: keep >= 0.45 at 50%)")


if __name__ == "__main__":
    main()
