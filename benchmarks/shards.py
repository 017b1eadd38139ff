"""The same JPEGs as loose files, WebDataset tar shards and LitData chunks, local and remote.

The synthetic ImageNet-like JPEG set (made once under .fastload-data) is packed with
``fastload.data.pack.pack`` into --shards shards, and folder and shards are uploaded to moto's
S3 server (in a process of its own) behind ``latency::`` (--latency-ms per request). Batch
--batch-size, RandomResizedCrop(--size) + flip, uint8 out. Each row is a loader built afresh,
timed over its first epoch (which pays its start: workers; the decoder measurement is the
first fastload loader's, later ones keep its verdict, NOTE [one decoder measurement per
process]) and its second, in images/s:

* folder remote, per object: ``fastload.DataLoader(ImageFolder(url))``, no cache, threads
* shards remote, cold cache: ``fastload.DataLoader(TarShards(urls, cache=<new dir>))`` (the
  index built before it, timed apart): whole shards downloaded with concurrent range
  requests, ahead in the epoch's order, into the cache's shard store (NOTE [the shard store]);
  its second epoch reads them from the local disk
* shards remote, warm cache: a new dataset and loader over the same cache directory; the
  cold/warm pair is made --repeats times (each cold in a new cache directory), medians shown
* shards local / folder local: the same engine over the local copies
* webdataset local / remote: webdataset's own pipeline (WebDataset -> PIL decode ->
  torchvision transforms -> batched) in a torch DataLoader with --workers workers; remote
  through a gopen handler over the same fsspec URL
* litdata local: LitData's StreamingDataLoader over its own chunks of the same JPEGs
  (benchmarks/_litdata.py; --workers persistent workers; local only, as _litdata.py says why)

``--drop-caches`` (root) adds a third row to each round: a warm epoch after the kernel's page
cache was dropped, its shards read from the disk. The cold epoch writes what it downloads
into new pages of the page cache; the warm row then reads them from memory, the third from
the disk into new pages as the cold one did. The page cache is dropped before every cold
epoch too, so that each round's cold epoch starts alike (without it the first round's cold
epoch followed the upload and the later ones a drop: 0.57-0.66x against 0.67-0.86x of their
warm epochs in one probe on the test VM); without ``--drop-caches`` nothing is dropped. The machine's price of a new page is printed
(``page_cache_cost``: CPU per MB written into a new file and over the same file again). On the
test machine, a VM whose balloon driver hands memory the guest frees back to the host within
seconds (virtio-balloon free page reporting), a page new to the page cache is new to the
guest, and the host backs it on first write: ~3 ms of CPU per MB, 15-50x a page it holds.

Then the index builds with no cache: with the DALI index and labels files ``fastload pack``
writes, with the index files only (the label members read, merged), and with neither (the
tar headers walked), the same shards uploaded again for each, in seconds and requests (NOTE
[reading through small gaps]); the ratios the issue sets, the shuffle quality of the shard
order vs a uniform permutation, and the index's bytes per sample. Targets (issue 23): the
cold first epoch >= 5x the per-object one, and within 20% of the warm cache's first epoch
(the store is not the bound); >= 1.5x webdataset, local and remote; >= LitData; local shards
>= the folder. Run with nothing else running.

moto's server runs on this machine. By default it shares every core with the loaders, so its
CPU per request and per byte (0.5-1.5 s for a cold epoch of 336 MB here) is taken from the
decode; ``--store-cpus N`` gives it the last N cores and every loader (and its workers) the
others, as a store on other machines would be: the rows then compare loaders on fewer cores.

    python benchmarks/shards.py                    # 512 images, 4 shards, 15 ms
    python benchmarks/shards.py --images 1000 --latency-ms 15 --workers 2
    python benchmarks/shards.py --images 5000 --shards 20 --store-cpus 1
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import psutil
import torch
import torch.utils.data
import webdataset as wds
from torchvision.transforms import v2 as T

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cache_epoch import epoch_seconds, served_folder  # noqa: E402  (benchmarks/)

from fastload import DataLoader, ImageFolder, TarShards  # noqa: E402
from fastload.io.origin import with_timeouts  # noqa: E402
from fastload.data.pack import pack  # noqa: E402
from fastload.data.shard_order import shuffle_quality  # noqa: E402
from fastload.testing.synthetic import make_jpeg_folder  # noqa: E402
from tests.fixtures.s3 import upload_folder  # noqa: E402


def webdataset_loader(urls: list[str], size: int, batch: int, workers: int) -> Any:
    transform = T.Compose([T.PILToTensor(), T.RandomResizedCrop(size, antialias=True),
                           T.RandomHorizontalFlip()])
    pipeline = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node,
                               empty_check=False)
                .shuffle(256).decode("pil").to_tuple("jpg", "cls").map_tuple(transform, int)
                .batched(batch))
    return torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=workers,
                                       persistent_workers=workers > 0)  # as the other rows keep theirs


def children_cpu() -> float:
    """CPU seconds of this process's children: moto's S3 server, while only fastload's
    threads engine runs (it starts no worker processes)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


