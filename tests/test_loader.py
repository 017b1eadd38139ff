"""fastload.DataLoader: drop-in batches, declared datasets on real workers, errors never hang."""

from __future__ import annotations

import gc
import logging
import multiprocessing.util
import os
import weakref
from pathlib import Path

import psutil
import pytest
import torch
import torch.utils.data
from torch.utils.data import Dataset

import fastload
from fastload import DataLoader, ImageFolder


class Squares(Dataset):
    def __len__(self):
        return 23

    def __getitem__(self, i):
        return {"x": torch.tensor([i, i * i]), "noise": torch.rand(2)}


def batches(loader):
    return [b for b in loader]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y)
        for k in x:
            assert torch.equal(x[k], y[k]), k


def test_plain_dataset_matches_torch_batch_for_batch_and_rng():
    torch.manual_seed(0)
    ref = batches(torch.utils.data.DataLoader(Squares(), batch_size=4, shuffle=True))
    after_ref = torch.rand(3)
    torch.manual_seed(0)
    ours = batches(DataLoader(Squares(), batch_size=4, shuffle=True))
    after_ours = torch.rand(3)
    assert_same(ref, ours)
    assert torch.equal(after_ref, after_ours)
    assert len(DataLoader(Squares(), batch_size=4)) == 6


def test_every_image_once_per_epoch_and_epochs_differ(jpeg_root):
    loader = DataLoader(ImageFolder(jpeg_root, size=32, train=True, seed=1), batch_size=5, shuffle=True)
    assert loader.settings.num_workers.value >= 1  # declared: real worker processes
    epochs = []
    for _ in range(2):
        labels, pixels = [], []
        for images, y in loader:
            assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.uint8
            labels += y.tolist()
            pixels.append(images)
        epochs.append((labels, torch.cat(pixels)))
    assert len(epochs[0][0]) == 48 and sorted(epochs[0][0]) == sorted(epochs[1][0])
    assert epochs[0][0] != epochs[1][0]  # reshuffled
    assert loader.epoch == 2


def test_workers_do_not_change_the_batches(jpeg_root):
    ds = ImageFolder(jpeg_root, size=24, train=True)
    torch.manual_seed(5)
    single = batches(DataLoader(ds, batch_size=8, shuffle=True, num_workers=0))
    torch.manual_seed(5)
    multi = batches(DataLoader(ds, batch_size=8, shuffle=True, num_workers=2))
    torch.manual_seed(5)
    auto = batches(DataLoader(ds, batch_size=8, shuffle=True, backend="torch"))
    torch.manual_seed(5)
    threads = batches(DataLoader(ds, batch_size=8, shuffle=True))  # auto: a short epoch -> threads
    for a, b, c, d in zip(single, multi, auto, threads, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[0], c[0])
        assert torch.equal(a[1], b[1]) and torch.equal(a[1], c[1]) and torch.equal(a[1], d[1])
        # the same crops and flips; pixels within tests/test_threads_engine.py's bound
        assert (a[0].float() - d[0].float()).abs().mean() < 4.0


def test_other_seed_other_augmentation(jpeg_root):
    ds = ImageFolder(jpeg_root, size=24, train=True)
    torch.manual_seed(1)
    a = next(iter(DataLoader(ds, batch_size=8, num_workers=0)))[0]
    torch.manual_seed(2)
    b = next(iter(DataLoader(ds, batch_size=8, num_workers=0)))[0]
    assert not torch.equal(a, b)


def test_device_cpu_normalizes_batches_like_the_dataset(jpeg_root):
    ds = ImageFolder(jpeg_root, size=32, normalize=True)
    on_device = next(iter(DataLoader(ds, batch_size=6, device="cpu", num_workers=0)))
    in_workers = next(iter(DataLoader(ds, batch_size=6, num_workers=0)))
    assert on_device[0].dtype == torch.float32
    assert torch.allclose(on_device[0], in_workers[0], atol=1e-5)
    assert torch.equal(on_device[1], in_workers[1])


def test_cuda_without_a_gpu_is_a_clear_error(jpeg_root):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(fastload.ConfigError, match="no CUDA device"):
        DataLoader(ImageFolder(jpeg_root), device="cuda")


@pytest.mark.gpu
def test_cuda_batches_arrive_on_the_gpu_normalized(jpeg_root):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ds = ImageFolder(jpeg_root, size=32, normalize=True)
    ref = next(iter(DataLoader(ds, batch_size=6, num_workers=0)))
    got = next(iter(DataLoader(ds, batch_size=6, device="cuda")))
    assert got[0].is_cuda and got[1].is_cuda
    assert torch.allclose(got[0].cpu(), ref[0], atol=1e-5)


def corrupt_copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    victim = sorted(dst.rglob("*.jpg"))[7]
    victim.write_bytes(b"\xff\xd8 this is not a jpeg")
    return victim


