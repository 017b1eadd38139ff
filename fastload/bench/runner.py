"""``run_bench``: every measurement of ``fastload bench`` in order, within a time budget.

Phases and their share of ``duration_s`` (each phase also has its own bounds):

1. inventory: one listing (not part of the budget);
2. raw reads against concurrency, 30% (halved between cold and warm with a cache);
3. small random range reads at the best concurrency, 5%;
4. decode + transform rate per core, 10%;
5. accelerator emulation, 55%: a feed-rate probe (one accelerator that never computes),
   then the requested ``--gpus`` and the predicted largest N that keeps the AU bar.

Example::

    >>> report = run_bench("s3://bucket/train", gpus=8, model="resnet50", duration_s=60)
    >>> report.verdict
    'this storage feeds 3 H100s training resnet50 at >= 90% AU; storage reads ...'
"""

from __future__ import annotations

import gc
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset, Subset

from fastload.bench import accelerators, decode, throughput
from fastload.bench.inventory import Inventory, take_inventory
from fastload.bench.rawfiles import RawFiles
from fastload.bench.report import BenchReport, Measurements
from fastload.bench.shardsets import shard_dataset, shard_kind, shard_samples, warm_shards
from fastload.bench.workloads import Workload, workload
from fastload.data.images import ImageFolder
from fastload.data.sharded import ShardedImages
from fastload.errors import CacheError, ConfigError, EmptyDatasetError
from fastload.io.file_urls import files_named, folder_of, named_paths
from fastload.io.storage import Storage
from fastload.loader import DataLoader
from fastload.machine import usable_cpu_cores
from fastload.settings import AUTO

logger = logging.getLogger(__name__)

Progress = Callable[[str, float], None]
"""Called with a phase name and the fraction (0..1) of that phase that is done."""

READ_SHARE, RANGE_SHARE, DECODE_SHARE, EMULATION_SHARE = 0.30, 0.05, 0.10, 0.55
MAX_BYTES_PER_LEVEL = 1 << 30
"""At most 1 GiB is read per concurrency level, however fast the storage is."""

CACHE_BENCH_BYTES = 2 << 30
"""With --cache, at most 2 GiB of files are measured cold and warm (scratch space under DIR)."""

EMULATION_BATCH = 64
"""Largest batch the emulation uses by default: short runs need many batches to be steady."""


@dataclass(frozen=True)
class BenchOptions:
    """What to measure and for how long; the arguments of :func:`run_bench`."""

    gpus: int | None = None
    duration_s: float = 60.0
    max_concurrency: int = 32
    num_workers: int | str = AUTO
    batch_size: int | None = None
    cache: str | None = None

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ConfigError(f"duration must be > 0 seconds, got {self.duration_s}")
        if self.gpus is not None and self.gpus < 1:
            raise ConfigError(f"--gpus must be >= 1, got {self.gpus}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")


