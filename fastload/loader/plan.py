"""The loader's order: which sampler the user sees, and which one fastload's engine runs.

NOTE [the public plan and the rank's plan]
A framework that distributes training re-creates or wraps a DataLoader from its public
attributes (docs/integrations.md): Lightning replaces ``loader.sampler`` unless it already
is a ``DistributedSampler``; Accelerate wraps ``loader.batch_sampler`` in its own
``BatchSamplerShard`` and builds a plain torch DataLoader around it. Each splits the plan
it reads by rank. So that a framework's split is the only one, a fastload loader that owns
its order shows the *all-ranks* order as its public ``sampler`` (an
:class:`~fastload.data.sampling.EpochSampler` with ``num_replicas=1``, which is a
``DistributedSampler``, so Lightning leaves it alone), and its engine runs a twin of it that
holds only this rank's share (:attr:`Plan.rank_sampler`). In a bare loop and under
Lightning, fastload's engine does the split; under Accelerate, Accelerate does it over the
public order; nobody does it twice.

A rebuilt loader hands the public sampler back to fastload: passed as ``sampler=``, it is
adopted (the new loader owns the order again, with the same seed); found inside a user's
``batch_sampler`` (Lightning's prediction wrapper), it is switched to this rank's share
there, since that batch sampler is now the plan.

Example::

    >>> plan = epoch_plan(folder, None, None, shuffle=True, generator=None, drop_last=False,
    ...                   batch_size=64)
    >>> plan.public.num_replicas, plan.rank_sampler.num_replicas
    (1, 2)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, Sampler, SequentialSampler

from fastload import distributed
from fastload.data.declared import is_declared
from fastload.data.sampling import EpochSampler
from fastload.data.sharded import ShardedImages

logger = logging.getLogger(__name__)

_NESTING = 4  # how deep a framework's batch-sampler wrappers are looked into


@dataclass
class Plan:
    """A loader's order.

    Attributes:
        public: the sampler torch's ``__init__`` gets and ``loader.sampler`` shows (the
            all-ranks order), or None to keep the user's / torch's default.
        rank_sampler: fastload's EpochSampler of this rank (None: the user's sampler or
            batch sampler decides the order, and fastload never splits it).
        batches: this rank's plan for the engine (a BatchSampler, or the rank's sampler
            itself for an unbatched loader); None: the loader's own ``batch_sampler`` (or,
            unbatched, its ``sampler``), as torch built it, is the plan.
    """

    public: EpochSampler | None = None
    rank_sampler: EpochSampler | None = None
    batches: Any = None
    seed_agreed: bool = True

    def follow_ranks(self, *, agree: bool) -> bool:
        """Split by the ranks as they are now; with ``agree``, also agree on the seed.
        Whether the split changed.

        NOTE [a loader built before the process group]
        Lightning's launcher sets the rank's environment and starts the process group inside
        ``trainer.fit``; a loader passed to ``fit`` was built before, as one process. Since
        its public sampler is a DistributedSampler, Lightning adds no split of its own, so
        the loader takes its rank's share when it is next measured (``len``) or iterated.
        The ranks agree on the seed at the first iteration after that (a collective: every
        rank iterates its loader, as DDP training does; ``len`` exchanges nothing). Before its
        first epoch the loader also resolves its settings again for the ranks now on the
        node (``fastload.DataLoader``).
        """
        mine = self.rank_sampler
        if mine is None:
            return False
        ranks = distributed.rank_info()
        changed = (mine.rank, mine.num_replicas) != (ranks.rank, ranks.world_size)
        if changed:
            mine.rank, mine.num_replicas = ranks.rank, ranks.world_size
            self.seed_agreed = ranks.world_size == 1
            logger.info("the loader now reads rank %d's share of %d", ranks.rank, ranks.world_size)
        if agree and not self.seed_agreed and ranks.connected:
            seed = distributed.agree_seed(mine.seed, ranks)
            mine.seed = self.public.seed = seed  # type: ignore[union-attr]
            self.seed_agreed = True
        return changed

    @property
    def owned(self) -> bool:
        """Whether the loader owns the order (sets its epoch, resumes by shards)."""
        return self.rank_sampler is not None


def epoch_plan(
    dataset: Dataset,
    sampler: Sampler | Iterable | None,
    batch_sampler: Sampler[list] | Iterable[list] | None,
    *,
    shuffle: bool | None,
    generator: torch.Generator | None,
    drop_last: bool,
    batch_size: int | None,
) -> Plan:
    """fastload's order for a loader built with these arguments (NOTE [the public plan...]).

    It owns the epoch order, the rank's shard (NOTE [one seed for all ranks]) and the
    per-sample seeds of declared datasets (NOTE [per-sample seeds]): for a declared dataset,
    and under torch.distributed for any map-style dataset, when the user passed no sampler;
    and for a sampler that a framework's rebuild hands back.
    """
    ranks = distributed.rank_info()
    if _is_view(sampler) and batch_sampler is None:
        return _plan(sampler, ranks, batch_size, drop_last)  # a rebuilt loader: adopt it
    if batch_sampler is not None or sampler is not None:
        given = batch_sampler if batch_sampler is not None else sampler
        _split_nested(given, ranks)
        _check_order(dataset, given)
        return Plan()
    declared = is_declared(dataset)
    if not (declared or (ranks.distributed and not isinstance(dataset, IterableDataset))):
        return Plan()
    public = EpochSampler(
        dataset, shuffle=bool(shuffle),
        seed=distributed.agree_seed(_base_seed(dataset, generator), ranks),
        drop_last=drop_last, tag_seeds=declared,
        order=dataset.epoch_order if declared else None,  # NOTE [shard-aware order]
    )
    public.loader_view = True
    return _plan(public, ranks, batch_size, drop_last)


def _is_view(sampler: Any) -> bool:
    """Whether ``sampler`` is a fastload loader's public order (not one a user built)."""
    return isinstance(sampler, EpochSampler) and sampler.loader_view and sampler.num_replicas == 1


