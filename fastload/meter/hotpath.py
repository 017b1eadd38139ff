"""The meter's per-batch hot path: :class:`MeteredIterator`, and counting a batch's samples.

Everything here runs once per batch, between torch's ``next()`` and the training loop, so it
does as little as it can: two ``perf_counter`` calls, two appends to float arrays and a
sample count that follows a remembered path into the batch (NOTE [fast sample count]), or
none at all when every batch holds the same count (NOTE [samples from the batch sampler] in
:mod:`.recorder`: the column is filled when read).

NOTE [the meter inside the loader's iterator]
Each layer between the training loop and torch's iterator costs a Python call per batch, and
inside a real loader (caches cold after torch's own per-batch work) each step of the meter
costs about as much again as over ready batches. So fastload's own loader iterator
(:class:`fastload.loader.iterator.LoaderIterator`) does not wrap torch's iterator in a
:class:`MeteredIterator` in the common case; it writes the same records from its own
``__next__`` through an :class:`InlinePass` (:meth:`StarvationMeter.track_inline`): the same
two timestamps, in the same columns, and the same pass opened at the first batch and closed
at ``StopIteration``.
"""

from __future__ import annotations

import collections.abc
import operator
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fastload.meter.recorder import StarvationMeter

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


class MeteredIterator(Iterator[Any]):
    """One pass of a meter over an iterator: yields exactly what the iterator yields.

    Written as a class, not a generator, so an exception from the iterator leaves it usable
    just as the iterator itself is (torch's iterators can be resumed after a worker error).
    The hot path binds the meter's column appends once per pass and touches nothing else
    unless a copy split, CUDA events or periodic logging are on.
    """

    __slots__ = (
        "_add_end",
        "_add_samples",
        "_add_start",
        "_extra",
        "_fixed",
        "_get",
        "_kind",
        "_meter",
        "_next",
        "_probe",
    )

    def __init__(self, meter: StarvationMeter, iterator: Iterator[Any]) -> None:
        self._meter = meter
        self._next = iterator.__next__
        meter.in_pass = False  # a new pass: its first batch opens it
        meter._fresh = True
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
            if self._meter.in_pass:
                self._meter._close_pass(t0)
            raise
        t1 = _perf()
        if not self._meter.in_pass:
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


class CountedMeteredIterator(MeteredIterator):
    """The common case's hot path: a fixed count per batch, no CUDA events, copy split or log.

    The same records as :class:`MeteredIterator` with the fewest steps per batch: inside a
    real loader each step costs about a microsecond (caches are cold after torch's own
    per-batch work), so the checks that cannot apply are left out, not skipped, and the
    sample count is not written per batch (the meter fills it in when read).
    """

    __slots__ = ()

    def __next__(self) -> Any:
        t0 = _perf()
        try:
            batch = self._next()
        except StopIteration:
            if self._meter.in_pass:
                self._meter._close_pass(t0)
            raise
        t1 = _perf()
        if not self._meter.in_pass:
            self._meter._open_pass(counted=True)
        self._add_start(t0)
        self._add_end(t1)
        return batch


def counted(meter: StarvationMeter) -> bool:
    """Whether a pass of ``meter`` takes the shortest hot path: a fixed count per batch, and
    no CUDA events, copy split or periodic log to feed."""
    return bool(meter.batch_size) and meter._probe is None and not (
        meter.copy_split or meter.log_every is not None
    )


def metered(meter: StarvationMeter, iterator: Iterator[Any]) -> MeteredIterator:
    """The meter's iterator over ``iterator``: the short hot path where it applies."""
    it = MeteredIterator(meter, iterator)
    if counted(meter):
        it.__class__ = CountedMeteredIterator
    return it


class InlinePass:
    """One pass of a meter recorded by an iterator that times its own ``next()`` calls.

    NOTE [the meter inside the loader's iterator]: for the counted case only (:func:`counted`;
    :meth:`StarvationMeter.track_inline` returns None otherwise). Per batch, the iterator
    records ``t0 = perf_counter()`` before its ``next()`` and ``t1`` after, then: if not
    ``opened``, :meth:`open`; then ``add_start(t0)`` and ``add_end(t1)``. At
    ``StopIteration``: :meth:`close` with its ``t0``.

    ``opened`` lives here, not on the meter, so the per-batch check reads one slot of an
    object the iterator holds (inside a real loader every other object it reads is a likely
    cache miss); the meter's ``reset()`` clears it, so a pass reset mid-way opens anew.

    Attributes:
        meter: the :class:`~fastload.meter.StarvationMeter` recorded into.
        add_start: appends a batch's ``t0`` (the meter's column, bound once per pass).
        add_end: appends a batch's ``t1``.
        opened: the pass has delivered its first batch (and the meter was not reset since).
    """

    __slots__ = ("__weakref__", "add_end", "add_start", "meter", "opened")

    def __init__(self, meter: StarvationMeter) -> None:
        self.meter = meter
        self.opened = False  # a new pass: its first batch opens it
        meter.in_pass = False
        meter._fresh = True
        self.add_start = meter._start.append
        self.add_end = meter._end.append

    def open(self) -> None:
        """Open the pass, at its first batch (before that batch's records)."""
        self.opened = True
        self.meter._open_pass(counted=True)

    def close(self, t: float) -> None:
        """End the pass at ``t``, the ``perf_counter`` of the ``next()`` that raised StopIteration."""
        if self.opened:
            self.opened = False
            self.meter._close_pass(t)
