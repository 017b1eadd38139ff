"""Between epochs the loader re-tunes its auto worker count from the meter's measurements.

The rule is unit-tested with the probe (tests/test_dataset_probe.py); here the loop: real
workers, a real meter, and a loader whose count changes only where the user left it to
fastload, never its batches.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import Dataset

from fastload import DataLoader
from fastload.meter.workers import MeasuredWorkerInit


class CheapSamples(Dataset):
    """Declared safe; a sample costs microseconds, so workers idle behind a 60 ms step
    (a shorter one waits ~5% on torch's own 1-2 ms hand-over of a batch: input-bound)."""

    fastload_worker_safe = True

    def __len__(self) -> int:
        return 64  # 16 batches of 4: more than the prefetch holds, so the workers are timed

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def epochs(loader: DataLoader, n: int, step_s: float) -> list[list[int]]:
    seen = []
    for _ in range(n):
        batches = []
        for (x,) in ((b,) for b in loader):
            time.sleep(step_s)  # the training step: far longer than a batch costs
            batches.append(x.flatten().tolist())
        seen.append(batches)
    return seen


@pytest.mark.timeout(120)
def test_idle_workers_are_lowered_and_the_batches_stay(monkeypatch):
    loader = DataLoader(CheapSamples(), batch_size=4, num_workers="auto", persistent_workers=True)
    if loader.num_workers < 2:
        pytest.skip("this machine gives one worker: nothing to lower")
    before = loader.num_workers
    first = epochs(loader, 1, step_s=0.06)
    busy = loader.meter.worker_stats().busy_share
    assert busy is not None and busy < 0.3, busy  # measured (about 1% here), not assumed
    # A pass the loop waited on is input-bound and keeps its workers (on a busy machine the
    # second worker can start late in the first epoch): the next pass, workers up, decides.
    for _ in range(2):
        second = epochs(loader, 1, step_s=0.06)
        if loader.num_workers < before:
            break
    assert loader.num_workers < before
    reason = loader.settings.num_workers.reason
    assert f"(was {before})" in reason and "busy" in reason
    assert loader.settings.num_workers.source == "auto"
    assert loader.worker_init_fn is None  # NOTE [what a rebuild copies]: the user's own
    assert isinstance(loader.worker_parts.worker_init_fn, MeasuredWorkerInit)
    assert loader.worker_parts.worker_init_fn.counters.num_workers == loader.num_workers
    assert sorted(sum(first[0], [])) == sorted(sum(second[0], [])) == list(range(64))
    assert first[0] == second[0]  # no shuffle: the same batches with fewer workers


@pytest.mark.timeout(120)
def test_a_value_the_user_set_never_changes():
    loader = DataLoader(CheapSamples(), batch_size=4, num_workers=2)
    epochs(loader, 2, step_s=0.01)
    assert loader.num_workers == 2 and loader.settings.num_workers.source == "argument"


def test_in_process_loaders_are_left_alone():
    loader = DataLoader(CheapSamples(), batch_size=4, num_workers=0)
    epochs(loader, 2, step_s=0.0)
    assert loader.num_workers == 0
