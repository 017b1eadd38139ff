"""Worker-side measurement for any dataset: how busy the loader's worker processes were.

A :class:`fastload.DataLoader` with worker processes passes torch a :class:`MeasuredWorkerInit`
in place of the user's ``worker_init_fn``. In each worker it calls the user's function first
(same argument, same exceptions, nothing else changed), then times that worker's batches into
:class:`WorkerCounters`, a small shared-memory array the main process created before the
workers started. Nothing travels with the batches and the dataset is not touched.

NOTE [timing the worker's fetcher]
torch's worker loop makes its fetcher (``_DatasetKind.create_fetcher``) right after the
worker_init_fn returns, and again when persistent workers start a new epoch. In the worker
process only, the init replaces that factory with one that puts two instance attributes on
each fetcher it makes: a timed ``fetch`` (dataset access and collate, what torch runs per
batch) and a timed ``collate_fn``. Both return what torch's own would, raise what it would,
and live on the worker's private fetcher object: the main process, its dataset, the worker's
dataset copy and ``loader.collate_fn`` stay as they are. A factory call for any other dataset
(a DataLoader built inside a worker) is passed through untimed. If torch's worker loop ever
stops making its fetcher this way, no worker reports and the summary says the workers were
not measured; it never guesses.

Per worker the counters hold totals (batches, busy seconds inside ``fetch``, process CPU
seconds during them, collate seconds, the end of the last batch, the start of the batch in
progress) and a ring of the last :data:`RING` batches' begin/end times, read back by the
meter to split each wait into "waiting for the workers" and "receiving in the main process"
(NOTE [the wait split] in :mod:`.analysis`).

Example::

    >>> counters = WorkerCounters(num_workers=4)
    >>> init = MeasuredWorkerInit(user_init_fn, counters)   # what torch is given
    >>> counters.totals()["busy_s"]                          # after some batches
    1.82
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fastload.meter.report import WorkerStats
from fastload.tuning.reuse import KeptSamples

HEADER = 8
"""Doubles per worker before its ring: see the ``_H_*`` offsets."""
_H_HOOKED, _H_BATCHES, _H_BUSY, _H_CPU, _H_COLLATE, _H_LAST_DONE, _H_BEGAN, _H_EPOCH_J = range(8)

RING = 2048
"""Batches per worker whose own begin/end times are kept (older ones are summarized only)."""
ENTRY = 4
_R_TAG, _R_BEGAN, _R_DONE, _R_COLLATE = range(4)  # tag = the batch's ordinal in its epoch + 1


class WorkerCounters:
    """Per-worker counters in shared memory, written by workers, read by the meter.

    Created in the main process before the workers start; workers inherit it (fork) or get
    it with their start-up arguments (spawn, forkserver). Each worker writes only its own
    slots, so no lock is needed.

    Args:
        num_workers: worker processes of the loader (worker ids ``0..num_workers-1``).
        ring: batches per worker whose begin/end times are kept.
        in_order: the loader delivers batches in the order it sent them (torch's
            ``in_order=True``), so batch ``k`` of an epoch is worker ``k % W``'s ``k // W``-th.
    """

    def __init__(self, num_workers: int, ring: int = RING, *, in_order: bool = True) -> None:
        if num_workers < 1:
            raise ValueError(f"WorkerCounters needs at least one worker, got {num_workers}")
        self.num_workers = num_workers
        self.ring = ring
        self.in_order = in_order
        self.stride = HEADER + ring * ENTRY
        self._array = multiprocessing.RawArray("d", num_workers * self.stride)
        self._view: np.ndarray | None = None

    def view(self) -> np.ndarray:
        """The counters as a float64 array (a view of the shared memory, not a copy)."""
        if self._view is None:
            self._view = np.frombuffer(self._array, dtype=np.float64)
        return self._view

    def __reduce__(self) -> Any:
        # The shared memory can only be handed to a process being started (sharedctypes
        # asserts it); torch starts spawn/forkserver workers that way.
        return (_rebuild_counters, (self._array, self.num_workers, self.ring, self.in_order))

    # -- the main process ------------------------------------------------------------------

    def hooked(self) -> int:
        """How many workers time their batches (0 until a worker has started its fetcher)."""
        v = self.view()
        return int(sum(v[w * self.stride + _H_HOOKED] > 0 for w in range(self.num_workers)))

    def totals(self, now: float | None = None) -> dict[str, float]:
        """Sums over workers: batches, busy/cpu/collate seconds, last batch end.

        ``busy_s`` includes the part of batches in progress up to ``now`` (default: now).
        """
        t = time.perf_counter() if now is None else now
        v = self.view()
        heads = v.reshape(self.num_workers, self.stride)[:, :HEADER].copy()
        began = heads[:, _H_BEGAN]
        running = np.where(began > 0, np.clip(t - began, 0.0, None), 0.0)
        return {
            "batches": float(heads[:, _H_BATCHES].sum()),
            "busy_s": float(heads[:, _H_BUSY].sum() + running.sum()),
            "cpu_s": float(heads[:, _H_CPU].sum()),
            "collate_s": float(heads[:, _H_COLLATE].sum()),
            "last_done": float(heads[:, _H_LAST_DONE].max()),
            "running": float((began > 0).sum()),
            "t": t,
        }

    def batch_times(self, ordinals: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Begin, end and collate seconds of the epoch's batches ``ordinals`` (nan if gone).

        Batch ``k`` of an epoch was made by worker ``k % W`` as its ``k // W``-th
        (NOTE [timing the worker's fetcher]: torch sends indices round-robin); entries
        overwritten since, or from another epoch, have another tag and come back nan.
        """
        w = self.num_workers
        k = np.asarray(ordinals, dtype=np.int64)
        j = k // w
        base = (k % w) * self.stride + HEADER + (j % self.ring) * ENTRY
        v = self.view()
        ok = v[base + _R_TAG] == (j + 1)
        nan = np.full(k.shape, np.nan)
        return (
            np.where(ok, v[base + _R_BEGAN], nan),
            np.where(ok, v[base + _R_DONE], nan),
            np.where(ok, v[base + _R_COLLATE], nan),
        )


