"""Drop-in parity: fastload.DataLoader yields exactly what torch's DataLoader yields.

Each case builds the same loader twice, once with ``torch.utils.data.DataLoader`` and once
with ``fastload.DataLoader``, after ``torch.manual_seed`` each time, and checks the batches
(values, dtypes, container types, order), ``len()``, and that the global random state after
the epoch is the same. No fastload-only argument is passed, so fastload's "auto" defaults are
in force: they must not change anything here (NOTE [auto never changes the batches] in
fastload/settings.py). PyTorch's own test_dataloader.py is run against fastload by
benchmarks/torch_compat/run.py (docs/torch_compat.md); these are the CI-sized checks.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    TensorDataset,
    get_worker_info,
)
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

import fastload

LOADERS = {"torch": TorchDataLoader, "fastload": fastload.DataLoader}


# -- datasets (module level so worker processes can unpickle them) -------------------------


class RandomDrawDataset(Dataset):
    """Each sample draws from the global generator of the process that reads it."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.rand(2)


class DictDataset(Dataset):
    def __len__(self) -> int:
        return 7

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((2,), float(i)), "name": f"s{i}", "meta": (i, i * 0.5)}


class ShardedRange(IterableDataset):
    """Splits range(n) between workers with get_worker_info(), as torch's docs show."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))

    def __len__(self) -> int:
        return self.n


class SleepyDataset(Dataset):
    """Its first read sleeps past a loader's timeout."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 0:  # only the first: a worker stopped mid-batch finishes the batch first
            time.sleep(self.sleep_s)
        return i


class SeedReportingDataset(Dataset):
    """Returns the torch seed of the process reading it: shows worker seeding is torch's."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> list[int]:
        return [i, torch.initial_seed()]


class ChangingDataset(Dataset):
    """Its samples change between epochs (the training loop sets ``offset``)."""

    def __init__(self) -> None:
        self.offset = 0

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        return i + self.offset


class UnpicklableDataset(Dataset):
    """Returns samples that cannot be pickled back from a worker process."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> Callable[[], int]:
        return lambda: i


def seed_worker(worker_id: int) -> None:
    torch.manual_seed(1000 + worker_id)


def clone_collate(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in batch]


def pairs_collate(batch: list[tuple[int, torch.Tensor]]) -> dict[str, Any]:
    return {"ids": [i for i, _ in batch], "sum": torch.stack([t for _, t in batch]).sum(0)}


def tensors() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(23, 3, generator=g), torch.arange(23))


# -- comparison ------------------------------------------------------------------------


