"""The threaded engine's pixel threads: one intra-op thread each (NOTE [one intra-op thread per
pixel thread]) and a transform's rest stacked into the batch by them (NOTE [the rest's outputs
stacked by the pixel threads])."""

from __future__ import annotations

import shutil
import threading

import pytest
import torch

torchvision = pytest.importorskip("torchvision")
import torchvision.transforms.v2 as T2

from fastload import DataLoader, ImageFolder
from fastload.engines.intraop import _openmp

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class CountThreads:
    """A user's step that draws nothing (so it runs on the pixel threads) and notes the torch
    intra-op thread count of the thread that runs it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        self.seen.append((threading.current_thread().name, torch.get_num_threads()))
        return image


def test_pixel_threads_run_torch_on_one_thread_and_leave_the_loops_count_alone(jpeg_root):
    counter = CountThreads()
    ds = ImageFolder(jpeg_root, transform=T2.Compose([T2.RandomResizedCrop(32), T2.PILToTensor(), counter]), seed=1)
    before = torch.get_num_threads()
    loader = DataLoader(ds, batch_size=4, backend="threads", num_workers=2)
    batches = list(loader)
    on_pixels = {n for name, n in counter.seen if name.startswith("fastload-pixels")}
    assert batches and on_pixels  # (the rest also ran once on the loop's thread, watched for draws)
    if _openmp() is not None:
        assert on_pixels == {1}
    assert torch.get_num_threads() == before  # the training loop's own count
    later: list[int] = []
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert later == [before]  # a thread started afterwards gets the process's count, not 1


@pytest.mark.parametrize("tail", ["plain", "tv_tensor"])
def test_a_rests_outputs_make_the_same_batches_whatever_the_batch_size(jpeg_root, tail):
    steps = [T2.RandomResizedCrop(48), T2.RandomHorizontalFlip(), T2.TrivialAugmentWide(), T2.PILToTensor(),
             T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD), T2.RandomErasing(0.5)]
    if tail == "tv_tensor":
        steps.insert(3, T2.ToImage())  # the rest then returns tv_tensors.Image: default collate
    ds = ImageFolder(jpeg_root, transform=T2.Compose(steps), seed=9)
    whole = torch.cat([x for x, _ in DataLoader(ds, batch_size=5, backend="threads")])
    single = torch.cat([x for x, _ in DataLoader(ds, batch_size=1, backend="threads")])
    assert whole.dtype == torch.float32 and whole.shape == (len(ds), 3, 48, 48)
    assert type(whole) is torch.Tensor and torch.equal(whole, single)


def test_a_skipped_sample_leaves_its_row_out(jpeg_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(jpeg_root, root)
    victim = sorted(root.rglob("*.jpg"))[2]
    victim.write_bytes(b"not a jpeg")
    steps = [T2.RandomResizedCrop(40), T2.TrivialAugmentWide(), T2.PILToTensor(),
             T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD), T2.RandomErasing(0.5)]
    ds = ImageFolder(root, transform=T2.Compose(steps), seed=3, on_error="skip")
    loader = DataLoader(ds, batch_size=4, backend="threads")
    images = torch.cat([x for x, _ in loader])
    assert images.shape[0] == len(ds) - 1
    clean = ImageFolder(jpeg_root, transform=T2.Compose(steps), seed=3)
    expected = torch.cat([x for x, _ in DataLoader(clean, batch_size=4, backend="threads")])
    keep = [i for i in range(len(ds)) if i != 2]
    assert torch.equal(images, expected[keep])
