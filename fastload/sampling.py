"""Epoch-aware sampling: the order of an epoch and the seed of every sample's augmentation.

NOTE [per-sample seeds]
A declared dataset (``ImageFolder``) draws its random augmentation from a generator seeded
by ``mix(seed, epoch, index)``, not from the worker's global RNG. The seed travels with the
index as a :class:`SampleIndex` (an ``int`` that also carries ``.seed``), so a sample is
augmented the same way whichever worker reads it, with any number of workers, with
persistent workers, and after a mid-epoch resume: everything follows from (seed, epoch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

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


class EpochSampler(Sampler[int]):
    """Shuffles by ``(seed, epoch)``, shards across ranks, and tags indices with seeds.

    The order of epoch ``e`` is a pure function of ``(seed, e)``, so every rank computes the
    same permutation and a run can be resumed at any batch. ``set_epoch(e)`` chooses the
    epoch; :class:`fastload.DataLoader` calls it at the start of each iteration.

    With ``num_replicas > 1`` the permutation is split like ``DistributedSampler``: rank
    ``r`` takes positions ``r, r + R, r + 2R, ...``; without ``drop_last`` the tail is padded
    by repeating the head so every rank yields the same count.

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
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        if self.drop_last:
            return self.size // self.num_replicas
        return math.ceil(self.size / self.num_replicas)

    def epoch_order(self, epoch: int | None = None) -> list[int]:
        """All ranks' indices of an epoch, before sharding (padded to a multiple of ranks)."""
        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(mix_seed(self.seed, epoch))
            order = torch.randperm(self.size, generator=g).tolist()
        else:
            order = list(range(self.size))
        total = len(self) * self.num_replicas
        if total > len(order):
            pad = total - len(order)
            order += (order * math.ceil(pad / max(1, len(order))))[:pad]
        return order[:total]

    def epoch_seed(self, epoch: int | None = None) -> int:
        """The seed that the augmentations of this epoch derive from."""
        return mix_seed(self.seed, 0xA5A5, self.epoch if epoch is None else epoch)

    def __iter__(self) -> Iterator[int]:
        mine = self.epoch_order()[self.rank :: self.num_replicas]
        if not self.tag_seeds:
            return iter(mine)
        base = self.epoch_seed()
        return (SampleIndex(i, mix_seed(base, i)) for i in mine)
