"""The starvation meter: how long the training loop waited for each batch, and why.

Every :class:`fastload.DataLoader` carries one (``loader.meter``); :func:`measure` puts the
same meter around any other iterable of batches (a stock torch DataLoader, a DALI
iterator) without changing what it yields.

Per batch it records, with ``time.perf_counter`` into preallocated-growth float arrays (no
locks, no formatting on the hot path):

* **wait**: the time the loop was blocked inside ``next()`` (as Lightning and Composer
  measure it);
* **step**: from one ``next()`` call to the following one (wait + the loop's own work);
* **copy**: host time of the host-to-device copy inside the wait (fastload loaders with
  ``device=``);
* **worker work**: fetch / decode / collate seconds measured inside the workers and carried
  back with the batch (declared datasets; NOTE [worker-seconds] in :mod:`.report`);
* **GPU idle**: from CUDA events on the consuming stream, read back lazily
  (NOTE [GPU idle from two events] in :mod:`.cuda`).

Example::

    >>> loader = fastload.DataLoader(dataset, batch_size=256)
    >>> for images, labels in loader:
    ...     train_step(images, labels)
    >>> print(loader.meter.summary())
    >>> loader.meter.to_json("meter.json"); loader.meter.plot("meter.png")
"""

from __future__ import annotations

import collections.abc
import logging
import math
import operator
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.errors import ConfigError
from fastload.meter.cuda import CudaIdleProbe
from fastload.meter.report import Diagnosis, Summary, Verdict, WorkerWork, diagnose, verdict_for
from fastload.settings import Machine

logger = logging.getLogger(__name__)

_perf = time.perf_counter


def batch_length(batch: Any) -> int:
    """Samples in a collated batch: the first dimension of its first tensor (1 if none).

    Walks into the first element of tuples/lists and the first value of dicts, so
    ``(images, labels)``, ``{"image": ...}`` and DALI's ``[{"data": ...}]`` all count right;
    a list of plain values (collated strings) counts its length.
    """
    return _walk(batch)[0]


def _walk(batch: Any) -> tuple[int, list[Any], type | None]:
    """The sample count, the path of keys/indices to the counted tensor, and its type."""
    path: list[Any] = []
    while True:
        if isinstance(batch, torch.Tensor):
            if batch.is_nested:  # a strided nested tensor has no .shape; keep off the fast path
                return int(batch.size(0)), path, None
            return (int(batch.shape[0]) if batch.dim() else 1), path, type(batch)
        if isinstance(batch, (list, tuple)):
            if not batch:
                return 0, path, None
            head = batch[0]
            if not isinstance(head, (torch.Tensor, list, tuple, collections.abc.Mapping)):
                return len(batch), path, None
            path.append(0)
        elif isinstance(batch, collections.abc.Mapping):
            if not batch:
                return 0, path, None
            key = next(iter(batch))
            path.append(key)
            head = batch[key]
        else:
            return 1, path, None
        batch = head


def _getter(path: list[Any]) -> Callable[[Any], Any] | None:
    """A C-speed function following ``path`` (indices/keys) into a batch; None for []."""
    if not path:
        return None
    if len(path) == 1:
        return operator.itemgetter(path[0])
    steps = [operator.itemgetter(step) for step in path]

    def follow(batch: Any) -> Any:
        for step in steps:
            batch = step(batch)
        return batch

    return follow