def assert_same(a: Any, b: Any, where: str = "batch") -> None:
    """Deep equality with types: tensors equal in value, dtype and shape."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys differ"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_epochs(
    kind: str,
    make_dataset: Callable[[], Any],
    epochs: int,
    fresh: dict[str, Callable[[], Any]],
    kwargs: dict[str, Any],
) -> tuple[list[list[Any]], int | None, torch.Tensor, Any]:
    """Seed, build one loader of ``kind``, run ``epochs`` epochs: batches, len, RNG, loader."""
    torch.manual_seed(0)
    built = {name: make() for name, make in fresh.items()}
    loader = LOADERS[kind](make_dataset(), **kwargs, **built)
    try:
        length = len(loader)
    except TypeError:
        length = None
    runs = [list(loader) for _ in range(epochs)]
    return runs, length, torch.get_rng_state(), loader


def assert_parity(
    make_dataset: Callable[[], Any],
    epochs: int = 1,
    ordered: bool = True,
    fresh: dict[str, Callable[[], Any]] | None = None,
    **kwargs: Any,
) -> list[list[Any]]:
    """Both loaders yield the same batches (sorted first when ``ordered`` is False).

    ``fresh`` builds stateful arguments (generators, samplers) anew for each loader, so the
    second loader does not start from where the first left them.
    """
    fresh = fresh or {}
    want, want_len, want_rng, _ = run_epochs("torch", make_dataset, epochs, fresh, kwargs)
    got, got_len, got_rng, loader = run_epochs("fastload", make_dataset, epochs, fresh, kwargs)
    assert isinstance(loader, TorchDataLoader)
    assert got_len == want_len
    for epoch, (w, g) in enumerate(zip(want, got)):
        assert len(g) == len(w), f"epoch {epoch}: {len(g)} batches, torch gave {len(w)}"
        if not ordered:
            w, g = sorted(w, key=repr), sorted(g, key=repr)
        assert_same(g, w, f"epoch {epoch}")
    assert torch.equal(got_rng, want_rng), "global RNG state differs after the epoch"
    return got


# -- single process --------------------------------------------------------------------


def test_shuffle_with_generator() -> None:
    got = assert_parity(
        tensors, epochs=2, batch_size=4, shuffle=True,
        fresh={"generator": lambda: torch.Generator().manual_seed(3)},
    )
    labels = [torch.cat([b[1] for b in epoch]) for epoch in got]
    assert not torch.equal(labels[0], labels[1])  # a new order each epoch, as torch


def test_shuffle_with_global_rng() -> None:
    assert_parity(tensors, epochs=2, batch_size=5, shuffle=True)


def test_sampler_and_drop_last() -> None:
    assert_parity(
        tensors, batch_size=4, drop_last=True,
        fresh={"sampler": lambda: SubsetRandomSampler(
            list(range(3, 20)), generator=torch.Generator().manual_seed(1))},
    )
    assert_parity(
        tensors, batch_size=3,
        fresh={"sampler": lambda: RandomSampler(range(23), replacement=True, num_samples=10)},
    )


def test_batch_sampler() -> None:
    batches = [[0, 1], [5, 4, 3], [22], [7, 8, 9, 10]]
    assert_parity(tensors, batch_sampler=batches)
    assert_parity(
        tensors, fresh={"batch_sampler": lambda: BatchSampler(RandomSampler(range(23)), 6, True)}
    )


def test_collate_fn_and_draws_in_dataset() -> None:
    assert_parity(RandomDrawDataset, batch_size=5, shuffle=True, collate_fn=pairs_collate)


def test_batch_size_none_and_mapping_samples() -> None:
    got = assert_parity(DictDataset, batch_size=None)
    assert isinstance(got[0][0]["x"], torch.Tensor) and got[0][0]["name"] == "s0"
    assert_parity(DictDataset, batch_size=3)


def test_iterable_dataset_single_process() -> None:
    assert_parity(lambda: ShardedRange(11), batch_size=4)
    assert_parity(lambda: ShardedRange(11), batch_size=4, drop_last=True)
    assert_parity(lambda: ShardedRange(5), batch_size=None)


def test_unpicklable_samples_stay_in_process() -> None:
    # Auto workers would have to pickle each sample back: it must keep torch's single process.
    for kind in LOADERS:
        got = [f() for f in LOADERS[kind](UnpicklableDataset(), batch_size=None)]
        assert got == [0, 1, 2]


def test_nested_tensor_batches() -> None:
    # Regression: the starvation meter read ``.shape`` of each batch, which a strided nested
    # tensor does not have, so every batch raised inside fastload's iterator.
    def make() -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return [torch.nested.nested_tensor([torch.randn(3, generator=g)]) for _ in range(4)]

    for kind in LOADERS:
        batches = list(LOADERS[kind](make(), batch_size=1, collate_fn=clone_collate))
        assert len(batches) == 4 and all(b[0].is_nested for b in batches)
        assert torch.equal(batches[2][0].unbind()[0], make()[2].unbind()[0])


def test_generic_like_torch() -> None:
    # Regression: subclassing torch's Generic DataLoader without a type parameter made
    # ``fastload.DataLoader[...]`` a TypeError, breaking annotations that work with torch.
    alias = fastload.DataLoader[list[torch.Tensor]]
    loader = alias([1, 2, 3], batch_size=2)
    assert isinstance(loader, fastload.DataLoader)
    assert_same(list(loader), list(TorchDataLoader([1, 2, 3], batch_size=2)))


def test_len_matches_torch() -> None:
    for kwargs in ({"batch_size": 3}, {"batch_size": 3, "drop_last": True}, {"batch_size": None}):
        for make in (tensors, lambda: ShardedRange(10)):
            want = len(TorchDataLoader(make(), **kwargs))
            assert len(fastload.DataLoader(make(), **kwargs)) == want


# -- explicit worker processes ---------------------------------------------------------


def test_iterable_dataset_sharded_by_workers() -> None:
    assert_parity(lambda: ShardedRange(13), batch_size=3, num_workers=2)


def test_worker_init_fn_and_worker_seeds() -> None:
    # Draws inside workers depend on which worker reads which index and on its seed.
    assert_parity(RandomDrawDataset, batch_size=2, num_workers=2, worker_init_fn=seed_worker)
    assert_parity(
        SeedReportingDataset, batch_size=2, num_workers=2,
        fresh={"generator": lambda: torch.Generator().manual_seed(5)},
    )


def test_timeout_yields_and_expires_as_torch() -> None:
    assert_parity(tensors, batch_size=6, num_workers=2, timeout=30)
    for kind in LOADERS:
        loader = LOADERS[kind](SleepyDataset(1.5), batch_size=2, num_workers=1, timeout=0.3)
        with pytest.raises(RuntimeError, match="DataLoader timed out after"):
            next(iter(loader))
        del loader
        gc.collect()


def test_out_of_order_yields_the_same_batches() -> None:
    assert_parity(tensors, ordered=False, batch_size=4, num_workers=2, in_order=False)


def test_dataset_changing_between_epochs_with_explicit_workers() -> None:
    # persistent_workers stays torch's False under "auto": each epoch's workers see the change.
    for kind in LOADERS:
        dataset = ChangingDataset()
        loader = LOADERS[kind](dataset, batch_size=3, num_workers=2)
        first = [b.tolist() for b in loader]
        dataset.offset = 100
        second = [b.tolist() for b in loader]
        assert first == [[0, 1, 2], [3, 4, 5]], kind
        assert second == [[100, 101, 102], [103, 104, 105]], kind


def test_explicit_persistent_workers_over_epochs() -> None:
    got = assert_parity(
        tensors, epochs=2, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
    )
    assert len(got) == 2


@pytest.mark.timeout(60)
def test_an_abandoned_loader_with_persistent_workers_ends_them_like_torch() -> None:
    """torch's own test_partial_workers: dropping the only reference to a loader's iterator
    ends its persistent workers at once, without the cycle collector (the loader and its
    engine must not hold each other)."""
    gc.disable()
    try:
        it = iter(fastload.DataLoader(TensorDataset(torch.arange(40)), batch_size=2,
                                      num_workers=2, persistent_workers=True))
        workers = list(it._workers)
        next(it)
        del it
        for w in workers:
            w.join(20)
        assert not any(w.is_alive() for w in workers)
    finally:
        gc.enable()
