"""Compiled augmentations (fastload.data.augment) against real torchvision and timm.

(1) pixels and parameters: with a generator seeded like ``torch.manual_seed(s)``, fastload's
compiled step gives exactly what torchvision v2's class gives after ``torch.manual_seed(s)``
(the same draws, the same kernels); v1's classes (other draw calls for the auto
augmentations) are compared by distribution, a two-sample KS statistic over many seeds.
(2) reproducibility: the same (seed, epoch, index) on every engine and worker count, and the
training loop's global generators untouched. (3) the issue's recipes run on threads.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from PIL import Image

torchvision = pytest.importorskip("torchvision")
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2

from fastload import DataLoader, ImageFolder
from fastload.data.augment import compile_augment

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IMAGE = torch.from_numpy(np.random.default_rng(0).integers(30, 200, (3, 40, 36), dtype=np.uint8))

V2_STEPS = {
    "ColorJitter": T2.ColorJitter(0.4, 0.4, 0.4, 0.1), "brightness": T2.ColorJitter(brightness=0.5),
    "hue": T2.ColorJitter(hue=0.3), "RandomGrayscale": T2.RandomGrayscale(0.5),
    "GaussianBlur": T2.GaussianBlur(5, (0.1, 2.0)), "RandomSolarize": T2.RandomSolarize(128),
    "RandomPosterize": T2.RandomPosterize(3), "RandomEqualize": T2.RandomEqualize(),
    "RandomAutocontrast": T2.RandomAutocontrast(), "RandomInvert": T2.RandomInvert(),
    "RandomAdjustSharpness": T2.RandomAdjustSharpness(2.0),
    "RandAugment": T2.RandAugment(), "RandAugment-bilinear-fill": T2.RandAugment(
        2, 9, interpolation=T2.InterpolationMode.BILINEAR, fill=[124, 116, 104]),
    "TrivialAugmentWide": T2.TrivialAugmentWide(), "AutoAugment": T2.AutoAugment(),
    "AugMix": T2.AugMix(), "AugMix-partial": T2.AugMix(severity=5, chain_depth=2, all_ops=False),
    "RandomApply": T2.RandomApply([T2.ColorJitter(0.8, 0.8, 0.8, 0.2), T2.RandomGrayscale(0.5)], p=0.8),
    "RandomRotation": T2.RandomRotation(30),
    "RandomRotation-expand": T2.RandomRotation((-10, 40), T2.InterpolationMode.BILINEAR, expand=True, fill=7),
    "RandomAffine": T2.RandomAffine(20, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5, -3, 3)),
    "RandomChoice": T2.RandomChoice([T2.ColorJitter(0.5), T2.RandomInvert(1.0), T2.RandomRotation(10)],
                                    p=[0.2, 0.5, 0.3]),
    "RandomOrder": T2.RandomOrder([T2.ColorJitter(0.5), T2.RandomInvert(0.5), T2.RandomRotation(10)]),
    "RandomErasing": T2.RandomErasing(0.7), "RandomErasing-random": T2.RandomErasing(0.9, value="random"),
}


def same_pixels(name: str, mine, theirs) -> bool:
    """Equal, except GaussianBlur's (NOTE [a separable blur]): two 1-D passes add the same
    float products in another order, so a pixel may be one level off, on very few pixels."""
    mine, theirs = (torch.as_tensor(np.asarray(x)).int() for x in (mine, theirs))
    if "GaussianBlur" not in name:
        return torch.equal(mine, theirs)
    diff = (mine - theirs).abs()
    return mine.shape == theirs.shape and int(diff.max()) <= 1 and diff.float().mean().item() < 1e-3


def ours(step, image: torch.Tensor, seed: int) -> torch.Tensor:
    augment, why = compile_augment(step)
    assert augment is not None, why
    return augment.apply(image.clone(), torch.Generator().manual_seed(seed))


def theirs(step, image: torch.Tensor, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return step(image.clone())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(V2_STEPS))
def test_v2_steps_draw_and_render_exactly_as_torchvision(name):
    step = V2_STEPS[name]
    image = IMAGE.float().div(255).sub(0.45) if "Erasing" in name else IMAGE  # erasing: after Normalize
    outputs = set()
    for seed in range(120):
        mine = ours(step, image, seed)
        assert same_pixels(name, mine, theirs(step, image, seed)), (name, seed)
        outputs.add(hash(mine.numpy().tobytes()))
    assert len(outputs) > 1  # it does draw


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n for n in V2_STEPS if "Erasing" not in n])
def test_v2_steps_on_pil_images_are_torchvisions_pil_path(name):
    """Where the user's Compose had a PIL image (before ToTensor), the compiled step runs
    torchvision's PIL kernels on it: torchvision's ImageFolder's pixels exactly."""
    step, pil = V2_STEPS[name], Image.fromarray(IMAGE.permute(1, 2, 0).numpy())
    augment, why = compile_augment(step)
    assert augment is not None, why
    for seed in range(40):
        mine = augment.apply(pil, torch.Generator().manual_seed(seed))
        torch.manual_seed(seed)
        assert isinstance(mine, Image.Image) and same_pixels(name, mine, step(pil)), (name, seed)


