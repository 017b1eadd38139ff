"""`fastload bench`'s numbers against references, in one run.

Part 1, sequential reads: on one set of large files on local disk, the read throughput that
`fastload bench` reports (fastload.bench.throughput.read_sweep, the function the command
runs, with its default 4 MiB requests copied out through a 1 MiB window) against fio's best
of two block sizes (Debian fio, psync, --rw=read, --bs=1M and --bs=256k) for
the same files at the same concurrency (c reader threads / c fio jobs, each file read once
per run). The page cache is dropped before every run when the kernel allows it
(`echo 3 > /proc/sys/vm/drop_caches`); otherwise, or with --warm, both read warm (the files
read once before every run), and the output says which. Each repeat runs fastload and fio
back to back; the ratio printed is the median of those paired ratios, so a disk that drifts
between repeats slows both sides of a pair alike. Target: fastload >= 0.9 x fio.

Part 2, the verdict with and without a cache: `fastload bench` on a moto S3 server on
loopback with 15 ms injected per request (`latency::s3://...`, fastload.testing.latency), once
without and once with --cache; prints both verdicts.

    python benchmarks/bench_vs_fio.py                       # 8 x 128 MiB files, 5 repeats
    python benchmarks/bench_vs_fio.py --files 8 --mib 64 --repeats 5 --skip-s3
    python benchmarks/bench_vs_fio.py --warm --skip-s3      # both from the page cache
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
from pathlib import Path

from fastload.bench import run_bench, throughput
from fastload.bench.inventory import take_inventory
from fastload.io.storage import Storage
from fastload.testing.synthetic import make_jpeg_folder

DATA = Path(__file__).resolve().parent.parent / ".fastload-data"


def make_files(root: Path, files: int, mib: int) -> list[Path]:
    """``files`` files of ``mib`` MiB of random bytes (reused when present with that size)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"part_{i:03d}.bin" for i in range(files)]
    for p in paths:
        if not p.exists() or p.stat().st_size != mib << 20:
            with open(p, "wb") as f:
                for _ in range(mib):
                    f.write(os.urandom(1 << 20))
    return paths


