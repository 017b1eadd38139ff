"""The starvation meter's recording side: the per-batch hot path and the meter's API.

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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fastload.errors import ConfigError
from fastload.meter.analysis import Recording, batch_records, summarize
from fastload.meter.cuda import CudaIdleProbe
from fastload.meter.export import as_summary_writer, write_json, write_plot, write_tensorboard
from fastload.meter.periodic import report_window
from fastload.meter.report import Summary

if TYPE_CHECKING:
    from fastload.machine import Machine

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
        self.on_device = False
        self._tensorboard = as_summary_writer(tensorboard) if tensorboard is not None else None
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
            num_workers=self.num_workers,
            cores=machine.cores_per_rank,
            gpus=machine.gpus,
            on_device=self.on_device,
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
