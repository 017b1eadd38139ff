"""Accelerator emulation in the manner of MLPerf Storage: do N accelerators stay busy?

An emulated accelerator is a thread that takes the next batch from the loader and then
sleeps for the batch's compute time (samples x the workload's seconds per sample): that is
how MLPerf Storage's DLIO emulates a training step, so the storage and the input pipeline
are measured, not a GPU. One real :class:`fastload.DataLoader` (its workers decode on this
host's cores) feeds all N accelerators through a queue of N batches, the way N ranks on one
node share its cores and its storage.

Accelerator utilization (AU) = compute time / (compute time + time waiting for a batch),
counted from the moment each accelerator received its first batch (worker start-up is not
a training-step cost). If a loader delivers R samples/s at most and one accelerator needs S
samples/s, N accelerators keep AU = min(1, R / (N x S)), so the largest N that keeps AU >= a
is floor(R / (a x S)) (:func:`largest_fed`); the runner checks that prediction by emulating it.

Example::

    >>> loader = fastload.DataLoader(ImageFolder(url, size=224, train=True), batch_size=64)
    >>> run = AcceleratorEmulator(loader, workload("resnet50", "h100"), 2, seconds=20).run()
    >>> run.au, [round(a.au, 2) for a in run.usage]
    (0.93, [0.94, 0.92])
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from fastload.bench.stats import per_second
from fastload.bench.workloads import Workload
from fastload.errors import ConfigError

logger = logging.getLogger(__name__)

_POLL_S = 0.05  # how often a waiting thread looks at the clock and the stop flag

STARTUP_TIMEOUT_S = 120.0
"""How long an emulation waits for its first batch before it gives up, seconds."""


@dataclass(frozen=True)
class AcceleratorUsage:
    """What one emulated accelerator did: batches, samples, seconds computing and waiting."""

    index: int
    batches: int
    samples: int
    compute_s: float
    wait_s: float
    startup_s: float

    @property
    def au(self) -> float:
        busy = self.compute_s + self.wait_s
        return self.compute_s / busy if busy > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "batches": self.batches,
            "samples": self.samples,
            "compute_s": self.compute_s,
            "wait_s": self.wait_s,
            "startup_s": self.startup_s,
            "au": self.au,
        }


@dataclass(frozen=True)
class Emulation:
    """One emulation run: N accelerators over ``seconds`` fed by one loader."""

    accelerators: int
    workload: Workload
    seconds: float
    fed_s: float
    usage: tuple[AcceleratorUsage, ...]
    loader_workers: int
    batch_size: int

    @property
    def samples(self) -> int:
        return sum(u.samples for u in self.usage)

    @property
    def au(self) -> float:
        """Overall AU: all accelerators' compute over all their compute and wait."""
        busy = sum(u.compute_s + u.wait_s for u in self.usage)
        return sum(u.compute_s for u in self.usage) / busy if busy > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Samples delivered per second once batches were flowing."""
        return per_second(self.samples, self.fed_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "accelerators": self.accelerators,
            "seconds": self.seconds,
            "samples": self.samples,
            "samples_per_s": self.samples_per_s,
            "au": self.au,
            "au_min": min((u.au for u in self.usage), default=0.0),
            "loader_workers": self.loader_workers,
            "batch_size": self.batch_size,
            "per_accelerator": [u.to_json() for u in self.usage],
        }


def largest_fed(samples_per_s: float, workload: Workload, au_target: float | None = None) -> int:
    """The most accelerators a feed of ``samples_per_s`` keeps at ``au_target`` or better."""
    target = workload.au_target if au_target is None else au_target
    return max(0, math.floor(samples_per_s / (target * workload.samples_per_s) + 1e-9))


def batch_samples(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor, or the length of a list."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            return int(first.shape[0])
        return len(batch)
    if isinstance(batch, dict) and batch:
        return batch_samples(next(iter(batch.values())))
    return 1


class AcceleratorEmulator:
    """N emulated accelerators fed by one loader, for a time budget (see the module docstring).

    One feed thread iterates ``loader`` and puts each batch's sample count into a queue of N
    slots; each accelerator thread takes the next count and sleeps for its compute time.
    :meth:`run` starts them, waits for the budget to be spent and returns the
    :class:`Emulation`; each call is a fresh run over the same loader. The clock starts when
    the first batch arrives (worker start-up and the first batch's latency are not training
    steps); if none arrives within ``startup_timeout_s`` the run ends empty. The loader is
    iterated epoch after epoch (only once with ``one_epoch``, e.g. to measure a cold cache)
    until the time is up. Errors of the loader are raised by :meth:`run`.

    Example::

        >>> emulator = AcceleratorEmulator(loader, workload("resnet50", "h100"), 2, seconds=20)
        >>> emulator.run().au
        0.93
    """

    def __init__(
        self,
        loader: Iterable[Any],
        workload: Workload,
        accelerators: int,
        *,
        seconds: float,
        one_epoch: bool = False,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        if accelerators < 1:
            raise ConfigError(f"accelerators must be >= 1, got {accelerators}")
        if seconds <= 0:
            raise ConfigError(f"seconds must be > 0, got {seconds}")
        self.loader = loader
        self.workload = workload
        self.accelerators = accelerators
        self.seconds = seconds
        self.one_epoch = one_epoch
        self.startup_timeout_s = startup_timeout_s
        self.progress = progress
        self._clock_lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._batches: queue.Queue[int] = queue.Queue(maxsize=self.accelerators)
        self._stop = threading.Event()
        self._exhausted = threading.Event()
        self._errors: list[BaseException] = []
        self._usage: list[AcceleratorUsage | None] = [None] * self.accelerators
        # NOTE [the clock starts at the first batch]: until any accelerator has a batch, the
        # deadline is the start-up timeout; the first arrival sets it to arrival + seconds, and
        # every accelerator's waiting counts from that moment (start-up is no training step).
        self._start = time.perf_counter()
        self._first = math.inf
        self._deadline = self._start + self.startup_timeout_s

    def run(self) -> Emulation:
        """Emulate until the time is up (or one epoch is done); errors of the loader are raised."""
        self._reset()
        feeder = threading.Thread(target=self._feed, name="fastload-bench-feeder")
        threads = [
            threading.Thread(target=self._accelerate, args=(i,), name=f"fastload-bench-accel-{i}")
            for i in range(self.accelerators)
        ]
        feeder.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        end = time.perf_counter()
        self._stop.set()
        feeder.join()
        if self._errors:
            raise self._errors[0]
        first = self._first
        return Emulation(
            accelerators=self.accelerators,
            workload=self.workload,
            seconds=end - self._start,
            fed_s=max(0.0, end - first) if math.isfinite(first) else 0.0,
            usage=tuple(u for u in self._usage if u is not None),
            loader_workers=int(getattr(self.loader, "num_workers", 0)),
            batch_size=int(getattr(self.loader, "batch_size", 0) or 0),
        )

    def _arrived(self, at: float) -> None:
        """A batch reached an accelerator at ``at``; the first one starts the clock."""
        with self._clock_lock:
            if math.isinf(self._first):
                self._first, self._deadline = at, at + self.seconds

    def _feed(self) -> None:
        """The feed thread: the loader's batches, as sample counts, into the queue."""
        try:
            while not self._stop.is_set():
                for batch in self.loader:
                    n = batch_samples(batch)
                    del batch  # an accelerator keeps only the count; free the tensors now
                    while not self._stop.is_set():
                        try:
                            self._batches.put(n, timeout=_POLL_S)
                            break
                        except queue.Full:
                            continue
                    if self._stop.is_set():
                        break
                if self.one_epoch:
                    break
        except BaseException as exc:  # re-raised in the caller's thread by run()
            self._errors.append(exc)
            self._stop.set()
        finally:
            self._exhausted.set()

    def _next_batch(self) -> int | None:
        """The next batch's sample count, or None when the run is over."""
        while not self._stop.is_set() and time.perf_counter() < self._deadline:
            try:
                n = self._batches.get(timeout=_POLL_S)
            except queue.Empty:
                if self._exhausted.is_set() and self._batches.empty():
                    return None
                continue
            got = time.perf_counter()
            self._arrived(got)
            return n if got < self._deadline else None  # too late to compute in this run
        return None

    def _accelerate(self, index: int) -> None:
        """One accelerator thread: take a batch, sleep its compute time, count the waiting."""
        n_batches = n_samples = 0
        compute = wait = 0.0
        while True:
            t0 = max(time.perf_counter(), self._first)
            n = self._next_batch()
            got = time.perf_counter()
            deadline = self._deadline
            if math.isfinite(self._first):
                wait += max(0.0, min(got, deadline) - t0)
            if n is None:
                break
            step = min(n * self.workload.sample_s, max(0.0, deadline - got))
            if step > 0:
                time.sleep(step)
            compute += step
            n_batches += 1
            n_samples += n
            if self.progress is not None and index == 0:
                elapsed = max(0.0, time.perf_counter() - self._first)
                self.progress(min(1.0, elapsed / self.seconds))
        startup = min(self._first, time.perf_counter()) - self._start
        self._usage[index] = AcceleratorUsage(index, n_batches, n_samples, compute, wait, startup)
