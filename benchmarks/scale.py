"""ImageNet scale: what 10k, 100k and 1M small objects cost, packed cache store vs per-file.

For each N, a dataset of N tiny JPEGs (hard links of one ~1 KB file, in 1,000 class folders,
made once under .fastload-data/scale-N) is measured side by side in one run:

* listing: torchvision's ``ImageFolder(root)`` and fastload's ``ImageFolder(root)``;
* per disk format (``packed``, today's default; ``files``, one file per entry as before):
  the first start with a cache (lists, stores the listing), ``fastload cache warm`` (the
  installed console script, local disk, objects/s), ``cache stats`` and ``cache verify``
  (console script, wall time), the second start in a fresh process (ImageFolder + DataLoader
  + first batch: it should list nothing), and the epoch: no cache, cold cache, warm cache.
  The epochs without a cache and with the packed cache are ``--epoch-repeats`` interleaved
  pairs (each cold one in a new cache directory): medians, and the cold-epoch overhead is
  the median of the pairs' ratios, so a machine that drifts during the run moves both
  sides of a pair. The warm epoch is the loader's second: for these local files it lists
  nothing (NOTE [a stat per local read]);
* memory: bytes of the dataset's index per sample (tracemalloc, fresh process) for fastload
  and torchvision, and what a forked worker's private memory grows by when it reads every
  sample's path and label (copy-on-read, pytorch/pytorch#13246).

and warm from ``latency::`` over the local files (``--remote-n`` objects, 15 ms per request)
and from moto S3 with and without that latency (``--moto-n``).

Epochs read at most ``--epoch-samples`` samples (a random subset, the same for every
loader), so a 1M row reports rates over that subset; the per-file tier warms at most
``--files-cap`` objects (``--shard``); both caps are printed where they apply.

    python benchmarks/scale.py                                   # N = 10k, 100k, 1M
    python benchmarks/scale.py --sizes 10000 --remote-n 2000 --epoch-samples 5000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".fastload-data"
FASTLOAD = str(Path(sys.executable).with_name("fastload"))
FORMATS = ("packed", "files")
LINKS_PER_SOURCE = 50_000


# -- the dataset --------------------------------------------------------------------------

def make_links(n: int, classes: int = 1000) -> Path:
    """``n`` hard links of small JPEGs (one file per 50,000) in ``classes`` folders (reused when present)."""
    root = DATA / f"scale-{n}"
    done = root / ".complete"
    if done.exists():
        return root
    import numpy as np
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    for c in range(classes):
        (root / f"n{c:08d}").mkdir(exist_ok=True)
    for i in range(n):
        if i % LINKS_PER_SOURCE == 0:  # ext4 allows 65,000 links to one inode
            source = DATA / f"scale-{n}.sources" / f"{i // LINKS_PER_SOURCE}.jpg"  # its own
            source.parent.mkdir(exist_ok=True)
            if not source.exists():
                Image.fromarray(pixels).save(source, quality=85)
        target = root / f"n{i % classes:08d}" / f"img_{i:08d}.JPEG"
        if not target.exists():
            os.link(source, target)
    done.write_text(str(n))
    return root


# -- steps run in fresh processes ---------------------------------------------------------

def run_cli(*args: str) -> tuple[float, int, str]:
    """Wall seconds, exit code and stdout of the installed ``fastload`` console script."""
    start = time.perf_counter()
    done = subprocess.run([FASTLOAD, *args], capture_output=True, text=True, check=False)
    return time.perf_counter() - start, done.returncode, done.stdout


def child(step: str, **kw: Any) -> dict[str, Any]:
    """Run ``step`` of this file in a fresh interpreter; its JSON result."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", step, "--child-args", json.dumps(kw)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {step} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _uss() -> int:
    import psutil

    return psutil.Process().memory_full_info().uss


