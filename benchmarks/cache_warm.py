"""``fastload cache warm`` throughput: objects/s into a new cache directory, by source and --jobs.

Sources (each a folder of --n random objects of --size bytes, made once under .fastload-data):

* ``local``:   the folder itself (page cache warm after the first pass);
* ``latency``: ``latency::file://`` over it, --latency-ms added to every request
  (fastload.testing.latency: a remote store's wait, without a server's CPU cost);
* ``moto``:    moto's S3 server in a subprocess of its own on 127.0.0.1 (its CPU is not
  spent under this process's GIL, but on this machine's cores all the same);
* ``moto+latency``: ``latency::s3://`` over that server.

Each cell is the median of --repeats warms of the whole folder into a fresh cache directory
(``fastload.cache.warm.warm``, the library call under the command), and a resume pass (a
second warm of the now full cache: every object found cached, nothing read). Prints a table.

    python benchmarks/cache_warm.py                          # 1,000 objects, all sources
    python benchmarks/cache_warm.py --n 10000 --jobs 1,8,32,128 --sources local,latency
    python benchmarks/cache_warm.py --sources moto --jobs 8,32,128 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastload.testing.latency  # noqa: F401  (registers latency::)
from fastload.cache.warm import warm
from tests.fixtures.s3 import DUMMY_ENV

BIN = Path(sys.executable).parent


def make_folder(n: int, size: int) -> Path:
    """--n objects of --size random bytes in 10 folders, made once."""
    root = ROOT / ".fastload-data" / f"warm-bench-{n}x{size}"
    done = root / "complete"  # outside the data folder: not an object
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        for i in range(n):
            folder = root / "data" / f"c{i % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:07d}.bin").write_bytes(os.urandom(size))
        done.write_text("ok")
    return root / "data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_bucket(folder: Path) -> Iterator[tuple[str, dict]]:
    """The folder uploaded to a moto S3 server subprocess: (URL, s3fs options)."""
    import s3fs

    port = _free_port()
    env = {**os.environ, **DUMMY_ENV}
    proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        os.environ.update(DUMMY_ENV)
        options = {"key": "testing", "secret": "testing", "endpoint_url": f"http://127.0.0.1:{port}",
                   "use_listings_cache": False, "skip_instance_cache": True}
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("warm-bench")
        files = sorted(p for p in folder.rglob("*.bin"))
        for start in range(0, len(files), 500):
            fs.pipe({f"warm-bench/data/{p.relative_to(folder).as_posix()}": p.read_bytes()
                     for p in files[start:start + 500]})
        yield "s3://warm-bench/data", options
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def one_warm(url: str, options: dict, jobs: int, scratch: Path) -> tuple[float, float, int]:
    """Seconds of a cold warm, seconds of the resume pass, objects."""
    cache = scratch / f"cache-{jobs}"
    shutil.rmtree(cache, ignore_errors=True)
    started = time.perf_counter()
    report = warm(url, cache, jobs=jobs, storage_options=options)
    cold = time.perf_counter() - started
    if not report.ok or report.fetched != report.files:
        raise RuntimeError(f"warm of {url} did not fetch everything: {report.failed[:3]}")
    started = time.perf_counter()
    again = warm(url, cache, jobs=jobs, storage_options=options)
    resume = time.perf_counter() - started
    if again.skipped != report.files:
        raise RuntimeError(f"the resume pass of {url} fetched {again.fetched} objects")
    shutil.rmtree(cache, ignore_errors=True)
    return cold, resume, report.files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="objects (default 1,000)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per object (default 1 KB)")
    parser.add_argument("--jobs", default="1,8,32,128", help="comma-separated --jobs values")
    parser.add_argument("--sources", default="local,latency,moto,moto+latency")
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    jobs_list = [int(j) for j in args.jobs.split(",")]
    folder = make_folder(args.n, args.size)
    latency = {"latency": args.latency_ms / 1000}
    rows = []
    with tempfile.TemporaryDirectory(prefix="warm-bench-") as tmp, contextlib.ExitStack() as stack:
        moto = None
        for source in args.sources.split(","):
            if source == "local":
                url, options = str(folder), {}
            elif source == "latency":
                url, options = f"latency::file://{folder}", {"latency": latency}
            elif source in ("moto", "moto+latency"):
                if moto is None:
                    moto = stack.enter_context(moto_bucket(folder))
                url, options = moto
                if source == "moto+latency":
                    url, options = f"latency::{url}", {"latency": latency, "s3": options}
            else:
                parser.error(f"unknown source {source!r}")
            for jobs in jobs_list:
                runs = [one_warm(url, options, jobs, Path(tmp)) for _ in range(args.repeats)]
                cold = statistics.median(r[0] for r in runs)
                resume = statistics.median(r[1] for r in runs)
                n = runs[0][2]
                rows.append((source, jobs, n, cold, n / cold, n / resume))
                print(f"{source:>13} jobs={jobs:<4} {n / cold:>9,.0f} objects/s "
                      f"(resume {n / resume:,.0f}/s)", file=sys.stderr, flush=True)
    ms = f"{args.latency_ms:g} ms"
    print(f"\ncache warm of {args.n:,} objects of {args.size:,} B, median of {args.repeats}; "
          f"latency = {ms} per request, {os.cpu_count()} CPUs")
    print(f"| {'source':<13} | {'jobs':>4} | {'objects':>7} | {'cold s':>7} | {'objects/s':>9} "
          f"| {'resume objects/s':>16} |")
    print(f"|{'-' * 15}|{'-' * 6}|{'-' * 9}|{'-' * 9}|{'-' * 11}|{'-' * 18}|")
    for source, jobs, n, cold, rate, resume in rows:
        print(f"| {source:<13} | {jobs:>4} | {n:>7,} | {cold:>7.2f} | {rate:>9,.0f} | {resume:>16,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
