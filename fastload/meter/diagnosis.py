"""The meter's diagnosis: the bottleneck and the fix, pure functions of measured numbers.

NOTE [what the diagnosis tells apart]
With worker processes measured (:mod:`.workers`: their busy share, how much of it was CPU and
collate, and per batch when its worker finished it), an input-bound loop is one of:

* **host-to-device copy**: the copy (``device=`` loaders) takes at least half the wait;
* **main process**: the workers are busy less than :data:`SATURATED` of their time and
  most of the wait comes after the batch's worker had finished it (where that split is
  measured): the cost is handing the batch over (torch's per-batch IPC, unpickling,
  pinning), so larger batches, uint8 instead of float and fewer tensors per sample help,
  more workers do not. Saturated workers come first: on a machine whose cores they fill,
  the main process also waits for a core to receive, and that is the workers' doing;
* workers saturated, by what their busy time is: **collate** (``collate_fn`` at least half
  of it), **storage fetch** (the CPU less than :data:`IO_BOUND_CPU` of it: waiting on I/O;
  cache, prefetch, more requests in flight), **decode/transform** or **storage fetch** from
  a declared dataset's own split, or **workers** (CPU: more workers up to the cores, then the
  threaded or DALI engine or the transcoded cache);
* **loader**: batches made in the main process (``num_workers=0``), or workers that were not
  measured (the summary says why);
* **none**: not input-bound; the fix then names what could come next, as suggestions.

Every recommendation is derived from measured numbers, which the summary prints next to it
(NOTE [worker-seconds] in :mod:`.report`).

Example::

    >>> diagnose(share=0.6, wait_s=0.030, step_s=0.050, copy_s=None,
    ...          work=WorkerWork(fetch_s=0.002, decode_s=0.118, collate_s=0.001),
    ...          num_workers=2, cores=16, gpus=1).fix
    'raise num_workers to 6'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastload.meter.report import (
    IN_PROCESS_ENGINES,
    IO_BOUND_CPU,
    MODERATELY_INPUT_BOUND,
    SATURATED,
    Diagnosis,
    Verdict,
    WorkerStats,
    WorkerWork,
    _ms,
    verdict_for,
)

# The opt-in for a decode-bound run that more workers cannot fix (docs/cache.md, "Transcoded
# tier"). A suggestion, not a default: it changes the pixels the model trains on.
TRANSCODE_HINT = (
    'opt in to the transcoded cache tier, cache={"disk": ..., "transcode": {"max_side": 256}}: '
    "it caches each image re-encoded as a JPEG at most max_side pixels on its longer side, so "
    "later epochs decode fewer pixels. It changes pixels: pick max_side at least the size you "
    "crop to; `fastload cache warm URL --cache DIR --transcode 256` fills it ahead"
)


FEW_WORKERS_PER_CORE = 4
"""Worker processes per core (at least :data:`MOST_WORKERS_AT_LEAST`) past which the
diagnosis stops asking for more: a worker waiting on storage needs no core, but each is a
process with its own copy of the dataset, and a loop that needs more than that (a bare
loop computes almost nothing per batch) needs fewer requests per sample, not more of them."""

MOST_WORKERS_AT_LEAST = 32


def workers_needed(work_s: float, compute_s: float) -> int:
    """Workers that produce one batch per ``compute_s`` when a batch costs ``work_s``."""
    return max(1, math.ceil(work_s / max(compute_s, 1e-6)))


def most_workers(cores: int) -> int:
    """The most workers the diagnosis asks for on ``cores`` usable cores."""
    return max(MOST_WORKERS_AT_LEAST, FEW_WORKERS_PER_CORE * cores)


def diagnose(
    *,
    share: float,
    wait_s: float,
    step_s: float,
    copy_s: float | None,
    work: WorkerWork | None,
    num_workers: int | None,
    cores: int,
    gpus: int,
    on_device: bool = False,
    workers: WorkerStats | None = None,
    receive_s: float | None = None,
    fetch_fix: str | None = None,
    smaller_fix: str | None = None,
    engine: str | None = None,
) -> Diagnosis:
    """Name the bottleneck and the fix from per-batch means (seconds) and the machine.

    Args:
        share: fraction of step time spent waiting (host wait, or GPU idle when measured).
        wait_s: mean host wait per batch; step_s: mean step (wait + the loop's own work).
        copy_s: mean host time of the host-to-device copy inside the wait, None if unknown.
        work: mean worker-seconds per batch by phase, None if the dataset reports none.
        num_workers: the loader's workers (0 = main process), None if unknown.
        cores: usable CPU cores; gpus: CUDA devices; on_device: batches already go to a GPU.
        workers: the workers' measured busy share and its make-up (:mod:`.workers`).
        receive_s: mean part of the wait after the batch's worker had finished it
            (NOTE [the wait split] in :mod:`.analysis`), None if unknown.
        fetch_fix: the dataset's own fix when fetching is the bottleneck (NOTE [the source's
            own fix] in :mod:`fastload.data.fetch_advice`), None for the general one.
        smaller_fix: the dataset's own way to decode fewer pixels, None for the transcoded
            cache tier (an ImageFolder's).
        engine: the fastload engine that made the batches, None if unknown; an in-process
            one (threads, DALI) reads with threads of its own, not ``num_workers``.

    See NOTE [what the diagnosis tells apart].
    """
    verdict = verdict_for(share)
    compute_s = max(0.0, step_s - wait_s)
    if verdict is Verdict.NOT:
        return Diagnosis(
            "none",
            "none: the input pipeline keeps up. What could come next, if the step should be "
            "faster: a larger batch or gradient accumulation, mixed precision (torch.autocast), "
            "or profiling the step (torch.profiler)",
            f"waiting {share:.1%} of a {_ms(step_s)} step is below the "
            f"{MODERATELY_INPUT_BOUND:.0%} band",
        )
    if copy_s is not None and copy_s >= 0.5 * wait_s:
        fix = (
            "keep images uint8 and normalize on the device (ImageFolder(normalize=True) with "
            "device='cuda' does this)"
            if on_device
            else "pass device='cuda' to the DataLoader: pinned memory, copy one batch ahead on "
            "a side stream, normalize on the GPU"
            if gpus
            else "batches are copied on the host: drop the copy or pass device=None"
        )
        return Diagnosis(
            "host-to-device copy", fix,
            f"the copy takes {_ms(copy_s)} of the {_ms(wait_s)} wait per batch",
        )
    measured = workers is not None and workers.busy_share is not None
    if measured and _main_process_bound(workers, wait_s, receive_s):  # type: ignore[arg-type]
        return _diagnose_main(workers, wait_s, receive_s)  # type: ignore[arg-type]
    source = _SourceFix(fetch_fix, smaller_fix, engine, cores)
    if work is not None and work.total_s > 0:
        return _diagnose_work(work, compute_s, num_workers, cores, gpus, workers, source)
    if measured:
        return _diagnose_busy(workers, compute_s, cores, source)  # type: ignore[arg-type]
    return _diagnose_unmeasured(wait_s, step_s, compute_s, num_workers, cores, workers)


@dataclass(frozen=True)
class _SourceFix:
    """What the dataset says to change (NOTE [the source's own fix]): ``fetch`` for a
    fetch-bound loop (else the general sentence, with more workers where more would do),
    ``smaller`` for how to decode fewer pixels (else the transcoded tier); the engine and
    the cores."""

    fetch: str | None
    smaller: str | None
    engine: str | None
    cores: int

    @property
    def in_process(self) -> bool:
        return self.engine in IN_PROCESS_ENGINES

    def fetch_text(self, need: int, workers: int | None) -> str:
        fix = self.fetch or "enable the cache: ImageFolder(..., cache='~/.cache/fastload')"
        if self.in_process or (workers is not None and need <= workers):
            return fix  # an in-process engine reads with its own threads, not num_workers
        if need <= most_workers(self.cores):
            return f"{fix}; or raise num_workers to {need} (fetching waits on storage, not cores)"
        return (
            f"{fix}. More workers are no fix here: keeping up with this loop would take {need} "
            "of them"
        )


def _main_process_bound(workers: WorkerStats, wait_s: float, receive_s: float | None) -> bool:
    # Saturated workers come first even when batches arrive late after they finish them: on
    # a machine whose cores the workers fill, the main process waits for a core to receive.
    if (workers.busy_share or 0.0) >= SATURATED:
        return False
    # Measured per batch: the wait came after the batch's worker had finished it.
    return receive_s is None or receive_s >= 0.5 * wait_s


def _busy(workers: WorkerStats) -> str:
    return (
        f"the {workers.workers} workers were busy {workers.busy_share:.0%} of their time, "
        f"{_ms(workers.busy_per_batch_s or 0.0)} per batch"
    )


def _diagnose_main(workers: WorkerStats, wait_s: float, receive_s: float | None) -> Diagnosis:
    after = (
        f"; {_ms(receive_s)} of the {_ms(wait_s)} wait per batch came after its worker had "
        "finished it"
        if receive_s is not None
        else f"; the loop still waits {_ms(wait_s)} per batch"
    )
    return Diagnosis(
        "main process",
        "the main process's hand-over of each batch is the cost (torch's per-batch IPC: "
        "passing each tensor's shared memory, unpickling, pinning): use larger batches (the "
        "cost is per batch), uint8 instead of float32 (a quarter of the bytes; normalize on "
        "the device), and fewer tensors per sample (stack them: each is its own hand-over)",
        _busy(workers) + after,
    )


def _diagnose_busy(
    workers: WorkerStats, compute_s: float, cores: int, source: _SourceFix
) -> Diagnosis:
    per_batch = workers.busy_per_batch_s or 0.0
    need = workers_needed(per_batch, compute_s)
    n = workers.workers
    evidence = (
        f"{_busy(workers)} (CPU {workers.cpu_share:.0%} of it, collate "
        f"{workers.collate_share:.0%}); the loop computes {_ms(compute_s)} per batch, so "
        f"{need} worker(s) keep up (now {n}, {cores} usable cores)"
    )
    more = f"raise num_workers to {need}" if need > n else None
    if (workers.collate_share or 0.0) >= 0.5:
        fix = "make collate_fn cheaper (one torch.stack per field, no per-element Python)"
        if more and need <= cores:
            fix += f", or {more}"
        return Diagnosis("collate", fix, evidence)
    if (workers.cpu_share or 0.0) < IO_BOUND_CPU:
        if source.fetch is not None:
            return Diagnosis("storage fetch", source.fetch_text(need, n), evidence)
        fix = (
            "the workers wait on storage, not on the CPU: cache the data near the loop "
            "(fastload.ImageFolder(..., cache='~/.cache/fastload'), which also prefetches the "
            "epoch's next files), or keep more requests in flight"
        )
        if more and need <= most_workers(cores):
            fix += f": {more} (waiting workers need no cores)"
        fix += ", or read with threads (backend='threads': 8 read threads for remote stores)"
        return Diagnosis("storage fetch", fix, evidence)
    if more and need <= cores:
        return Diagnosis("workers", more, evidence)
    if need <= n:
        fix = (
            f"the {n} workers share {cores} cores with the loop: make the dataset's "
            "__getitem__ cheaper, or use a machine with more cores"
        )
    else:
        fix = (
            f"making batches needs {need} workers' worth of CPU and this machine has {cores} "
            "usable cores: make __getitem__ cheaper; for images, fastload.ImageFolder with "
            'backend="threads" (threaded decoding) or backend="dali" on a GPU, or '
            + TRANSCODE_HINT
        )
    return Diagnosis("workers", fix, evidence)


def _diagnose_work(
    work: WorkerWork,
    compute_s: float,
    workers: int | None,
    cores: int,
    gpus: int,
    stats: WorkerStats | None,
    source: _SourceFix,
) -> Diagnosis:
    need = workers_needed(work.total_s, compute_s)
    phases = {
        "storage fetch": work.fetch_s,
        "decode/transform": work.decode_s,
        "collate": work.collate_s,
    }
    bottleneck = max(phases, key=phases.__getitem__)
    now = f"now {workers}" if workers is not None else "workers unknown"
    busy = f"; {_busy(stats)}" if stats is not None and stats.busy_share is not None else ""
    spent = (
        f"{_ms(work.total_s)} per batch (fetch {_ms(work.fetch_s)}, decode "
        f"{_ms(work.decode_s)}, collate {_ms(work.collate_s)})"
    )
    evidence = (
        f"the {source.engine} engine's threads spend {spent}; the loop computes "
        f"{_ms(compute_s)} per batch, so {need} threads' worth of that work keep up ({now} "
        f"threads, {cores} usable cores)"
        if source.in_process
        else f"workers spend {spent}; the loop computes {_ms(compute_s)} per batch, so "
        f"{need} worker(s) keep up ({now}, {cores} usable cores){busy}"
    )
    can_raise = workers is None or need > workers
    if bottleneck == "storage fetch":
        return Diagnosis(bottleneck, source.fetch_text(need, workers), evidence)
    if can_raise and need <= cores:
        return Diagnosis(bottleneck, f"raise num_workers to {need}", evidence)
    if bottleneck == "decode/transform" and gpus:
        fix = (
            f'use backend="dali": decoding needs {need} workers, this machine has {cores} '
            f"cores; or, to decode fewer pixels, {source.smaller or TRANSCODE_HINT}"
        )
        return Diagnosis(bottleneck, fix, evidence)
    fix = (
        f"raise num_workers to {cores} (all usable cores); beyond that, decoding needs {need} "
        "cores' worth of CPU: store smaller images or use a machine with more cores"
        if workers is None or workers < cores
        else f"all {cores} usable cores already work; decoding needs {need}: store smaller "
        "images, or use a machine with more cores or a GPU with backend=\"dali\""
    )
    if bottleneck == "decode/transform":
        fix += (f"; to decode fewer pixels, {source.smaller}" if source.smaller else
                f"; to store smaller images without rewriting the dataset, {TRANSCODE_HINT}")
    return Diagnosis(bottleneck, fix, evidence)


def _diagnose_unmeasured(
    wait_s: float,
    step_s: float,
    compute_s: float,
    workers: int | None,
    cores: int,
    stats: WorkerStats | None,
) -> Diagnosis:
    if workers == 0:  # the whole batch is made inside next(): its cost is the wait
        need = workers_needed(wait_s, compute_s)
        fix = f"raise num_workers to {min(need, most_workers(cores))}"
        if need > cores:
            fix += f" (beyond {cores} cores this helps only if the dataset waits on I/O)"
        fix += "; or declare the dataset worker-safe: fastload_worker_safe = True on its class"
        return Diagnosis(
            "loader",
            fix,
            f"batches are made in the main process inside next(): {_ms(wait_s)} per batch; the "
            f"loop computes {_ms(compute_s)} per batch, so {need} worker(s) keep up ({cores} "
            "usable cores)",
        )
    why = stats.note if stats is not None and stats.note else "the workers were not measured"
    return Diagnosis(
        "loader",
        "raise the loader's num_workers, or run it as a fastload.DataLoader, which measures "
        "its workers and names the stage",
        f"the loop waits {_ms(wait_s)} of each {_ms(step_s)} step; {why}",
    )