def step_index_memory(root: str, cache: str | None, kind: str) -> dict[str, Any]:
    """Bytes of the dataset object's allocations per sample, and a forked child's growth."""
    import tracemalloc

    if kind == "torchvision":
        from torchvision.datasets import ImageFolder as make
    else:
        from fastload import ImageFolder as make  # imported before the count and the clock
    tracemalloc.start()
    start = time.perf_counter()
    ds = make(root) if kind == "torchvision" else make(root, size=16, cache=cache)
    seconds = time.perf_counter() - start
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = len(ds)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker forked from the main process reads every sample's path and label
        os.close(read)
        before = _uss()
        for i in range(n):
            _path, _label = ds.samples[i]
        grown = _uss() - before
        os.write(write, str(grown).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        grown = int(f.read())
    os.waitpid(pid, 0)
    return {"n": n, "seconds": seconds, "bytes_per_sample": held / n, "worker_growth_per_sample": grown / n}


def step_restart(root: str, cache: str, fmt: str) -> dict[str, Any]:
    """A second start in a fresh process: ImageFolder + DataLoader + first batch, counted
    from the interpreter's start (imports included, as a user waits for them)."""
    import psutil

    from fastload import DataLoader, ImageFolder

    start = time.perf_counter()
    ds = ImageFolder(root, size=16, cache={"disk": cache, "disk_format": fmt})
    built = time.perf_counter() - start
    loader = DataLoader(ds, batch_size=256, shuffle=True, num_workers=2)
    next(iter(loader))
    since_exec = time.time() - psutil.Process().create_time()
    return {"built_s": built, "ready_s": since_exec}


def step_epochs(root: str, cache: str | None, fmt: str, samples: int, n: int) -> dict[str, Any]:
    """Seconds of a first and a second pass over the same random ``samples`` of N."""
    from fastload import DataLoader, ImageFolder

    spec = None if cache is None else {"disk": cache, "disk_format": fmt}
    ds = ImageFolder(root, size=16, cache=spec)
    subset = random.Random(0).sample(range(n), min(samples, n))
    loader = DataLoader(ds, batch_size=256, sampler=subset, num_workers=2, persistent_workers=True)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        for _ in loader:
            pass
        times.append(time.perf_counter() - start)
    return {"first_s": times[0], "second_s": times[1], "samples": len(subset)}


STEPS = {"index_memory": step_index_memory, "restart": step_restart, "epochs": step_epochs}


# -- one N --------------------------------------------------------------------------------

def measure_epochs(root: Path, n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``--epoch-repeats`` interleaved pairs: the epochs without a cache, then with the
    packed cache in a new directory (first and second pass); medians and pair ratios."""
    pairs = []
    for r in range(args.epoch_repeats):
        none = child("epochs", root=str(root), cache=None, fmt="packed", samples=args.epoch_samples, n=n)
        cold = work / f"cold-packed-{r}"
        cached = child("epochs", root=str(root), cache=str(cold), fmt="packed", samples=args.epoch_samples, n=n)
        shutil.rmtree(cold, ignore_errors=True)
        pairs.append((none, cached))
    med = statistics.median
    return {
        "nocache": {"samples": pairs[0][0]["samples"], "first_s": med(p[0]["first_s"] for p in pairs)},
        "packed": {"samples": pairs[0][1]["samples"], "first_s": med(p[1]["first_s"] for p in pairs),
                   "second_s": med(p[1]["second_s"] for p in pairs)},
        "overheads": [c["first_s"] / nc["first_s"] - 1 for nc, c in pairs],
    }


def measure_format(root: Path, n: int, fmt: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from fastload import ImageFolder

    row: dict[str, Any] = {"format": fmt}
    cache = work / f"cache-{fmt}"
    start = time.perf_counter()
    ImageFolder(str(root), size=16, cache={"disk": str(cache), "disk_format": fmt})
    row["first_start_s"] = time.perf_counter() - start
    shard = max(1, -(-n // args.files_cap)) if fmt == "files" else 1
    wall, rc, out = run_cli("cache", "warm", str(root), "--cache", str(cache),
                            "--jobs", str(args.jobs), "--shard", f"0/{shard}", "--json")
    report = json.loads(out) if rc == 0 else {}
    row.update(warm_s=wall, warm_rc=rc, warmed=report.get("fetched", 0), shard=shard)
    row["warm_per_s"] = row["warmed"] / wall if wall else 0.0
    row["stats_s"], row["stats_rc"], _ = run_cli("cache", "stats", str(cache))
    row["verify_s"], row["verify_rc"], _ = run_cli("cache", "verify", str(cache))
    row.update({f"restart_{k}": v for k, v in child("restart", root=str(root), cache=str(cache), fmt=fmt).items()})
    if fmt != "packed":  # the packed format's epochs are measure_epochs' pairs
        cold = work / f"cold-{fmt}"
        row.update({f"cached_{k}": v for k, v in child(
            "epochs", root=str(root), cache=str(cold), fmt=fmt, samples=args.epoch_samples, n=n).items()})
    return row


def measure_n(n: int, args: argparse.Namespace) -> dict[str, Any]:
    root = make_links(n)
    out: dict[str, Any] = {"n": n}
    with tempfile.TemporaryDirectory(prefix=f"fastload-scale-{n}-", dir=args.workdir) as tmp:
        work = Path(tmp)
        out["torchvision"] = child("index_memory", root=str(root), cache=None, kind="torchvision")
        out["fastload"] = child("index_memory", root=str(root), cache=None, kind="fastload")
        epochs = measure_epochs(root, n, args, work)
        out["nocache"], out["overheads"] = epochs["nocache"], epochs["overheads"]
        out["formats"] = [measure_format(root, n, fmt, args, work) for fmt in FORMATS]
        out["formats"][0].update({f"cached_{k}": v for k, v in epochs["packed"].items()})
        # The index as a restarted process holds it (read back from the packed cache).
        out["fastload_stored"] = child("index_memory", root=str(root),
                                       cache=str(work / "cache-packed"), kind="fastload")
    return out


# -- remote warm --------------------------------------------------------------------------

def measure_remote(args: argparse.Namespace) -> list[tuple[str, float, int]]:
    """Warm objects/s from latency::file (``--remote-n`` objects) and from moto S3 with and
    without the latency (``--moto-n``: moto serves ~100 objects/s on 2 cores)."""
    rows = []
    for origin in ("file", "s3"):
        n = args.remote_n if origin == "file" else args.moto_n
        if n <= 0:
            continue
        root = make_links(n, classes=100)
        with tempfile.TemporaryDirectory(prefix="fastload-scale-remote-", dir=args.workdir) as tmp:
            if origin == "file":
                url, options = f"latency::file://{root}", {"latency": {"latency": args.latency_ms / 1000}}
                rows.append(_warm_remote(f"latency:: file + {args.latency_ms:g} ms", url, options, tmp, args))
                continue
            with moto_dataset(root, args.latency_ms) as (url, options):
                rows.append(_warm_remote(f"moto S3 + {args.latency_ms:g} ms", url, options, tmp, args))
                rows.append(_warm_remote("moto S3, no added latency", url.removeprefix("latency::"),
                                         options["s3"], os.path.join(tmp, "plain"), args))
    return rows


def moto_dataset(root: Path, latency_ms: float):
    """``root`` on moto S3 behind ``latency::``, served as cache_epoch.py serves its set."""
    from cache_epoch import served_folder

    return served_folder(root, f"s3://scale-{root.name}/train", latency_ms)


def _warm_remote(label: str, url: str, options: dict, cache: str, args) -> tuple[str, float, int]:
    from fastload.cache.warm import warm

    start = time.perf_counter()
    report = warm(url, cache, jobs=args.remote_jobs, storage_options=options)
    wall = time.perf_counter() - start
    return label, report.fetched / wall, report.fetched


# -- the table ----------------------------------------------------------------------------

def print_n(r: dict[str, Any], args: argparse.Namespace) -> None:
    n = r["n"]
    tv, fl, st, nc = r["torchvision"], r["fastload"], r["fastload_stored"], r["nocache"]
    print(f"\nN = {n:,} (epochs over {nc['samples']:,} random samples, batch 256, 2 workers, size 16)")
    print(f"  listing: torchvision ImageFolder {tv['seconds']:.2f} s, fastload ImageFolder {fl['seconds']:.2f} s"
          f" ({tv['seconds'] / fl['seconds']:.2f}x)")
    print(f"  index bytes/sample (main): torchvision {tv['bytes_per_sample']:.0f}, fastload {fl['bytes_per_sample']:.0f}"
          f", fastload read back from the cache {st['bytes_per_sample']:.0f} (target < 200)")
    print(f"  forked worker grows per sample read: torchvision {tv['worker_growth_per_sample']:.1f} B, "
          f"fastload {fl['worker_growth_per_sample']:.1f} B")
    nocache = nc["samples"] / nc["first_s"]
    pairs = ", ".join(f"{o:+.1%}" for o in r["overheads"])
    print(f"  epoch without a cache: {nocache:,.0f} img/s (median of {len(r['overheads'])}); "
          f"packed cold-epoch overhead per pair: {pairs} (target <= +10%)")
    head = (f"  {'format':7s} {'1st start':>9s} {'warm obj/s':>10s} {'stats':>6s} {'verify':>7s} "
            f"{'restart':>8s} {'of which build':>14s} {'cold img/s':>10s} {'cold ovh':>8s} {'warm img/s':>10s}")
    print(head)
    for f in r["formats"]:
        cold = f["cached_samples"] / f["cached_first_s"]
        overhead = statistics.median(r["overheads"]) if f["format"] == "packed" else nocache / cold - 1
        warm_epoch = f["cached_samples"] / f["cached_second_s"]
        shard = f" (1/{f['shard']})" if f["shard"] > 1 else ""
        rc = "" if f["warm_rc"] == 0 else f" rc={f['warm_rc']}"
        print(f"  {f['format']:7s} {f['first_start_s']:8.2f}s {f['warm_per_s']:10,.0f}{shard}{rc} "
              f"{f['stats_s']:5.2f}s {f['verify_s']:6.2f}s {f['restart_ready_s']:7.2f}s "
              f"{f['restart_built_s']:13.2f}s {cold:10,.0f} {overhead:+8.1%} {warm_epoch:10,.0f}")
    packed, files = r["formats"]
    print(f"  packed vs files: warm {packed['warm_per_s'] / max(files['warm_per_s'], 1e-9):.1f}x, "
          f"cold epoch {files['cached_first_s'] / files['cached_samples'] * packed['cached_samples'] / packed['cached_first_s']:.2f}x, "
          f"verify {files['verify_s'] / packed['verify_s']:.2f}x (files verify covers {files['warmed']:,} entries)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--jobs", type=int, default=8, help="cache warm --jobs (local)")
    parser.add_argument("--epoch-samples", type=int, default=100_000)
    parser.add_argument("--epoch-repeats", type=int, default=3,
                        help="interleaved pairs of epochs without and with the packed cache")
    parser.add_argument("--files-cap", type=int, default=100_000,
                        help="the per-file tier warms at most about this many objects (a shard)")
    parser.add_argument("--remote-n", type=int, default=10_000, help="latency:: objects; 0 = skip")
    parser.add_argument("--moto-n", type=int, default=2_000, help="moto S3 objects; 0 = skip")
    parser.add_argument("--remote-jobs", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--workdir", default=None, help="where the caches go (default: the temp dir)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-args", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(STEPS[args.child](**json.loads(args.child_args))))
        return
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    results = []
    for n in args.sizes.split(","):  # each N's table as soon as it is measured
        results.append(measure_n(int(n), args))
        if not args.json:
            print_n(results[-1], args)
            sys.stdout.flush()
    remote = measure_remote(args)
    if args.json:
        print(json.dumps({"sizes": results, "remote": remote}, indent=1))
        return
    if remote:
        print(f"\nwarm from a remote store, {args.remote_jobs} in flight "
              f"(targets: >= 1,000 objects/s at 15 ms; >= 5,000/s local):")
        for label, rate, fetched in remote:
            print(f"  {label:32s} {rate:8,.0f} objects/s ({fetched:,} fetched)")


if __name__ == "__main__":
    main()
