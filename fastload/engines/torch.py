"""The torch engine: torch's own DataLoader iterator, worker processes and all.

With ``fastload/meter/workers.py`` (the workers' fetcher hook) and ``fastload/loader/first_epoch.py``
this is all of fastload that touches torch's DataLoader internals (here the private loader's
``_iterator``, the persistent iterator torch keeps between epochs; docs/design.md lists each
use). Everything torch does
stays torch's: worker processes, their seeds, pinning, ``timeout``, ``in_order``.

Example::

    >>> engine = TorchEngine.build(context)   # built by fastload.DataLoader
    >>> batches = engine.epoch()               # torch's iterator over a private DataLoader
"""

from __future__ import annotations

import atexit
import logging
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data
import torch.utils.data.dataloader

from fastload.engines.base import Engine, EngineContext, WorkerParts

logger = logging.getLogger(__name__)


class TorchEngine(Engine):
    """Runs a loader's epochs on torch's iterator, over a private torch DataLoader.

    The private loader is the facade's settings (workers, pinning, prefetch, persistence,
    generator, timeout, start method, order) with fastload's own parts (NOTE [what a
    rebuild copies] in :mod:`fastload.engines.base`) and this rank's plan; the facade keeps
    the user's own attributes. It lives across epochs, so persistent workers persist, and
    is built again after :meth:`restart` (a re-tuned worker count).

    Args:
        context: what the loader built the engine from: the facade, the dataset as it
            runs, this rank's plan, fastload's collate and worker init.
        draws_like_torch: persistence was fastload's choice, not the user's: draw the base
            seed torch would have drawn for a new iterator (NOTE [auto persistence draws
            like torch]).
    """

    name = "torch"

    @classmethod
    def build(cls, context: EngineContext) -> TorchEngine:
        return cls(context, draws_like_torch=context.draws_like_torch)

    def __init__(self, context: EngineContext, *, draws_like_torch: bool = False) -> None:
        # A weak reference: the loader holds its engine, and a cycle would keep an abandoned
        # loader, and its persistent workers, alive until the cycle collector runs.
        self._loader_ref = weakref.ref(context.loader)
        self._dataset = context.dataset
        self._plan = context.batch_sampler
        self._parts = context.parts
        self._draws_like_torch = draws_like_torch
        self._kept = _Kept()
        self._current: weakref.ref[Iterator[Any]] | None = None
        _close_at_exit(self)
        weakref.finalize(self, _drop_kept, self._kept).atexit = False

    @property
    def _private(self) -> torch.utils.data.DataLoader | None:
        """The private loader (NOTE [workers of a collected loader])."""
        return self._kept.loader

    @_private.setter
    def _private(self, private: torch.utils.data.DataLoader | None) -> None:
        self._kept.loader = private

    @property
    def _loader(self) -> torch.utils.data.DataLoader:
        loader = self._loader_ref()
        if loader is None:
            raise ReferenceError("the DataLoader of this TorchEngine is gone")
        return loader

    @property
    def kept_iterator(self) -> Iterator[Any] | None:
        """torch's iterator kept between epochs (persistent workers), None when none is kept."""
        return self._private._iterator if self._private is not None else None

    @property
    def reuses_iterator(self) -> bool:
        """Whether the next epoch resets torch's persistent iterator instead of building one."""
        return self._private is not None and self._private._iterator is not None

    def epoch(self) -> Iterator[Any]:
        loader = self._loader
        private = self._private
        if self._draws_like_torch and private is not None and private._iterator is not None:
            # NOTE [auto persistence draws like torch]
            # torch draws one base seed from the generator for every new iterator, but a
            # reused persistent iterator draws none. When persistence was fastload's choice,
            # not the user's, draw (and drop) that number, so the caller's random stream and
            # a RandomSampler's order in later epochs are exactly what torch's default gives.
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        settings = getattr(loader, "settings", None)
        with warnings.catch_warnings():
            if settings is not None and settings.num_workers.source == "auto":
                # NOTE [more workers than cores] in fastload.loader.dataloader
                warnings.filterwarnings("ignore", message="This DataLoader will create")
            if private is None:
                private = self._private = private_loader(loader, self._dataset, self._plan, self._parts)
            # The defining module's class: ``torch.utils.data.DataLoader`` may be fastload's
            # own facade where a script substituted it (benchmarks/torch_compat does).
            iterator = torch.utils.data.dataloader.DataLoader.__iter__(private)
        self._current = weakref.ref(iterator)
        return iterator

    def abandon(self, epoch: Iterator[Any]) -> None:
        """Shut down the workers of an epoch that raised, unless they persist.

        Left to torch, they would live as long as the error's traceback holds the iterator,
        and when the cycle collector frees it they stall its shutdown: their queues' feeder
        threads stop before torch's ``__del__`` runs, so the workers never hear the
        shutdown and are joined with a timeout each (5 s), then killed."""
        if epoch is not self.kept_iterator:
            _shut_down(epoch)

    def restart(self) -> None:
        """Shut down persistent workers; the next epoch starts new ones from the dataset now
        (and from the loader's settings now: a re-tuned worker count)."""
        if self._shut_down_persistent():
            logger.info("restarted the loader's persistent workers")
        self._private = None

    def close(self) -> None:
        """Shut down the workers of the epoch in progress and the persistent ones."""
        current = self._current() if self._current is not None else None
        self._current = None
        _shut_down(current)
        self._shut_down_persistent()

    def _shut_down_persistent(self) -> bool:
        """Stop the iterator torch keeps between epochs, if any; whether there was one."""
        private = self._private
        if private is None:
            return False
        iterator = private._iterator
        private._iterator = None
        _shut_down(iterator)
        return iterator is not None