def _plan(public: EpochSampler, ranks: distributed.RankInfo, batch_size: int | None, drop_last: bool) -> Plan:
    mine = public.for_rank(ranks.rank, ranks.world_size)
    batches = BatchSampler(mine, batch_size, drop_last) if batch_size is not None else mine
    return Plan(public, mine, batches)


def _split_nested(plan: Any, ranks: distributed.RankInfo) -> None:
    """A public EpochSampler inside a user's (a framework's) sampler wrappers: this rank's share.

    Lightning's prediction loop rebuilds a loader around
    ``_IndexBatchSamplerWrapper(BatchSampler(loader.sampler))`` and, since the sampler is a
    DistributedSampler, adds no split of its own.
    """
    for level in _nested(plan):
        if isinstance(level, EpochSampler):
            if _is_view(level) and ranks.world_size > 1:
                level.num_replicas, level.rank = ranks.world_size, ranks.rank
                logger.info(
                    "a fastload sampler inside the loader's batch_sampler now yields rank %d's "
                    "share of %d (a framework rebuilt the loader around it)", ranks.rank, ranks.world_size,
                )
            return


def _check_order(dataset: Dataset, given: Any) -> None:
    """A sharded dataset read in the order of a sampler of the user's own is told so (NOTE
    [a sampler of one's own over shards]): not for fastload's samplers, bare or wrapped by a
    framework, nor for the storage order."""
    if not isinstance(dataset, ShardedImages):
        return
    levels = list(_nested(given))
    if any(isinstance(level, (EpochSampler, SequentialSampler, range)) for level in levels):
        return
    dataset.check_order(type(levels[-1]).__name__)


def _nested(plan: Any) -> Iterator[Any]:
    """``plan`` and the samplers inside it (``.sampler``, ``.batch_sampler``), outermost first."""
    for _ in range(_NESTING):
        if plan is None:
            return
        yield plan
        plan = getattr(plan, "sampler", None) or getattr(plan, "batch_sampler", None)


def _base_seed(dataset: Dataset, generator: torch.Generator | None) -> int:
    """The seed of an epoch-seeded order (and of a declared dataset's augmentation).

    ``torch.initial_seed()`` follows ``torch.manual_seed`` without consuming random numbers,
    so a fastload loader leaves torch's global random stream exactly where torch would.
    """
    seed = dataset.seed if is_declared(dataset) else None
    if seed is not None:
        return seed
    return generator.initial_seed() if generator is not None else torch.initial_seed()
