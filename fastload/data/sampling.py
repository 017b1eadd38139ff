"""Epoch-aware sampling: the order of an epoch and the seed of every sample's augmentation.

NOTE [per-sample seeds]
A declared dataset (``ImageFolder``) draws its random augmentation from a generator seeded
by ``mix(seed, epoch, index)``, not from the worker's global RNG. The seed travels with the
index as a :class:`SampleIndex` (an ``int`` that also carries ``.seed``), so a sample is
augmented the same way whichever worker reads it, with any number of workers, with
persistent workers, and after a mid-epoch resume: everything follows from (seed, epoch).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
import xxhash
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from integers (splitmix64 finalizer over each part)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & _MASK64)) & _MASK64
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 27
        h = (h * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


class SampleIndex(int):
    """A dataset index that also carries the seed of the sample's augmentation.

    It is a plain ``int`` to everything else (lists, ``Subset``, numpy indexing).
    """

    seed: int

    def __new__(cls, index: int, seed: int) -> SampleIndex:
        obj = super().__new__(cls, index)
        obj.seed = seed
        return obj

    def __reduce__(self):
        return (SampleIndex, (int(self), self.seed))


class EpochSampler(DistributedSampler):
    """Shuffles by ``(seed, epoch)``, shards across ranks, and tags indices with seeds.

    The order of epoch ``e`` is a pure function of ``(seed, e)``, so every rank computes the
    same permutation and a run can be resumed at any batch. ``set_epoch(e)`` chooses the
    epoch; :class:`fastload.DataLoader` calls it at the start of each iteration.

    With ``num_replicas > 1`` the permutation is split like ``DistributedSampler``: rank
    ``r`` takes positions ``r, r + R, r + 2R, ...``; without ``drop_last`` the tail is padded
    by repeating the head of the permutation so every rank yields the same count.

    NOTE [resumed epochs]
    One epoch can be narrowed to a *span* of its permutation, ``perm[start:stop]`` (what is
    left after a checkpoint, see :mod:`fastload.loader.resume`), and this rank can skip the first
    ``skip`` indices of its shard. Padding always repeats the head of the full permutation,
    so a span that starts at a multiple of ``num_replicas`` shards exactly like the positions
    it replaces: a same-size restart sees the same remaining order, and an elastic restart
    re-splits the span over the new ranks.

    NOTE [a sampler frameworks leave alone]
    It is a ``torch.utils.data.distributed.DistributedSampler`` (with that class's
    attributes: ``dataset``, ``num_replicas``, ``rank``, ``epoch``, ``shuffle``, ``seed``,
    ``drop_last``, ``num_samples``, ``total_size``), because that is what PyTorch Lightning
    checks before it replaces a loader's sampler with its own under DDP: a loader whose
    sampler already is one is left as it is. A :class:`fastload.DataLoader` shows the
    *all-ranks* order as its public ``sampler`` (``num_replicas=1``) and runs this rank's
    share (:meth:`for_rank`) in its engine, so a framework that splits the public plan
    itself (Accelerate's ``BatchSamplerShard``) splits it once, and so does fastload
    (docs/integrations.md).

    ``order``: an object whose ``permutation(seed, epoch, shuffle=, num_replicas=)`` gives
    the epoch's permutation instead of a uniform one (a sharded dataset's
    :class:`~fastload.data.shard_order.ShardOrder`, NOTE [shard-aware order]).

    Example::

        >>> s = EpochSampler(10, shuffle=True, seed=0)
        >>> s.set_epoch(1)
        >>> sorted(s) == list(range(10))
        True
    """

    def __init__(
        self,
        data_source: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
        tag_seeds: bool = False,
        order: Any = None,
    ) -> None:
        self.size = data_source if isinstance(data_source, int) else len(data_source)
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, num_replicas={num_replicas})")
        self.shuffle = shuffle
        self.seed = int(seed)
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.tag_seeds = tag_seeds
        self.order = order  # permutation(seed, epoch, shuffle=, num_replicas=), or None: uniform
        self.epoch = 0
        self.dataset = data_source if not isinstance(data_source, int) else range(data_source)
        self.iterations = 0  # how many times this object was iterated (a public view: by whom?)
        self.loader_view = False  # a fastload loader's public all-ranks order (fastload.loader.plan)
        self._resumed: tuple[int, int, int, int] | None = None  # (epoch, start, stop, skip)
        self._layout: tuple[int, int] | None = None  # (epoch, ranks its `order` was laid out for)
        self._digest: tuple[tuple, str] | None = None  # (what it was of, order_digest)

    def for_rank(self, rank: int, num_replicas: int) -> EpochSampler:
        """The same order (seed, shuffle, epoch, padding), as the share of ``rank`` of
        ``num_replicas``; no resume span."""
        twin = EpochSampler(
            self.dataset, shuffle=self.shuffle, seed=self.seed, num_replicas=num_replicas,
            rank=rank, drop_last=self.drop_last, tag_seeds=self.tag_seeds, order=self.order,
        )
        twin.epoch = self.epoch
        twin.loader_view = False
        return twin

    @property
    def num_samples(self) -> int:  # DistributedSampler's name for the indices per rank
        return self.shard_len()

    @property
    def total_size(self) -> int:  # DistributedSampler's: all ranks' indices, padded
        return self.shard_len() * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def resume(
        self, epoch: int, *, start: int = 0, stop: int | None = None, skip: int = 0,
        layout: int | None = None,
    ) -> None:
        """Make ``epoch`` cover only ``perm[start:stop]``, this rank skipping ``skip`` indices.

        Other epochs are unaffected. See NOTE [resumed epochs]. ``layout``: the number of
        ranks the saved permutation was laid out for, where an ``order`` depends on it (a
        restart on another number of ranks re-splits that permutation's rest).
        """
        stop = self.size if stop is None else stop
        if not 0 <= start <= stop <= self.size or skip < 0:
            raise ValueError(
                f"resume span [{start}:{stop}] skip={skip} does not fit a dataset of {self.size}"
            )
        self._resumed = (int(epoch), int(start), int(stop), int(skip))
        self._layout = None if layout is None else (int(epoch), int(layout))

    def layout(self, epoch: int | None = None) -> int:
        """The number of ranks an epoch's permutation is laid out for (see :meth:`resume`)."""
        epoch = self.epoch if epoch is None else epoch
        if self._layout is not None and self._layout[0] == epoch:
            return self._layout[1]
        return self.num_replicas

    def span(self, epoch: int | None = None) -> tuple[int, int, int]:
        """``(start, stop, skip)`` of an epoch: ``(0, size, 0)`` unless it was resumed."""
        epoch = self.epoch if epoch is None else epoch
        if self._resumed is not None and self._resumed[0] == epoch:
            return self._resumed[1:]
        return 0, self.size, 0

    def shard_len(self, epoch: int | None = None) -> int:
        """Indices per rank in an epoch, before this rank's ``skip``."""
        start, stop, _ = self.span(epoch)
        if self.drop_last:
            return (stop - start) // self.num_replicas
        return math.ceil((stop - start) / self.num_replicas)

    def full_len(self) -> int:
        """Indices per rank in a whole epoch, as if it had not been resumed."""
        if self.drop_last:
            return self.size // self.num_replicas
        return math.ceil(self.size / self.num_replicas)

    def __len__(self) -> int:
        return max(0, self.shard_len() - self.span()[2])

    def _permutation(self, epoch: int, layout: int | None = None) -> list[int]:
        if self.order is not None:  # a dataset's own order (NOTE [shard-aware order])
            return self.order.permutation(self.seed, epoch, shuffle=self.shuffle,
                                          num_replicas=layout or self.layout(epoch))
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator()
        g.manual_seed(mix_seed(self.seed, epoch))
        return torch.randperm(self.size, generator=g).tolist()

    def order_digest(self, epoch: int, layout: int | None = None) -> str:
        """A digest of an epoch's whole permutation (laid out for ``layout`` ranks, default
        the epoch's own), which a saved state records (NOTE [a changed order]). The last one
        is kept: a permutation of ImageNet takes ~0.25 s, and a loop may save every few steps."""
        key = (epoch, layout or self.layout(epoch), self.seed, self.shuffle, self.size, self.order)
        if self._digest is not None and self._digest[0] == key:
            return self._digest[1]
        perm = np.asarray(self._permutation(epoch, layout), dtype=np.int64)
        digest = xxhash.xxh3_64_hexdigest(perm.tobytes())
        self._digest = (key, digest)
        return digest

    def epoch_order(self, epoch: int | None = None) -> list[int]:
        """All ranks' indices of an epoch, before sharding (padded to a multiple of ranks)."""
        epoch = self.epoch if epoch is None else epoch
        perm = self._permutation(epoch)
        start, stop, _ = self.span(epoch)
        order = perm[start:stop]
        total = self.shard_len(epoch) * self.num_replicas
        if total > len(order):
            pad = total - len(order)
            order += (perm * math.ceil(pad / max(1, len(perm))))[:pad]
        return order[:total]

    def indices(self, epoch: int | None = None) -> list[int]:
        """This rank's indices of an epoch, in the order it yields them (after any resume)."""
        epoch = self.epoch if epoch is None else epoch
        return self.epoch_order(epoch)[self.rank :: self.num_replicas][self.span(epoch)[2] :]

    def epoch_seed(self, epoch: int | None = None) -> int:
        """The seed that the augmentations of this epoch derive from."""
        return mix_seed(self.seed, 0xA5A5, self.epoch if epoch is None else epoch)

    def __iter__(self) -> Iterator[int]:
        self.iterations += 1
        if self.loader_view and self.iterations == 1:
            # Only another DataLoader iterates a loader's public order (fastload's engine
            # runs its rank's twin): say once that fastload's engine is not the one running.
            logger.warning(
                "a fastload.DataLoader's sampler is being iterated by another DataLoader (a "
                "framework rebuilt the loader as torch's own class, as Accelerate's prepare() "
                "and skip_first_batches() do): the batches are the same, but fastload's engine "
                "and starvation meter do not run there. To keep them under Accelerate, leave "
                "the loader out of prepare() and pass DataLoader(..., device=accelerator.device) "
                "(docs/integrations.md)"
            )
        mine = self.indices()
        if not self.tag_seeds:
            return iter(mine)
        base = self.epoch_seed()
        return (SampleIndex(i, mix_seed(base, i)) for i in mine)
