"""The meter's verdict and diagnosis: pure functions of measured numbers, and the summary.

NOTE [verdict bands]
The bands are those of the TensorFlow profiler's input-pipeline analyzer: a loop that spends
at least 20% of its step time waiting for input is *highly* input-bound, at least 5%
*moderately*, otherwise *not* input-bound. The share is measured over the steady state: the
first batch of each pass (worker start-up) is shown apart and left out, because more workers
cannot shorten it. On a GPU the share is the GPU's own idle time (CUDA events); without one it
is the host's wait around ``next()``.

NOTE [worker-seconds]
Fetch, decode and collate times come from inside the workers and are *summed over a batch's
samples*: work, not wall time. ``W`` workers run in parallel, so a pipeline whose batches cost
``work`` worker-seconds delivers one batch per ``work / W`` seconds at best, and keeping up
with a loop that computes for ``compute`` seconds per batch takes ``ceil(work / compute)``
workers. Every recommendation below is derived from those measured numbers, which the
summary prints next to it.

Example::

    >>> verdict_for(0.31)
    <Verdict.HIGHLY: 'highly input-bound'>
    >>> diagnose(share=0.6, wait_s=0.030, step_s=0.050, copy_s=None,
    ...          work=WorkerWork(fetch_s=0.002, decode_s=0.118, collate_s=0.001),
    ...          num_workers=2, cores=16, gpus=1).fix
    'raise num_workers to 6: ...'
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

HIGHLY_INPUT_BOUND = 0.20
MODERATELY_INPUT_BOUND = 0.05

BOTTLENECKS = ("storage fetch", "decode/transform", "collate/copy", "loader", "none")
"""What :func:`diagnose` can name; "loader" when the dataset does not split its time."""


class Verdict(str, Enum):
    """How input-bound a training loop is, in the bands of NOTE [verdict bands]."""

    HIGHLY = "highly input-bound"
    MODERATELY = "moderately input-bound"
    NOT = "not input-bound"


def verdict_for(share: float) -> Verdict:
    """The band of a waiting share (a fraction of step time, 0..1)."""
    if share >= HIGHLY_INPUT_BOUND:
        return Verdict.HIGHLY
    if share >= MODERATELY_INPUT_BOUND:
        return Verdict.MODERATELY
    return Verdict.NOT


@dataclass(frozen=True)
class WorkerWork:
    """Mean worker-seconds per batch spent in each phase (NOTE [worker-seconds])."""

    fetch_s: float
    decode_s: float
    collate_s: float

    @property
    def total_s(self) -> float:
        return self.fetch_s + self.decode_s + self.collate_s


@dataclass(frozen=True)
class Diagnosis:
    """The most likely bottleneck, the fix in fastload's terms, and the numbers behind both."""

    bottleneck: str
    fix: str
    evidence: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


# The opt-in for a decode-bound run that more workers cannot fix (docs/cache.md, "Transcoded
# tier"). A suggestion, not a default: it changes the pixels the model trains on.
TRANSCODE_HINT = (
    'opt in to the transcoded cache tier, cache={"disk": ..., "transcode": {"max_side": 256}}: '
    "it caches each image re-encoded as a JPEG at most max_side pixels on its longer side, so "
    "later epochs decode fewer pixels. It changes pixels: pick max_side at least the size you "
    "crop to; `fastload cache warm URL --cache DIR --transcode 256` fills it ahead"
)


def workers_needed(work_s: float, compute_s: float) -> int:
    """Workers that produce one batch per ``compute_s`` when a batch costs ``work_s``."""
    return max(1, math.ceil(work_s / max(compute_s, 1e-6)))


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
) -> Diagnosis:
    """Name the bottleneck and the fix from per-batch means (seconds) and the machine.

    Args:
        share: fraction of step time spent waiting (host wait, or GPU idle when measured).
        wait_s: mean host wait per batch; step_s: mean step (wait + the loop's own work).
        copy_s: mean host time of the host-to-device copy inside the wait, None if unknown.
        work: mean worker-seconds per batch by phase, None if the dataset reports none.
        num_workers: the loader's workers (0 = main process), None if unknown.
        cores: usable CPU cores; gpus: CUDA devices; on_device: batches already go to a GPU.
    """
    verdict = verdict_for(share)
    compute_s = max(0.0, step_s - wait_s)
    if verdict is Verdict.NOT:
        return Diagnosis(
            "none",
            "none: the input pipeline keeps up",
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
            "collate/copy", fix, f"the copy takes {_ms(copy_s)} of the {_ms(wait_s)} wait per batch"
        )
    workers = num_workers if num_workers is not None else None
    if work is not None and work.total_s > 0:
        return _diagnose_work(work, compute_s, workers, cores, gpus)
    return _diagnose_unsplit(wait_s, step_s, compute_s, workers, cores)


