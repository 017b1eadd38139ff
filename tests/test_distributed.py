"""Multi-rank runs under torchrun (gloo, CPU): sharding, seed agreement, kill and resume.

Each test launches ``tests/dist_scripts/epochs.py`` with ``torchrun --standalone`` and checks
the sample ids every rank wrote against a reference computed from the seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastload import ConfigError, DataLoader
from fastload import distributed
from fastload.distributed import rank_info
from fastload.data.sampling import EpochSampler, mix_seed

SCRIPT = Path(__file__).parent / "dist_scripts" / "epochs.py"
N, BATCH = 40, 4


def torchrun(out: Path, nproc: int, *args: str, expect_ok: bool = True) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(SCRIPT), "--out", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert proc.returncode != 0, "the run was supposed to die mid-epoch"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def reference(seed: int, epoch: int, n: int = N) -> list[int]:
    """The permutation of an epoch, from the seed alone (independent of the sampler code)."""
    g = torch.Generator()
    g.manual_seed(mix_seed(seed, epoch))
    return torch.randperm(n, generator=g).tolist()


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


@pytest.mark.slow
def test_two_ranks_two_epochs_each_sample_once_per_epoch(tmp_path):
    ranks = torchrun(tmp_path, 2, "--samples", str(N), "--epochs", "2")
    assert ranks[0]["seed"] == ranks[1]["seed"] == 1000  # rank 0's, broadcast to rank 1
    orders = []
    for e in range(2):
        parts = [flat(r["epochs"][e]["batches"]) for r in ranks]
        assert sorted(parts[0] + parts[1]) == list(range(N))  # exactly once across ranks
        ref = reference(1000, e)
        assert parts[0] == ref[0::2] and parts[1] == ref[1::2]
        orders.append(ref)
    assert orders[0] != orders[1]


@pytest.mark.slow
def test_killed_mid_epoch_and_resumed_on_two_then_on_one_rank(tmp_path):
    crashed = tmp_path / "crash"
    common = ["--samples", str(N), "--epochs", "2", "--workers", "2"]
    before = torchrun(crashed, 2, *common, "--save-at", "2", expect_ok=False)
    seen_before = [flat(r["epochs"][0]["batches"]) for r in before]
    assert [len(s) for s in seen_before] == [2 * BATCH, 2 * BATCH]

    # Same world size: each rank continues its own shard, sample for sample.
    after = torchrun(tmp_path / "two", 2, *common, "--resume", str(crashed))
    ref = reference(1000, 0)
    for r in range(2):
        assert seen_before[r] + flat(after[r]["epochs"][0]["batches"]) == ref[r::2]
        assert flat(after[r]["epochs"][1]["batches"]) == reference(1000, 1)[r::2]

    # 2 -> 1 rank: the one rank gets exactly the samples no rank had consumed.
    alone = torchrun(tmp_path / "one", 1, *common, "--resume", str(crashed), "--resume-from-rank0")
    rest = flat(alone[0]["epochs"][0]["batches"])
    assert sorted(seen_before[0] + seen_before[1] + rest) == list(range(N))
    assert rest == ref[4 * BATCH :]  # the unconsumed tail of the permutation, in order
    assert flat(alone[0]["epochs"][1]["batches"]) == reference(1000, 1)


@pytest.mark.slow
def test_two_nodes_sharing_redis_read_each_object_from_the_origin_once(
    tmp_path, redis_server, s3_server, s3_options, s3_jpegs
):
    s3_server.reset_counts()
    cache = {"disk": str(tmp_path / "node{rank}"), "redis": redis_server.url}  # 2 local disks
    ranks = torchrun(
        tmp_path / "out", 2, "--images", s3_jpegs, "--cache", json.dumps(cache),
        "--storage-options", json.dumps(s3_options), "--epochs", "2", "--batch-size", "8",
    )
    assert all(len(flat(r["epochs"][e]["batches"])) == 24 for r in ranks for e in range(2))
    gets = s3_server.gets(s3_jpegs.removeprefix("s3://") + "/")
    images = {path: n for path, n in gets.items() if path.endswith(".jpg")}
    # Epoch 1 reshuffles, so each rank now reads objects the other fetched in epoch 0:
    # without the shared tier those would be second origin reads.
    assert len(images) == 48 and sum(images.values()) == 48, sorted(images.items())


def test_environment_ranks_shard_without_a_process_group(monkeypatch, caplog):
    # The warning is given once per process; an earlier test (the engine contract's rank
    # shards) may have given it already.
    monkeypatch.setattr(distributed, "_warned_unconnected", False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    info = rank_info()
    assert (info.rank, info.world_size, info.source) == (2, 3, "environment")
    torch.manual_seed(4)
    loader = DataLoader(list(range(10)), batch_size=2, shuffle=True)
    # NOTE [the public plan and the rank's plan]: the public sampler is the all-ranks order,
    # the engine runs this rank's share of it.
    assert isinstance(loader.sampler, EpochSampler) and loader.sampler.num_replicas == 1
    assert loader.epoch_sampler.num_replicas == 3 and loader.epoch_sampler.rank == 2
    assert len(loader) == 2 and len(loader.batch_sampler) == 5
    got = [int(i) for _ in range(2) for b in loader for i in b]
    ref = EpochSampler(10, seed=4, num_replicas=3, rank=2)
    expected = []
    for e in range(2):  # the epoch advances by itself: no set_epoch in the loop
        ref.set_epoch(e)
        expected += list(ref)
    assert got == expected
    assert "init_process_group" in caplog.text  # ranks cannot agree on a seed: say how


def test_user_sampler_is_respected_as_is(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    mine = EpochSampler(10, seed=1)
    loader = DataLoader(list(range(10)), batch_size=2, sampler=mine)
    assert loader.sampler is mine and mine.num_replicas == 1
    list(loader), list(loader)
    assert mine.epoch == 0  # the user's sampler gets no automatic set_epoch


def test_bad_rank_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two'"):
        rank_info()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="0 <= RANK < WORLD_SIZE"):
        rank_info()
