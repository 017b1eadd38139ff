"""The starvation meter's recording side: the meter's columns and its API.

The per-batch code itself is :class:`~.hotpath.MeteredIterator`; it appends to the columns
held here.

Every :class:`fastload.DataLoader` carries one (``loader.meter``); :func:`~.wrap.measure`
puts the same meter around any other iterable of batches (a stock torch DataLoader, a DALI
iterator) without changing what it yields. What the records mean is computed elsewhere,
only when asked for: numbers and the summary in :mod:`.analysis`, the periodic log line in
:mod:`.periodic`, files in :mod:`.export`.

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
  (NOTE [GPU idle from two events] in :mod:`.cuda`);
* **worker begin/end**: for any dataset on a fastload DataLoader's worker processes, read
  back from the workers' shared counters once per pass and when a summary is asked for, never
  per batch (:mod:`.workers`).

Example::

    >>> loader = fastload.DataLoader(dataset, batch_size=256)
    >>> for images, labels in loader:
    ...     train_step(images, labels)
    >>> print(loader.meter.summary())
    >>> loader.meter.to_json("meter.json"); loader.meter.plot("meter.png")
"""

from __future__ import annotations

import logging
import math
import weakref
from array import array
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastload.errors import ConfigError
from fastload.meter.analysis import Recording, batch_records, summarize, unmeasured_note
from fastload.meter.cuda import CudaIdleProbe
from fastload.meter.export import as_summary_writer, write_json, write_plot, write_tensorboard
from fastload.meter.hotpath import InlinePass, MeteredIterator, counted, metered
from fastload.meter.periodic import report_window
from fastload.meter.report import Summary, WorkerStats
from fastload.meter.workers import (
    MeasuredWorkerInit,
    WorkerCounters,
    activity,
    measured_worker_init,
)

if TYPE_CHECKING:
    from fastload.machine import Machine

logger = logging.getLogger(__name__)


def _unknown_engine() -> None:
    return None


