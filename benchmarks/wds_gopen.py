"""webdataset over S3 shards of ~80 MB: fastload:: URLs (large shards from the shard store, and
read whole into memory as before) against webdataset's plain fsspec stream, side by side.

--shards tar shards of --mb MB (members of 100 KB of random bytes, so the row measures reading
and not decoding) on moto's S3 server (a process of its own) behind ``latency::``
(--latency-ms per request). Each row is a webdataset pipeline (``wds.WebDataset(urls)``, no
decode, no workers) iterating every sample once, in a fresh Python process so that its peak
memory (max RSS) is its own; a cache row runs a cold epoch (new cache directory) then a warm
one (same directory, new process); its memory is the peak RSS over the RSS the process had
before the epoch (after its imports). Rows:

* ``fsspec stream``: a gopen handler that returns ``fsspec.open(url).open()``, the stream a
  webdataset user over S3 writes without fastload (no cache: every epoch from S3)
* ``fastload:: in memory``: ``register_gopen`` with ``large_bytes=None``: each shard read whole
  into memory through the cache, as every shard was before NOTE [large objects through
  fastload::]
* ``fastload:: shard store``: ``register_gopen`` as shipped (shards >= 64 MiB downloaded into
  the cache's shard store and opened from the local file)

Prints seconds and MB/s per epoch, the epoch's memory, the S3 server's CPU seconds (moto
serves a range by reading the whole object: each 8 MiB range of an 80 MB shard costs it the
80 MB, which a real S3 does not; it shares this machine's cores), and the ratios of the shard store against the
other two (> 1: faster, or less memory). Medians of --repeats rounds. Run with nothing else
running.

    python benchmarks/wds_gopen.py                    # 4 shards of 80 MB, moto + 15 ms
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MEMBER = 100_000

# One epoch in a process of its own: argv = row, cache dir, urls json, options json.
_EPOCH = r"""
import json, resource, sys, time
import fsspec, webdataset as wds
import fastload
row, cache, urls, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
if row == "fsspec stream":
    wds.gopen_schemes["latency"] = lambda u, mode="rb", bufsize=8192: fsspec.open(u, mode, **options).open()
else:
    extra = {"large_bytes": None} if row == "fastload:: in memory" else {}
    fastload.register_gopen(cache, {**options, "fastload": extra})
    urls = ["fastload::" + u for u in urls]
import psutil
before = psutil.Process().memory_info().rss  # the imports' own, below the epoch's peak
start = time.perf_counter()
n = sum(len(s["bin"]) for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False))
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"bytes": n, "seconds": seconds, "rss_mb": max(peak - before, 0) / 1e6}))
"""


def write_shards(out: Path, shards: int, mb: float) -> None:
    per = int(mb * 1e6 // MEMBER)
    out.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with tarfile.open(out / f"train-{s:06d}.tar", "w") as tar:
            for i in range(per):
                info = tarfile.TarInfo(f"{s:06d}{i:06d}.bin")
                info.size = MEMBER
                tar.addfile(info, io.BytesIO(os.urandom(MEMBER)))


def server_cpu(servers: list[psutil.Process]) -> float:
    """CPU seconds of the S3 server's processes so far."""
    return sum(sum(p.cpu_times()[:2]) for p in servers)


def epoch(row: str, cache: Path, urls: list[str], options: dict,
          servers: list[psutil.Process]) -> dict:
    before = server_cpu(servers)
    out = subprocess.run([sys.executable, "-c", _EPOCH, row, str(cache), json.dumps(urls),
                          json.dumps(options)], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise RuntimeError(f"{row}: {out.stderr[-2000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]),
            "server_cpu": server_cpu(servers) - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--mb", type=float, default=80.0, help="MB of each shard")
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from cache_epoch import served_folder

    with tempfile.TemporaryDirectory(prefix="fastload-wds-gopen-") as tmp:
        work = Path(tmp)
        write_shards(work / "shards", args.shards, args.mb)
        with served_folder(work / "shards", "s3://wds-gopen/train", args.latency_ms) as (url, options):
            urls = [f"{url}/train-{s:06d}.tar" for s in range(args.shards)]
            servers = psutil.Process().children(recursive=True)  # moto's, alone so far
            rows = ("fsspec stream", "fastload:: in memory", "fastload:: shard store")
            got: dict[str, list[dict]] = {f"{r}, {e}": [] for r in rows for e in ("cold", "warm")}
            for k in range(args.repeats):
                for row in rows:
                    cache = work / f"cache-{k}-{rows.index(row)}"
                    for kind in ("cold", "warm"):
                        got[f"{row}, {kind}"].append(epoch(row, cache, urls, options, servers))
        total = got["fsspec stream, cold"][0]["bytes"]
        print(f"{args.shards} shards of {args.mb:g} MB (members of {MEMBER // 1000} KB), moto + "
              f"{args.latency_ms:g} ms/request, webdataset without workers; medians of "
              f"{args.repeats} rounds, each epoch in a new process:")
        med = {name: tuple(statistics.median(r[k] for r in runs)
                           for k in ("seconds", "rss_mb", "server_cpu"))
               for name, runs in got.items()}
        for name, (seconds, rss, cpu) in med.items():
            print(f"  {name:34s} {seconds:6.2f} s  {total / seconds / 1e6:7.1f} MB/s   memory "
                  f"{rss:6.0f} MB over the imports'   S3 server CPU {cpu:5.2f} s")
        for kind in ("cold", "warm"):
            store = med[f"fastload:: shard store, {kind}"]
            for other in ("fsspec stream", "fastload:: in memory"):
                o = med[f"{other}, {kind}"]
                print(f"  shard store vs {other}, {kind}: time {o[0] / store[0]:.2f}x, "
                      f"memory {o[1] / store[1]:.2f}x")


if __name__ == "__main__":
    main()