def ks_statistic(a: list[float], b: list[float]) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two ECDFs."""
    a_sorted, b_sorted = np.sort(a), np.sort(b)
    grid = np.concatenate([a_sorted, b_sorted])
    cdf_a = np.searchsorted(a_sorted, grid, side="right") / len(a)
    cdf_b = np.searchsorted(b_sorted, grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


V1_STEPS = {
    "ColorJitter": T1.ColorJitter(0.4, 0.4, 0.4, 0.1), "GaussianBlur": T1.GaussianBlur(5),
    "RandAugment": T1.RandAugment(), "TrivialAugmentWide": T1.TrivialAugmentWide(),
    "AutoAugment": T1.AutoAugment(), "AugMix": T1.AugMix(), "RandomGrayscale": T1.RandomGrayscale(0.3),
    "RandomErasing": T1.RandomErasing(0.8, value="random"),
    "RandomApply": T1.RandomApply([T1.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
    "RandomAffine": T1.RandomAffine(20, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5)),
    "RandomChoice": T1.RandomChoice([T1.ColorJitter(0.5), T1.RandomInvert(1.0)], p=[0.3, 0.7]),
    "RandomOrder": T1.RandomOrder([T1.RandomInvert(0.5), T1.RandomRotation(10)]),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(V1_STEPS))
def test_v1_steps_draw_torchvisions_distribution(name):
    """Summaries of the output (per-channel means, the changed share) over 500 seeds each, ours
    (seeds 0..) against v1's under torch.manual_seed (seeds 10**6..): KS below the 0.1% critical
    value. Different seeds, so this compares distributions, not streams."""
    step, n = V1_STEPS[name], 500
    image = IMAGE.float().div(255) if "Erasing" in name else IMAGE

    def summary(out: torch.Tensor) -> list[float]:
        changed = (out.float() != image.float()).float().mean().item()
        return [*out.float().mean(dim=(1, 2)).tolist(), changed]

    mine = np.array([summary(ours(step, image, s)) for s in range(n)])
    v1 = np.array([summary(theirs(step, image, 10**6 + s)) for s in range(n)])
    critical = 1.95 * math.sqrt(2 / n)  # alpha = 0.001
    for column in range(mine.shape[1]):
        assert ks_statistic(mine[:, column].tolist(), v1[:, column].tolist()) < critical, (name, column)


@pytest.mark.parametrize("name", ["ColorJitter", "GaussianBlur"])
def test_v1_kernels_within_one_level_for_the_same_draws(name):
    """v1's ColorJitter and GaussianBlur make the same draw calls as v2: the same parameters; v1's
    tensor kernels round differently: at most 4 of 255 (hue), 0.1 on average."""
    step = V1_STEPS[name]
    for seed in range(60):
        diff = (ours(step, IMAGE, seed).int() - theirs(step, IMAGE, seed).int()).abs()
        assert int(diff.max()) <= 4 and diff.float().mean().item() < 0.1


def test_timm_random_erasing_draws_as_timm():
    erasing = pytest.importorskip("timm.data.random_erasing")
    step = erasing.RandomErasing(0.9, mode="pixel", max_count=3, device="cpu")
    augment, why = compile_augment(step)
    assert augment is not None, why
    image = torch.randn(3, 40, 36)
    for seed in range(100):
        random.seed(seed)
        torch.manual_seed(seed + 1)
        expected = step(image.clone())
        got = augment.erase(image.clone(), random.Random(seed), torch.Generator().manual_seed(seed + 1))
        assert torch.equal(got, expected)


def test_what_is_not_compiled_says_so():
    class Mine(T2.ColorJitter):  # a subclass may override forward: it runs as written
        pass

    assert compile_augment(Mine(0.4)) == (None, "")
    augment, why = compile_augment(T2.AutoAugment(T2.AutoAugmentPolicy.CIFAR10))
    assert augment is None and "ImageNet policy only" in why
    augment, why = compile_augment(T2.RandomApply([T2.RandomPerspective()]))
    assert augment is None and "its RandomPerspective is not compiled" in why


RECIPES = {
    "reference": T2.Compose([
        T2.RandomResizedCrop(32), T2.RandomHorizontalFlip(), T2.TrivialAugmentWide(), T2.PILToTensor(),
        T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD), T2.RandomErasing(0.5)]),
    "randaugment": T2.Compose([T2.RandomResizedCrop(32), T2.RandomHorizontalFlip(), T2.RandAugment(2, 9),
                               T2.ToImage(), T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD)]),
    "colorjitter-v1": T1.Compose([T1.RandomResizedCrop(32), T1.RandomHorizontalFlip(), T1.ColorJitter(0.4, 0.4, 0.4),
                                  T1.ToTensor(), T1.Normalize(MEAN, STD)]),
    "simclr": T2.Compose([T2.RandomResizedCrop(32), T2.RandomHorizontalFlip(),
                          T2.RandomApply([T2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T2.RandomGrayscale(0.2),
                          T2.GaussianBlur(3, (0.1, 2.0)), T2.ToImage(), T2.ToDtype(torch.float32, scale=True)]),
}


def _timm_recipe():
    timm_factory = pytest.importorskip("timm.data.transforms_factory")
    return timm_factory.create_transform(32, is_training=True, auto_augment="rand-m9-inc1", re_prob=0.25)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(RECIPES))
def test_recipes_run_on_threads_reproducibly(name, jpeg_root):
    ds = ImageFolder(jpeg_root, transform=RECIPES[name], seed=4)
    assert ds.compiled.global_draws == ()
    loader = DataLoader(ds, batch_size=8, backend="auto")
    assert loader.backend == "auto" and "draws" not in loader.backend_reason, loader.backend_reason
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    threads = [images for images, _ in DataLoader(ds, batch_size=8, backend="threads")]
    # Loading an epoch on threads left the training loop's generators where they were.
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])
    ref = torchvision.datasets.ImageFolder(jpeg_root, transform=RECIPES[name])[0][0]
    assert threads[0].shape[1:] == ref.shape and threads[0].dtype == ref.dtype
    # torch workers, 0 or 2 of them: the same samples exactly (the same decode and draws).
    serial = [images for images, _ in DataLoader(ds, batch_size=8, backend="torch")]
    two = [images for images, _ in DataLoader(ds, batch_size=8, backend="torch", num_workers=2)]
    assert all(torch.equal(a, b) for a, b in zip(serial, two))
    # threads against torch: only the decoders' few levels differ (tests/test_threads_engine.py).
    scale = torch.tensor(STD).view(1, 3, 1, 1) if name != "simclr" else torch.ones(1)
    gaps = [((a - b).abs() * scale).mean().item() * 255 for a, b in zip(threads, serial)]
    assert max(gaps) < 4.0, gaps


@pytest.mark.timeout(300)
def test_timms_recipe_runs_on_threads(jpeg_root):
    """create_transform(..., auto_augment="rand-m9-inc1", re_prob=0.25): timm's RandAugment
    and RandomErasing compiled, the loader off torch workers, the generators untouched."""
    ds = ImageFolder(jpeg_root, transform=_timm_recipe(), seed=4)
    assert ds.compiled.global_draws == ()
    assert DataLoader(ds, batch_size=8).backend == "auto"
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    threads = [images for images, _ in DataLoader(ds, batch_size=8, backend="threads")]
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])
    serial = [images for images, _ in DataLoader(ds, batch_size=8, backend="torch")]
    gaps = [((a - b).abs() * torch.tensor(STD).view(1, 3, 1, 1)).mean().item() * 255 for a, b in zip(threads, serial)]
    assert threads[0].shape == (8, 3, 32, 32) and max(gaps) < 4.0, gaps


@pytest.mark.parametrize("config", ["rand-m9-mstd0.5-inc1", "rand-m9-n3", "rand-m7-mstd101-p0.7"])
def test_timm_randaugment_draws_and_renders_as_timm(config):
    """Seeded like timm's globals (random.seed, np.random.seed), the compiled RandAugment
    chooses, draws and renders exactly as timm's; where timm raises (Pillow 13 refuses the
    0-bit posterize that ``inc1`` gives at magnitude 10), it raises the same error."""
    auto_augment = pytest.importorskip("timm.data.auto_augment")
    step = auto_augment.rand_augment_transform(config, {"translate_const": 100, "img_mean": (124, 116, 104)})
    augment, why = compile_augment(step)
    assert augment is not None, why
    pil = Image.fromarray(IMAGE.permute(1, 2, 0).numpy())

    def outcome(run):
        try:
            return np.asarray(run())
        except ValueError as exc:
            return str(exc)

    for seed in range(150):
        random.seed(seed)
        np.random.seed(seed + 7)
        expected = outcome(lambda: step(pil))
        rng, choices = random.Random(seed), np.random.RandomState(seed + 7)
        got = outcome(lambda: augment.augment(pil, rng, choices))  # noqa: B023 - called at once
        assert np.array_equal(got, expected) if not isinstance(expected, str) else got == expected

@pytest.mark.timeout(300)
def test_timm_randaugment_per_sample_draws_have_timms_distribution():
    """``apply`` picks timm's ops from the sample's own ``random.Random`` (not a numpy
    RandomState): over 400 seeds each, the outputs' summaries are distributed as timm's own
    (KS below the 0.1% critical value), and the same generator seed gives the same image."""
    auto_augment = pytest.importorskip("timm.data.auto_augment")
    step = auto_augment.rand_augment_transform("rand-m9-mstd0.5", {"img_mean": (124, 116, 104)})
    augment, why = compile_augment(step)
    assert augment is not None, why
    pil, n = Image.fromarray(IMAGE.permute(1, 2, 0).numpy()), 400

    def summary(out: Image.Image) -> list[float]:
        pixels = np.asarray(out).astype(np.float64)
        return [*pixels.mean(axis=(0, 1)).tolist(), float((pixels != np.asarray(pil)).mean())]

    mine = np.array([summary(augment.apply(pil, torch.Generator().manual_seed(s))) for s in range(n)])
    theirs = []
    for s in range(n):
        random.seed(10**6 + s)
        np.random.seed(10**6 + s)
        theirs.append(summary(step(pil)))
    critical = 1.95 * math.sqrt(2 / n)
    for column in range(mine.shape[1]):
        assert ks_statistic(mine[:, column].tolist(), np.array(theirs)[:, column].tolist()) < critical, column
    again = augment.apply(pil, torch.Generator().manual_seed(3))
    assert np.array_equal(np.asarray(again), np.asarray(augment.apply(pil, torch.Generator().manual_seed(3))))


@pytest.mark.timeout(300)
def test_batch_level_mixup_and_cutmix_on_fastload_batches(jpeg_root):
    """v2.MixUp / v2.CutMix and timm's Mixup take fastload's (images, labels) batches as they
    take torch's: on the CPU, and with device= on the device after the copy (examples/mixup.py)."""
    ds = ImageFolder(jpeg_root, transform=RECIPES["reference"], seed=2)
    classes = len(ds.classes)
    devices = [None, torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for device in devices:
        loader = DataLoader(ds, batch_size=8, backend="threads", device=device, drop_last=True)
        images, labels = next(iter(loader))
        for mix in (T2.MixUp(num_classes=classes), T2.CutMix(num_classes=classes)):
            mixed, soft = mix(images, labels)
            assert mixed.shape == images.shape and mixed.device == images.device
            assert soft.shape == (8, classes) and torch.allclose(soft.sum(1), torch.ones(8, device=soft.device))
            assert not torch.equal(mixed, images)
        timm_mixup = pytest.importorskip("timm.data.mixup")
        mixer = timm_mixup.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=classes, label_smoothing=0.1)
        mixed, soft = mixer(images.clone(), labels)
        assert mixed.shape == images.shape and soft.shape == (8, classes)


@pytest.mark.timeout(300)
def test_a_recipe_that_still_falls_back_names_only_the_step_that_draws(jpeg_root):
    t = T2.Compose([T2.RandomResizedCrop(32), T2.TrivialAugmentWide(), T2.RandomPerspective(0.5),
                    T2.PILToTensor(), T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD),
                    T2.RandomErasing(0.5)])
    ds = ImageFolder(jpeg_root, transform=t, seed=1)
    loader = DataLoader(ds, batch_size=8)
    assert loader.backend == "torch"
    assert "the transform's RandomPerspective draws from torch's global random generator" in loader.backend_reason
    assert "TrivialAugmentWide" not in loader.backend_reason and "RandomErasing" not in loader.backend_reason
    images, _ = next(iter(loader))
    assert images.shape == (8, 3, 32, 32)