class StarvationMeter:
    """Measures, per batch, how long a training loop waits for its input, and diagnoses why.

    Args:
        log_every: log a one-line report through ``logging`` (logger
            ``fastload.meter.periodic``, level INFO) every this many batches; None = never.
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
        self._pass_length: Callable[[], int] | None = None  # see count_by_sampler()
        self.on_device = False
        # Worker processes' own counters (NOTE [timing the worker's fetcher] in .workers), set
        # by a fastload DataLoader with workers; workers_note says why not when they are None.
        self.workers: WorkerCounters | None = None
        self.workers_note: str | None = None
        # Set by a fastload DataLoader: the dataset's own fixes for slow reads and for too
        # many pixels (NOTE [the source's own fix]) and its engine's name, which the
        # diagnosis words its fix by.
        self.fetch_fix: str | None = None
        self.smaller_fix: str | None = None
        self.engine_of: Callable[[], str | None] = _unknown_engine
        self._tensorboard = as_summary_writer(tensorboard) if tensorboard is not None else None
        self.reset()

    worker_init = staticmethod(measured_worker_init)
    """The ``worker_init_fn`` a fastload DataLoader gives torch (:mod:`.workers`)."""

    def watch_workers(self, worker_init_fn: Any) -> None:
        """Read the workers' counters of the loader torch was given ``worker_init_fn`` for.

        A :class:`~.workers.MeasuredWorkerInit` (:meth:`worker_init`) brings its counters;
        anything else (None, the user's own function) means the workers are not measured.
        """
        init = worker_init_fn if isinstance(worker_init_fn, MeasuredWorkerInit) else None
        self.workers = init.counters if init is not None else None

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
            self._wbegan = array("d")  # per batch: when its worker began it (nan: unknown)
            self._wdone = array("d")  # per batch: when its worker finished it
        self._harvested = 0  # batches whose worker times were read back
        # per pass: [counters at open, at close or None, opened at its iterator's first batch]
        self._wpass: list[list[Any]] = []
        self._fresh = False  # the next pass opens at the first batch of its iterator
        self._pass_first: list[int] = []  # batch index of each pass's first batch
        self._pass_end: list[float] = []  # perf_counter of the next() that ended it, or nan
        self.in_pass = False
        """A pass has delivered its first batch and not ended (read by the hot path)."""
        inline = getattr(self, "_inline", None)
        inline = inline() if inline is not None else None
        if inline is not None:
            inline.opened = False
        self._inline: weakref.ref[InlinePass] | None = None
        self._pending = 0  # samples of each batch not yet in _samples (a counted pass)
        self._upstream = 0.0
        self.copy_split = getattr(self, "copy_split", False)
        self._probe: CudaIdleProbe | None = None
        self._log_at = self.log_every or -1

    def _columns(self) -> list[array]:
        return [self._start, self._end, self._samples, self._copy, self._work_at,
                self._fetch, self._decode, self._collate, self._wbegan, self._wdone]

    # -- hot path -----------------------------------------------------------------------

    def track(self, iterator: Iterator[Any]) -> MeteredIterator:
        """Start a pass over ``iterator``: the returned iterator yields the same batches."""
        if self._probe is None and self._use_gpu():
            self._probe = CudaIdleProbe()
        return metered(self, iterator)

    def track_inline(self) -> InlinePass | None:
        """Start a pass recorded by the caller's own ``__next__``, where the counted hot path
        applies; None where it does not (then use :meth:`track`).

        NOTE [the meter inside the loader's iterator] in :mod:`.hotpath`.
        """
        if self._probe is None and self._use_gpu():
            self._probe = CudaIdleProbe()
        if not counted(self):
            return None
        inline = InlinePass(self)
        self._inline = weakref.ref(inline)  # reset() clears its ``opened``
        return inline

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

    def _open_pass(self, counted: bool = False) -> None:
        """A pass's first batch is being delivered; ``counted``: its batches' sample counts
        are not appended but filled in when read (each ``batch_size``)."""
        self._fill_samples()
        self._pending = (self.batch_size or 0) if counted else 0
        self._pass_first.append(len(self._end))
        self._pass_end.append(math.nan)
        self.in_pass = True
        if self.workers is not None:  # once per pass: a few shared doubles
            # A pass opened after reset() mid-iterator does not start at the epoch's batch 0.
            self._wpass.append([self.workers.totals(), None, self._fresh])
        self._fresh = False

    def count_by_sampler(self, loader: Any, batch_sampler: Any = None) -> None:
        """Count each batch of a torch-style loader as ``batch_size`` samples, not by looking.

        NOTE [samples from the batch sampler]
        A loader whose batches come from torch's own ``BatchSampler`` over a sampler with a
        length hands out ``batch_size`` samples per batch, except a short last batch of
        ``len(sampler) % batch_size`` (without ``drop_last``), known when the pass ends. So
        the hot path skips looking into the batch (about a third of its cost inside a real
        loader, where caches are cold after torch's own per-batch work) and the pass's last
        batch is corrected then. Other loaders are counted by looking (NOTE [fast sample
        count] in :mod:`.hotpath`). A meter given an explicit ``batch_size`` keeps it.
        """
        import torch.utils.data

        sampler = batch_sampler if batch_sampler is not None else getattr(loader, "batch_sampler", None)
        if self.batch_size is not None or type(sampler) is not torch.utils.data.BatchSampler:
            return
        inner = sampler.sampler
        if not hasattr(type(inner), "__len__") or isinstance(
            getattr(loader, "dataset", None), torch.utils.data.IterableDataset
        ):
            return
        size, drop_last = sampler.batch_size, sampler.drop_last
        if drop_last:
            self._pass_length = None
        else:
            self._pass_length = lambda: len(inner) % size
        self.batch_size = size

    def _fill_samples(self) -> None:
        """Write the sample counts of a counted pass's batches (NOTE [samples from the batch
        sampler]): each of them holds ``batch_size`` samples, the last corrected at its end."""
        gap = len(self._end) - len(self._samples)
        if gap > 0 and self._pending:
            self._samples.extend(array("q", (self._pending,)) * gap)

    def _close_pass(self, t: float) -> None:
        self._fill_samples()
        self._pass_end[-1] = t
        self.in_pass = False
        self._upstream = 0.0
        if self._pass_length is not None and len(self._end) > self._pass_first[-1]:
            try:
                short = self._pass_length()
            except Exception:  # noqa: BLE001 - a sampler whose length went away: never replace StopIteration
                short = 0
            if short:  # NOTE [samples from the batch sampler]
                self._samples[-1] = short
        if self.workers is not None and self._wpass:
            self._wpass[-1][1] = self.workers.totals()
            self._harvest()

    def _harvest(self) -> None:
        """Read back the worker begin/end times of the batches delivered since the last call."""
        n, lo = len(self._end), self._harvested
        if lo >= n:
            return
        nan = np.full(n - lo, math.nan)
        began, done = nan, nan.copy()
        c = self.workers
        if c is not None and c.in_order and len(self._wpass) == len(self._pass_first):
            idx = np.arange(lo, n)
            firsts = np.asarray(self._pass_first, dtype=np.int64)
            p = np.searchsorted(firsts, idx, side="right") - 1
            # With device="cuda" the feeder pulls one batch ahead (docs/meter.md, Limits): the
            # wait of handed-out batch k was for torch's batch k + 1.
            ahead = 1 if self.on_device and self.copy_split else 0
            b, d, _ = c.batch_times(idx - firsts[p] + ahead)
            end = np.asarray(self._end[lo:n], dtype=np.float64)
            fresh = np.array([w[2] for w in self._wpass], dtype=bool)[p]
            ok = fresh & (d <= end)  # made before it was delivered: this pass's batch
            began, done = np.where(ok, b, nan), np.where(ok, d, nan)
        self._wbegan.extend(began.tolist())
        self._wdone.extend(done.tolist())
        self._harvested = n

    def worker_stats(self) -> WorkerStats | None:
        """The workers' busy share and its make-up over the passes (None: not measured)."""
        if self.workers is None:
            return None
        return activity(self.workers, self._wpass, self._end[-1] if self._end else 0.0)

    # -- reading it back (none of this runs per batch) ------------------------------------

    @property
    def batches(self) -> int:
        """Batches delivered so far."""
        return len(self._end)

    def recording(self) -> Recording:
        """The recorded columns, live (not copies), for :mod:`.analysis`; read, never change.

        Example::

            >>> rec = loader.meter.recording()
            >>> rec.end[-1] - rec.start[-1]   # the last batch's wait, seconds
            0.0021
        """
        self._fill_samples()
        if self.workers is not None:
            self._harvest()
        return Recording(
            start=self._start,
            end=self._end,
            samples=self._samples,
            copy=self._copy if self.copy_split else None,
            work_at=self._work_at,
            fetch=self._fetch,
            decode=self._decode,
            collate=self._collate,
            pass_first=self._pass_first,
            pass_end=self._pass_end,
            gpu_idle=self._probe.idle_s if self._probe is not None else None,
            worker_began=self._wbegan if self.workers is not None else None,
            worker_done=self._wdone if self.workers is not None else None,
        )

    def summary(self) -> Summary:
        """The report: batches, samples/s, wait p50/p95/max, waiting share, verdict, fix.

        Reads back pending CUDA events first (waiting on those events only).
        """
        if self._probe is not None:
            self._probe.flush()
        if self.machine is None:
            from fastload.machine import Machine  # probed only when a summary is asked for

            machine = Machine.probe()
        else:
            machine = self.machine
        return summarize(
            self.recording(),
            workers=self.worker_stats(),
            workers_note=None if self.workers is not None else unmeasured_note(
                self.workers_note, self.num_workers),
            num_workers=self.num_workers,
            cores=machine.cores_per_rank,
            gpus=machine.gpus,
            on_device=self.on_device,
            fetch_fix=self.fetch_fix,
            smaller_fix=self.smaller_fix,
            engine=self.engine_of(),
        )

    def records(self) -> list[dict[str, Any]]:
        """One dict per batch: times in seconds from the first ``next()``, None where unknown."""
        if self._probe is not None:
            self._probe.flush()
        return batch_records(self.recording())

    def _report_period(self) -> None:
        n = len(self._end)
        report_window(self.recording(), max(0, n - (self.log_every or n)), n, self._tensorboard)

    # -- exports ------------------------------------------------------------------------

    def to_json(self, path: str) -> None:
        """Write ``{"summary": ..., "batches": [one record per batch]}`` to ``path``."""
        write_json(self, path)

    def plot(self, path: str) -> None:
        """Write a PNG: wait (and GPU idle) per batch over time, and the wait histogram.

        Needs matplotlib: ``pip install 'fastload[plot]'``.
        """
        write_plot(self, path)

    def to_tensorboard(self, writer: Any) -> None:
        """Write per-batch wait, step and GPU idle scalars to a SummaryWriter or log dir."""
        write_tensorboard(self, as_summary_writer(writer))

    def __repr__(self) -> str:
        return f"StarvationMeter({len(self._end)} batches, log_every={self.log_every})"