def _rebuild_counters(array: Any, num_workers: int, ring: int, in_order: bool) -> WorkerCounters:
    counters = WorkerCounters.__new__(WorkerCounters)
    counters.num_workers, counters.ring, counters.in_order = num_workers, ring, in_order
    counters.stride = HEADER + ring * ENTRY
    counters._array, counters._view = array, None
    return counters


class MeasuredWorkerInit:
    """The ``worker_init_fn`` torch is given: the user's, then the timing of this worker.

    Calls ``user_fn(worker_id)`` exactly as torch would (its exceptions propagate untouched
    and then nothing is installed), then installs the timed fetcher (NOTE [timing the
    worker's fetcher]) and, in the first epoch, the probe's kept samples (NOTE [probe samples
    reused] in :mod:`fastload.tuning.reuse`). Pickled for a worker being started it carries
    the shared counters and the samples still held; pickled any other time
    (``copy.deepcopy(loader)``) it keeps the user's function only.

    Attributes:
        user_fn: the user's ``worker_init_fn`` (None if none was given); also ``__wrapped__``.
        counters: the :class:`WorkerCounters` the workers write, None when not measuring.
        samples: the probe's :class:`~fastload.tuning.reuse.KeptSamples`, served by the first
            fetcher of each worker of the first epoch (the main process empties it once that
            epoch's workers have started); None when none were kept.
    """

    def __init__(
        self,
        user_fn: Callable[[int], None] | None,
        counters: WorkerCounters | None,
        samples: KeptSamples | None = None,
    ):
        self.user_fn = user_fn
        self.counters = counters
        self.samples = samples

    @property
    def __wrapped__(self) -> Callable[[int], None] | None:
        return self.user_fn

    def __call__(self, worker_id: int) -> None:
        if self.user_fn is not None:
            self.user_fn(worker_id)
        samples = self.samples if self.samples is not None and self.samples.held else None
        if self.counters is not None or samples is not None:
            _install(self.counters, worker_id, samples)

    def __reduce__(self) -> Any:
        if multiprocessing.context.get_spawning_popen() is not None:
            return (MeasuredWorkerInit, (self.user_fn, self.counters, self.samples))
        return (MeasuredWorkerInit, (self.user_fn, None))

    def __repr__(self) -> str:
        return f"MeasuredWorkerInit({self.user_fn!r})"