class StarvationMeter:
    """Measures, per batch, how long a training loop waits for its input, and diagnoses why.

    Args:
        log_every: log a one-line report through ``logging`` (logger ``fastload.meter.core``,
            level INFO) every this many batches; None = never.
        tensorboard: a ``torch.utils.tensorboard.SummaryWriter`` (or a log directory to open
            one in) that receives the periodic scalars; needs ``tensorboard`` installed.
        gpu: measure GPU idle with CUDA events. None (default) = when CUDA is in use in this
            process when a pass starts; False = host wait only.
        num_workers: the loader's worker processes, for the diagnosis (a fastload loader and
            :func:`measure` over a torch DataLoader fill it in).
        machine: cores and GPUs for the diagnosis; probed when None.
        batch_size: samples per batch when batches have no first dimension to count
            (``batch_size=None`` loaders yield single samples: pass 1).

    Example::

        >>> meter = StarvationMeter(log_every=500)
        >>> loader = fastload.DataLoader(dataset, batch_size=64, meter=meter)
        >>> ...
        >>> meter.summary().verdict
        <Verdict.NOT: 'not input-bound'>
    """

    def __init__(
        self,
        *,
        log_every: int | None = None,
        tensorboard: Any = None,
        gpu: bool | None = None,
        num_workers: int | None = None,
        machine: Machine | None = None,
        batch_size: int | None = None,
    ) -> None:
        if log_every is not None and (not isinstance(log_every, int) or log_every < 1):
            raise ConfigError(
                f"StarvationMeter(log_every={log_every!r}): expected a positive number of "
                "batches, or None to never log"
            )
        self.log_every = log_every
        self.gpu = gpu
        self.num_workers = num_workers
        self.machine = machine
        self.batch_size = batch_size
        self.on_device = False
        self._tensorboard = _open_tensorboard(tensorboard) if tensorboard is not None else None
        self.reset()

    def reset(self) -> None:
        """Forget every measurement (the settings stay)."""
        if hasattr(self, "_start"):
            for column in self._columns():
                del column[:]
        else:
            self._start = array("d")  # perf_counter when next() was called
            self._end = array("d")  # perf_counter when next() returned the batch
            self._samples = array("q")
            self._copy = array("d")  # only while copy_split is on
            self._work_at = array("q")  # batch index each worker record belongs to
            self._fetch = array("d")
            self._decode = array("d")
            self._collate = array("d")
        self._pass_first: list[int] = []  # batch index of each pass's first batch
        self._pass_end: list[float] = []  # perf_counter of the next() that ended it, or nan
        self._open = False  # a pass has delivered its first batch and not ended
        self._upstream = 0.0
        self.copy_split = getattr(self, "copy_split", False)
        self._probe: CudaIdleProbe | None = None
        self._log_at = self.log_every or -1

    def _columns(self) -> list[array]:
        return [self._start, self._end, self._samples, self._copy, self._work_at,
                self._fetch, self._decode, self._collate]

    # -- hot path -----------------------------------------------------------------------

    def track(self, iterator: Iterator[Any]) -> MeteredIterator:
        """Start a pass over ``iterator``: the returned iterator yields the same batches."""
        if self._probe is None and self._use_gpu():
            self._probe = CudaIdleProbe()
        return MeteredIterator(self, iterator)

    def _use_gpu(self) -> bool:
        if self.gpu is False:
            return False
        if not torch.cuda.is_available():
            if self.gpu:
                logger.warning("StarvationMeter(gpu=True) but no CUDA device: host wait only")
                self.gpu = False
            return False
        return bool(self.gpu) or torch.cuda.is_initialized()

    def note_upstream(self, seconds: float) -> None:
        """Time spent getting the batch before the copy (to split the copy out of the wait)."""
        self._upstream += seconds

    def note_work(self, fetch_s: float, decode_s: float, collate_s: float) -> None:
        """Worker-seconds reported with the batch now being delivered."""
        self._work_at.append(len(self._end))
        self._fetch.append(fetch_s)
        self._decode.append(decode_s)
        self._collate.append(collate_s)

    def _after_batch(self, t0: float, t1: float) -> None:
        """The per-batch work beyond the three columns: copy split, CUDA events, logging."""
        if self.copy_split:
            self._copy.append(max(0.0, t1 - t0 - self._upstream))
            self._upstream = 0.0
        if self._probe is not None:
            self._probe.after(len(self._end) - 1)
        if len(self._end) == self._log_at:
            self._log_at += self.log_every or 0
            self._report_period()

    def _open_pass(self) -> None:
        self._pass_first.append(len(self._end))
        self._pass_end.append(math.nan)
        self._open = True

    def _close_pass(self, t: float) -> None:
        self._pass_end[-1] = t
        self._open = False
        self._upstream = 0.0

    # -- analysis -----------------------------------------------------------------------

    @property
    def batches(self) -> int:
        """Batches delivered so far."""
        return len(self._end)

    def _table(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Per-batch arrays for batches ``lo..hi-1``: wait, step (nan if open), first-of-pass."""
        n = len(self._end)
        start = np.array(self._start[lo : min(hi + 1, n)], dtype=np.float64)
        end = np.array(self._end[lo:hi], dtype=np.float64)
        following = np.full(hi - lo, math.nan)
        following[: len(start) - 1] = start[1:]
        first = np.zeros(hi - lo, dtype=bool)
        for p, f in enumerate(self._pass_first):
            if lo <= f < hi:
                first[f - lo] = True
            if p > 0 and lo < f <= hi:  # the batch before a pass start ended the pass before
                following[f - 1 - lo] = self._pass_end[p - 1]
        if hi == n and n and self._pass_end:
            following[-1] = self._pass_end[-1]
        return {
            "start": start[: hi - lo],
            "wait": end - start[: hi - lo],
            "step": following - start[: hi - lo],
            "first": first,
            "samples": np.array(self._samples[lo:hi], dtype=np.int64),
        }

    def _gpu_idle(self, lo: int, hi: int) -> np.ndarray | None:
        if self._probe is None:
            return None
        idle = self._probe.idle_s
        return np.array([idle.get(i, math.nan) for i in range(lo, hi)], dtype=np.float64)

    def _work(self) -> WorkerWork | None:
        if not self._work_at or not len(self._end):
            return None
        n = len(self._end)
        return WorkerWork(sum(self._fetch) / n, sum(self._decode) / n, sum(self._collate) / n)

    def summary(self) -> Summary:
        """The report: batches, samples/s, wait p50/p95/max, waiting share, verdict, fix.

        Reads back pending CUDA events first (waiting on those events only).
        """
        if self._probe is not None:
            self._probe.flush()
        machine = self.machine or Machine.probe()
        n = len(self._end)
        t = self._table(0, n)
        wait, step, first = t["wait"], t["step"], t["first"]
        known = np.isfinite(step)
        steady = known & ~first
        if not steady.any():
            steady = known
        passes = len(self._pass_first)
        wall = 0.0
        for p, f in enumerate(self._pass_first):
            last = self._pass_first[p + 1] - 1 if p + 1 < passes else n - 1
            finish = self._pass_end[p] if math.isfinite(self._pass_end[p]) else self._end[last]
            wall += finish - self._start[f]
        samples = int(t["samples"].sum())
        copy = (
            float(np.array(self._copy, dtype=np.float64)[steady].mean())
            if self.copy_split and len(self._copy) == n and steady.any()
            else None
        )
        work = self._work()
        idle = self._gpu_idle(0, n)
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
        if steady.any():
            diagnosis = diagnose(
                share=judged,
                wait_s=float(wait[steady].mean()),
                step_s=step_mean,
                copy_s=copy,
                work=work,
                num_workers=self.num_workers,
                cores=machine.cores_per_rank,
                gpus=machine.gpus,
                on_device=self.on_device,
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
            num_workers=self.num_workers,
            cores=machine.cores_per_rank,
            gpus=machine.gpus,
            gpu_idle_p50_s=idle_p50,
            gpu_idle_share=idle_share,
            measured_by=(
                "host wait around next(), GPU idle from CUDA events on the consuming stream"
                if self._probe is not None
                else "host wait around next() only (no CUDA in use: GPU idle not measured)"
            ),
            verdict=verdict_for(judged) if steady.any() else Verdict.NOT,
            diagnosis=diagnosis,
        )

    def records(self) -> list[dict[str, Any]]:
        """One dict per batch: times in seconds from the first ``next()``, None where unknown."""
        n = len(self._end)
        if self._probe is not None:
            self._probe.flush()
        t = self._table(0, n)
        idle = self._gpu_idle(0, n)
        origin = self._start[0] if n else 0.0
        work: dict[int, list[float]] = {}
        for i, at in enumerate(self._work_at):
            acc = work.setdefault(min(at, n - 1), [0.0, 0.0, 0.0])
            acc[0] += self._fetch[i]
            acc[1] += self._decode[i]
            acc[2] += self._collate[i]
        passes = np.searchsorted(np.array(self._pass_first), np.arange(n), side="right") - 1
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
                "copy_s": self._copy[i] if self.copy_split and i < len(self._copy) else None,
                "fetch_s": fetch_decode_collate[0] if fetch_decode_collate else None,
                "decode_s": fetch_decode_collate[1] if fetch_decode_collate else None,
                "collate_s": fetch_decode_collate[2] if fetch_decode_collate else None,
                "gpu_idle_s": (
                    float(idle[i]) if idle is not None and math.isfinite(idle[i]) else None
                ),
            })
        return out

    def _report_period(self) -> None:
        n = len(self._end)
        lo = max(0, n - (self.log_every or n))
        t = self._table(lo, n)
        known = np.isfinite(t["step"]) & ~t["first"]
        if not known.any():
            return
        w, s = t["wait"][known], t["step"][known]
        share = float(w.sum() / s.sum()) if s.sum() > 0 else 0.0
        p50 = float(np.median(w))
        logger.info(
            "batches %d-%d: wait p50 %.2f ms, max %.2f ms, %.1f%% of step time waiting (%s)",
            lo, n - 1, p50 * 1e3, float(w.max()) * 1e3, share * 100, verdict_for(share).value,
        )
        if self._tensorboard is not None:
            self._tensorboard.add_scalar("fastload/wait_p50_ms", p50 * 1e3, n)
            self._tensorboard.add_scalar("fastload/wait_share", share, n)
            idle = self._gpu_idle(lo, n)
            if idle is not None and np.isfinite(idle[known]).any():
                ok = known & np.isfinite(idle)
                self._tensorboard.add_scalar(
                    "fastload/gpu_idle_share", float(idle[ok].sum() / t["step"][ok].sum()), n
                )
            self._tensorboard.flush()  # every N batches: a crash loses at most one period

    # -- exports ------------------------------------------------------------------------

    def to_json(self, path: str) -> None:
        """Write ``{"summary": ..., "batches": [one record per batch]}`` to ``path``."""
        from fastload.meter.export import write_json

        write_json(self, path)

    def plot(self, path: str) -> None:
        """Write a PNG: wait (and GPU idle) per batch over time, and the wait histogram.

        Needs matplotlib: ``pip install 'fastload[plot]'``.
        """
        from fastload.meter.export import write_plot

        write_plot(self, path)

    def to_tensorboard(self, writer: Any) -> None:
        """Write per-batch wait, step and GPU idle scalars to a SummaryWriter or log dir."""
        from fastload.meter.export import write_tensorboard

        write_tensorboard(self, _open_tensorboard(writer))

    def __repr__(self) -> str:
        return f"StarvationMeter({len(self._end)} batches, log_every={self.log_every})"


def _open_tensorboard(target: Any) -> Any:
    if hasattr(target, "add_scalar"):
        return target
    from fastload.meter.export import open_summary_writer

    return open_summary_writer(target)


class MeteredIterator(Iterator[Any]):
    """One pass of a meter over an iterator: yields exactly what the iterator yields.

    Written as a class, not a generator, so an exception from the iterator leaves it usable
    just as the iterator itself is (torch's iterators can be resumed after a worker error).
    The hot path binds the meter's column appends once per pass and touches nothing else
    unless a copy split, CUDA events or periodic logging are on.
    """

    __slots__ = ("_meter", "_next", "_probe", "_extra", "_fixed", "_get", "_kind",
                 "_add_start", "_add_end", "_add_samples")

    def __init__(self, meter: StarvationMeter, iterator: Iterator[Any]) -> None:
        self._meter = meter
        self._next = iterator.__next__
        meter._open = False  # a new pass: its first batch opens it
        self._probe = meter._probe
        self._extra = meter.copy_split or meter._probe is not None or meter.log_every is not None
        self._fixed = meter.batch_size
        self._get: Callable[[Any], Any] | None = None  # batch -> the tensor to count
        self._kind: type | None = None
        self._add_start = meter._start.append
        self._add_end = meter._end.append
        self._add_samples = meter._samples.append

    def __iter__(self) -> MeteredIterator:
        return self

    def __next__(self) -> Any:
        probe = self._probe
        if probe is not None:
            probe.before()
        t0 = _perf()
        try:
            batch = self._next()
        except StopIteration:
            if probe is not None:
                probe.cancel()
            if self._meter._open:
                self._meter._close_pass(t0)
            raise
        t1 = _perf()
        if not self._meter._open:
            self._meter._open_pass()
        self._add_start(t0)
        self._add_end(t1)
        # NOTE [fast sample count]: isinstance() against torch.Tensor or Mapping costs about a
        # microsecond, so the walk of batch_length() runs once per structure; later batches
        # follow the remembered path to the counted tensor and check only its exact type.
        if self._fixed:
            self._add_samples(self._fixed)
        else:
            get = self._get
            try:
                node = batch if get is None else get(batch)
            except (LookupError, TypeError):
                node = None
            if type(node) is self._kind:
                shape = node.shape
                self._add_samples(shape[0] if shape else 1)
            else:
                count, path, self._kind = _walk(batch)
                self._get = _getter(path)
                self._add_samples(count)
        if self._extra:
            self._meter._after_batch(t0, t1)
        return batch


class Metered(Iterable[Any]):
    """An iterable of batches with a meter around it; see :func:`measure`.

    Each ``iter()`` starts a pass. ``len()`` and any other attribute (a DALI iterator's
    ``reset()``, a DataLoader's ``dataset``) are those of the wrapped iterable.
    """

    def __init__(self, iterable: Iterable[Any], meter: StarvationMeter) -> None:
        self.iterable = iterable
        self.meter = meter

    def __iter__(self) -> MeteredIterator:
        return self.meter.track(iter(self.iterable))

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("iterable", "meter"):  # not yet set (unpickling)
            raise AttributeError(name)
        return getattr(self.iterable, name)


def measure(
    iterable: Iterable[Any],
    *,
    meter: StarvationMeter | None = None,
    num_workers: int | None = None,
    log_every: int | None = None,
    gpu: bool | None = None,
) -> Metered:
    """Wrap any iterable of batches with a starvation meter; what it yields is unchanged.

    Use it to measure a stock ``torch.utils.data.DataLoader`` or a DALI iterator before
    switching to fastload. ``num_workers`` defaults to the iterable's own ``num_workers``
    attribute when it has one (torch's DataLoader does).

    Example::

        >>> from fastload.meter import measure
        >>> batches = measure(torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4))
        >>> for x, y in batches:
        ...     step(x, y)
        >>> print(batches.meter.summary())
    """
    if meter is None:
        workers = num_workers
        if workers is None and isinstance(getattr(iterable, "num_workers", None), int):
            workers = iterable.num_workers  # type: ignore[attr-defined]
        # A torch DataLoader with batch_size=None yields single samples.
        unbatched = isinstance(iterable, torch.utils.data.DataLoader) and (
            iterable.batch_size is None and iterable.batch_sampler is None
        )
        batch_size = 1 if unbatched else None
        meter = StarvationMeter(
            log_every=log_every, gpu=gpu, num_workers=workers, batch_size=batch_size
        )
    elif num_workers is not None:
        meter.num_workers = num_workers
    return Metered(iterable, meter)
