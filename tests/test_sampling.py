"""EpochSampler: permutations from (seed, epoch), rank sharding, seed tags."""

import pickle

import pytest

from fastload.data.sampling import EpochSampler, SampleIndex, mix_seed


def test_every_epoch_is_a_permutation_and_epochs_differ():
    s = EpochSampler(100, shuffle=True, seed=3)
    orders = []
    for epoch in range(3):
        s.set_epoch(epoch)
        order = list(s)
        assert sorted(order) == list(range(100))
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]


def test_order_is_a_pure_function_of_seed_and_epoch():
    a, b = EpochSampler(50, seed=1), EpochSampler(50, seed=1)
    a.set_epoch(4)
    b.set_epoch(4)
    assert list(a) == list(b)
    assert list(EpochSampler(50, seed=2)) != list(EpochSampler(50, seed=1))


def test_unshuffled_is_sequential():
    assert list(EpochSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_split_an_epoch_like_distributed_sampler(drop_last):
    ranks = [EpochSampler(10, seed=0, num_replicas=3, rank=r, drop_last=drop_last) for r in range(3)]
    parts = [list(s) for s in ranks]
    assert len({len(p) for p in parts}) == 1 and len(parts[0]) == len(ranks[0])
    seen = [i for p in parts for i in p]
    if drop_last:
        assert len(seen) == 9 and len(set(seen)) == 9
    else:
        assert len(seen) == 12 and set(seen) == set(range(10))


def test_seed_tags_ride_on_plain_ints():
    s = EpochSampler(8, seed=0, tag_seeds=True)
    tagged = list(s)
    assert all(isinstance(i, SampleIndex) and isinstance(i, int) for i in tagged)
    assert [i.seed for i in tagged] == [mix_seed(s.epoch_seed(), int(i)) for i in tagged]
    again = pickle.loads(pickle.dumps(tagged[0]))
    assert again == tagged[0] and again.seed == tagged[0].seed
    assert list(range(10))[tagged[0]] == int(tagged[0])


def test_bad_rank_is_rejected():
    with pytest.raises(ValueError, match="rank 2"):
        EpochSampler(4, num_replicas=2, rank=2)


def test_mix_seed_spreads_neighbours():
    seeds = {mix_seed(0, i) for i in range(1000)}
    assert len(seeds) == 1000
    assert all(0 <= s < 2**63 for s in seeds)


def test_the_order_digest_is_computed_once_per_epoch_and_follows_the_seed(monkeypatch):
    sampler = EpochSampler(1000, seed=3)
    made = []
    real = EpochSampler._permutation
    monkeypatch.setattr(EpochSampler, "_permutation",
                        lambda self, *a, **k: made.append(a) or real(self, *a, **k))
    first = sampler.order_digest(0)
    assert sampler.order_digest(0) == first and len(made) == 1  # a save every step: one permutation
    assert sampler.order_digest(1) != first and len(made) == 2
    sampler.seed = 4  # a loaded state sets the seed: another permutation, another digest
    fresh = EpochSampler(1000, seed=4)
    assert sampler.order_digest(1) == fresh.order_digest(1) and len(made) == 4
    assert sampler.order_digest(0) == fresh.order_digest(0) != first
