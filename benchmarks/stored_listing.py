"""Start-up of an ImageFolder from its stored listing (NOTE [the stored listing]), and its size.

Two measurements, each build in a fresh Python process (what a restart or a new rank is):

* ``--samples N`` (default 1,000,000): a synthetic index of N ImageNet-like names with
  local-file versions is stored in a disk-tier cache over an empty root (no image files
  needed); prints the index's bytes per sample and the time ``ImageFolder(root,
  cache=...)`` takes to load it (median of ``--repeats``), import time excluded.
* ``--files M`` (default 0 = skipped): M real (empty) .jpg files in 1000 class folders;
  prints the first build (one listing, then stored) against the second (reused), and the
  listing requests each sent (``latency::`` counts them).

Targets (issue 14): the second start of a 1M dataset lists nothing and is ready in < 5 s;
< 200 bytes of index per sample per process.

    python benchmarks/stored_listing.py                       # 1M synthetic samples
    python benchmarks/stored_listing.py --samples 200000 --files 20000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_BUILD = """
import json, sys, time
t0 = time.perf_counter()
from fastload import ImageFolder
t1 = time.perf_counter()
url, cache = sys.argv[1], sys.argv[2]
options = {"latency": {"latency": 0.0}} if url.startswith("latency::") else None
ds = ImageFolder(url, size=224, cache=cache, storage_options=options)
t2 = time.perf_counter()
listings = ds.storage.fs.requests["find"] + ds.storage.fs.requests["ls"] if options else None
print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1, "samples": len(ds), "listings": listings}))
"""


def _build(url: str, cache: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _BUILD, url, cache], capture_output=True,
                          text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def synthetic(n: int, repeats: int, work: Path) -> None:
    from fastload.cache import open_cache
    from fastload.data.folder_rules import FolderRules
    from fastload.data.index import DatasetIndex
    from fastload.data.listing import prefix_of
    from fastload.data.stored_listing import StoredListing
    from fastload.io.storage import Storage

    root, cache = work / "synthetic_root", str(work / "synthetic_cache")
    root.mkdir()
    classes = [f"n{c:08d}" for c in range(1000)]
    paths = sorted(f"{classes[i % 1000]}/{classes[i % 1000]}_{i}.JPEG" for i in range(n))
    labels = [int(p[1:9]) for p in paths]
    versions = [f"{100_000 + i}:1764403200{i:09d}:{5_308_443 + i}:1764403200{i:09d}" for i in range(n)]
    storage = Storage(root)
    stored = StoredListing.of(open_cache(cache), storage, FolderRules(), {})  # ImageFolder's defaults
    index = DatasetIndex.build(prefix_of(storage), paths, labels, classes=classes,
                               versions=versions, extra=stored.extra())
    start = time.perf_counter()
    assert stored.save(index), "the disk tier refused the index"
    saved = time.perf_counter() - start
    runs = [_build(str(root), cache) for _ in range(repeats)]
    build = statistics.median(r["build_s"] for r in runs)
    each = ", ".join(f"{r['build_s']:.2f}" for r in runs)
    print(f"synthetic {n:,} samples: index {index.nbytes / n:.1f} bytes/sample "
          f"({index.nbytes / 1e6:.0f} MB), stored in {saved:.2f} s; ImageFolder from the stored "
          f"listing {build:.2f} s median of {repeats} (runs: {each}; import "
          f"{runs[0]['import_s']:.1f} s)")


def real_files(m: int, work: Path) -> None:
    root, cache = work / "files", str(work / "files_cache")
    for i in range(m):
        folder = root / f"n{i % 1000:08d}"
        if i < 1000:
            folder.mkdir(parents=True)
        (folder / f"{i}.jpg").touch()
    first = _build(f"latency::{root}", cache)
    second = _build(f"latency::{root}", cache)
    print(f"{m:,} files: first build {first['build_s']:.2f} s ({first['listings']} listing "
          f"requests), second {second['build_s']:.2f} s ({second['listings']} listing requests)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fastload-stored-listing-") as tmp:
        if args.samples:
            synthetic(args.samples, args.repeats, Path(tmp))
        if args.files:
            real_files(args.files, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