def measured_worker_init(
    user_fn: Callable[[int], None] | None,
    num_workers: int,
    meter: Any,
    *,
    in_order: bool = True,
    samples: KeptSamples | None = None,
) -> Callable[[int], None] | MeasuredWorkerInit | None:
    """The ``worker_init_fn`` for torch: the user's own when nothing is measured or served.

    Measures when there are worker processes and a meter (``meter`` is the DataLoader's
    ``meter=`` argument: False turns the meter, and this, off); carries the probe's kept
    ``samples`` to the workers when there are some (with or without the meter).

    Example::

        >>> init = measured_worker_init(my_init, 4, True)
        >>> isinstance(init, MeasuredWorkerInit), init.user_fn is my_init
        (True, True)
    """
    if not isinstance(num_workers, int) or num_workers < 1:
        return user_fn
    if samples is not None and not samples.held:
        samples = None
    if meter is False:
        return MeasuredWorkerInit(user_fn, None, samples) if samples is not None else user_fn
    return MeasuredWorkerInit(user_fn, WorkerCounters(num_workers, in_order=in_order), samples)


# -- inside a worker -----------------------------------------------------------------------


class _FetchTimer:
    """One worker's timing of its fetcher; writes its own slots of the shared counters."""

    def __init__(self, counters: WorkerCounters, worker_id: int, dataset: Any) -> None:
        self.v = counters.view()
        self.base = worker_id * counters.stride
        self.ring = counters.ring
        self.dataset = dataset
        self.j = 0
        self.collate = 0.0

    def new_epoch(self) -> None:
        self.j = 0
        self.v[self.base + _H_EPOCH_J] = 0.0

    def wrap(self, fetcher: Any) -> Any:
        fetch, collate = fetcher.fetch, getattr(fetcher, "collate_fn", None)
        try:
            fetcher.fetch = self._timed_fetch(fetch)
            if callable(collate):
                fetcher.collate_fn = self._timed_collate(collate)
        except (AttributeError, TypeError):  # a fetcher with __slots__: leave it untimed
            try:
                fetcher.fetch = fetch
            except (AttributeError, TypeError):
                pass
            return fetcher
        self.v[self.base + _H_HOOKED] = 1.0
        return fetcher

    def _timed_collate(self, collate: Callable[[Any], Any]) -> Callable[[Any], Any]:
        perf = time.perf_counter

        def collate_fn(data: Any) -> Any:
            start = perf()
            try:
                return collate(data)
            finally:
                self.collate += perf() - start

        return collate_fn

    def _timed_fetch(self, fetch: Callable[[Any], Any]) -> Callable[[Any], Any]:
        perf, cpu = time.perf_counter, time.process_time
        v, b = self.v, self.base

        def timed(index: Any) -> Any:
            self.collate = 0.0
            began, c0 = perf(), cpu()
            v[b + _H_BEGAN] = began
            ended = False
            try:
                return fetch(index)
            except StopIteration:  # an iterable dataset's end: no batch
                ended = True
                raise
            finally:
                done = perf()
                v[b + _H_BEGAN] = 0.0
                v[b + _H_BUSY] += done - began
                v[b + _H_CPU] += cpu() - c0
                v[b + _H_COLLATE] += self.collate
                v[b + _H_LAST_DONE] = done
                if not ended:
                    j = self.j
                    self.j = j + 1
                    v[b + _H_BATCHES] += 1.0
                    v[b + _H_EPOCH_J] = j + 1
                    e = b + HEADER + (j % self.ring) * ENTRY
                    v[e + _R_TAG] = 0.0  # invalid while being written
                    v[e + _R_BEGAN] = began
                    v[e + _R_DONE] = done
                    v[e + _R_COLLATE] = self.collate
                    v[e + _R_TAG] = j + 1

        return timed


