"""What the DALI engine feeds DALI: samples read and planned in Python, batch by batch.

For each sample a read thread fetches the bytes through ``dataset.read_bytes`` (fastload's
storage and cache), reads the image size from the header with Pillow (no pixel decode), and
plans the crop box, output size and flip with the sample's seed (NOTE [one plan, two
engines] in :mod:`fastload.engines.dali`). :class:`Reader` does that a few batches ahead on a
thread pool; :class:`Feed` is DALI's external source and remembers every batch in flight, so
a failed decode can be traced to its file and the batches replayed (NOTE [finding the bad
file]).

Example::

    >>> feed = Feed(Reader(dataset, batch_sampler, ahead=3))
    >>> data, anchor, shape, roi_start, roi_end, size, flip = feed()   # one batch's columns
"""

from __future__ import annotations

import io
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.pool import AsyncResult, ThreadPool

import numpy as np
from PIL import Image

from fastload.data import batchinfo
from fastload.data.declared import DeclaredImages
from fastload.data.pipeline import Plan
from fastload.data.sample_errors import DECODE_ERRORS
from fastload.errors import SampleError

logger = logging.getLogger(__name__)

READ_THREADS = 8
"""Threads fetching bytes and headers; reads release the GIL, so this covers remote latency.

They are ``multiprocessing.pool.ThreadPool`` threads: daemon threads, so an epoch the user
abandons never keeps the process alive while it waits to be garbage-collected."""


@dataclass
class Sample:
    """One sample read and planned, waiting for DALI: its bytes stay until its batch is out."""

    index: int
    label: int
    data: np.ndarray | None  # encoded bytes, uint8; None when DALI's reader reads them
    plan: Plan
    width: int
    height: int
    fetch_s: float


@dataclass
class Slot:
    """One batch of the sampler, in order: fed to DALI, or all skipped, or failed."""

    samples: list[Sample]
    info: batchinfo.BatchInfo = field(default_factory=batchinfo.BatchInfo)
    error: BaseException | None = None

    @property
    def fed(self) -> bool:
        return self.error is None and bool(self.samples)


def prepare(dataset: DeclaredImages, index: int) -> Sample:
    """Fetch one sample's bytes and plan its geometry (runs in a read thread)."""
    start = time.perf_counter()
    data = dataset.read_bytes(index)
    fetched = time.perf_counter()
    try:
        with Image.open(io.BytesIO(data)) as img:  # parses the header only
            width, height = img.size
    except DECODE_ERRORS as exc:
        raise dataset.corrupt(index, exc) from exc
    plan = dataset.pipeline.plan(width, height, random.Random(dataset.sample_seed(index)))
    label = dataset.label(index)
    return Sample(int(index), label, np.frombuffer(data, np.uint8), plan, width, height, fetched - start)


class Reader:
    """Reads and plans the sampler's batches a few batches ahead, on a thread pool.

    ``prepare``: what a read thread does for one sample (:func:`prepare`: bytes and plan; the
    plan alone where DALI's reader reads the bytes, NOTE [DALI's reader, exactly])."""

    def __init__(self, dataset: DeclaredImages, batches: Iterable[list[int]], ahead: int,
                 prepare: Callable[[DeclaredImages, int], Sample] = prepare) -> None:
        self._dataset = dataset
        self._prepare = prepare
        self._batches = iter(batches)
        self._ahead = ahead
        self._pool = ThreadPool(READ_THREADS)
        self._queue: deque[list[tuple[int, AsyncResult[Sample]]]] = deque()
        self._exhausted = False

    def _fill(self) -> None:
        while not self._exhausted and len(self._queue) < self._ahead:
            try:
                batch = next(self._batches)
            except StopIteration:
                self._exhausted = True
                return
            self._queue.append(
                [(i, self._pool.apply_async(self._prepare, (self._dataset, i))) for i in batch]
            )

    def next_slot(self) -> Slot | None:
        """The next batch, read; None at the end of the epoch."""
        self._fill()
        if not self._queue:
            return None
        pending = self._queue.popleft()
        self._fill()
        slot = Slot([])
        for index, result in pending:
            try:
                slot.samples.append(result.get())
            except SampleError as exc:  # every read or decode failure of one sample
                if self._dataset.on_error == "raise":
                    slot.error = exc
                    break
                slot.info.skipped.append(self._dataset.skipped(index, exc))
            except Exception as exc:  # storage down, a bug: raised when the loop reaches it
                slot.error = exc
                break
        slot.info.fetch_s = sum(s.fetch_s for s in slot.samples)
        return slot

    def close(self) -> None:
        self._queue.clear()
        self._pool.terminate()  # drops reads not started; waits for the ones running
        self._pool.join()


class Feed:
    """DALI's external source: hands DALI the next non-empty batch and remembers every slot.

    ``pending`` holds, in sampler order, every slot DALI has pulled and the loop has not yet
    yielded, including the ones that are not fed to DALI (all skipped, or failed); DALI's
    outputs come back in the order of the fed ones.
    """

    def __init__(self, reader: Reader, plans_only: int | None = None) -> None:
        """``plans_only``: DALI's reader reads the bytes; hand it the plans of batches of
        this size (a short batch padded with its last sample's plan)."""
        self._reader = reader
        self._plans_only = plans_only
        self.pending: deque[Slot] = deque()
        self._replay: deque[Slot] = deque()
        self.done = False

    def replay(self) -> None:
        """Hand every pending slot to DALI again (after a pipeline was rebuilt)."""
        self._replay = deque(self.pending) + self._replay
        self.pending.clear()
        self.done = False

    def _next_slot(self) -> Slot | None:
        return self._replay.popleft() if self._replay else self._reader.next_slot()

    def __call__(self) -> tuple[list[np.ndarray], ...]:
        while True:
            slot = self._next_slot()
            if slot is None:
                self.done = True
                raise StopIteration
            self.pending.append(slot)
            if slot.fed and self._plans_only is not None:
                samples = slot.samples
                return columns(samples + [samples[-1]] * (self._plans_only - len(samples)))[1:]
            if slot.fed:
                return columns(slot.samples)


def columns(samples: list[Sample]) -> tuple[list[np.ndarray], ...]:
    """The external source's seven per-sample inputs of a batch (see :func:`fastload.engines.dali.graph`)."""
    data, anchor, shape, roi_start, roi_end, size, flip = [], [], [], [], [], [], []
    for s in samples:
        left, top, right, bottom = s.plan.box
        # A margin of the filter's reach keeps the resampling at the crop's edge like Pillow's,
        # which reads pixels outside its box too.
        margin = math.ceil(max(1.0, (right - left) / s.plan.out_w, (bottom - top) / s.plan.out_h)) + 1
        x0, y0 = max(0, math.floor(left) - margin), max(0, math.floor(top) - margin)
        x1, y1 = min(s.width, math.ceil(right) + margin), min(s.height, math.ceil(bottom) + margin)
        data.append(s.data)
        anchor.append(np.array([x0, y0], np.float32))  # (x, y): axis_names="WH"
        shape.append(np.array([x1 - x0, y1 - y0], np.float32))
        roi_start.append(np.array([top - y0, left - x0], np.float32))  # (y, x): shape order
        roi_end.append(np.array([bottom - y0, right - x0], np.float32))
        size.append(np.array([s.plan.out_h, s.plan.out_w], np.float32))
        flip.append(np.array(int(s.plan.flip), np.int32))
    return data, anchor, shape, roi_start, roi_end, size, flip
