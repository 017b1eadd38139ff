"""Where a loader is: one explicit state object that the loader owns and resume reads.

:class:`LoaderState` is everything a :class:`fastload.DataLoader` remembers between epochs
and what :mod:`fastload.loader.resume` needs to save and restore it. The resume functions
take it and return it; nothing outside :mod:`fastload.loader` reads a loader's private
attributes.

Example::

    >>> loader.state.epoch, loader.state.progress.batches     # 2 epochs started, 17 batches in
    (2, 17)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Progress:
    """How far one iteration of a loader has come, counted where the user receives batches."""

    epoch: int
    batches: int = 0
    done: bool = False
    rng_state: torch.Tensor | None = None
    rng_source: str = "global"
    reused: bool = False  # torch reset its persistent iterator instead of building one
    skip: int = 0  # the sampler's skip when this epoch started (sharded mode)
    span: tuple[int, int] = (0, 0)
    shard_len: int = 0


@dataclass
class ReplayPlan:
    """What the next iteration must replay: restore ``rng_state``, drop ``batches`` batches."""

    batches: int
    rng_state: torch.Tensor | None  # None: the epoch had not started; use the current state
    rng_source: str
    warm: torch.Tensor | None = None  # start persistent workers from this state first


@dataclass
class LoaderState:
    """A loader's position and memory (NOTE [two ways to resume] in :mod:`fastload.loader.resume`).

    Attributes:
        owns_sampler: the loader built its own EpochSampler: it alone gets ``set_epoch``
            and the sharded resume mode.
        epoch: iterations started; the epoch in progress is ``epoch - 1``.
        iterations: iterators this loader has started (torch reuses persistent ones).
        progress: the iteration in progress (or the last one).
        replay: what the next iteration must replay (replay mode, after a load).
        loaded: a state loaded but not iterated yet: ``state_dict()`` returns it as it is.
        first_rng: the random state the first epoch started its workers from
            (NOTE [persistent workers]).
    """

    owns_sampler: bool = False
    epoch: int = 0
    iterations: int = 0
    progress: Progress | None = None
    replay: ReplayPlan | None = None
    loaded: dict[str, Any] | None = field(default=None, repr=False)
    first_rng: torch.Tensor | None = field(default=None, repr=False)

    @property
    def in_epoch(self) -> bool:
        """Whether an epoch has started and not ended."""
        return self.progress is not None and not self.progress.done
