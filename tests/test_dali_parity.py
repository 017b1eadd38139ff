"""Parity between the torch engine and the DALI engine (CPU-only DALI) on the same files.

Same files and seed -> identical labels and order, identical shapes, dtypes and layout, the
same crops and flips (both engines run one geometry plan, NOTE [one plan, two engines]), and
pixels within a few intensity levels. Why pixels differ at all: Pillow resamples with its
own fixed-point bilinear filter and, when the crop is over twice the output, lets libjpeg
decode at 1/2-1/8 scale in the DCT (draft mode); DALI decodes at full size with
libjpeg-turbo (its own chroma upsampling) and resamples with its float antialiased linear
filter. Measured on the synthetic JPEGs (docs/dali.md has the full table):

* no draft (crop under twice the output): mean |diff| 0.15-0.20 levels, max pixel 1-2
* draft (crop over twice the output):     mean |diff| 0.36-1.87 levels, max pixel 4-15

The bounds below (0.5 and 3.0 levels of mean |diff|) leave about 2x margin over those.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("nvidia.dali", reason="nvidia-dali is not installed (pip install 'fastload[dali]')")

from fastload import CorruptSampleError, DataLoader, ImageFolder, ObjectNotFoundError  # noqa: E402
from fastload.data.pipeline import ImagePipeline  # noqa: E402
from fastload.data.sampling import EpochSampler  # noqa: E402
from fastload.testing.synthetic import make_jpeg_folder  # noqa: E402

NO_DRAFT_MEAN_BOUND = 0.5  # intensity levels (0-255)
DRAFT_MEAN_BOUND = 3.0


@pytest.fixture(scope="module")
def photo_root(tmp_path_factory) -> Path:
    """A few ImageNet-sized JPEGs (500x375), where Pillow's draft mode kicks in for small outputs."""
    return make_jpeg_folder(tmp_path_factory.mktemp("photos"), images=12, classes=3, size=(500, 375))


def both(dataset: ImageFolder, **kwargs) -> tuple[DataLoader, DataLoader]:
    torch_loader = DataLoader(dataset, backend="torch", num_workers=0, **kwargs)
    dali_loader = DataLoader(dataset, backend="dali", **kwargs)
    assert torch_loader.backend == "torch" and dali_loader.backend == "dali"
    return torch_loader, dali_loader


def compare_epochs(torch_loader, dali_loader, epochs: int = 2) -> list[float]:
    """Both loaders' batches, epoch by epoch: labels, shape, dtype equal; mean |diff| per batch."""
    assert len(torch_loader) == len(dali_loader)
    diffs = []
    for _ in range(epochs):
        a_batches, b_batches = list(torch_loader), list(dali_loader)
        assert len(a_batches) == len(b_batches) == len(torch_loader)
        for (xa, ya), (xb, yb) in zip(a_batches, b_batches):
            assert torch.equal(ya, yb)
            assert ya.dtype == yb.dtype == torch.int64
            assert xa.shape == xb.shape and xa.dtype == xb.dtype and xb.is_contiguous()
            diffs.append(float((xa.float() - xb.float()).abs().mean()))
    return diffs


@pytest.mark.parametrize(
    "root_name, size, bound",
    [("jpeg_root", 64, NO_DRAFT_MEAN_BOUND), ("photo_root", 224, NO_DRAFT_MEAN_BOUND),
     ("jpeg_root", 48, DRAFT_MEAN_BOUND), ("photo_root", 160, DRAFT_MEAN_BOUND)],
    ids=["small-64", "imagenet-224", "small-48-draft", "imagenet-160-draft"],
)
def test_deterministic_path_matches(request, root_name, size, bound):
    """Resize + center crop, no flip: order, labels, shapes equal; pixels within a bound."""
    root = request.getfixturevalue(root_name)
    ds = ImageFolder(root, size=size, seed=7)
    diffs = compare_epochs(*both(ds, batch_size=5, shuffle=True))
    assert max(diffs) <= bound, diffs


def test_random_path_has_the_same_crops_and_flips(jpeg_root):
    """Random-resized-crop + flip: the same seed gives the same crop box and flip on both,
    so pixels agree as closely as on the deterministic path."""
    ds = ImageFolder(jpeg_root, size=64, train=True, seed=11)
    diffs = compare_epochs(*both(ds, batch_size=8, shuffle=True))
    assert max(diffs) <= NO_DRAFT_MEAN_BOUND, diffs


def test_normalized_hwc_float(jpeg_root):
    pipeline = ImagePipeline.standard(64, normalize=True, layout="HWC")
    ds = ImageFolder(jpeg_root, pipeline=pipeline, seed=1)
    torch_loader, dali_loader = both(ds, batch_size=16)
    (xa, ya), (xb, yb) = next(iter(torch_loader)), next(iter(dali_loader))
    assert xb.dtype == torch.float32 and xb.shape == (16, 64, 64, 3)
    assert torch.equal(ya, yb)
    # one level of 255, in normalized units (std ~0.22)
    assert float((xa - xb).abs().mean()) <= NO_DRAFT_MEAN_BOUND / (0.224 * 255)