def test_corrupt_image_raises_through_workers_naming_file(jpeg_root, tmp_path):
    victim = corrupt_copy(jpeg_root, tmp_path / "d")
    loader = DataLoader(ImageFolder(tmp_path / "d", size=16), batch_size=4, num_workers=2)
    with pytest.raises(fastload.CorruptSampleError, match=victim.name):
        batches(loader)


def test_skip_counts_and_reports_at_epoch_end(jpeg_root, tmp_path, caplog):
    victim = corrupt_copy(jpeg_root, tmp_path / "d")
    loader = DataLoader(ImageFolder(tmp_path / "d", size=16, on_error="skip"), batch_size=4, num_workers=2)
    with caplog.at_level(logging.WARNING, logger="fastload.loader"):
        n = sum(len(y) for _, y in loader)
    assert n == 47
    assert [s.path for s in loader.skipped] == [str(victim)]
    assert loader.skipped[0].index == 7
    assert any("skipped 1 samples that could not be read or decoded" in r.getMessage() for r in caplog.records)


class DiesInWorker(Dataset):
    # Worker 0 dies on its first sample, before it has put any batch on the queue: a worker
    # that died after sending a batch made torch's unpickling of that batch fail first (its
    # tensor's file descriptor is served by the dead worker: ConnectionResetError), a race
    # that a busy machine (two pytest-xdist processes) lost once in CI.
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 0:
            os._exit(3)
        return i


@pytest.mark.timeout(60)
def test_a_dying_worker_is_an_error_not_a_hang():
    loader = DataLoader(DiesInWorker(), batch_size=2, num_workers=2)
    with pytest.raises(RuntimeError, match="exited unexpectedly|killed"):
        batches(loader)


def test_explicit_settings_are_honoured(jpeg_root):
    loader = DataLoader(ImageFolder(jpeg_root), batch_size=4, num_workers=1, prefetch_factor=3,
                        persistent_workers=False, pin_memory=False)
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (1, 3, False)
    assert loader.settings.num_workers.source == "argument"


def test_user_sampler_is_respected(jpeg_root):
    ds = ImageFolder(jpeg_root, size=16)
    order = [3, 1, 2]
    loader = DataLoader(ds, batch_size=2, sampler=order, num_workers=0)
    labels = [y for _, ys in loader for y in ys.tolist()]
    assert labels == [ds.samples[i][1] for i in order]


class DeclaredRange(Dataset):
    fastload_worker_safe = True

    def __len__(self):
        return 20

    def __getitem__(self, i):
        return i


def test_auto_persistent_workers_keep_torchs_order_and_random_stream_over_epochs():
    def run(loader_class, **kwargs):
        torch.manual_seed(0)
        loader = loader_class(DeclaredRange(), batch_size=5, shuffle=True, **kwargs)
        orders = [[b.tolist() for b in loader] for _ in range(3)]
        return orders, torch.rand(2)

    ref_orders, ref_after = run(torch.utils.data.DataLoader)
    loader = DataLoader(DeclaredRange(), batch_size=5)
    assert loader.persistent_workers and loader.num_workers > 0  # auto chose persistence
    orders, after = run(DataLoader)
    assert orders == ref_orders
    assert torch.equal(after, ref_after)


def test_an_abandoned_iterator_stops_its_workers_without_the_cycle_collector(jpeg_root):
    import gc

    loader = DataLoader(ImageFolder(jpeg_root, size=16), batch_size=4, num_workers=2,
                        persistent_workers=False)
    gc.disable()
    try:
        it = iter(loader)
        next(it)
        workers = list(it._workers)
        assert all(w.is_alive() for w in workers)
        del it
        assert not any(w.is_alive() for w in workers)
    finally:
        gc.enable()


def _mark_clean_exit(folder: str) -> None:
    """Worker init: a file named after the worker's pid appears when it exits cleanly (a
    worker killed by a signal runs no exit finalizers)."""
    path = Path(folder) / str(os.getpid())
    multiprocessing.util.Finalize(None, path.touch, exitpriority=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("left", ["persistent loader", "epoch iterator"])
def test_workers_of_a_loader_or_iterator_in_a_cycle_stop_cleanly_when_collected(tmp_path, left):
    # NOTE [workers of a collected loader]: freed by the cycle collector, the workers still
    # hear torch's shutdown and exit on their own, instead of being killed after a timeout
    before = {child.pid for child in psutil.Process().children()}
    loader = DataLoader(Squares(), batch_size=8, num_workers=2,
                        persistent_workers=left == "persistent loader",
                        worker_init_fn=lambda _: _mark_clean_exit(str(tmp_path)))
    if left == "persistent loader":
        assert len(list(loader)) == 3  # 23 samples
        kept = loader
    else:  # an epoch left mid-way, as by an error whose traceback holds it
        kept = iter(loader)
        next(kept)
    del loader
    workers = {child.pid for child in psutil.Process().children()} - before
    assert len(workers) == 2
    ref = weakref.ref(kept)
    cycle: list = [kept]
    cycle.append(cycle)
    del kept, cycle
    gc.collect()
    assert ref() is None
    assert not [pid for pid in workers if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == sorted(workers)
