"""The engine contract (fastload.engines.base), run on every registered engine.

Each engine runs an ImageFolder whose label is the sample's own index, so a batch's labels
say exactly which samples it holds. Every engine must: follow the loader's batch plan
(order, len, drop_last, the rank's shard), resume mid-epoch exactly (the shared resume
helper), skip failed samples under on_error="skip" naming file and index, raise errors that
name the file and index otherwise (and stop the workers of the epoch that raised at once),
and leave no thread or process behind after close().
"""

from __future__ import annotations

import importlib.util
import shutil
import threading
from pathlib import Path

import psutil
import pytest
import torch

from fastload import CorruptSampleError, DataLoader, ImageFolder
from tests.contracts.resume import interrupted, same_batches

HAS_DALI = importlib.util.find_spec("nvidia.dali") is not None

# (backend, loader keyword arguments): torch in-process and with worker processes, the
# threaded engine, and DALI.
ENGINES = {
    "torch-inline": ("torch", {"num_workers": 0}),
    "torch-workers": ("torch", {"num_workers": 2}),
    "threads": ("threads", {}),
    "dali": ("dali", {}),
}


@pytest.fixture(params=sorted(ENGINES))
def engine(request) -> tuple[str, dict]:
    backend, kwargs = ENGINES[request.param]
    if backend == "dali" and not HAS_DALI:
        pytest.skip("nvidia-dali is not installed (pip install 'fastload[dali]')")
    return backend, kwargs


@pytest.fixture(scope="module")
def indexed(jpeg_root) -> list[tuple[str, int]]:
    """The conftest's 48 JPEGs as (path, label) where the label is the sample's index."""
    paths = sorted(str(p) for p in Path(jpeg_root).glob("*/*.jpg"))
    return [(p, i) for i, p in enumerate(paths)]


def make_loader(engine, samples, **kwargs) -> DataLoader:
    backend, engine_kwargs = engine
    ds = ImageFolder(samples, size=24, train=True, seed=11, on_error=kwargs.pop("on_error", "raise"))
    loader = DataLoader(ds, backend=backend, **engine_kwargs, **kwargs)
    assert loader.backend == backend, loader.backend_reason
    return loader


def labels_of(batches) -> list[list[int]]:
    return [batch[1].tolist() for batch in batches]


def plan_of(loader: DataLoader, epoch: int) -> list[list[int]]:
    """The batch plan of an epoch: what the loader's own batch sampler says, as indices
    (one process: the public order is this rank's)."""
    loader.sampler.set_epoch(epoch)
    return [[int(i) for i in batch] for batch in loader.batch_sampler]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_follow_the_plan_order_len_and_drop_last(engine, indexed, drop_last):
    loader = make_loader(engine, indexed, batch_size=10, shuffle=True, drop_last=drop_last)
    assert len(loader) == (4 if drop_last else 5)
    for epoch in range(2):
        expected = plan_of(loader, epoch)
        loader.epoch = epoch
        batches = list(loader)
        assert labels_of(batches) == expected
        assert len(batches) == len(loader)
        assert all(images.dtype == torch.uint8 and images.shape[1:] == (3, 24, 24) for images, _ in batches)
    assert labels_of(list(loader)) != labels_of(batches)  # a new epoch, a new order


@pytest.mark.timeout(120)
def test_each_rank_reads_its_own_shard(engine, indexed, monkeypatch):
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = make_loader(engine, indexed, batch_size=8, shuffle=True)
        seen.append([i for batch in labels_of(list(loader)) for i in batch])
    assert len(seen[0]) == len(seen[1]) == 24
    assert sorted(seen[0] + seen[1]) == list(range(48))


@pytest.mark.timeout(180)
def test_mid_epoch_resume_is_exact(engine, indexed):
    full, resumed, state = interrupted(
        lambda: make_loader(engine, indexed, batch_size=5, shuffle=True), k=4
    )
    assert state["batches"] == 4
    assert same_batches(full, resumed)  # the same samples, crops and flips


@pytest.fixture
def damaged(indexed, tmp_path) -> tuple[list[tuple[str, int]], dict[int, str]]:
    """The samples with #7 truncated and #30 not an image (copies; the originals stay)."""
    samples = []
    bad = {}
    for path, i in indexed:
        if i in (7, 30):
            copy = tmp_path / f"bad{i}.jpg"
            shutil.copy(path, copy)
            data = copy.read_bytes()
            copy.write_bytes(data[: len(data) // 3] if i == 7 else b"not an image" * 50)
            path = bad[i] = str(copy)
        samples.append((path, i))
    return samples, bad


@pytest.mark.timeout(120)
def test_skip_on_error_drops_and_names_the_failed_samples(engine, damaged):
    samples, bad = damaged
    loader = make_loader(engine, samples, batch_size=6, shuffle=True, on_error="skip")
    got = sorted(i for batch in labels_of(list(loader)) for i in batch)
    assert got == [i for i in range(48) if i not in bad]
    assert sorted((s.index, s.path) for s in loader.skipped) == sorted(bad.items())


@pytest.mark.timeout(120)
def test_an_error_names_the_file_and_index(engine, damaged):
    samples, bad = damaged
    loader = make_loader(engine, samples, batch_size=6, shuffle=False)
    with pytest.raises(CorruptSampleError) as info:
        list(loader)
    assert (info.value.index, info.value.path) == (7, bad[7])
    assert bad[7] in str(info.value) and "index 7" in str(info.value)


@pytest.mark.timeout(120)
def test_an_epoch_that_raised_leaves_no_process_while_its_error_is_held(engine, damaged):
    samples, _ = damaged
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    loader = make_loader(engine, samples, batch_size=6, shuffle=False, persistent_workers=False)
    with pytest.raises(CorruptSampleError) as info:
        list(loader)
    assert info.value.index == 7
    # the traceback in `info` still holds the epoch's iterator (NOTE [an epoch that raised])
    left = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in children and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    assert left == []


@pytest.mark.timeout(120)
def test_close_leaves_no_thread_or_process_behind(engine, indexed):
    threads = set(threading.enumerate())
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    loader = make_loader(engine, indexed, batch_size=4, shuffle=True, persistent_workers=False)
    it = iter(loader)
    next(it)
    next(it)
    loader.engine.close()
    left = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    for t in left:
        t.join(timeout=10)
    assert not [t for t in left if t.is_alive()]
    gone, alive = psutil.wait_procs(
        [p for p in psutil.Process().children(recursive=True) if p.pid not in children], timeout=10
    )
    assert not alive
