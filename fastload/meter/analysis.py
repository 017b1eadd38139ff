"""The meter's records turned into numbers: per-batch tables, percentiles, the summary.

Everything here reads a :class:`Recording`, the meter's columns as the hot path wrote them,
and runs only when a summary, an export or a periodic log asks for it.

NOTE [steps and passes]
A batch's step runs from its ``next()`` call to the following one. The last batch of a
pass has no following call in the pass: its step ends at the ``next()`` that raised
StopIteration (``pass_end``), or is unknown (nan) when the pass was left with ``break``.
The first batch of each pass is worker start-up and is kept out of the steady state.

Example::

    >>> rec = loader.meter.recording()
    >>> table = batch_table(rec, 0, len(rec.end))
    >>> float(table["wait"].max())
    0.0123
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.meter.diagnosis import diagnose
from fastload.meter.report import Diagnosis, Summary, Verdict, WorkerStats, WorkerWork, verdict_for


@dataclass(frozen=True)
class Recording:
    """The meter's columns, live (the meter's own arrays, not copies): read, never change.

    ``start``/``end``/``samples`` have one entry per batch; ``work_at`` names the batch each
    ``fetch``/``decode``/``collate`` record belongs to; ``pass_first`` and ``pass_end`` have
    one entry per pass (NOTE [steps and passes]). ``copy`` is None unless the meter splits the
    copy out of the wait; ``gpu_idle`` (batch index -> seconds) is None without CUDA events.
    ``worker_began``/``worker_done`` (per batch, read back so far, nan where unknown) are when
    its worker began and finished it, None without measured workers.

    Example::

        >>> rec = meter.recording()
        >>> len(rec.end), len(rec.pass_first)
        (500, 1)
    """

    start: Sequence[float]
    end: Sequence[float]
    samples: Sequence[int]
    copy: Sequence[float] | None
    work_at: Sequence[int]
    fetch: Sequence[float]
    decode: Sequence[float]
    collate: Sequence[float]
    pass_first: Sequence[int]
    pass_end: Sequence[float]
    gpu_idle: Mapping[int, float] | None
    worker_began: Sequence[float] | None = None
    worker_done: Sequence[float] | None = None


def batch_table(rec: Recording, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Per-batch arrays for batches ``lo..hi-1``: start, wait, step (nan if unknown), first
    of a pass, samples.

    Example::

        >>> batch_table(meter.recording(), 0, 10)["step"].shape
        (10,)
    """
    n = len(rec.end)
    start = np.array(rec.start[lo : min(hi + 1, n)], dtype=np.float64)
    end = np.array(rec.end[lo:hi], dtype=np.float64)
    following = np.full(hi - lo, math.nan)
    following[: len(start) - 1] = start[1:]
    first = np.zeros(hi - lo, dtype=bool)
    for p, f in enumerate(rec.pass_first):
        if lo <= f < hi:
            first[f - lo] = True
        if p > 0 and lo < f <= hi:  # the batch before a pass start ended the pass before
            following[f - 1 - lo] = rec.pass_end[p - 1]
    if hi == n and n and rec.pass_end:
        following[-1] = rec.pass_end[-1]
    return {
        "start": start[: hi - lo],
        "wait": end - start[: hi - lo],
        "step": following - start[: hi - lo],
        "first": first,
        "samples": np.array(rec.samples[lo:hi], dtype=np.int64),
    }


def gpu_idle(rec: Recording, lo: int, hi: int) -> np.ndarray | None:
    """GPU idle seconds of batches ``lo..hi-1`` (nan where not read back); None without CUDA."""
    if rec.gpu_idle is None:
        return None
    idle = rec.gpu_idle
    return np.array([idle.get(i, math.nan) for i in range(lo, hi)], dtype=np.float64)


def worker_work(rec: Recording) -> WorkerWork | None:
    """Mean worker-seconds per batch by phase (NOTE [worker-seconds]); None if none reported."""
    if not rec.work_at or not len(rec.end):
        return None
    n = len(rec.end)
    return WorkerWork(sum(rec.fetch) / n, sum(rec.decode) / n, sum(rec.collate) / n)