def run_bench(
    url: str,
    *,
    gpus: int | None = None,
    model: str = "resnet50",
    accelerator: str = "h100",
    samples_per_sec: float | None = None,
    au_target: float | None = None,
    cache: str | None = None,
    duration_s: float = 60.0,
    max_concurrency: int = 32,
    num_workers: int | str = AUTO,
    batch_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> BenchReport:
    """Measure whether the data at ``url`` can feed ``gpus`` accelerators training ``model``.

    Reads only; with ``cache`` it fills a fresh subdirectory of that directory (removed at
    the end) so "cold" really starts empty and the user's cache is left as it was.
    """
    opts = BenchOptions(gpus, duration_s, max_concurrency, num_workers, batch_size, cache)
    work = workload(model, accelerator, samples_per_sec=samples_per_sec, au_target=au_target)
    tick = progress or (lambda phase, fraction: None)
    files = files_named(url, storage_options or {}, owner="fastload bench")
    folder = url if files is None else folder_of(url, files)
    storage = Storage(folder, storage_options)
    tick("inventory", 0.0)
    inventory = take_inventory(storage)
    if files is not None:  # a pattern: its files only, named in the report as it was given
        inventory = _named(inventory, url, files, storage)
    tick("inventory", 1.0)
    kind = shard_kind(inventory.entries)  # NOTE [bench over shards]
    shards = None if kind is None else shard_dataset(
        kind, [storage.to_url(e.path) for e in inventory.entries], cache_dir=None,
        storage_options=storage_options)
    if shards is not None:
        samples = shard_samples(shards)
    else:
        samples = decode.read_samples(storage, inventory.entries)
    decode_s = DECODE_SHARE * duration_s
    rates = (decode.pillow_rate(samples, seconds=decode_s),)
    tick("decode", 1.0)
    if cache is None:
        measured = [_measure(folder, "origin", storage, inventory, work, opts, 1.0, tick, None,
                             shards)]
    else:
        measured = _measure_cached(folder, storage_options, inventory, work, opts, tick)
    return BenchReport(
        url=url,
        workload=work,
        inventory=inventory,
        decode=rates,
        measurements=tuple(measured),
        cores=usable_cpu_cores(),
        cache=cache,
        gpus=gpus,
        samples_per_file=1.0 if shards is None else len(shards) / max(1, inventory.files),
    )


def _measure_cached(
    url: str,
    storage_options: dict[str, Any] | None,
    inventory: Inventory,
    work: Workload,
    opts: BenchOptions,
    tick: Progress,
) -> list[Measurements]:
    """Cold then warm measurements through fastload's cache, in scratch dirs under ``--cache``.

    NOTE [cold means cold]: the cold read sweep splits one pass over the files between its
    concurrency levels, so no object is read twice; the cold emulation runs one epoch through
    a second, empty cache. Then every file is read once through that cache (a warm-up, as
    ``fastload cache warm`` would), and the warm sweep and emulation read it again.
    Datasets larger than ``CACHE_BENCH_BYTES`` are measured on a random subset of files.
    """
    assert opts.cache is not None
    parent = os.path.expanduser(opts.cache)
    try:
        os.makedirs(parent, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="fastload-bench-", dir=parent)
    except OSError as exc:
        raise CacheError(
            f"cannot create a scratch cache in --cache {opts.cache}: {exc}; pick a writable directory"
        ) from exc
    subset = _subset(inventory, CACHE_BENCH_BYTES)
    try:
        budget = opts.duration_s / 2
        levels = throughput.concurrency_levels(opts.max_concurrency)
        reads_storage = cached_storage(url, os.path.join(scratch, "reads"), storage_options)
        cold_reads = throughput.read_sweep(
            reads_storage, subset.entries, levels=levels,
            seconds_per_level=READ_SHARE * budget / len(levels),
            bytes_per_level=max(1, subset.total_bytes // len(levels)), one_pass=True,
            stop_at_plateau=False, progress=lambda f: tick("cold reads", f),
        )
        origin = Storage(url, storage_options)
        ranges = throughput.range_reads(
            origin, subset.entries, concurrency=throughput.best_point(cold_reads).concurrency,
            seconds=RANGE_SHARE * budget,
        )
        train_dir = os.path.join(scratch, "train")
        train_storage = cached_storage(url, train_dir, storage_options)
        dataset = emulation_dataset(url, train_storage, subset, train_dir)
        cold_runs = _emulate_all(
            dataset, work, opts, EMULATION_SHARE * budget, "cold", tick, subset, one_epoch=True
        )
        cold = Measurements("cold", tuple(cold_reads), ranges, cold_runs[0], tuple(cold_runs[1:]))
        concurrency = throughput.best_point(cold_reads).concurrency
        if isinstance(dataset, ShardedImages):  # its files whole in the shard store
            warm_shards(origin, subset.entries, train_dir, jobs=concurrency)
        else:
            warm_up(train_storage, subset, concurrency=concurrency)
        tick("warm-up", 1.0)
        warm = _measure(url, "warm", train_storage, subset, work, opts, 0.5, tick, train_dir)
        return [cold, warm]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _named(inventory: Inventory, pattern: str, files: list[str], storage: Storage) -> Inventory:
    """The entries of ``inventory`` (the listing of ``storage``) that ``pattern`` named."""
    by_path = {e.path: e for e in inventory.entries}
    paths = named_paths(pattern, files, storage.url, storage.root, by_path)
    return Inventory(pattern, tuple(by_path[p] for p in paths), inventory.listing_s)


def _subset(inventory: Inventory, max_bytes: int) -> Inventory:
    """The inventory itself if it fits ``max_bytes``, else a seeded random subset that does."""
    if inventory.total_bytes <= max_bytes:
        return inventory
    order = list(inventory.entries)
    random.Random(0).shuffle(order)
    chosen, total = [], 0
    for e in order:
        if total + e.size > max_bytes and chosen:
            break
        chosen.append(e)
        total += e.size
    logger.info("cache measurements use %d of %d files (%d bytes)", len(chosen), inventory.files, total)
    return Inventory(inventory.url, tuple(sorted(chosen, key=lambda e: e.path)), inventory.listing_s)


def cached_storage(url: str, cache_dir: str, storage_options: dict[str, Any] | None) -> Storage:
    """A Storage of ``url`` whose reads go through fastload's cache in ``cache_dir``."""
    from fastload.cache import open_cache
    from fastload.cache.filesystem import CachedReads

    storage = Storage(url, storage_options, read_through=CachedReads(open_cache(cache_dir)))
    storage.find()  # one listing gives every object's version: no HEAD per read for cache keys
    return storage


def warm_up(storage: Storage, inventory: Inventory, *, concurrency: int) -> None:
    """Read every file of ``inventory`` once through ``storage`` (and so into its cache)."""
    with ThreadPoolExecutor(concurrency, thread_name_prefix="fastload-bench-warm") as pool:
        # Each read's bytes are dropped as soon as it is done (only the cache keeps them);
        # iterating the results still re-raises the first read that failed.
        for data in pool.map(storage.read, [e.path for e in inventory.entries]):
            del data


def _measure(
    url: str,
    label: str,
    storage: Storage,
    inventory: Inventory,
    work: Workload,
    opts: BenchOptions,
    share: float,
    tick: Progress,
    cache_dir: str | None,
    dataset: Dataset | None = None,
) -> Measurements:
    """Reads, range reads (at the origin only) and the emulation under one condition, over
    ``dataset`` when given (the shard dataset ``run_bench`` built already), else
    :func:`emulation_dataset`'s."""
    budget = opts.duration_s * share
    levels = throughput.concurrency_levels(opts.max_concurrency)
    reads = throughput.read_sweep(
        storage,
        inventory.entries,
        levels=levels,
        seconds_per_level=READ_SHARE * budget / len(levels),
        bytes_per_level=MAX_BYTES_PER_LEVEL,
        progress=lambda f: tick(f"{label} reads", f),
    )
    best = throughput.best_point(reads)
    if cache_dir is None:
        ranges = throughput.range_reads(
            storage, inventory.entries, concurrency=best.concurrency, seconds=RANGE_SHARE * budget
        )
    else:
        ranges = throughput.RangeReads(best.concurrency, 0, 0, 0.0, skipped_reason=(
            "measured at the origin under the cold condition (the cache keeps whole objects)"
        ))
    tick(f"{label} range reads", 1.0)
    if dataset is None:
        dataset = emulation_dataset(url, storage, inventory, cache_dir)
    runs = _emulate_all(dataset, work, opts, EMULATION_SHARE * budget, label, tick, inventory)
    return Measurements(label, tuple(reads), ranges, runs[0], tuple(runs[1:]))


def emulation_dataset(
    url: str, storage: Storage, inventory: Inventory, cache_dir: str | None
) -> Dataset:
    """ImageFolder (decoded like training data) for class-per-folder images, TarShards or
    ParquetImages for a folder of tar shards or Parquet files (NOTE [bench over shards]),
    else RawFiles. Only the files of ``inventory`` take part (a subset under a cache).
    """
    kind = shard_kind(inventory.entries)
    if kind is not None:
        shards = shard_dataset(kind, [storage.to_url(e.path) for e in inventory.entries],
                               cache_dir=cache_dir, storage_options=storage.storage_options)
        if shards is not None:
            return shards
    if decode.image_entries(inventory.entries):
        try:
            images = ImageFolder(
                url, size=224, train=True, cache=cache_dir,
                storage_options=storage.storage_options,
            )
        except EmptyDatasetError:
            logger.info("%s is not class-per-folder images; the emulation reads raw bytes", url)
        else:
            keep = {e.path for e in inventory.entries}
            if len(keep) == len(images):
                return images
            return Subset(images, [i for i, (p, _) in enumerate(images.samples) if p in keep])
    return RawFiles(storage, [e.path for e in inventory.entries])


def _emulate_all(
    dataset: Dataset,
    work: Workload,
    opts: BenchOptions,
    seconds: float,
    label: str,
    tick: Progress,
    inventory: Inventory,
    *,
    one_epoch: bool = False,
) -> list[accelerators.Emulation]:
    """The feed-rate probe, then the requested N and the predicted largest N."""
    batch = opts.batch_size or min(work.batch_size, EMULATION_BATCH, max(1, len(dataset) // 8))
    collate = list if isinstance(dataset, RawFiles) else None
    loader = DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=opts.num_workers, collate_fn=collate
    )
    probe_work = Workload(work.model, work.accelerator, 0.0, 1, work.au_target, "feed-rate probe")
    slice_s = seconds / 3
    try:
        probe = accelerators.AcceleratorEmulator(
            loader, probe_work, 1, seconds=slice_s, one_epoch=one_epoch,
            progress=lambda f: tick(f"{label} feed rate", f),
        ).run()
        predicted = accelerators.largest_fed(probe.samples_per_s, work)
        logger.info(
            "%s: loader feeds %.1f samples/s -> up to %d accelerators at AU >= %.0f%%",
            label, probe.samples_per_s, predicted, 100 * work.au_target,
        )
        counts = [n for n in dict.fromkeys([opts.gpus, max(1, predicted)]) if n is not None]
        runs = [probe]
        for n in counts:
            runs.append(
                accelerators.AcceleratorEmulator(
                    loader, work, n, seconds=slice_s * 2 / len(counts), one_epoch=one_epoch,
                    progress=lambda f, n=n: tick(f"{label} {n} accelerators", f),
                ).run()
            )
    finally:
        # Persistent workers live as long as the loader: end them before the next phase
        # (and before a scratch cache they write to is removed).
        del loader
        gc.collect()
    return runs
