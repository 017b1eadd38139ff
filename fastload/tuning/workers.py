"""Worker counts from a probe's numbers, and their re-tuning between epochs.

    >>> choose_workers(probe, cores=2, batch_size=32).workers
    8
    >>> retune_workers(2, input_bound=True, workers_busy=0.95, cores=8, limit=8)
    (3, '3 workers (was 2): ...')

NOTE [workers from measurements]
The probe (NOTE [the dataset probe]) gives a sample's CPU time, wall time and pickled size.
From them, in this order:

* Workers must repay their cost. A torch worker costs the main process ``IPC_BATCH_S`` per
  batch (measured, see the constants: 16 µs a sample at batch_size 32) plus
  ``IPC_COST_PER_BYTE_S`` per pickled byte, and each epoch pays their start-up
  (``WORKER_START_S``). A sample whose wall time is below ``MIN_SAMPLE_S``, or under
  ``IPC_MARGIN`` times its own IPC cost, stays in-process: workers would gain little, and a
  small, in-memory dataset gains nothing at all. So does an epoch so short (length x wall
  time) that starting workers is a sizeable part of it (under ``MIN_EPOCH_STARTS`` start-ups).
* CPU-bound samples (wall < ``WAIT_RATIO`` x CPU) get one worker per usable core, less one
  when the main process's share (receiving every sample: workers x IPC cost / wall time)
  reaches half a core.
* Samples that mostly wait get more workers than cores: enough that a batch is ready every
  ``TARGET_BATCH_S`` (wall x batch_size / workers <= target), and not more than saturate the
  cores (cores x wall / CPU), at least one per core and at most ``WAIT_CAP`` per core.
* Every count is capped by memory: each worker costs ``WORKER_BASE_BYTES`` (the private
  memory of a forked torch worker, measured; a spawned one imports torch afresh:
  ``SPAWN_BASE_BYTES``), plus the pickled dataset (its copy in the worker), plus two batches
  of samples in flight; the workers may take half of ``MemAvailable``.
* A dataset that draws from the main process's global RNG gets one worker per core whatever
  it measured (less only if memory says so): its batches then depend on the worker count, as
  with torch's workers, so the count must not depend on timings, and a seed reproduces the
  batches run after run on the same machine. Re-tuning leaves it alone for the same reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastload.tuning.probe import DatasetProbe

# Measured on this project's 2-core machine (torch 2.14.1, Python 3.11) on 2026-12-01 by
# `python benchmarks/worker_costs.py` (median of 3; the machine had one other job running).
# The thresholds below keep a wide margin over these figures.
IPC_BATCH_S = 520e-6
"""Main-process CPU seconds per batch received from a worker: 520 µs a batch of one small
sample, 16.4 µs a sample at batch_size 32 (in-process, the whole loop costs 36 / 2.5 µs)."""

IPC_COST_PER_BYTE_S = 0.21e-9
"""Main-process CPU seconds per byte of sample received (a 3x224x224 float32 image at
batch_size 32: 144 µs a sample against 16.4 µs for 16 floats)."""

WORKER_START_S = {"fork": 0.063, "forkserver": 3.5, "spawn": 3.6}
"""Seconds from iter() to the first batch of 2 fresh workers, per start method (a spawned or
forkserver worker imports torch afresh)."""

WORKER_BASE_BYTES = 10 << 20
"""Private memory (USS) of a forked torch worker after its first sample: 10 MB (it grows as
it writes to pages it shares with the main process)."""

SPAWN_BASE_BYTES = 283 << 20
"""Private memory of a spawned (or forkserver) worker after its first sample: 283 MB."""

MIN_SAMPLE_S = 1e-3
"""Samples cheaper than this stay in-process: about 60x the per-sample IPC cost at
batch_size 32 (16.4 µs), twice the per-batch cost at batch_size 1 (520 µs)."""

IPC_MARGIN = 4.0
"""A sample must cost at least this many times its own IPC cost to go to workers (the main
process can receive at most wall/IPC times as many samples as it could fetch itself)."""

MIN_EPOCH_STARTS = 3.0
"""An in-process epoch shorter than this many worker start-ups stays in-process."""

TARGET_BATCH_S = 0.02
"""Waiting samples get enough workers to deliver a batch every this many seconds."""

WAIT_CAP = 4
"""Waiting samples get at most this many workers per usable core."""

MEMORY_SHARE = 0.5
"""Workers may take this share of the memory available when the loader is built."""

BUSY_HIGH = 0.8
"""Re-tuning: workers busier than this, with the loop waiting on input, want more workers."""

BUSY_LOW = 0.3
"""Re-tuning: workers busier than this fraction are not idle enough to lose one."""


@dataclass(frozen=True)
class WorkerChoice:
    """A worker count, why (with the numbers), and the most workers memory and cores allow."""

    workers: int
    reason: str
    limit: int = 0
    per_worker_bytes: int | None = None


def ipc_cost(probe: DatasetProbe, batch_size: int | None = 1) -> float:
    """Estimated main-process seconds per sample of receiving it from a worker."""
    return IPC_BATCH_S / max(1, batch_size or 1) + (probe.sample_bytes or 0) * IPC_COST_PER_BYTE_S


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def choose_workers(
    probe: DatasetProbe,
    *,
    cores: int,
    batch_size: int | None = 1,
    available_bytes: int | None = None,
) -> WorkerChoice:
    """The worker count NOTE [workers from measurements] gives for ``probe`` on ``cores`` cores."""
    if not probe.usable:
        return WorkerChoice(0, f"in-process: {probe.blocker}; {probe.summary()}")
    cores = max(1, cores)
    wall, cpu = probe.wall_s or 0.0, probe.cpu_s or 0.0
    numbers = f"{_ms(cpu)} CPU and {_ms(wall)} wall per sample"
    ipc = ipc_cost(probe, batch_size)
    if wall < MIN_SAMPLE_S or wall < IPC_MARGIN * ipc:
        floor = max(MIN_SAMPLE_S, IPC_MARGIN * ipc)
        return WorkerChoice(0, (
            f"in-process: {numbers}, below the {_ms(floor)} that repays a worker "
            f"(~{_ms(ipc)} of IPC per sample at batch_size {batch_size or 1}, measured); "
            f"{probe.summary()}"
        ))
    start_s = WORKER_START_S.get(probe.context, max(WORKER_START_S.values()))
    epoch_s = (probe.length or 0) * wall
    if epoch_s < MIN_EPOCH_STARTS * start_s:
        return WorkerChoice(0, (
            f"in-process: {numbers} x {probe.length} samples = {epoch_s:.2f} s an epoch, under "
            f"{MIN_EPOCH_STARTS:g}x the ~{start_s:g} s {probe.context} workers take to start; "
            f"{probe.summary()}"
        ))

    base = WORKER_BASE_BYTES if probe.context == "fork" else SPAWN_BASE_BYTES
    per_worker = base + (probe.dataset_bytes or 0) + 2 * max(1, batch_size or 1) * (probe.sample_bytes or 0)
    ram_cap = None
    if available_bytes is not None:
        ram_cap = max(1, int(available_bytes * MEMORY_SHARE // per_worker))
    limit = min(WAIT_CAP * cores if probe.waits else cores, ram_cap or 10**6)

    if probe.rng:
        n, why = cores, ("one per usable core, fixed since it draws from the global RNG: "
                         "the count must not depend on timings")
    elif probe.waits:
        n_batch = math.ceil(wall * max(1, batch_size or 1) / TARGET_BATCH_S)
        n_saturate = math.ceil(cores * wall / max(cpu, 1e-6))
        n = max(cores, min(n_batch, n_saturate, WAIT_CAP * cores))
        binding = min(
            (n_batch, f"a batch of {batch_size or 1} every {_ms(TARGET_BATCH_S)}"),
            (n_saturate, "enough to fill the cores"),
            (WAIT_CAP * cores, f"at most {WAIT_CAP} per core"),
        )
        why = f"waits on I/O, more workers than cores: {binding[1]}" if n > cores else "waits on I/O"
    else:
        main_share = cores * ipc / max(wall, 1e-9)
        n = cores - 1 if main_share >= 0.5 and cores > 1 else cores
        why = f"CPU-bound, one per usable core (main process ~{main_share:.0%} of a core)"
    if ram_cap is not None and n > ram_cap:
        n, why = ram_cap, f"{why}; capped by memory ({_mb(available_bytes or 0)} available)"
    n = max(1, n)
    reason = (
        f"{n} workers: {numbers} ({why}), {cores} core{'s' if cores != 1 else ''}, "
        f"{_mb(per_worker)} per worker; {probe.summary()}"
    )
    if probe.rng:
        reason += (
            "; workers are seeded by torch as its own are (base seed + worker id), so a "
            "torch.manual_seed reproduces the batches"
        )
    return WorkerChoice(n, reason, max(limit, n), per_worker)


def retune_workers(
    current: int,
    *,
    input_bound: bool,
    workers_busy: float | None,
    cores: int,
    limit: int | None = None,
    cpu_busy: float | None = None,
) -> tuple[int, str] | None:
    """A new worker count after an epoch, with the reason, or None to keep ``current``.

    More workers (half again, at least one) when the loop waited on input while the workers
    were busy (``workers_busy`` >= BUSY_HIGH) and there is headroom: below ``limit`` (default
    ``cores``) and the machine's CPUs not saturated (``cpu_busy`` < 0.9 where known). Fewer
    when the loop did not wait and the workers idled (busy < BUSY_LOW): enough to run at
    ~70% busy. In-process loaders (``current == 0``) are never given workers here: the
    probe decided that.
    """
    if current <= 0 or workers_busy is None:
        return None
    limit = max(1, limit if limit is not None else cores)
    if input_bound and workers_busy >= BUSY_HIGH:
        if current >= limit:
            return None
        if cpu_busy is not None and cpu_busy >= 0.9:
            return None
        new = min(limit, current + max(1, current // 2))
        return new, (
            f"{new} workers (was {current}): the last epoch waited on input with workers "
            f"{workers_busy:.0%} busy and headroom below {limit}"
        )
    if not input_bound and workers_busy < BUSY_LOW:
        new = max(1, math.ceil(current * workers_busy / 0.7))
        if new >= current:
            return None
        return new, (
            f"{new} workers (was {current}): workers were {workers_busy:.0%} busy and the loop "
            "never waited on input"
        )
    return None


def _ms(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1e3:.1f} ms"


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.0f} MB"
