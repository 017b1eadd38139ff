"""fastload under Hugging Face Accelerate, with the real library (docs/integrations.md).

``accelerator.prepare`` re-creates a DataLoader as torch's own class around the loader's public
attributes and splits its batch sampler by rank (``BatchSamplerShard``). fastload shows the
all-ranks order there, so Accelerate's is the only split, and its own batches (not fastload's
internal envelopes) come out. Each test runs ``tests/dist_scripts/accelerate_run.py``, alone
or under torchrun with two processes (gloo).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.launch import ONE_PER_CLASS as N
from tests.fixtures.launch import launch_env

pytest.importorskip("accelerate")

SCRIPT = Path(__file__).parent / "dist_scripts" / "accelerate_run.py"
BATCH = 4

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def accelerate(data: Path, out: Path, *args: str, nproc: int = 2, expect_ok: bool = True) -> list[dict]:
    env = launch_env()
    launch = [sys.executable]
    if nproc > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = [*launch, str(SCRIPT), "--data", str(data), "--out", str(out), "--batch", str(BATCH), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert proc.returncode != 0, "the run was supposed to die mid-epoch"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def two_ranks(one_per_class, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """torchrun, two processes, the Accelerator made before the loaders (its docs' order)."""
    return accelerate(one_per_class, tmp_path_factory.mktemp("two"))


def seen(rank: dict, kind: str, epoch: int) -> list[int]:
    return [i for e, batch in rank[kind] if e == epoch for i in batch]


def assert_one_split(ranks: list[dict]) -> None:
    for kind in ("train", "val"):
        for epoch in range(2):
            parts = [seen(r, kind, epoch) for r in ranks]
            assert [len(p) for p in parts] == [N // len(ranks)] * len(ranks), (kind, epoch)
            assert sorted(i for p in parts for i in p) == list(range(N)), (kind, epoch)
    assert seen(ranks[0], "train", 0) != seen(ranks[0], "train", 1)  # a new order each epoch


def test_one_process_prepare_gives_plain_batches(one_per_class, tmp_path):
    (rank,) = accelerate(one_per_class, tmp_path, nproc=1)
    assert_one_split([rank])
    loader = rank["loaders"][0]
    assert loader["len"] == loader["original_len"] == N // BATCH
    # Accelerate runs its own torch DataLoader: fastload says so instead of pretending
    assert "another DataLoader iterated this loader's sampler" in loader["reason"]


@pytest.mark.parametrize("order", [[], ["--loaders-first"]], ids=["accelerator_first", "loaders_first"])
def test_torchrun_two_processes_split_once(one_per_class, tmp_path, order, request):
    ranks = accelerate(one_per_class, tmp_path, *order) if order else request.getfixturevalue("two_ranks")
    assert_one_split(ranks)
    for rank in ranks:
        assert rank["loaders"][0]["len"] == N // 2 // BATCH


def test_save_state_load_state_skip_first_batches_is_exact(one_per_class, tmp_path, two_ranks):
    full = two_ranks
    state = tmp_path / "state"
    crashed = accelerate(one_per_class, tmp_path / "crashed", "--stop-at", "3", "--state", str(state), expect_ok=False)
    resumed = accelerate(one_per_class, tmp_path / "resumed", "--resume", str(state))
    for before, after, whole in zip(crashed, resumed, full):
        assert len(before["train"]) == 3
        assert before["train"] + after["train"] == whole["train"]  # the rest, then a whole epoch