def wait_split(rec: Recording, steady: np.ndarray) -> tuple[float, float] | None:
    """Mean (waiting for the worker, receiving after it) per steady batch, seconds.

    NOTE [the wait split]
    A batch's worker wrote down when it finished the batch (:mod:`.workers`). The part of
    the loop's wait before that moment was waiting for the workers; the rest, from then
    (or from the ``next()`` call, if the batch was ready earlier) until ``next()`` returned,
    was the main process receiving it: torch's queue, unpickling, pinning, fastload's own
    hand-over. Both clocks are ``perf_counter``, one system-wide monotonic clock. None when
    fewer than half the steady batches have a known finish.
    """
    if rec.worker_done is None:
        return None
    n = len(rec.end)
    done = np.full(n, np.nan)
    known = np.asarray(rec.worker_done[:n], dtype=np.float64)
    done[: len(known)] = known
    start = np.asarray(rec.start[:n], dtype=np.float64)
    end = np.asarray(rec.end[:n], dtype=np.float64)
    ok = steady & np.isfinite(done)
    if not ok.any() or ok.sum() < 0.5 * steady.sum():
        return None
    waited = np.clip(done[ok] - start[ok], 0.0, end[ok] - start[ok])
    return float(waited.mean()), float((end[ok] - start[ok] - waited).mean())


def unmeasured_note(note: str | None, num_workers: int | None) -> str:
    """Why a meter has no worker counters: ``note`` when its loader gave one, else what
    ``num_workers`` implies."""
    if note is not None:
        return note
    if num_workers == 0:
        return "no worker processes (num_workers=0): batches are made inside next()"
    return (
        "worker busy share not measured: the workers were not started by a "
        "fastload.DataLoader (measure() leaves a loader's workers as they are)"
    )


def summarize(
    rec: Recording,
    *,
    num_workers: int | None,
    cores: int,
    gpus: int,
    on_device: bool,
    workers: WorkerStats | None = None,
    workers_note: str | None = None,
    fetch_fix: str | None = None,
    smaller_fix: str | None = None,
    engine: str | None = None,
) -> Summary:
    """The :class:`Summary` of a recording on a machine with ``cores`` and ``gpus``;
    ``fetch_fix``, ``smaller_fix`` and ``engine`` are what :func:`~.diagnosis.diagnose` takes.

    Example::

        >>> summarize(meter.recording(), num_workers=4, cores=16, gpus=1, on_device=True).verdict
        <Verdict.NOT: 'not input-bound'>
    """
    n = len(rec.end)
    t = batch_table(rec, 0, n)
    wait, step, first = t["wait"], t["step"], t["first"]
    known = np.isfinite(step)
    steady = known & ~first
    if not steady.any():
        steady = known
    passes = len(rec.pass_first)
    wall = 0.0
    rates = []  # samples/s of each pass: a cold first epoch stands apart from warm ones
    for p, f in enumerate(rec.pass_first):
        last = rec.pass_first[p + 1] - 1 if p + 1 < passes else n - 1
        finish = rec.pass_end[p] if math.isfinite(rec.pass_end[p]) else rec.end[last]
        span = finish - rec.start[f]
        wall += span
        rates.append(float(t["samples"][f:last + 1].sum()) / span if span > 0 else 0.0)
    samples = int(t["samples"].sum())
    copy = (
        float(np.array(rec.copy, dtype=np.float64)[steady].mean())
        if rec.copy is not None and len(rec.copy) == n and steady.any()
        else None
    )
    work = worker_work(rec)
    idle = gpu_idle(rec, 0, n)
    idle_p50 = idle_share = None
    if idle is not None:
        measured = steady & np.isfinite(idle)
        if measured.any():
            idle_p50 = float(np.median(idle[measured]))
            idle_share = float(idle[measured].sum() / step[measured].sum())
    if steady.any():
        w, s = wait[steady], step[steady]
        share = float(w.sum() / s.sum()) if s.sum() > 0 else 0.0
        p50, p95, wmax = (float(v) for v in np.percentile(w, [50, 95, 100]))
        step_mean = float(s.mean())
        compute_mean = float(max(0.0, (s - w).mean()))
    else:
        share = p50 = p95 = wmax = step_mean = compute_mean = 0.0
    judged = idle_share if idle_share is not None else share
    split = wait_split(rec, steady) if steady.any() else None
    if workers is None and workers_note is not None:
        workers = WorkerStats.unmeasured(num_workers or 0, workers_note)
    if steady.any():
        diagnosis = diagnose(
            share=judged,
            wait_s=float(wait[steady].mean()),
            step_s=step_mean,
            copy_s=copy,
            work=work,
            num_workers=num_workers,
            cores=cores,
            gpus=gpus,
            on_device=on_device,
            workers=workers,
            receive_s=split[1] if split is not None else None,
            fetch_fix=fetch_fix,
            smaller_fix=smaller_fix,
            engine=engine,
        )
    else:
        diagnosis = Diagnosis("none", "measure more batches", "no batch has a complete step yet")
    return Summary(
        batches=n,
        samples=samples,
        passes=passes,
        wall_s=wall,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        steady_batches=int(steady.sum()),
        step_mean_s=step_mean,
        compute_mean_s=compute_mean,
        wait_p50_s=p50,
        wait_p95_s=p95,
        wait_max_s=wmax,
        wait_share=share,
        startup_wait_s=float(wait[first].sum()),
        copy_mean_s=copy,
        work=work,
        num_workers=num_workers,
        cores=cores,
        gpus=gpus,
        gpu_idle_p50_s=idle_p50,
        gpu_idle_share=idle_share,
        measured_by=(
            "host wait around next(), GPU idle from CUDA events on the consuming stream"
            if rec.gpu_idle is not None
            else "host wait around next() only (no CUDA in use: GPU idle not measured)"
        ),
        verdict=verdict_for(judged) if steady.any() else Verdict.NOT,
        diagnosis=diagnosis,
        worker_stats=workers,
        engine=engine,
        pass_samples_per_s=tuple(rates),
        wait_for_workers_s=split[0] if split is not None else None,
        receive_s=split[1] if split is not None else None,
    )


