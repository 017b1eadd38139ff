"""The torch candidate of the engine probe: torch workers over a share of the first epoch.

:class:`~fastload.engines.probe.ProbeEngine` times each candidate on consecutive batches of
the first epoch's plan. torch's is a plain DataLoader built like the facade's own
(``private_loader``: the same dataset, collate and worker settings) over the batches the
probe's gate hands it, with torch's default ``prefetch_factor`` and no persistent workers:
the facade's own torch engine starts at the second epoch if torch is kept, and
:func:`epoch_of_trial_torch` finishes the first one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch.utils.data

from fastload.engines.base import Engine, EngineContext
from fastload.engines.torch import private_loader

TRIAL_PREFETCH = 2
"""torch's own default ``prefetch_factor``, for the torch candidate's trial loader."""


class TrialTorch(Engine):
    """torch workers over a share of the plan: a plain DataLoader built like the facade's."""

    name = "torch"

    def __init__(self, context: EngineContext) -> None:
        self._context = context
        self.batch_sampler: Iterable[list[int]] = context.batch_sampler
        self._iterator: Any = None

    @classmethod
    def build(cls, context: EngineContext) -> TrialTorch:
        return cls(context)

    @property
    def ahead(self) -> int:
        return self.producers * TRIAL_PREFETCH

    @property
    def producers(self) -> int:
        return max(1, self._context.loader.num_workers)

    def epoch(self) -> Iterator[Any]:
        self._iterator = iter(_private_loader(self._context, self.batch_sampler))
        return self._iterator

    def close(self) -> None:
        _shut_down(self._iterator)
        self._iterator = None


def _private_loader(context: EngineContext, batches: Iterable[list[int]]) -> torch.utils.data.DataLoader:
    workers = context.loader.num_workers
    return private_loader(
        context.loader, context.dataset, batches, context.parts,
        prefetch_factor=TRIAL_PREFETCH if workers > 0 else None, persistent_workers=False,
        worker_init_fn=None, generator=None,
    )


def epoch_of_trial_torch(context: EngineContext, rest: Iterable[list[int]]) -> Iterator[Any]:
    """The rest of the first epoch on a plain torch loader (the facade's own starts at epoch 2)."""
    iterator = iter(_private_loader(context, rest))
    try:
        yield from iterator
    finally:
        _shut_down(iterator)


def _shut_down(iterator: Any) -> None:
    """End a torch iterator's workers now (a single-process one has none)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