def _install(counters: WorkerCounters | None, worker_id: int, samples: KeptSamples | None = None) -> None:
    """In a worker: time the fetchers torch's worker loop makes from now on, and let the
    first of them serve the probe's kept ``samples`` (NOTE [probe samples reused])."""
    import torch.utils.data
    from torch.utils.data import dataloader

    info = torch.utils.data.get_worker_info()
    kind = getattr(dataloader, "_DatasetKind", None)
    factory = kind.__dict__.get("create_fetcher") if kind is not None else None
    make = getattr(factory, "__func__", None)
    if counters is not None and not (0 <= worker_id < counters.num_workers):
        return
    if info is None or make is None:
        return  # not in a torch worker, or a torch whose worker loop we do not know
    if getattr(make, "_fastload_make", None) is not None:  # installed already (reused init)
        make = make._fastload_make
    timer = _FetchTimer(counters, worker_id, info.dataset) if counters is not None else None
    if counters is not None:
        counters.view()[timer.base + _H_BEGAN] = 0.0
    ours = info.dataset
    first = [samples]

    def create_fetcher(kind_: Any, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        fetcher = make(kind_, dataset, *args, **kwargs)
        if dataset is not ours:  # a loader made inside the worker: not ours to touch
            return fetcher
        held, first[0] = first[0], None  # the first epoch's fetcher only
        if held is not None:
            held.serve(fetcher)  # before the timer, so the timer times what it serves
        if timer is None:
            return fetcher
        timer.new_epoch()
        return timer.wrap(fetcher)

    create_fetcher._fastload_timer = timer  # type: ignore[attr-defined]
    create_fetcher._fastload_make = make  # type: ignore[attr-defined]
    kind.create_fetcher = staticmethod(create_fetcher)


# -- the main process: what the counters say ---------------------------------------------------


def activity(counters: WorkerCounters, passes: list[list[Any]], last_delivered: float) -> WorkerStats:
    """The workers' :class:`~.report.WorkerStats` over the passes' steady state.

    Each pass counts from its first delivered batch (the counters read then) to its workers'
    last batch (a pass that ended), or for a pass still open to now while a worker is busy,
    else to the later of its workers' last batch and the last delivered one (a loop that
    left with ``break``): busy share = busy seconds / (that span x workers). Workers that
    finish early at a pass's end, once the sampler ran out, count as idle for the rest of it.
    """
    hooked = counters.hooked()
    if not hooked:
        return WorkerStats.unmeasured(
            counters.num_workers,
            "worker busy share not measured: no worker reported its batches (the engine "
            "ran no torch worker processes, or this torch's worker loop is not one fastload "
            "knows how to time)",
        )
    busy = cpu = collate = batches = capacity = 0.0
    for opened, closed, _ in passes:
        last = closed if closed is not None else counters.totals()
        end = last["t"]
        if not last["running"]:
            finished = last["last_done"] if closed is not None else max(
                last["last_done"], last_delivered
            )
            if finished > opened["t"]:
                end = min(end, finished)
        span = max(0.0, end - opened["t"])
        made = last["batches"] - opened["batches"]
        if made <= 0 and not last["running"]:  # no worker process made this pass's batches
            continue
        busy += last["busy_s"] - opened["busy_s"]
        cpu += last["cpu_s"] - opened["cpu_s"]
        collate += last["collate_s"] - opened["collate_s"]
        batches += made
        capacity += span * counters.num_workers
    if capacity <= 0 or batches <= 0:
        return WorkerStats(
            counters.num_workers, hooked, 0, None, None, None, None,
            "worker busy share not measured: the workers made no batch after the first of a "
            "pass was delivered (too few batches for the prefetch, or another engine ran "
            "the passes)",
        )
    return WorkerStats(
        workers=counters.num_workers,
        reporting=hooked,
        batches=int(batches),
        busy_share=min(1.0, busy / capacity),
        busy_per_batch_s=busy / batches,
        cpu_share=min(1.0, cpu / busy) if busy > 0 else 0.0,
        collate_share=min(1.0, collate / busy) if busy > 0 else 0.0,
        note=None,
    )