def private_loader(
    loader: torch.utils.data.DataLoader, dataset: Any, plan: Any, parts: WorkerParts,
    **overrides: Any,
) -> torch.utils.data.DataLoader:
    """A plain torch DataLoader with ``loader``'s settings over ``plan`` with fastload's parts.

    ``plan`` is a batch sampler, or for an unbatched loader the index sampler; an iterable
    dataset's loader batches by ``batch_size`` as the facade does. ``overrides`` replace
    settings (the engine probe's trials prefetch less).
    """
    workers = int(loader.num_workers)
    settings: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": parts.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": parts.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context if workers else None,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor if workers else None,
        "persistent_workers": bool(loader.persistent_workers) and workers > 0,
        "in_order": loader.in_order,
    }
    if loader.pin_memory_device:
        settings["pin_memory_device"] = loader.pin_memory_device
    settings.update(overrides)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return torch.utils.data.dataloader.DataLoader(
            dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, **settings
        )
    if loader.batch_sampler is None:  # unbatched: the plan is the index sampler
        return torch.utils.data.dataloader.DataLoader(dataset, batch_size=None, sampler=plan, **settings)
    return torch.utils.data.dataloader.DataLoader(dataset, batch_sampler=plan, **settings)


# NOTE [workers of a collected loader]
# A loader left in a reference cycle (a traceback that holds it, a framework's objects that
# point at each other) is freed by the cycle collector, and with it, when the engine held
# them alone, its persistent workers' iterator and queues. The collector runs the queues'
# weakref callbacks before torch's ``__del__``: their feeder threads get the sentinel and
# stop, so torch's shutdown puts its stop message into a queue nobody sends, and waits 5 s
# for each worker before it kills it, in whatever thread the collection ran. So the private
# loader sits in a _Kept that a finalizer of the engine also holds: it is never part of such
# garbage, and when the engine goes the finalizer drops it: freed by its reference count,
# torch's ``__del__`` shuts the workers down with their queues whole.
class _Kept:
    """The engine's private loader, shared with the engine's finalizer."""

    __slots__ = ("loader",)

    def __init__(self) -> None:
        self.loader: torch.utils.data.DataLoader | None = None


def _drop_kept(kept: _Kept) -> None:
    # Dropped, not shut down: an epoch's iterator still in use (``iter(DataLoader(...))``
    # keeps only the iterator) goes on; one nobody holds is freed here, by its count.
    kept.loader = None


# NOTE [workers end at exit]
# At interpreter exit torch does not stop a loader's workers (its shutdown is a no-op once its
# own exit hook ran) and multiprocessing kills the daemonic ones, so a persistent worker never
# runs its exit hooks: the disk cache's buffered puts are lost and its packed store keeps the
# worker's crash mark, which makes the next boot throw the store away (NOTE [packed
# durability] in fastload/cache/packedsync.py). Engines still open at exit are closed first:
# this hook is registered after torch's (atexit runs the last registered first).
_OPEN: weakref.WeakSet[TorchEngine] = weakref.WeakSet()


def _close_at_exit(engine: TorchEngine) -> None:
    if not _OPEN:
        atexit.unregister(_close_open_engines)
        atexit.register(_close_open_engines)
    _OPEN.add(engine)


def _close_open_engines() -> None:
    for engine in list(_OPEN):
        try:
            engine.close()
        except Exception as exc:  # noqa: BLE001 - an exit hook must not fail the exit
            logger.debug("closing a loader's workers at exit failed: %s", exc)


def _shut_down(iterator: Iterator[Any] | None) -> None:
    """Stop an iterator's worker processes (an in-process iterator has none)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
