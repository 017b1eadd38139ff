"""The engine contract: what every engine that runs a loader's epochs must do.

An engine turns a loader's *batch plan* into batches. The plan is the loader's batch sampler,
iterated once per epoch: the order, ``drop_last``, the rank's shard and a resumed epoch's
remaining indices are all the sampler's (NOTE [one plan, two engines] in
:mod:`fastload.engines.dali`), so engines never decide what to read, only how.

An engine

* is registered with what it needs and why it cannot run a loader, answered before it is
  built (:class:`fastload.engines.registry.EngineSpec`);
* yields one epoch's batches from :meth:`Engine.epoch`: plain batches, or
  :class:`fastload.data.batchinfo.Envelope` objects that carry the batch with the time spent
  fetching, decoding and collating it and the samples skipped under ``on_error="skip"``;
  a failed sample raises an error that names its file and index;
* keeps no position of its own (the batch plan is the position), and says whether the next
  epoch continues workers kept from the last one (:attr:`Engine.reuses_iterator`, which the
  replay resume needs: NOTE [persistent workers] in :mod:`fastload.loader.resume`);
* stops an epoch that ended with an error on :meth:`Engine.abandon` (NOTE [an epoch that
  raised] in :mod:`fastload.loader.iterator`), forgets what it keeps between epochs on
  :meth:`Engine.restart`, and leaves no thread or process behind after :meth:`Engine.close`.

tests/contracts/test_engines.py holds every registered engine to this.

Example::

    >>> engine = engine_class("dali").build(context)   # built by fastload.DataLoader
    >>> for item in engine.epoch(): ...
    >>> engine.close()
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.utils.data
from torch.utils.data import Dataset


@dataclass(frozen=True)
class EngineRequest:
    """What a loader asks of an engine, known before the loader is built.

    Attributes:
        dataset: the user's dataset.
        device: where batches go (None: host memory).
        batched: whether the loader yields batches (``batch_size`` or ``batch_sampler`` set).
        collate_fn, worker_init_fn: the user's, if any.
        cuda_available: whether a CUDA GPU can be used; None asks torch.
    """

    dataset: Dataset
    device: torch.device | None = None
    batched: bool = True
    collate_fn: Callable[[list[Any]], Any] | None = None
    worker_init_fn: Callable[[int], None] | None = None
    cuda_available: bool | None = None


@dataclass
class WorkerParts:
    """What fastload runs around the user's functions where torch's iterator runs them.

    NOTE [what a rebuild copies]
    A loader's public ``collate_fn`` and ``worker_init_fn`` are the user's own, because
    Lightning and Accelerate re-create a loader from its public attributes. fastload's own
    wrappers live here, read by the torch engine when it builds its iterator, and re-tuning
    replaces ``worker_init_fn`` here, never on the loader.

    Attributes:
        collate_fn: the collate function torch's iterator runs (for a declared dataset the
            user's inside :class:`~fastload.data.batchinfo.CollateWithInfo`); None: torch's
            default.
        worker_init_fn: the ``worker_init_fn`` torch's workers run (the user's inside
            :class:`~fastload.meter.workers.MeasuredWorkerInit` when measured).
    """

    collate_fn: Callable[[list[Any]], Any] | None = None
    worker_init_fn: Callable[[int], None] | None = None


@dataclass(frozen=True)
class EngineContext:
    """What an engine is built from: the loader and the settings resolved for it.

    Attributes:
        loader: the facade (a ``torch.utils.data.DataLoader``); the torch engine reads its
            public settings (workers, pinning, generator, timeout, ...), others nothing.
        dataset: the dataset as the engine runs it (without Normalize when the loader
            normalizes on the device).
        batch_sampler: the batch plan of this rank, iterated once per epoch (for an
            unbatched loader, its index sampler).
        batch_size: the largest batch; None when a user batch sampler decides.
        device: where batches go (None: host memory).
        num_threads: the parallelism the settings chose (worker processes or threads).
        pin_memory: put host batches in pinned memory.
        parts: fastload's collate and worker init (NOTE [what a rebuild copies]).
        draws_like_torch: persistence of workers was fastload's choice, not the user's
            (NOTE [auto persistence draws like torch] in :mod:`fastload.engines.torch`).
    """

    loader: torch.utils.data.DataLoader
    dataset: Dataset
    batch_sampler: Any
    batch_size: int | None
    device: torch.device | None
    num_threads: int
    pin_memory: bool
    draws_like_torch: bool = False
    parts: WorkerParts = field(default_factory=WorkerParts)


class Engine(abc.ABC):
    """Base of the engines: runs the epochs of one loader (see the module's contract)."""

    name: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def build(cls, context: EngineContext) -> Engine:
        """The engine for one loader."""

    @abc.abstractmethod
    def epoch(self) -> Iterator[Any]:
        """One epoch's batches (or Envelopes), in the order of the loader's batch plan."""

    @property
    def ahead(self) -> int:
        """Batches the engine takes from its plan before the loop has received one (its
        queue: what :mod:`fastload.engines.probe` must not count as measured)."""
        return 1

    @property
    def producers(self) -> int:
        """Batches the engine makes side by side, each whole by its own producer (torch's
        workers); they arrive in rounds, which :mod:`fastload.engines.probe` must time whole."""
        return 1

    @property
    def reuses_iterator(self) -> bool:
        """Whether the next epoch continues workers kept from the last one (draws no seed)."""
        return False

    def abandon(self, epoch: Iterator[Any]) -> None:
        """``epoch``, an iterator :meth:`epoch` returned, ended with an error out of the loop
        (a sample error, Ctrl-C, a timeout): stop what serves it now, not when the iterator
        is collected. What the engine keeps between epochs (persistent workers) stays.
        An engine whose epochs close themselves on an error needs nothing here."""

    def restart(self) -> None:
        """Forget anything kept between epochs (persistent workers), so the next epoch
        starts from the dataset as it is now."""

    def close(self) -> None:
        """Stop every thread and process the engine started."""
