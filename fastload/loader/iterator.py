"""The iterator of one epoch of a fastload loader, and the stages it chains.

:class:`LoaderIterator` wraps the engine's epoch in the stages the loader needs, in order:
opening worker envelopes (timings, skips, a worker's sample error), clairvoyant prefetch
into the cache (:mod:`fastload.loader.prefetch`), the device hand-over
(:class:`fastload.device.DeviceFeeder`) and the meter. It counts batches where the user
receives them, which is what a resume continues from (NOTE [two ways to resume]).

Example::

    >>> it = iter(loader)          # a LoaderIterator
    >>> batch = next(it)
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fastload.data import batchinfo
from fastload.device import DeviceFeeder
from fastload.loader import prefetch
from fastload.loader.state import Progress
from fastload.meter import StarvationMeter
from fastload.meter.hotpath import InlinePass

if TYPE_CHECKING:
    from fastload.loader.dataloader import DataLoader

logger = logging.getLogger(__name__)

_perf = time.perf_counter


def epoch_iterator(
    loader: DataLoader,
    inner: Iterator[Any],
    progress: Progress,
    first: list[Any] | None = None,
    *,
    declared: bool = False,
    feeder: DeviceFeeder | None = None,
) -> LoaderIterator:
    """The iterator of one epoch of ``loader`` over the engine's ``inner`` iterator.

    A plain dataset without ``device=`` gets the shortest per-batch path: torch's iterator
    called directly, and the meter recorded in the same ``__next__`` (NOTE [the meter inside
    the loader's iterator] in :mod:`fastload.meter.hotpath`). Built as its own class, not
    switched to it afterwards: CPython specialises attribute reads for an instance's class
    as it was built (a switched instance read its attributes ~0.1 µs slower per batch).
    """
    if declared or feeder is not None:
        return LoaderIterator(loader, inner, progress, first, declared=declared, feeder=feeder)
    inline = loader.meter.track_inline() if loader.meter is not None else None
    if inline is not None:
        return _MeteredPlain(loader, inner, progress, first, inline=inline)
    return _Plain(loader, inner, progress, first)


class LoaderIterator(Iterator[Any]):
    """The iterator of a fastload loader: unwraps worker envelopes, feeds the device, meters.

    Attributes it does not define are read from torch's iterator underneath, so code that
    inspects ``_workers`` or calls ``_shutdown_workers()`` keeps working. For a plain
    dataset without ``device=`` (:func:`epoch_iterator` builds the plain kinds) it calls
    torch's iterator directly (no generator between), so errors and ``StopIteration``
    behave exactly as torch's.
    """

    def __init__(
        self,
        loader: DataLoader,
        inner: Iterator[Any],
        progress: Progress,
        first: list[Any] | None = None,
        *,
        declared: bool = False,
        feeder: DeviceFeeder | None = None,
    ) -> None:
        self._inner = inner
        # NOTE [workers of a collected loader] (fastload.engines.torch), for one epoch: held
        # from a finalizer, torch's iterator is never part of the cycle collector's garbage, so
        # its shutdown finds its queues whole when an iterator left in a cycle is freed.
        weakref.finalize(self, _let_go, inner).atexit = False
        self._meter = loader.meter
        # The engine that made ``inner``: told when the epoch raises (NOTE [an epoch that raised]).
        self._engine = loader.engine if declared or feeder is not None else None
        # NOTE [two ways to resume]: batches count when the user gets them; _unwrap records how
        # many of torch's items each one stands for (an all-skipped batch is never handed out).
        self._progress = progress
        self._counts: collections.deque[int] = collections.deque()
        loader.skipped = []
        source: Iterator[Any] = itertools.chain(first, inner) if first else inner
        if declared or feeder is not None:
            source = _unwrap(source, loader, self._meter, self._counts)
        if declared:  # a cached ImageFolder: fetch the epoch's next items ahead
            source = prefetch.follow_loader(loader, source, start_batch=self._progress.batches)
        if feeder is not None:
            source = feeder(source)
        self._source = source
        self._next = self._metered(source)

    def _metered(self, source: Iterator[Any]) -> Callable[[], Any]:
        """What ``__next__`` calls for the next batch: the meter's pass over ``source``."""
        return self._meter.track(source).__next__ if self._meter is not None else source.__next__

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = self._next()
        except StopIteration:
            self._progress.done = True
            raise
        except BaseException:
            # NOTE [an epoch that raised]
            # Here batches come through generators (_unwrap, prefetch, the feeder), which end
            # when an error passes through them: the epoch is over (a next() stops). Its
            # workers are stopped now, not when the error's traceback lets the iterator go.
            # The plain kinds call torch's iterator directly and keep torch's behaviour: a
            # worker's error leaves the iterator usable, and its workers running.
            try:
                self._engine.abandon(self._inner)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the epoch's own error is the one to see
                logger.warning("could not stop the workers of an epoch that raised: %s", exc)
            raise
        self._progress.batches += self._counts.popleft() if self._counts else 1
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet (a failed __init__)
            raise AttributeError(name)
        return getattr(self._inner, name)


class _Plain(LoaderIterator):
    """A plain dataset's iterator: each item from torch is one batch; the meter, if any,
    wraps torch's iterator (its full hot path: CUDA events, copy split, periodic log)."""

    def __init__(
        self, loader: DataLoader, inner: Iterator[Any], progress: Progress,
        first: list[Any] | None = None,
    ) -> None:
        super().__init__(loader, inner, progress, first)

    def __next__(self) -> Any:
        try:
            batch = self._next()
        except StopIteration:
            self._progress.done = True
            raise
        self._progress.batches += 1
        return batch


class _MeteredPlain(LoaderIterator):
    """A plain dataset's iterator that records the meter's counted pass itself: torch's
    ``__next__`` timed between two ``perf_counter`` calls (NOTE [the meter inside the
    loader's iterator])."""

    def __init__(
        self, loader: DataLoader, inner: Iterator[Any], progress: Progress,
        first: list[Any] | None = None, *, inline: InlinePass,
    ) -> None:
        self._pass = inline
        self._add_start, self._add_end = inline.add_start, inline.add_end
        super().__init__(loader, inner, progress, first)

    def _metered(self, source: Iterator[Any]) -> Callable[[], Any]:
        return source.__next__  # recorded in __next__ below

    def __next__(self) -> Any:
        t0 = _perf()
        try:
            batch = self._next()
        except StopIteration:
            self._progress.done = True
            self._pass.close(t0)
            raise
        t1 = _perf()
        if not self._pass.opened:
            self._pass.open()
        self._add_start(t0)
        self._add_end(t1)
        self._progress.batches += 1
        return batch


def _let_go(inner: Iterator[Any]) -> None:
    """A finalizer's callback: nothing to do, the finalizer only held ``inner`` until now."""


def _unwrap(
    inner: Iterator[Any],
    loader: DataLoader,
    meter: StarvationMeter | None,
    counts: collections.deque[int],
) -> Iterator[Any]:
    """Open worker envelopes: record their timings and skips, yield the bare batches.

    A module-level generator, not a method: it must not hold its LoaderIterator, or an
    abandoned iterator would live until the cycle collector runs and keep workers alive.
    """
    # With a feeder the meter splits the copy out of the wait: it needs the time spent
    # upstream of it (the "copy" column in fastload.meter.recorder).
    upstream = meter if meter is not None and meter.copy_split else None
    perf = time.perf_counter
    pending = 0
    while True:
        began = perf()
        try:
            item = next(inner)
        except StopIteration:
            break
        finally:
            if upstream is not None:
                upstream.note_upstream(perf() - began)
        pending += 1
        if isinstance(item, batchinfo.Envelope):
            info = item.info
            if meter is not None:
                meter.note_work(info.fetch_s, info.decode_s, info.collate_s)
            if info.skipped:
                loader.skipped.extend(info.skipped)
            if info.error is not None:  # NOTE [sample errors cross the process boundary]
                raise info.error.exception()
            if item.batch is None:  # every sample of this batch was skipped
                continue
            item = item.batch
        counts.append(pending)
        pending = 0
        yield item
    _report_skipped(loader)


def _report_skipped(loader: DataLoader) -> None:
    skipped = loader.skipped
    if skipped:
        shown = "; ".join(f"#{s.index} {s.path}" for s in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        logger.warning(
            "epoch %d skipped %d samples that could not be read or decoded (on_error='skip'; "
            "loader.skipped gives each one's reason): %s%s",
            loader.epoch - 1, len(skipped), shown, more,
        )