def drop_caches() -> bool:
    """Drop the page cache; False when this container may not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


def fastload_rate(root: Path, concurrency: int) -> float:
    storage = Storage(root)
    inv = take_inventory(storage)
    (point,) = throughput.read_sweep(
        storage, inv.entries, levels=[concurrency], seconds_per_level=600.0,
        bytes_per_level=inv.total_bytes, stop_at_plateau=False,
    )
    assert point.bytes == inv.total_bytes, "the run must read every file exactly once"
    return point.read_bytes_per_s


FIO_BLOCK_SIZES = ("1M", "256k")


def fio_rate(paths: list[Path], concurrency: int, block_size: str) -> float:
    """fio's aggregate read bytes/s: job j reads files j, j+c, j+2c, ... one after another."""
    # --invalidate=0: fio by default evicts the files from the page cache before reading,
    # which would make fio read cold where fastload reads warm; the caller sets the cache.
    cmd = ["fio", "--rw=read", f"--bs={block_size}", "--ioengine=psync", "--invalidate=0",
           "--group_reporting",
           "--output-format=json", "--file_service_type=sequential"]
    for j in range(concurrency):
        group = ":".join(str(p).replace(":", "\\:") for p in paths[j::concurrency])
        cmd += [f"--name=reader{j}", f"--filename={group}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out)["jobs"][0]["read"]
    return float(job["bw_bytes"])


def part_fio(args: argparse.Namespace) -> None:
    if shutil.which("fio") is None:
        print("fio is not installed (apt-get install fio): part 1 skipped")
        return
    root = DATA / "bench_fio"
    paths = make_files(root, args.files, args.mib)
    dropped = not args.warm and drop_caches()
    mode = (
        "page cache dropped before each run" if dropped
        else "both read warm (--warm)" if args.warm
        else "page cache NOT droppable: both read warm"
    )
    print(f"part 1: {args.files} files x {args.mib} MiB in {root}; {mode}; median of {args.repeats}")
    print(f"{'threads':>8} {'fastload MB/s':>14} {'fio MB/s':>10} {'ratio':>7}  (median of paired ratios)")
    for c in args.concurrency:
        ours: list[float] = []
        theirs: dict[str, list[float]] = {bs: [] for bs in FIO_BLOCK_SIZES}
        runs = [(lambda: fastload_rate(root, c), ours)] + [
            (lambda bs=bs: fio_rate(paths, c, bs), theirs[bs]) for bs in FIO_BLOCK_SIZES
        ]
        for _ in range(args.repeats):
            for measure, sink in runs:
                if dropped:
                    drop_caches()
                else:
                    warm(paths)
                sink.append(measure())
        best = max(theirs.values(), key=statistics.median)  # fio at its better block size
        ratio = statistics.median(a / b for a, b in zip(ours, best))
        a, b = statistics.median(ours), statistics.median(best)
        print(f"{c:>8} {a / 1e6:>14,.0f} {b / 1e6:>10,.0f} {ratio:>7.2f}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def part_s3(args: argparse.Namespace) -> None:
    from moto.server import ThreadedMotoServer
    import s3fs

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "bench")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        s3 = {"endpoint_url": endpoint, "key": "bench", "secret": "bench", "skip_instance_cache": True}
        fs = s3fs.S3FileSystem(**s3)
        fs.mkdir("bench")
        if args.jpeg:  # decoded like ImageNet training data by the emulation's loader
            jpegs = make_jpeg_folder(DATA / "bench_s3_jpegs", images=args.images, classes=10)
            for p in sorted(jpegs.rglob("*.jpg")):
                fs.pipe_file(f"bench/train/{p.relative_to(jpegs).as_posix()}", p.read_bytes())
            what = f"{args.images} JPEGs"
        else:  # raw sample files (like MLPerf's cosmoflow/unet3d): the loader only reads them
            for i in range(args.images):
                fs.pipe_file(f"bench/train/sample_{i:05d}.npz", os.urandom(args.kib << 10))
            what = f"{args.images} raw files of {args.kib} KiB"
        url = "latency::s3://bench/train"
        options = {"latency": {"latency": args.latency_ms / 1000}, "s3": s3}
        print(f"\npart 2: {what} on moto S3 + {args.latency_ms:g} ms per request "
              f"({url}), --model {args.model} --duration {args.duration:g}")
        common = dict(model=args.model, duration_s=args.duration, storage_options=options,
                      max_concurrency=16)
        plain = run_bench(url, **common)
        print(f"without --cache: {plain.verdict}")
        with tempfile.TemporaryDirectory(dir=DATA) as cache:
            cached = run_bench(url, cache=cache, **common)
        print(f"with --cache:    {cached.verdict}")
        for label, rep in (("no cache", plain), ("cache", cached)):
            for m in rep.measurements:
                print(f"  {label:>8} {m.label:>6}: best read {m.best_read.objects_per_s:,.0f} files/s "
                      f"at {m.best_read.concurrency} threads, loader feed {m.feed_samples_per_s:,.0f} "
                      f"samples/s, largest N {m.largest_fed(rep.workload)[0]}")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=128, help="size of each file, MiB")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=400, help="files in the S3 part")
    parser.add_argument("--kib", type=int, default=256, help="size of each raw file, KiB")
    parser.add_argument("--jpeg", action="store_true", help="S3 part with JPEGs, not raw files")
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--model", default="cosmoflow")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warm", action="store_true", help="both read from the page cache")
    parser.add_argument("--skip-fio", action="store_true")
    parser.add_argument("--skip-s3", action="store_true")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines
    DATA.mkdir(exist_ok=True)
    if not args.skip_fio:
        part_fio(args)
    if not args.skip_s3:
        part_s3(args)


if __name__ == "__main__":
    main()