def pin(process: psutil.Process, cores: list[int]) -> None:
    """Every thread of ``process`` onto ``cores`` (threads and processes it starts later
    inherit it)."""
    for thread in process.threads():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(thread.id, cores)


def split_cores(store_cpus: int) -> tuple[list[int], list[int]]:
    """(the loaders' cores, the store's): the last ``store_cpus`` cores for the store."""
    cores = sorted(os.sched_getaffinity(0))
    if not 0 < store_cpus < len(cores):
        raise SystemExit(f"--store-cpus {store_cpus}: this machine has {len(cores)} cores; "
                         "leave the loaders at least one")
    return cores[:-store_cpus], cores[-store_cpus:]


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> None:
    """Write back, then drop the kernel's clean page cache: the next reads come from the disk."""
    os.sync()
    Path(DROP_CACHES).write_text("1")


def page_cache_cost(directory: Path, mb: int = 256) -> tuple[float, float]:
    """ms of CPU per MB to write ``mb`` MB into a new file kept (the kernel takes new pages for
    its page cache, as a cold epoch's downloads do), and to write them again over the same file
    (pages it holds). A file of twice ``mb`` is written first and kept meanwhile: pages freed a
    moment ago are reused cheaply (for a few seconds, on the test VM), and only pages past them
    show what new memory costs here."""
    buf = os.urandom(1 << 20)
    first, probe = directory / "page-cache-first", directory / "page-cache-probe"

    def write(path: Path, n: int) -> float:
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        try:
            start = time.process_time()
            for i in range(n):
                os.pwrite(fd, buf, i << 20)
            return 1000 * (time.process_time() - start) / (n * 1.048576)
        finally:
            os.close(fd)

    try:
        write(first, 2 * mb)
        return write(probe, mb), write(probe, mb)
    finally:
        first.unlink(missing_ok=True)
        probe.unlink(missing_ok=True)


def index_build(urls: list[str], options: dict[str, Any],
                common: dict[str, Any]) -> tuple[float, int]:
    """Seconds and requests (counted by the ``latency::`` layer) of one TarShards index
    build with no cache."""
    fs = fsspec.core.url_to_fs(urls[0], **with_timeouts(urls[0], options))[0]  # TarShards' own
    before = fs.total_requests
    start = time.perf_counter()
    ds = TarShards(urls, storage_options=options, **common)
    took = time.perf_counter() - start
    if ds.fs is not fs:
        raise RuntimeError("TarShards opened another latency:: filesystem than fsspec's cached "
                           "one: its requests cannot be counted from here")
    return took, fs.total_requests - before


def epochs(n: int, loader, cpu: list[float] | None = None) -> tuple[float, float]:
    """Images/s of a loader's first and second epoch; the first's CPU seconds in this process
    (every thread) appended to ``cpu`` when given."""
    start = time.process_time()
    first = n / epoch_seconds(loader)
    if cpu is not None:
        cpu.append(time.process_time() - start)
    return first, n / epoch_seconds(loader)


