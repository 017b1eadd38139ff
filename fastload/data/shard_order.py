"""The shard-aware epoch order of a sharded dataset, and how well it shuffles.

NOTE [shard-aware order]
A uniform permutation of a sharded dataset reads every shard at every step: each sample is a
range read of a different shard, and a shard cache would need the whole dataset at once. An
epoch of :class:`ShardOrder` instead (the block shuffle of Mosaic Streaming, simplified):

1. shuffles the shards by ``(seed, epoch)``;
2. cuts that list into windows of ``window`` shards and shuffles the samples within each
   window (seeded by the same generator), so the stream reads ``window`` shards at a time;
3. with ``R`` ranks, gives rank ``r`` a *contiguous* block of that stream (the first
   ``N mod R`` ranks one sample more), so each rank reads whole shards apart from the two
   ends of its block. The blocks are laid out so that rank ``r`` takes positions
   ``r, r + R, ...`` of the permutation, the split :class:`~fastload.EpochSampler` and
   ``DistributedSampler`` make: padding, ``drop_last`` and exact mid-epoch resume (NOTE
   [resumed epochs]) work unchanged. A resume must use the same number of ranks (the
   permutation depends on it); the public all-ranks order a loader shows is the stream.

Without ``shuffle`` the stream is the storage order. :func:`shuffle_quality` measures the
result against a uniform permutation (docs/shards.md has the numbers).

NOTE [row groups of files]
Parquet's shards are row groups (a sample's read decodes its whole group), but its
downloads are files of several groups each (NOTE [the shard store]). Shuffled as shards,
the groups of a file were spread over the whole epoch: every file was first needed in the
first windows and last needed in the last ones, so a cold epoch downloaded most files at its
start and held each until its end, and through a budget smaller than the dataset files were
downloaded again within the epoch (1-3 times each in tests/test_parquet_cache.py: 8 files
of 3 groups, a budget of 3 files; each once now). Given ``files`` (the file of each shard),
step 1 instead shuffles the files and reads ``window`` of them at a time, each one's groups
in a shuffled order: a group of each in turn, and a file whose groups are done gives way to
the next file. That stream of groups is cut into windows of ``window`` groups, so a window
still mixes the groups of about ``window`` files (random groups came from a few more), and
a file is read from its first group to its last while ``window - 1`` others are. The files
join one a round at the start, so that they end one at a time: the reader needs one new
file at a time (aligned, the window's files all ended together and the reader, a few
batches ahead of the loop, needed the next ``window`` files while the last were still held,
past the budget), as for tar shards. docs/shards.md has the shuffle quality.

Example::

    >>> order = ShardOrder([100, 100, 100, 100], window=2)
    >>> perm = order.permutation(seed=0, epoch=1, shuffle=True, num_replicas=1)
    >>> sorted(perm) == list(range(400))
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload.data.sampling import mix_seed

__all__ = ["ShardOrder", "shuffle_quality"]


class ShardOrder:
    """Epoch orders of samples stored in shards of ``sizes`` samples (NOTE [shard-aware order]).

    Args:
        sizes: samples in each shard, in storage order (sample ids run shard by shard).
        window: shards whose samples are shuffled together (at least 1).
        files: the file of each shard, where a file holds several (Parquet's row groups):
            files are then read ``window`` at a time (NOTE [row groups of files]).
    """

    def __init__(self, sizes: Sequence[int], window: int = 4,
                 files: Sequence[int] | None = None) -> None:
        if window < 1:
            raise ValueError(f"a shuffle window of {window} shards; it must be at least 1")
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.window = int(window)
        self.files: list[np.ndarray] | None = None  # the shards of each file, by file
        if files is not None:
            of = np.asarray(files, dtype=np.int64)
            if len(of) != len(self.sizes):
                raise ValueError(f"{len(of)} files given for {len(self.sizes)} shards")
            by_file = np.argsort(of, kind="stable")
            cuts = np.flatnonzero(np.diff(of[by_file])) + 1
            self.files = np.split(by_file, cuts) if len(of) else []

    def __len__(self) -> int:
        return int(self.sizes.sum())

    def __repr__(self) -> str:
        return f"ShardOrder({len(self.sizes)} shards, {len(self)} samples, window={self.window})"

    def stream(self, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
        """All samples of an epoch in the order they are read (steps 1 and 2)."""
        if not shuffle:
            return np.arange(len(self), dtype=np.int64)
        rng = np.random.Generator(np.random.PCG64(mix_seed(seed, 0x5A4D, epoch) % 2**63))
        parts = []
        for shards in self._windows(rng):
            members = np.concatenate([
                np.arange(self.starts[s], self.starts[s] + self.sizes[s]) for s in shards
            ])
            rng.shuffle(members)
            parts.append(members)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _windows(self, rng: np.random.Generator) -> list[np.ndarray]:
        """The shards of each window, in the order read (step 1 and the cut of step 2)."""
        if self.files is None:
            shards = rng.permutation(len(self.sizes))
            return [shards[w: w + self.window] for w in range(0, len(shards), self.window)]
        files = iter(rng.permutation(len(self.files)).tolist())  # NOTE [row groups of files]
        reading: list[list[int]] = []  # the groups of each file being read, still to come
        dealt: list[int] = []
        while True:
            if len(reading) < self.window and (joining := next(files, None)) is not None:
                reading.append(rng.permutation(self.files[joining]).tolist())  # one a round
            if not reading:
                break
            for slot, groups in enumerate(reading):  # a group of each file in turn
                dealt.append(groups.pop())
                if not groups and (following := next(files, None)) is not None:
                    reading[slot] = rng.permutation(self.files[following]).tolist()
            reading = [groups for groups in reading if groups]
        return [np.array(dealt[w: w + self.window]) for w in range(0, len(dealt), self.window)]

    def permutation(self, seed: int, epoch: int, *, shuffle: bool, num_replicas: int) -> list[int]:
        """The epoch's permutation, laid out for ``num_replicas`` ranks (step 3)."""
        stream = self.stream(seed, epoch, shuffle)
        n, ranks = len(stream), max(1, int(num_replicas))
        if ranks == 1 or n == 0:
            return stream.tolist()
        per = -(-n // ranks)  # ceil
        short = per * ranks - n  # the last `short` ranks take one sample fewer
        out = np.empty(n, dtype=np.int64)
        start = 0
        for r in range(ranks):
            count = per - (1 if r >= ranks - short else 0)
            out[r: r + count * ranks: ranks] = stream[start: start + count]
            start += count
        return out.tolist()


def shuffle_quality(
    order: Sequence[int], shard_of: Sequence[int] | np.ndarray, span: int = 256,
) -> dict[str, Any]:
    """How an epoch ``order`` mixes samples stored in shards (``shard_of[i]``: sample i's shard).

    * ``position_correlation``: Pearson correlation of a sample's storage position with its
      epoch position (0 for a uniform permutation, 1 for the storage order);
    * ``same_shard_neighbours``: share of consecutive samples from one shard (a uniform
      permutation: about one over the number of shards; the storage order: near 1);
    * ``shards_per_span``: distinct shards among each ``span`` consecutive samples, on
      average (how many shards a reader needs at once: the cost of mixing).
    """
    positions = np.asarray(order, dtype=np.int64)
    shards = np.asarray(shard_of)[positions]
    epoch = np.arange(len(positions), dtype=np.float64)
    spans = [len(np.unique(shards[k: k + span])) for k in range(0, len(shards), span)]
    return {
        "position_correlation": float(np.corrcoef(positions.astype(np.float64), epoch)[0, 1]),
        "same_shard_neighbours": float(np.mean(shards[:-1] == shards[1:])),
        "shards_per_span": float(np.mean(spans)),
    }
