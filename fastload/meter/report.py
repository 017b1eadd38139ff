"""The meter's verdict bands, the numbers a diagnosis reads, and the summary.

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
workers. Every recommendation (:mod:`.diagnosis`) is derived from those measured numbers,
which the summary prints next to it.

Example::

    >>> verdict_for(0.31)
    <Verdict.HIGHLY: 'highly input-bound'>
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

HIGHLY_INPUT_BOUND = 0.20
MODERATELY_INPUT_BOUND = 0.05

BOTTLENECKS = (
    "workers",
    "storage fetch",
    "decode/transform",
    "collate",
    "main process",
    "host-to-device copy",
    "loader",
    "none",
)
"""What :func:`~.diagnosis.diagnose` can name (NOTE [what the diagnosis tells apart])."""

SATURATED = 0.6
"""Worker busy share from which the workers, not the main process, hold the loop up."""
IO_BOUND_CPU = 0.2
"""Below this share of CPU time inside their busy time, busy workers wait on storage."""

IN_PROCESS_ENGINES = frozenset({"threads", "dali"})
"""fastload engines that make batches in the loop's process (``num_workers`` their threads)."""


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
class WorkerStats:
    """What the worker processes' own counters say (:mod:`.workers`), over the steady state.

    ``busy_share`` is busy seconds / (wall seconds x workers); ``busy_per_batch_s`` the
    worker-seconds one batch took (dataset access and collate); ``cpu_share`` and
    ``collate_share`` the parts of the busy time spent on the CPU and in ``collate_fn``.
    All None, with ``note`` saying why, when the workers were not measured.
    """

    workers: int
    reporting: int
    batches: int
    busy_share: float | None
    busy_per_batch_s: float | None
    cpu_share: float | None
    collate_share: float | None
    note: str | None

    @classmethod
    def unmeasured(cls, workers: int, note: str) -> WorkerStats:
        return cls(workers, 0, 0, None, None, None, None, note)


@dataclass(frozen=True)
class Diagnosis:
    """The most likely bottleneck, the fix in fastload's terms, and the numbers behind both."""

    bottleneck: str
    fix: str
    evidence: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


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
    worker_stats: WorkerStats | None = None
    wait_for_workers_s: float | None = None
    receive_s: float | None = None
    engine: str | None = None
    pass_samples_per_s: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        return out

    def _per_pass(self) -> list[str]:
        """One line of samples/s per pass when there are several (at most the first 3 and
        the last 3)."""
        rates = [f"{r:,.0f}" for r in self.pass_samples_per_s]
        if len(rates) < 2:
            return []
        shown = rates if len(rates) <= 6 else [*rates[:3], "...", *rates[-3:]]
        return [f"  per pass:   {', '.join(shown)} samples/s (first to last)"]

    def __str__(self) -> str:
        if self.batches == 0:
            return "fastload starvation meter: no batches measured yet"
        lines = [
            (
                f"fastload starvation meter: {self.batches} batches in {self.passes} pass(es), "
                f"{self.samples} samples, {self.samples_per_s:.1f} samples/s"
            ),
            f"  measured:   {self.measured_by}",
            *self._per_pass(),
            f"  steady state ({self.steady_batches} batches, first batch of each pass apart):",
            (
                f"  step        {_ms(self.step_mean_s)} mean = loop {_ms(self.compute_mean_s)} "
                f"+ waiting {_ms(self.step_mean_s - self.compute_mean_s)}"
            ),
            (
                f"  wait        p50 {_ms(self.wait_p50_s)}  p95 {_ms(self.wait_p95_s)}  "
                f"max {_ms(self.wait_max_s)}  = {self.wait_share:.1%} of step time"
            ),
        ]
        if self.gpu_idle_share is not None and self.gpu_idle_p50_s is not None:
            lines.append(
                f"  GPU idle    p50 {_ms(self.gpu_idle_p50_s)}  = {self.gpu_idle_share:.1%} of "
                "step time (CUDA events)"
            )
        if self.copy_mean_s is not None:
            lines.append(f"  copy        {_ms(self.copy_mean_s)} per batch (host side, in the wait)")
        workers = "unknown" if self.num_workers is None else str(self.num_workers)
        ws = self.worker_stats
        if self.engine in IN_PROCESS_ENGINES:
            lines.append(
                f"  workers     none: the {self.engine} engine makes batches in the loop's "
                f"process, {workers} threads on {self.cores} usable cores"
            )
        elif ws is not None and ws.busy_share is not None:
            lines.append(
                f"  workers     {workers} on {self.cores} usable cores; busy "
                f"{ws.busy_share:.1%} of their time, {_ms(ws.busy_per_batch_s or 0.0)} per "
                f"batch (CPU {ws.cpu_share:.0%} of it, collate {ws.collate_share:.0%}; "
                f"{ws.reporting} reporting)"
            )
        else:
            note = f"; {ws.note}" if ws is not None and ws.note else ""
            lines.append(f"  workers     {workers} on {self.cores} usable cores{note}")
        if self.work is not None:
            w = self.work
            lines.append(
                f"  phases      per batch fetch {_ms(w.fetch_s)}, decode {_ms(w.decode_s)}, "
                f"collate {_ms(w.collate_s)} (worker-seconds, from the dataset)"
            )
        if self.wait_for_workers_s is not None and self.receive_s is not None:
            lines.append(
                f"  wait split  {_ms(self.wait_for_workers_s)} until the worker had the batch "
                f"+ {_ms(self.receive_s)} receiving it in the main process, per batch"
            )
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
