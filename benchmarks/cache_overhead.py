"""What the cache costs per object on tiny local JPEGs: no cache vs cold vs warm epoch.

Issue 14's budget: a cold epoch with a cache costs at most 10% more than one without, and a
warm one about the same. The set is ``--n`` copies of one ~1.3 KB JPEG (a file each, not
hard links: another process linking the source would change every link's ctime, so its
version) in 1,000 class folders, made once under .fastload-data/overhead-N, read by
``ImageFolder(size=16)`` through ``fastload.DataLoader(batch_size=256)``. Per repeat and
worker count, interleaved: an epoch without a cache, the first epoch with a cache in a new
directory (cold: a stat, a batched miss, a local read and a put per object, NOTE [batched
reads], NOTE [write-behind]) and its second epoch (warm: a stat and a batched hit per
object, NOTE [a stat per local read]; the loader lists nothing between epochs of a local
root). The overheads are the medians of each repeat's ratios to its own epoch without a
cache. ``listing``: what an explicit ``ds.revalidate()`` (one listing of the root) costs,
timed apart: what the loader ran before every epoch until the stat per read replaced it.

    python benchmarks/cache_overhead.py                       # 2,000 objects, 0 and 2 workers
    python benchmarks/cache_overhead.py --n 10000 --repeats 7 --workers 2
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_set(n: int, classes: int = 1000) -> Path:
    """``n`` copies of one small JPEG in ``classes`` folders (reused when present)."""
    root = ROOT / ".fastload-data" / f"overhead-{n}"
    if (root / ".complete").exists():
        return root
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 255, (24, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, format="JPEG", quality=60)
    for i in range(n):
        folder = root / f"n{i % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:08d}.JPEG").write_bytes(buf.getvalue())
    (root / ".complete").touch()
    return root


def epoch(loader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def measure(root: Path, workers: int, repeats: int) -> dict[str, float]:
    from fastload import DataLoader, ImageFolder

    times: dict[str, list[float]] = {"none": [], "cold": [], "warm": [], "revalidate": []}
    for _ in range(repeats):
        ds = ImageFolder(str(root), size=16)
        times["none"].append(epoch(DataLoader(ds, batch_size=256, num_workers=workers)))
        with tempfile.TemporaryDirectory(dir=ROOT) as cache:
            ds = ImageFolder(str(root), size=16, cache={"disk": cache})
            loader = DataLoader(ds, batch_size=256, num_workers=workers)
            times["cold"].append(epoch(loader))
            times["warm"].append(epoch(loader))
            start = time.perf_counter()
            ds.revalidate()
            times["revalidate"].append(time.perf_counter() - start)
    out = {k: statistics.median(v) for k, v in times.items()}
    # per repeat, cold and warm against the epoch without a cache just before: a machine
    # that drifts during the run moves both sides of a pair
    out["cold ovh"] = statistics.median(c / n - 1 for c, n in zip(times["cold"], times["none"]))
    out["warm ovh"] = statistics.median(w / n - 1 for w, n in zip(times["warm"], times["none"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="objects in the set")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    root = make_set(args.n)
    print(f"{args.n:,} JPEGs of {next(root.glob('*/*.JPEG')).stat().st_size} bytes, size=16, "
          f"batch 256, median of {args.repeats}")
    print(f"  {'workers':>7s} {'no cache':>9s} {'cold':>8s} {'warm':>8s} {'cold ovh':>9s} "
          f"{'warm ovh':>9s} {'listing':>10s} {'cold us/obj':>11s}")
    for workers in args.workers:
        m = measure(root, workers, args.repeats)
        per_object = (m["cold"] - m["none"]) / args.n * 1e6
        print(f"  {workers:7d} {m['none']:8.3f}s {m['cold']:7.3f}s {m['warm']:7.3f}s "
              f"{m['cold ovh']:+9.1%} {m['warm ovh']:+9.1%} "
              f"{m['revalidate'] * 1e3:8.1f}ms {per_object:11.1f}")


if __name__ == "__main__":
    main()
