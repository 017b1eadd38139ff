"""timm's transforms through ``ImageFolder(root, transform=t)``, against real timm.

``create_transform(..., is_training=False)`` compiles whole into the decode and runs on the
threaded engine with timm+PIL's pixels; ``is_training=True`` compiles its crop (drawn by
timm's distribution) and flip and runs what remains. Which steps keep a transform off the
threaded engine: only those that draw from a global random generator (NOTE [which steps draw]).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

timm_data = pytest.importorskip("timm.data")
torchvision = pytest.importorskip("torchvision")
import timm.data.transforms as timm_transforms
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2

from fastload import BackendUnavailable, DataLoader, ImageFolder
from fastload.data.pipeline import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    HorizontalFlip,
    Normalize,
    RandomResizedCrop,
    Resize,
    ResizeKeepRatio,
)
from fastload.data.sampling import SampleIndex
from fastload.data.transforms import compile_transform
from fastload.engines.base import EngineRequest
from fastload.engines.registry import blocker_of, choose_backend

create_transform = timm_data.create_transform

PIXEL_BOUND = 1.0
"""Worst per-image mean |fastload - timm+PIL| in 0-255 units on the photo-like images, the
bound tests/test_transforms.py holds torchvision's eval transform to. Measured 0.60-0.74 for
bilinear, bicubic and the non-square ResizeKeepRatio, on the torch and threaded engines."""


def worst_diff_0_255(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == torch.float32
    return ((ours - theirs).abs() * std).mean(dim=(1, 2, 3)).max().item()


def timm_batch(root: Path, transform) -> tuple[torch.Tensor, list[int]]:
    ref = torchvision.datasets.ImageFolder(root, transform=transform)  # timm's steps on PIL images
    pairs = [ref[i] for i in range(len(ref))]
    return torch.stack([x for x, _ in pairs]), [y for _, y in pairs]


def loader_batches(ds: ImageFolder, backend: str) -> tuple[torch.Tensor, list[int]]:
    workers = {"num_workers": 0} if backend == "torch" else {}
    loader = DataLoader(ds, batch_size=4, backend=backend, **workers)
    batches = list(loader)
    assert loader.backend == backend
    loader.engine.close()
    return torch.cat([x for x, _ in batches]), [y for _, labels in batches for y in labels.tolist()]


EVAL = {
    "default": {},
    "bicubic-crop_pct": {"interpolation": "bicubic", "crop_pct": 0.95},
    "non-square": {"input_size": (3, 224, 288), "crop_pct": 0.9, "interpolation": "bicubic"},
}


def test_eval_transform_compiles_whole():
    c = compile_transform(create_transform(224, is_training=False))
    norm = Normalize(IMAGENET_MEAN, IMAGENET_STD)  # timm's tensor mean/std, read as numbers
    assert c.pipeline.steps == (Resize(256), CenterCrop((224, 224)), norm)
    assert c.rest is None and c.normalize is None
    c = compile_transform(create_transform(224, is_training=False, **EVAL["bicubic-crop_pct"]))
    assert c.pipeline.steps == (Resize(235, "bicubic"), CenterCrop((224, 224)), norm)
    c = compile_transform(create_transform(**EVAL["non-square"]))
    # timm emits ResizeKeepRatio((248, 320)) for a non-square target, not torchvision's Resize.
    assert c.pipeline.steps == (ResizeKeepRatio((248, 320), 0.0, "bicubic"), CenterCrop((224, 288)), norm)
    assert c.rest is None


def test_dali_leaves_bicubic_to_the_other_engines(jpeg_root):
    ds = ImageFolder(jpeg_root, transform=create_transform(224, interpolation="bicubic"))
    why = blocker_of("dali", EngineRequest(ds, None, True, None, None, None))
    assert why is not None and "bicubic" in str(why) and "bilinear only" in str(why)
    assert blocker_of("threads", EngineRequest(ds, None, True, None, None, None)) is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(EVAL))
def test_eval_transform_runs_on_threads_with_timm_pixels(name, photos, monkeypatch):
    t = create_transform(**{"input_size": 224, "is_training": False, **EVAL[name]})
    ds = ImageFolder(photos, transform=t)
    assert choose_backend("auto", ds, device=None).candidates[0] == "threads"
    monkeypatch.setenv("FASTLOAD_ENGINE_PROBE", "0")  # auto without measuring: threads
    auto = DataLoader(ds, batch_size=4)
    assert auto.backend == "threads", auto.backend_reason
    auto.engine.close()
    ref, labels = timm_batch(photos, t)
    for backend in ("threads", "torch"):
        images, got = loader_batches(ds, backend)
        assert got == labels
        assert worst_diff_0_255(images, ref) < PIXEL_BOUND, backend


def test_train_transform_compiles_its_crop_and_runs_the_rest(jpeg_root):
    t = create_transform(224, is_training=True)
    ds = ImageFolder(jpeg_root, transform=t, seed=1)
    assert ds.pipeline.steps == (RandomResizedCrop((224, 224)), HorizontalFlip(0.5))
    assert "RandomResizedCropAndInterpolation -> decode" in ds.compiled.notes
    assert ds.compiled.rest_names == ["ColorJitter"]
    assert ds.compiled.normalize == Normalize(IMAGENET_MEAN, IMAGENET_STD)  # moves to the device
    loader = DataLoader(ds, batch_size=8)
    # ColorJitter is compiled (fastload.data.augment): it draws from the sample's generator.
    assert ds.compiled.global_draws == () and loader.backend == "auto", loader.backend_reason
    images, labels = next(iter(loader))
    ref = torchvision.datasets.ImageFolder(jpeg_root, transform=t)  # timm's steps on PIL images
    assert images.shape == (8, *ref[0][0].shape) and images.dtype == ref[0][0].dtype
    assert labels.tolist() == ref.targets[:8]
    sample = ds[SampleIndex(3, 7)][0]
    assert torch.equal(sample, ds[SampleIndex(3, 7)][0])  # seeded per sample
    # Where torchvision's ImageFolder hands ColorJitter a PIL image, fastload's compiled step
    # gets one too (PIL's kernels); the torch engine hands it the decode's PIL image straight.
    assert any(n.startswith("ColorJitter -> fastload's draws") for n in ds.compiled.notes)
    assert ds.compiled.takes_pil
    seed = ds.sample_seed(SampleIndex(3, 7))
    assert torch.equal(sample, ds.finish(ds.pipeline.run(ds.read_bytes(3), seed), seed))
    on_threads, _ = next(iter(DataLoader(ds, batch_size=8, backend="threads")))
    on_torch, _ = next(iter(DataLoader(ds, batch_size=8, backend="torch")))
    # The same draws on either engine: only the decoders' few levels of difference remain
    # (tests/test_threads_engine.py's bound); another jitter would move whole images.
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert ((on_threads - on_torch).abs() * std).mean().item() * 255 < 4.0


@pytest.mark.timeout(120)
def test_randaugment_random_erasing_and_random_interpolation(jpeg_root):
    t = create_transform(224, is_training=True, auto_augment="rand-m9-inc1", re_prob=0.5,
                         interpolation="random")
    ds = ImageFolder(jpeg_root, transform=t, seed=2)
    assert ds.pipeline.steps == (RandomResizedCrop((224, 224), interpolation="random"), HorizontalFlip(0.5))
    assert ds.compiled.rest_names == ["RandAugment", "Normalize", "RandomErasing"]
    # timm's RandAugment and RandomErasing are compiled (fastload.data.augment): no global draw.
    assert ds.compiled.global_draws == ()
    a, b = ds[SampleIndex(5, 3)][0], ds[SampleIndex(5, 3)][0]
    assert a.shape == (3, 224, 224) and a.dtype == torch.float32 and torch.equal(a, b)
    assert not all(torch.equal(a, ds[SampleIndex(5, s)][0]) for s in range(4, 8))
    on_threads, _ = next(iter(DataLoader(ds, batch_size=4, backend="threads")))
    on_workers, _ = next(iter(DataLoader(ds, batch_size=4, num_workers=2)))
    assert on_threads.shape == on_workers.shape == (4, 3, 224, 224)


def test_crops_are_distributed_like_timms():
    """fastload's plan over many seeds vs timm's RandomResizedCropAndInterpolation.get_params
    (which draws from Python's random), as tests/test_transforms.py does for torchvision's."""
    step = timm_transforms.RandomResizedCropAndInterpolation(24, interpolation="random")
    pipeline = compile_transform(T1.Compose([step, T1.RandomHorizontalFlip()])).pipeline
    width, height, n = 500, 375, 4000
    ours = [pipeline.plan(width, height, random.Random(seed)) for seed in range(n)]
    image = torch.empty(3, height, width)
    saved = random.getstate()
    try:
        random.seed(0)
        theirs = [step.get_params(image, step.scale, step.ratio) for _ in range(n)]
        modes = [random.choice(step.interpolation).value for _ in range(n)]
    finally:
        random.setstate(saved)

    def stats(boxes):  # (area fraction, log aspect, centre x fraction, centre y fraction)
        a = np.array(boxes, dtype=float)
        return (a[:, 0] * a[:, 1] / (width * height), np.log(a[:, 1] / a[:, 0]), a[:, 2] / width,
                a[:, 3] / height)

    mine = stats([(b[3] - b[1], b[2] - b[0], (b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b, *_ in ours])
    ref = stats([(h, w, j + w / 2, i + h / 2) for i, j, h, w in theirs])
    for m, r in zip(mine, ref):  # n = 4000: standard errors ~0.005 (area), ~0.003 (aspect)
        assert abs(m.mean() - r.mean()) < 0.02
        assert np.abs(np.quantile(m, [0.1, 0.5, 0.9]) - np.quantile(r, [0.1, 0.5, 0.9])).max() < 0.04
    bicubic = np.mean([p.interpolation == "bicubic" for p in ours])
    assert abs(bicubic - np.mean([m == "bicubic" for m in modes])) < 0.05 and abs(bicubic - 0.5) < 0.03
    assert abs(np.mean([p.flip for p in ours]) - 0.5) < 0.03
    assert {p.interpolation for p in ours} == {"bilinear", "bicubic"}
    # The interpolation is drawn after the box: the boxes are those of a fixed interpolation.
    fixed = compile_transform(timm_transforms.RandomResizedCropAndInterpolation(24)).pipeline
    boxes = [fixed.plan(width, height, random.Random(s)).box for s in range(50)]
    assert boxes == [p.box for p in ours[:50]]


class Noise:
    """A user's step that really draws from torch's global generator."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image + torch.randint(0, 2, image.shape, dtype=image.dtype)


class CoinFlips:
    """A user's step that draws from Python's and numpy's global generators."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image if random.random() < 2 and np.random.rand() < 2 else image


NOTHING_DRAWN = {
    "tensor-normalize-in-rest": T1.Compose([
        T1.CenterCrop(24), T1.ToTensor(),
        T1.Normalize(torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)),
        T1.Lambda(lambda x: x.clamp(-2, 2)),
    ]),
    "v2-lambda": T2.Compose([T2.CenterCrop(24), T2.Lambda(lambda x: x), T2.ToImage(),
                             T2.ToDtype(torch.float32, scale=True)]),
    "v1-lambda": T1.Compose([T1.CenterCrop(24), T1.Lambda(lambda im: im.rotate(90)), T1.ToTensor()]),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(NOTHING_DRAWN))
def test_steps_that_draw_nothing_are_not_called_random(name, jpeg_root, monkeypatch):
    ds = ImageFolder(jpeg_root, transform=NOTHING_DRAWN[name], seed=4)
    assert ds.compiled.rest is not None and ds.compiled.global_draws == ()
    assert choose_backend("auto", ds, device=None).candidates[0] == "threads"
    monkeypatch.setenv("FASTLOAD_ENGINE_PROBE", "0")
    loader = DataLoader(ds, batch_size=8)
    assert loader.backend == "threads", loader.backend_reason
    loader.engine.close()
    threads, labels = loader_batches(ds, "threads")  # the rest runs on the pixel threads
    on_torch, torch_labels = loader_batches(ds, "torch")
    assert labels == torch_labels and threads.dtype == on_torch.dtype == torch.float32
    assert threads.shape == on_torch.shape == (len(ds), 3, 24, 24)
    # The engines' uint8 pixels differ within tests/test_threads_engine.py's bound (4 of 255).
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) if name.startswith("tensor") else torch.ones(1)
    assert ((threads - on_torch).abs() * std).mean().item() * 255 < 4.0


@pytest.mark.parametrize(
    "step", [Noise(), CoinFlips(), T2.RandomPerspective(p=0.0)], ids=["torch", "python+numpy", "tv-random"]
)
def test_a_step_that_draws_keeps_the_transform_off_threads(step, jpeg_root):
    t = T2.Compose([T2.CenterCrop(24), T2.ToImage(), step, T2.ToDtype(torch.float32, scale=True)])
    ds = ImageFolder(jpeg_root, transform=t)
    name = type(step).__name__
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    loader = DataLoader(ds, batch_size=8)
    assert loader.backend == "torch"
    assert f"{name} draws from" in loader.backend_reason and "training loop" in loader.backend_reason
    # Watching it draw left the caller's generators where they were.
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])
    with pytest.raises(BackendUnavailable, match=f"{name} draws from"):
        DataLoader(ds, batch_size=8, backend="threads")


def test_a_step_that_cannot_be_watched_counts_as_drawing(jpeg_root):
    def needs_a_pil_image(image):
        return image.convert("L") if hasattr(image, "convert") else image.no_such_method()

    t = T2.Compose([T2.CenterCrop(24), T2.ToImage(), needs_a_pil_image,
                    T2.ToDtype(torch.float32, scale=True)])
    ds = ImageFolder(jpeg_root, transform=t)
    reason = DataLoader(ds, batch_size=8).backend_reason
    assert "needs_a_pil_image may draw" in reason and "AttributeError" in reason