def litdata_row(local: Path, work: Path, n: int, size: int, batch: int, workers: int) -> tuple[float, float] | None:
    try:
        from _litdata import litdata_chunks, litdata_loader
    except ImportError:
        return None
    try:
        chunks = litdata_chunks(local, work / "litdata")
    except ImportError:  # litdata is not installed
        return None
    return epochs(n, litdata_loader(chunks, size=size, batch=batch, workers=workers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=2, help="webdataset's and LitData's torch workers")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3,
                        help="cold/warm pairs of the remote shards rows (medians shown)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="add a warm row read from the disk: the kernel's page cache dropped "
                             "before it (root: /proc/sys/vm/drop_caches)")
    parser.add_argument("--store-cpus", type=int, default=0,
                        help="cores for moto's server alone (the loaders get the others); "
                             "0: it shares every core with them")
    args = parser.parse_args()
    if args.drop_caches and not os.access(DROP_CACHES, os.W_OK):
        raise SystemExit(f"--drop-caches: {DROP_CACHES} is not writable here (run as root)")
    store_cores: list[int] = []
    if args.store_cpus:
        loader_cores, store_cores = split_cores(args.store_cpus)
        pin(psutil.Process(), loader_cores)  # before any loader measures the machine
        torch.set_num_threads(len(loader_cores))
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    local = make_jpeg_folder(ROOT / ".fastload-data" / f"shards-bench-{args.images}",
                             images=args.images, classes=10, size=(500, 375))
    work = Path(tempfile.mkdtemp(prefix="fastload-shards-bench-"))
    total = sum(p.stat().st_size for p in local.rglob("*.jpg"))
    packed = pack(str(local), str(work / "shards"), shard_size=total / args.shards + 20_000)
    local_urls = [u.replace("file://", "") for u in packed.urls]
    n, size, batch = args.images, args.size, args.batch_size
    rows: dict[str, tuple[float, float] | None] = {}
    common = {"size": size, "train": True, "seed": 0}
    run = {"batch_size": batch, "shuffle": True, "backend": "threads"}
    rows["folder local (threads)"] = epochs(n, DataLoader(ImageFolder(str(local), **common), **run))
    rows["shards local (threads)"] = epochs(n, DataLoader(TarShards(local_urls, **common), **run))
    rows["webdataset local"] = epochs(n, webdataset_loader(local_urls, size, batch, args.workers))
    new_pages, old_pages = page_cache_cost(work)
    before_server = {p.pid for p in psutil.Process().children(recursive=True)}
    with served_folder(local, f"s3://shards-bench-{n}/folder", args.latency_ms) as (url, options):
        for child in psutil.Process().children(recursive=True):
            if store_cores and child.pid not in before_server:  # moto's server
                pin(child, store_cores)
        shard_root = upload_folder(options["s3"], work / "shards", f"s3://shards-bench-{n}/shards")
        remote = [f"latency::{shard_root}/{Path(u).name}" for u in local_urls]
        folder = ImageFolder(url, storage_options=options, **common)
        rows["folder remote, per object (threads)"] = epochs(n, DataLoader(folder, **run))
        kinds = ["cold", "warm"] + (["warm from disk"] if args.drop_caches else [])
        pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        index_s, server = [], {k: [] for k in kinds}
        loader_cpu: dict[str, list[float]] = {k: [] for k in kinds}
        for repeat in range(args.repeats):  # cold then warm, each cold in a new cache directory
            cache = {"disk": str(work / f"cache-{repeat}")}
            start = time.perf_counter()
            ds = TarShards(remote, storage_options=options, cache=cache, **common)
            index_s.append(time.perf_counter() - start)
            for kind in pairs:  # warm: a new dataset over the same cache
                if kind != "warm" and args.drop_caches:  # every cold round after a drop alike
                    drop_page_cache()
                dataset = ds if kind == "cold" else TarShards(
                    remote, storage_options=options, cache=cache, **common)
                before = children_cpu()
                pairs[kind].append(epochs(n, DataLoader(dataset, **run), loader_cpu[kind]))
                server[kind].append(children_cpu() - before)
            store = ds.shard_store
            fetched = (f"{store.downloads} shards, {store.requests} range requests; while their "
                       f"shard downloaded, {store.early} samples read from the download as they "
                       f"landed, {store.around} from the origin"
                       if store is not None else "no shard store: a range request per sample")
        names = {"cold": "cold cache", "warm": "warm cache", "warm from disk": "warm, from disk"}
        for kind, got in pairs.items():
            rows[f"shards remote, {names[kind]} (threads)"] = (
                statistics.median(g[0] for g in got), statistics.median(g[1] for g in got))
        cold_vs_warm = {kind: [c[0] / w[0] for c, w in zip(pairs["cold"], pairs[kind])]
                        for kind in kinds[1:]}

        # the same shards with their DALI index files only (the label members are read), and
        # without either (the index walks the tar headers)
        builds = {"with index and labels files": index_build(remote, options, common)}
        for kind, suffixes in (("index files only", (".tar", ".idx")),
                               ("neither (header walk)", (".tar",))):
            copy = work / kind.split()[0]
            copy.mkdir()
            for u in local_urls:
                for suffix in suffixes:
                    source = Path(u).with_suffix(suffix)
                    (copy / source.name).hardlink_to(source)
            copy_root = upload_folder(options["s3"], copy, f"s3://shards-bench-{n}/{copy.name}")
            builds[kind] = index_build([f"latency::{copy_root}/{Path(u).name}" for u in local_urls],
                                       options, common)

        def gopen_fsspec(u: str, mode: str = "rb", bufsize: int = 8192) -> Any:
            return fsspec.open(u, mode, **options).open()

        wds.gopen_schemes["latency"] = gopen_fsspec
        rows["webdataset remote"] = epochs(n, webdataset_loader(remote, size, batch, args.workers))
    # Last: LitData's optimize() sets multiprocessing's start method to spawn for the process,
    # and spawned workers would not see the gopen handler registered above.
    rows["litdata local"] = litdata_row(local, work, n, size, batch, args.workers)
    cores = (f"the loaders on cores {loader_cores}, moto's server alone on {store_cores}"
             if store_cores else "moto's server sharing every core with the loaders")
    print(f"{n} JPEGs (500x375) in {len(local_urls)} shards, batch {batch}, RandomResizedCrop "
          f"{size} + flip; remote: moto + {args.latency_ms:g} ms/request; webdataset and LitData "
          f"with {args.workers} workers; {cores}. images/s, first and second epoch of a new "
          "loader:")
    for name, value in rows.items():
        shown = f"{value[0]:8.1f} {value[1]:8.1f}" if value else f"{'n/a':>8} {'n/a':>8} (not installed)"
        print(f"  {name:38s} {shown}")
    if args.repeats > 1:
        print(f"  shards remote rows: medians of {args.repeats} rounds; cold vs warm first epochs "
              "per round: " + "; ".join(f"{kind} {', '.join(f'{r:.2f}x' for r in got)}"
                                        for kind, got in cold_vs_warm.items()))
    if args.drop_caches:
        print("  warm, from disk: the page cache dropped before it (its shards and index read "
              "from the disk, as after a reboot); dropped before every cold epoch too")
    shard_mb = sum(Path(u).stat().st_size for u in local_urls) / 1e6
    print(f"  this machine's page cache: {new_pages:.2f} ms of CPU per MB written into new pages, "
          f"{old_pages:.2f} into pages it holds; a cold epoch writes its {shard_mb:.0f} MB of "
          f"downloads into new ones: ~{new_pages * shard_mb / 1000:.2f} s of CPU (on a VM that "
          "hands freed memory back to its host, what memory freed seconds before costs varies)")
    print(f"  index of {len(remote)} remote shards built in {statistics.median(index_s):.2f} s "
          f"(median of {len(index_s)}); "
          f"{ds.index.nbytes / len(ds):.0f} bytes/sample")
    print("  index builds with no cache: " + "; ".join(
        f"{kind} {took:.2f} s, {requests} requests" for kind, (took, requests) in builds.items()))
    print(f"  cold epoch downloaded {fetched}")
    where = "its own cores" if store_cores else "the loader's cores"
    print(f"  the S3 server's own CPU (on {where}): {statistics.median(server['cold']):.2f} s "
          f"over the cold row's epochs, {statistics.median(server['warm']):.2f} s over the warm "
          "row's (medians)")
    print("  the loader's own CPU over its first epoch (medians): " + ", ".join(
        f"{kind} {statistics.median(got):.2f} s" for kind, got in loader_cpu.items()))

    def ratio(a: str, b: str, epoch: int) -> str:
        x, y = rows.get(a), rows.get(b)
        return f"{x[epoch] / y[epoch]:.2f}x" if x and y else "n/a"

    cold, warm_row = "shards remote, cold cache (threads)", "shards remote, warm cache (threads)"
    from_disk = "shards remote, warm, from disk (threads)"
    print(f"  cold vs per object (first epochs): {ratio(cold, 'folder remote, per object (threads)', 0)} "
          f"(target >= 5x); cold vs warm cache (first epochs): {ratio(cold, warm_row, 0)}"
          + (f", vs warm from disk {ratio(cold, from_disk, 0)}" if args.drop_caches else "")
          + " (target >= 0.8x)")
    print(f"  vs webdataset: local {ratio('shards local (threads)', 'webdataset local', 1)}, remote "
          f"{ratio(cold, 'webdataset remote', 0)} cold / {ratio(cold, 'webdataset remote', 1)} second "
          f"epochs (target >= 1.5x); local shards vs litdata (second epochs): "
          f"{ratio('shards local (threads)', 'litdata local', 1)} (target >= 1x); local shards vs folder: "
          f"{ratio('shards local (threads)', 'folder local (threads)', 1)} (target >= 1x)")
    shard_of = ds.index.shards
    for window in (1, 4):
        ds.epoch_order.window = window
        order = ds.epoch_order.permutation(0, 1, shuffle=True, num_replicas=1)
        q = shuffle_quality(order, shard_of)
        print(f"  shard order, window {window}: " + ", ".join(f"{k} {v:.3f}" for k, v in q.items()))
    uniform = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).numpy()
    q = shuffle_quality(uniform.tolist(), np.asarray(shard_of))
    print("  uniform permutation:     " + ", ".join(f"{k} {v:.3f}" for k, v in q.items()))


if __name__ == "__main__":
    main()
