"""Origin reads and epoch time of 2 "nodes" with separate local caches, with and without Redis.

Two ranks (torchrun, gloo, CPU) read a synthetic JPEG set from S3 (moto on 127.0.0.1, with
``latency::`` adding a per-request delay like a remote store) for two shuffled epochs, each
rank with its own disk cache, as two nodes would have. Without a shared tier, epoch 2 makes
each rank fetch the objects the *other* rank fetched in epoch 1; with the Redis tier they come
from Redis. Printed: origin reads (each rank's cache counts its fetches), the median epoch
time of each epoch over the ranks, and the ratios.

    .venv/bin/python benchmarks/redis_origin_reads.py --images 200 --latency-ms 15
"""

from __future__ import annotations

import argparse
import logging
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUCKET = "fastload-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_job(args: argparse.Namespace) -> None:
    """One rank: two epochs over the ImageFolder; writes its timings and origin reads."""
    import torch.distributed as dist

    from fastload import DataLoader, ImageFolder

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = json.loads(args.cache.replace("{rank}", str(rank)))
    options = json.loads(args.storage_options)
    ds = ImageFolder(f"latency::s3://{BUCKET}/train", size=64, cache=spec, storage_options=options)
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=0)
    times = []
    for _ in range(2):
        dist.barrier()
        start = time.perf_counter()
        for _batch in loader:
            pass
        times.append(time.perf_counter() - start)
    reads = ds.cache.origin_reads
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"epochs_s": times, "origin_reads": reads}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--latency-ms", type=float, default=15.0)
    p.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    p.add_argument("--storage-options", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_job:
        rank_job(args)
        return

    import s3fs
    from moto.server import ThreadedMotoServer

    from fastload.testing.synthetic import make_jpeg_folder

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto logs every request
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ[name] = "bench"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    work = Path(tempfile.mkdtemp(prefix="fastload-redis-bench-"))
    s3_port, redis_port = free_port(), free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port)
    moto.start()
    redis_proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "",
         "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL,
    )
    try:
        s3 = {"key": "bench", "secret": "bench", "endpoint_url": f"http://127.0.0.1:{s3_port}"}
        local = make_jpeg_folder(work / "jpegs", images=args.images, classes=10, size=(160, 120))
        fs = s3fs.S3FileSystem(**s3)
        fs.mkdir(BUCKET)
        for f in sorted(local.rglob("*.jpg")):
            fs.pipe_file(f"{BUCKET}/train/{f.relative_to(local).as_posix()}", f.read_bytes())
        options = {"latency": {"latency": args.latency_ms / 1000}, "s3": s3}
        time.sleep(0.2)  # redis-server binds its port
        results = {}
        for label, redis_url in (("no shared tier", None), ("shared Redis", f"redis://127.0.0.1:{redis_port}/0")):
            run_dir = work / label.replace(" ", "_")
            run_dir.mkdir()
            spec = {"disk": str(run_dir / "node{rank}"), "prefetch": False}
            if redis_url:
                spec["redis"] = redis_url
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   __file__, "--rank-job", "--out", str(run_dir), "--cache", json.dumps(spec),
                   "--storage-options", json.dumps(options)]
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(2)]
            results[label] = {
                "reads": sum(r["origin_reads"] for r in ranks),
                "epoch1": statistics.median(r["epochs_s"][0] for r in ranks),
                "epoch2": statistics.median(r["epochs_s"][1] for r in ranks),
            }
    finally:
        redis_proc.kill()
        redis_proc.wait()
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    base, shared = results["no shared tier"], results["shared Redis"]
    print(f"{args.images} JPEGs, 2 ranks x 2 epochs, {args.latency_ms:.0f} ms per request, "
          "separate disk caches per rank")
    print(f"{'':16}{'origin reads':>14}{'reads/object':>14}{'epoch 1 s':>11}{'epoch 2 s':>11}")
    for label, r in results.items():
        print(f"{label:16}{r['reads']:>14}{r['reads'] / args.images:>14.2f}"
              f"{r['epoch1']:>11.2f}{r['epoch2']:>11.2f}")
    print(f"origin reads: {base['reads'] / max(1, shared['reads']):.2f}x fewer with Redis; "
          f"epoch 2 (median over ranks): {base['epoch2'] / shared['epoch2']:.2f}x faster")


if __name__ == "__main__":
    main()
