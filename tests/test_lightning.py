"""fastload under PyTorch Lightning's DDP, with the real library (docs/integrations.md).

Each test runs ``tests/dist_scripts/lightning_run.py``: a real ``Trainer(strategy="ddp",
devices=2)`` on the CPU (gloo), Lightning's own launcher starting the second rank. The sample
ids are labels (one image per class), so what each rank saw is what it trained on.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.launch import ONE_PER_CLASS as N
from tests.fixtures.launch import launch_env

pytest.importorskip("pytorch_lightning")

SCRIPT = Path(__file__).parent / "dist_scripts" / "lightning_run.py"
BATCH = 4

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def lightning(data: Path, out: Path, *args: str, devices: int = 2, expect: int = 0) -> list[dict]:
    env = launch_env()
    cmd = [sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out),
           "--devices", str(devices), "--batch", str(BATCH), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]


def seen(rank: dict, kind: str, epoch: int) -> list[int]:
    return [i for e, batch in rank[kind] if e == epoch for i in batch]


def assert_one_split(ranks: list[dict], epochs: int = 2) -> None:
    """Each rank its 1/world share of every epoch: disjoint, together the whole set."""
    for kind in ("train", "val"):
        for epoch in range(epochs):
            parts = [seen(r, kind, epoch) for r in ranks]
            assert [len(p) for p in parts] == [N // len(ranks)] * len(ranks), (kind, epoch)
            assert sorted(i for p in parts for i in p) == list(range(N)), (kind, epoch)
    orders = [seen(ranks[0], "train", e) for e in range(epochs)]
    assert orders[0] != orders[1]  # a new order each epoch


@pytest.fixture(scope="module")
def default_run(one_per_class, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Lightning's defaults (use_distributed_sampler=True), two ranks, two epochs."""
    return lightning(one_per_class, tmp_path_factory.mktemp("default"))


@pytest.mark.parametrize("variant", [
    pytest.param([], id="use_distributed_sampler"),
    pytest.param(["--no-distributed-sampler"], id="no_distributed_sampler"),
    pytest.param(["--late-import", "--fit-with-loaders", "--predict"], id="late_import_fit_loaders"),
])
def test_ddp_each_rank_sees_its_share_on_fastloads_engine(one_per_class, tmp_path, variant, request):
    ranks = request.getfixturevalue("default_run") if not variant else lightning(one_per_class, tmp_path, *variant)
    assert_one_split(ranks)
    for rank in ranks:
        for loader in rank["loaders"]:
            assert loader["class"] == "fastload.loader.dataloader.DataLoader"
            assert loader["backend"] == "threads", loader["reason"]
            assert loader["len"] == loader["batches"] == N // 2 // BATCH
            assert "engine: threads" in loader["settings"]
            # also for loaders built before the launcher (NOTE [a loader built before the
            # process group]): resolved again for the ranks on the node before their first epoch
            assert "2 rank(s) on this node" in loader["settings"]
            assert "num_workers=1" in loader["settings"]  # 2 cores, 2 ranks
    if "--predict" in variant:  # Lightning rebuilds the loader to predict: still fastload, split once
        preds = [sorted(i for b in r["predict"] for i in b) for r in ranks]
        assert sorted(preds[0] + preds[1]) == list(range(N)) and not set(preds[0]) & set(preds[1])
        for rank in ranks:
            assert rank["predict_loader"]["class"] == "fastload.loader.dataloader.DataLoader"
            assert rank["predict_loader"]["backend"] == "threads", rank["predict_loader"]["reason"]


def test_ddp_mid_epoch_resume_through_ckpt_path_is_exact(one_per_class, tmp_path, default_run):
    full = default_run
    ckpt = tmp_path / "mid.ckpt"
    crashed = lightning(one_per_class, tmp_path / "crashed", "--stop-at", "3", "--ckpt", str(ckpt), expect=3)
    resumed = lightning(one_per_class, tmp_path / "resumed", "--resume", str(ckpt))
    for before, after, whole in zip(crashed, resumed, full):
        assert len(before["train"]) == 3
        # the 3 batches before the checkpoint, then exactly the rest of that epoch and a
        # whole next one: the batches the uninterrupted run gave, in its order
        assert before["train"] + after["train"] == whole["train"]
        assert [loader["len"] for loader in after["loaders"]] == [N // 2 // BATCH] * 2


def test_one_device_resume_keeps_every_later_epoch_whole(one_per_class, tmp_path):
    full = lightning(one_per_class, tmp_path / "full", "--epochs", "3", devices=1)
    ckpt = tmp_path / "mid.ckpt"
    crashed = lightning(one_per_class, tmp_path / "crashed", "--epochs", "3", "--stop-at", "7", "--ckpt", str(ckpt),
                        devices=1, expect=3)
    resumed = lightning(one_per_class, tmp_path / "resumed", "--epochs", "3", "--resume", str(ckpt), devices=1)
    assert crashed[0]["train"] + resumed[0]["train"] == full[0]["train"]
    per_epoch = [len([b for e, b in resumed[0]["train"] if e == k]) for k in range(3)]
    assert per_epoch == [N // BATCH - 7, N // BATCH, N // BATCH]  # the rest, then whole epochs


@pytest.fixture(scope="module")
def id_shards(one_per_class, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The 40 one-per-class images as 8 tar shards of 5 (webdataset's ShardWriter): sample id
    (label) ``i`` lies in shard ``i // 5``."""
    from tests.test_shards import write_shards

    return write_shards(one_per_class, tmp_path_factory.mktemp("id-shards"), per_shard=5)


def test_ddp_over_tar_shards_reads_whole_shards_per_rank_and_resumes_exactly(one_per_class, id_shards, tmp_path):
    """Lightning's DDP keeps TarShards' shard-aware order: with shuffle_window=2, each rank's
    20 samples of an epoch are two whole windows, four whole shards (NOTE [shard-aware order])."""
    full = lightning(one_per_class, tmp_path / "full", "--shards", id_shards)
    assert_one_split(full)
    for rank in full:
        for epoch in range(2):
            per_shard = collections.Counter(i // 5 for i in seen(rank, "train", epoch))
            assert sorted(per_shard.values()) == [5, 5, 5, 5], (rank["rank"], epoch, per_shard)
        assert all(loader["class"] == "fastload.loader.dataloader.DataLoader" for loader in rank["loaders"])
    ckpt = tmp_path / "mid.ckpt"
    crashed = lightning(one_per_class, tmp_path / "crashed", "--shards", id_shards, "--stop-at", "3",
                        "--ckpt", str(ckpt), expect=3)
    resumed = lightning(one_per_class, tmp_path / "resumed", "--shards", id_shards, "--resume", str(ckpt))
    for before, after, whole in zip(crashed, resumed, full):
        assert len(before["train"]) == 3
        assert before["train"] + after["train"] == whole["train"]