def _diagnose_work(
    work: WorkerWork, compute_s: float, workers: int | None, cores: int, gpus: int
) -> Diagnosis:
    need = workers_needed(work.total_s, compute_s)
    phases = {
        "storage fetch": work.fetch_s,
        "decode/transform": work.decode_s,
        "collate/copy": work.collate_s,
    }
    bottleneck = max(phases, key=phases.__getitem__)
    now = f"now {workers}" if workers is not None else "workers unknown"
    evidence = (
        f"workers spend {_ms(work.total_s)} per batch (fetch {_ms(work.fetch_s)}, decode "
        f"{_ms(work.decode_s)}, collate {_ms(work.collate_s)}); the loop computes "
        f"{_ms(compute_s)} per batch, so {need} worker(s) keep up ({now}, {cores} usable cores)"
    )
    can_raise = workers is None or need > workers
    if bottleneck == "storage fetch":
        fix = "enable the cache: ImageFolder(..., cache='~/.cache/fastload')"
        if can_raise:
            fix += f", or raise num_workers to {need} (fetching waits on storage, not cores)"
        return Diagnosis(bottleneck, fix, evidence)
    if can_raise and need <= cores:
        return Diagnosis(bottleneck, f"raise num_workers to {need}", evidence)
    if bottleneck == "decode/transform" and gpus:
        fix = (
            f'use backend="dali": decoding needs {need} workers, this machine has {cores} '
            f"cores; or, to decode fewer pixels, {TRANSCODE_HINT}"
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
        fix += f"; to store smaller images without rewriting the dataset, {TRANSCODE_HINT}"
    return Diagnosis(bottleneck, fix, evidence)


def _diagnose_unsplit(
    wait_s: float, step_s: float, compute_s: float, workers: int | None, cores: int
) -> Diagnosis:
    if workers is None:
        return Diagnosis(
            "loader",
            "raise the loader's num_workers (pass num_workers= to measure() to get a number)",
            f"the loop waits {_ms(wait_s)} of each {_ms(step_s)} step; the dataset reports no "
            "fetch/decode split and the number of workers is unknown",
        )
    # With no workers the whole batch is made inside next(): its cost is the wait. With W
    # saturated workers one batch arrives per step, so a batch costs about W * step.
    work_s = wait_s if workers == 0 else workers * step_s
    how = "made in the main process" if workers == 0 else f"{workers} busy workers, one per step"
    need = workers_needed(work_s, compute_s)
    evidence = (
        f"a batch costs about {_ms(work_s)} of loader work ({how}); the loop computes "
        f"{_ms(compute_s)} per batch, so {need} worker(s) keep up ({cores} usable cores); the "
        "dataset reports no fetch/decode split"
    )
    if need <= workers:  # saturated workers that should keep up: they are starved of CPU
        return Diagnosis(
            "loader",
            f"the {workers} workers share {cores} cores: make the dataset's __getitem__ cheaper, "
            "or use fastload.ImageFolder to see where the time goes",
            evidence,
        )
    fix = f"raise num_workers to {need}"
    if need > cores:
        fix += f" (beyond {cores} cores this helps only if the dataset waits on I/O)"
    if workers == 0:
        fix += "; declare the dataset worker-safe: fastload_worker_safe = True on its class"
    return Diagnosis("loader", fix, evidence)


@dataclass(frozen=True)
class Summary:
    """What :meth:`StarvationMeter.summary` returns; ``str()`` renders the report.

    Times are seconds; ``*_share`` are fractions of step time. The steady state leaves out
    the first batch of each pass (NOTE [verdict bands]).
    """

    batches: int
    samples: int
    passes: int
    wall_s: float
    samples_per_s: float
    steady_batches: int
    step_mean_s: float
    compute_mean_s: float
    wait_p50_s: float
    wait_p95_s: float
    wait_max_s: float
    wait_share: float
    startup_wait_s: float
    copy_mean_s: float | None
    work: WorkerWork | None
    num_workers: int | None
    cores: int
    gpus: int
    gpu_idle_p50_s: float | None
    gpu_idle_share: float | None
    measured_by: str
    verdict: Verdict
    diagnosis: Diagnosis

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        return out

    def __str__(self) -> str:
        if self.batches == 0:
            return "fastload starvation meter: no batches measured yet"
        lines = [
            f"fastload starvation meter: {self.batches} batches in {self.passes} pass(es), "
            f"{self.samples} samples, {self.samples_per_s:.1f} samples/s",
            f"  measured:   {self.measured_by}",
            f"  steady state ({self.steady_batches} batches, first batch of each pass apart):",
            f"  step        {_ms(self.step_mean_s)} mean = loop {_ms(self.compute_mean_s)} "
            f"+ waiting {_ms(self.step_mean_s - self.compute_mean_s)}",
            f"  wait        p50 {_ms(self.wait_p50_s)}  p95 {_ms(self.wait_p95_s)}  "
            f"max {_ms(self.wait_max_s)}  = {self.wait_share:.1%} of step time",
        ]
        if self.gpu_idle_share is not None and self.gpu_idle_p50_s is not None:
            lines.append(
                f"  GPU idle    p50 {_ms(self.gpu_idle_p50_s)}  = {self.gpu_idle_share:.1%} of "
                "step time (CUDA events)"
            )
        if self.copy_mean_s is not None:
            lines.append(f"  copy        {_ms(self.copy_mean_s)} per batch (host side, in the wait)")
        if self.work is not None:
            w = self.work
            lines.append(
                f"  workers     {self.num_workers} on {self.cores} usable cores; per batch "
                f"fetch {_ms(w.fetch_s)}, decode {_ms(w.decode_s)}, collate {_ms(w.collate_s)} "
                "(worker-seconds)"
            )
        else:
            workers = "unknown" if self.num_workers is None else str(self.num_workers)
            lines.append(f"  workers     {workers} on {self.cores} usable cores")
        lines.append(f"  start-up    {self.startup_wait_s:.3f} s waiting for first batches")
        share = self.gpu_idle_share if self.gpu_idle_share is not None else self.wait_share
        band = (
            f">= {HIGHLY_INPUT_BOUND:.0%}" if self.verdict is Verdict.HIGHLY
            else f">= {MODERATELY_INPUT_BOUND:.0%}" if self.verdict is Verdict.MODERATELY
            else f"< {MODERATELY_INPUT_BOUND:.0%}"
        )
        d = self.diagnosis
        lines += [
            f"  verdict     {self.verdict.value.upper()} ({share:.1%} waiting, {band})",
            f"  bottleneck  {d.bottleneck}: {d.evidence}",
            f"  fix         {d.fix}",
        ]
        return "\n".join(lines)