def batch_records(rec: Recording) -> list[dict[str, Any]]:
    """One dict per batch: times in seconds from the first ``next()``, None where unknown.

    Example::

        >>> batch_records(meter.recording())[0]["wait_s"]
        0.2311
    """
    n = len(rec.end)
    t = batch_table(rec, 0, n)
    idle = gpu_idle(rec, 0, n)
    origin = rec.start[0] if n else 0.0
    work: dict[int, list[float]] = {}
    for i, at in enumerate(rec.work_at):
        acc = work.setdefault(min(at, n - 1), [0.0, 0.0, 0.0])
        acc[0] += rec.fetch[i]
        acc[1] += rec.decode[i]
        acc[2] += rec.collate[i]
    passes = np.searchsorted(np.array(rec.pass_first), np.arange(n), side="right") - 1
    copy = rec.copy
    began, done = rec.worker_began, rec.worker_done
    out = []
    for i in range(n):
        step = float(t["step"][i])
        fetch_decode_collate = work.get(i)
        out.append({
            "batch": i,
            "pass": int(passes[i]),
            "start_s": float(t["start"][i] - origin),
            "wait_s": float(t["wait"][i]),
            "step_s": step if math.isfinite(step) else None,
            "samples": int(t["samples"][i]),
            "copy_s": copy[i] if copy is not None and i < len(copy) else None,
            "fetch_s": fetch_decode_collate[0] if fetch_decode_collate else None,
            "decode_s": fetch_decode_collate[1] if fetch_decode_collate else None,
            "collate_s": fetch_decode_collate[2] if fetch_decode_collate else None,
            "gpu_idle_s": float(idle[i]) if idle is not None and math.isfinite(idle[i]) else None,
            "worker_began_s": _since(began, i, origin),
            "worker_done_s": _since(done, i, origin),
        })
    return out


def _since(times: Sequence[float] | None, i: int, origin: float) -> float | None:
    """``times[i] - origin``, None where unknown."""
    if times is None or i >= len(times) or not math.isfinite(times[i]):
        return None
    return float(times[i] - origin)
