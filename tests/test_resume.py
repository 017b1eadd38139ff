"""Exact mid-epoch resumption: state_dict / load_state_dict in both modes, and elastic restarts.

Ranks are simulated in one process with RANK/WORLD_SIZE (no process group); the real
multi-rank runs under torchrun are in test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from fastload import ConfigError, DataLoader, ImageFolder
from tests.contracts.resume import interrupted


class Ids(Dataset):
    """Sample i is [i, a random number from the global generator of the reading process]."""

    fastload_worker_safe = True

    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([int(i), int(torch.randint(0, 10**6, ()))])


def same(a: list, b: list, column: slice = slice(None)) -> bool:
    return len(a) == len(b) and all(torch.equal(x[..., column], y[..., column]) for x, y in zip(a, b))


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_default_path_replays_exactly(workers):
    full, resumed, state = interrupted(
        lambda: DataLoader(Ids(), batch_size=4, shuffle=True, num_workers=workers), k=3
    )
    assert state["mode"] == "replay" and state["batches"] == 3
    assert same(full, resumed, slice(0, 1))  # the order, batch for batch
    if workers:  # worker seeds are restored too; main-process draws cannot be (documented)
        assert same(full, resumed)


def test_replay_with_a_generator_restores_it():
    make = lambda: DataLoader(
        Ids(), batch_size=5, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(9)
    )
    full, resumed, _ = interrupted(make, k=4)
    assert same(full, resumed)


def test_declared_dataset_resumes_order_and_augmentation_with_workers(jpeg_root):
    make = lambda: DataLoader(
        ImageFolder(str(jpeg_root), size=32, train=True, seed=7),
        batch_size=5, shuffle=True, num_workers=2,
    )
    full, resumed, state = interrupted(make, k=4)
    assert state["mode"] == "sharded" and state["consumed"] == 20
    assert len(full) == len(resumed) == 10
    for (xa, ya), (xb, yb) in zip(full, resumed):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_state_between_epochs_continues_with_the_next_epoch():
    torch.manual_seed(0)
    loader = DataLoader(Ids(22), batch_size=4, shuffle=True)
    for _ in range(2):
        list(loader)
    state, user_rng = loader.state_dict(), torch.get_rng_state()
    assert (state["epoch"], state["batches"]) == (2, 0) and "rng_state" not in state
    third = list(loader)
    torch.manual_seed(99)
    again = DataLoader(Ids(22), batch_size=4, shuffle=True)
    again.load_state_dict(state)
    assert again.state_dict() == state  # loaded, not yet iterated: still that state
    torch.set_rng_state(user_rng)  # the training script restores its own random state
    assert same(third, list(again), slice(0, 1)) and again.epoch == 3  # NOTE [persistent workers]


def ranked(monkeypatch, world: int, rank: int, *, n: int = 22, drop_last: bool = False):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))
    torch.manual_seed(42)  # equal on every simulated rank (no process group to broadcast)
    return DataLoader(Ids(n), batch_size=3, shuffle=True, drop_last=drop_last)


@pytest.mark.parametrize(("old", "new", "drop_last"), [(2, 2, False), (2, 1, False), (3, 2, False),
                                                       (2, 3, True), (1, 2, False)])
def test_elastic_restart_covers_the_rest_exactly_once(monkeypatch, old, new, drop_last):
    n, k = 22, 2
    states, before = [], []
    for r in range(old):
        loader = ranked(monkeypatch, old, r, n=n, drop_last=drop_last)
        it = iter(loader)
        before += [int(i) for _ in range(k) for i in next(it)[:, 0]]
        states.append(loader.state_dict())
        full_len = len(loader.sampler.epoch_order())
    after = []
    for r in range(new):
        loader = ranked(monkeypatch, new, r, n=n, drop_last=drop_last)
        loader.load_state_dict(states[r % old])
        after.append([int(i) for b in loader for i in b[:, 0]])
    seen = before + [i for part in after for i in part]
    if drop_last:
        assert len(seen) == len(set(seen))  # nothing twice; the uneven tail is dropped
        assert len(seen) >= full_len - new * 3 - new
    else:
        assert set(seen) == set(range(n))  # every sample
        if old == new:  # same world: exactly the uninterrupted epoch, in order
            for r in range(new):
                ref = ranked(monkeypatch, new, r, n=n)
                assert after[r] == [int(i) for b in list(ref) for i in b[:, 0]][k * 3 :]
        else:
            left = n - old * k * 3
            assert len(seen) - len(before) - left < new  # at most the padding of the new split
    assert len({len(a) for a in after}) == 1  # equal steps on every rank (DDP needs that)


def test_elastic_restart_refuses_unknown_positions_clearly(monkeypatch):
    loader = ranked(monkeypatch, 2, 0)
    with pytest.raises(ConfigError, match="state_dict"):
        loader.load_state_dict({"epoch": 1})
    state = loader.state_dict()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ConfigError, match="replay"):
        DataLoader(Ids(22), batch_size=3, shuffle=True).load_state_dict(state)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    smaller = DataLoader(Ids(10), batch_size=3, shuffle=True)
    with pytest.raises(ConfigError, match="dataset_len=22"):
        smaller.load_state_dict(state)


def test_out_of_order_delivery_cannot_be_saved():
    loader = DataLoader(Ids(8), batch_size=2, num_workers=2, in_order=False)
    with pytest.raises(ConfigError, match="in_order=True"):
        loader.state_dict()


def test_mid_epoch_resume_in_a_later_epoch_with_persistent_workers():
    make = lambda: DataLoader(
        Ids(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
    )
    torch.manual_seed(5)
    ref = make()
    list(ref)
    rng = torch.get_rng_state()
    full = list(ref)  # epoch 1, uninterrupted
    torch.manual_seed(5)
    loader = make()
    list(loader)
    torch.set_rng_state(rng)
    it = iter(loader)
    before = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert "first_rng_state" in state and state["epoch"] == 1
    del it
    torch.manual_seed(77)
    again = make()
    again.load_state_dict(state)
    assert same(full, before + list(again), slice(0, 1))


class IndexOnly(Dataset):
    """Undeclared, so the loader probes it and keeps the probe's samples for its first epoch."""

    def __init__(self, n: int, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sleep_s:
            import time

            time.sleep(self.sleep_s)
        return torch.tensor([float(i), float(i) ** 2])


@pytest.mark.parametrize("sleep_s", [0.0, 0.003], ids=["in-process", "workers"])
def test_resume_over_the_probes_kept_samples_is_exact(sleep_s):
    # NOTE [probe samples reused]: the resumed loader's replay and rest run with its own kept
    # samples in its first iteration; a second epoch fetches everything again.
    loaders = []

    def make():
        loaders.append(DataLoader(IndexOnly(96, sleep_s), batch_size=4, shuffle=True))
        return loaders[-1]

    full, resumed, state = interrupted(make, k=5)
    assert state["mode"] == "replay" and same(full, resumed)
    again = loaders[-1]
    assert (again.num_workers > 0) == (sleep_s > 0)
    assert again.settings.probe.kept.count == 8 and again.settings.probe.kept.held == 0
    torch.manual_seed(1)
    stock = torch.utils.data.DataLoader(IndexOnly(96), batch_size=4, shuffle=True)
    expected = [list(stock) for _ in range(2)]
    torch.manual_seed(1)
    fresh = make()
    assert [same(list(fresh), epoch) for epoch in expected] == [True, True]