def test_drop_last_len_and_device(jpeg_root):
    ds = ImageFolder(jpeg_root, size=24, seed=2)
    torch_loader, dali_loader = both(ds, batch_size=10, drop_last=True, device="cpu")
    assert len(dali_loader) == 4
    batches = list(dali_loader)
    assert [b[0].shape[0] for b in batches] == [10] * 4
    assert all(b[0].device.type == "cpu" for b in batches)
    compare_epochs(torch_loader, dali_loader, epochs=1)


def test_rank_shard_follows_the_sampler(jpeg_root):
    """A rank's shard is the sampler's, on either engine (the loader's own sampler under
    torchrun is this same EpochSampler)."""
    ds = ImageFolder(jpeg_root, size=24, seed=3)
    labels = {}
    for engine in ("torch", "dali"):
        sampler = EpochSampler(ds, shuffle=True, seed=5, num_replicas=2, rank=1, tag_seeds=True)
        loader = DataLoader(ds, batch_size=6, sampler=sampler, backend=engine, num_workers=0)
        labels[engine] = torch.cat([y for _, y in loader])
    expected = torch.tensor([ds.targets[i] for i in EpochSampler(ds, seed=5, num_replicas=2, rank=1)])
    assert torch.equal(labels["torch"], expected) and torch.equal(labels["dali"], expected)


def test_meter_sees_the_dali_engine(jpeg_root):
    ds = ImageFolder(jpeg_root, size=24, seed=4)
    loader = DataLoader(ds, batch_size=12, backend="dali")
    for _ in loader:
        pass
    assert loader.meter is not None and loader.meter.batches == len(loader)


@pytest.fixture
def damaged_root(jpeg_root, tmp_path) -> tuple[Path, dict[str, str]]:
    """A copy of the JPEG set with one truncated JPEG and one file that is not an image."""
    root = Path(shutil.copytree(jpeg_root, tmp_path / "damaged"))
    files = sorted(root.glob("*/*.jpg"))
    truncated, garbage = files[5], files[30]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 3])
    garbage.write_bytes(b"this is not an image" * 20)
    return root, {"truncated": str(truncated), "garbage": str(garbage)}


@pytest.mark.parametrize("which", ["truncated", "garbage"])
def test_corrupt_file_raises_naming_file_and_index(damaged_root, which):
    root, bad = damaged_root
    ds = ImageFolder(root, size=24, seed=0)
    index = [p for p, _ in ds.samples].index(bad[which])
    single = ImageFolder([ds.samples[index], ds.samples[0]], size=24, seed=0)
    for engine in ("torch", "dali"):
        loader = DataLoader(single, batch_size=2, backend=engine, num_workers=0)
        with pytest.raises(CorruptSampleError) as info:
            list(loader)
        assert info.value.path == bad[which] and info.value.index == 0
        assert bad[which] in str(info.value) and "index 0" in str(info.value)


def test_missing_file_raises_naming_it(jpeg_root, tmp_path):
    ds = ImageFolder(jpeg_root, size=24)
    missing = str(tmp_path / "gone.jpg")
    listed = ImageFolder([ds.samples[0], (missing, 1)], size=24)
    for engine in ("torch", "dali"):
        loader = DataLoader(listed, batch_size=2, backend=engine, num_workers=0)
        with pytest.raises(ObjectNotFoundError, match="gone.jpg.*index 1"):
            list(loader)


def test_skip_drops_the_same_samples(damaged_root, tmp_path):
    """on_error="skip": both engines skip the truncated, the garbage and a missing file, and
    yield the same labels in the same order; DALI recovers from its own decode failure."""
    root, bad = damaged_root
    listed = ImageFolder(root, size=24).samples + [(str(tmp_path / "gone.jpg"), 0)]
    ds = ImageFolder(listed, size=24, seed=9, on_error="skip")
    torch_loader, dali_loader = both(ds, batch_size=7, shuffle=True)
    labels_a = torch.cat([y for _, y in torch_loader])
    labels_b = torch.cat([y for _, y in dali_loader])
    assert torch.equal(labels_a, labels_b) and len(labels_b) == len(listed) - 3
    skipped_a = sorted((s.index, s.path) for s in torch_loader.skipped)
    skipped_b = sorted((s.index, s.path) for s in dali_loader.skipped)
    assert skipped_a == skipped_b
    assert {p for _, p in skipped_b} == {bad["truncated"], bad["garbage"], str(tmp_path / "gone.jpg")}


def test_abandoned_epoch_leaves_nothing_behind(jpeg_root):
    """Breaking out of an epoch stops the read threads; the next epoch starts clean."""
    ds = ImageFolder(jpeg_root, size=24, seed=6)
    torch_loader, dali_loader = both(ds, batch_size=4, shuffle=True)
    it = iter(dali_loader)
    next(it)
    del it
    torch_loader.epoch = dali_loader.epoch = 1
    compare_epochs(torch_loader, dali_loader, epochs=1)
