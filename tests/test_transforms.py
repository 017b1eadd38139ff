"""ImageFolder(root, transform=t): a user's torchvision transform, compiled and run as-is.

Compared against torchvision's own ImageFolder over the same files: labels, eval pixels,
the distribution of training crops and flips, and the steps that run unchanged.
"""

from __future__ import annotations

import math
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

torchvision = pytest.importorskip("torchvision")
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2

import fastload
from fastload import ConfigError, ImageFolder
from fastload.data.pipeline import CenterCrop, HorizontalFlip, Normalize, RandomResizedCrop, Resize
from fastload.data.sampling import SampleIndex
from fastload.data.transforms import OnPIL, compile_transform

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def to_float(v):
    return [T1.ToTensor()] if v is T1 else [T2.ToImage(), T2.ToDtype(torch.float32, scale=True)]


def step_types(ds_or_compiled) -> list[str]:
    return [type(s).__name__ for s in ds_or_compiled.pipeline.steps]


@pytest.mark.parametrize("v", [T1, T2], ids=["v1", "v2"])
def test_standard_train_transform_compiles_to_fastload_steps(v):
    t = v.Compose([v.RandomResizedCrop(24), v.RandomHorizontalFlip(), *to_float(v), v.Normalize(MEAN, STD)])
    c = compile_transform(t)
    assert c.pipeline.steps == (
        RandomResizedCrop((24, 24)), HorizontalFlip(0.5), Normalize(tuple(MEAN), tuple(STD)),
    )
    assert c.rest is None and c.normalize is None
    assert any("RandomResizedCrop -> decode" in n for n in c.notes)


def test_nested_compose_and_conversions_in_the_prefix():
    t = T2.Compose([T2.ToImage(), T2.Compose([T2.Resize(256), T2.CenterCrop(224)]),
                    T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD), T2.ToPureTensor()])
    c = compile_transform(t)
    assert c.pipeline.steps == (Resize(256), CenterCrop((224, 224)), Normalize(tuple(MEAN), tuple(STD)))
    assert c.rest is None


def test_what_does_not_compile_runs_as_is_and_says_why():
    c = compile_transform(T1.Compose([
        T1.RandomResizedCrop(24, interpolation=T1.InterpolationMode.NEAREST), T1.ToTensor(),
    ]))
    assert step_types(c) == [] and c.rest is not None
    assert any("nearest" in n for n in c.notes)
    assert c.normalize == Normalize((0.0,) * 3, (1.0,) * 3)  # the bare ToTensor: x / 255
    c = compile_transform(T2.Compose([T2.Resize((20, 30)), T2.CenterCrop(16), T2.PILToTensor()]))
    assert step_types(c) == [] and any("keeps the aspect ratio" in n for n in c.notes)
    # A geometric step after a colour step stays in rest, in order.
    c = compile_transform(T2.Compose([T2.ColorJitter(0.4), T2.CenterCrop(16), T2.ToImage()]))
    assert step_types(c) == [] and c.rest_names[:2] == ["ColorJitter", "CenterCrop"]


def test_labels_match_torchvision(jpeg_root):
    t = T1.Compose([T1.Resize(32), T1.CenterCrop(32), T1.ToTensor()])
    ours, theirs = ImageFolder(jpeg_root, transform=t), torchvision.datasets.ImageFolder(jpeg_root, transform=t)
    assert ours.classes == theirs.classes and ours.class_to_idx == theirs.class_to_idx
    assert ours.targets == theirs.targets
    assert [Path(p).name for p, _ in ours.samples] == [Path(p).name for p, _ in theirs.samples]


def mean_abs_diff_0_255(ours, theirs) -> float:
    """Worst per-image mean absolute difference, in 0-255 pixel units (Normalize undone)."""
    std = torch.tensor(STD).view(3, 1, 1) * 255
    worst = 0.0
    for i in range(len(theirs)):
        (a, la), (b, lb) = ours[i], theirs[i]
        assert la == lb and a.shape == b.shape == (3, 224, 224) and a.dtype == b.dtype == torch.float32
        worst = max(worst, ((a - b).abs() * std).mean().item())
    return worst


@pytest.mark.parametrize("v", [T1, T2], ids=["v1", "v2"])
def test_eval_transform_output_is_close_to_torchvision(v, photos, jpeg_root):
    t = v.Compose([v.Resize(256), v.CenterCrop(224), *to_float(v), v.Normalize(MEAN, STD)])
    ours = ImageFolder(photos, transform=t)
    assert ours.compiled.rest is None
    # Measured 0.60 (worst image, v1 and v2) on these photo-like images: fastload resizes and
    # crops in one pass, centred to the sub-pixel; torchvision rounds the crop offset to a
    # whole pixel, so the two grids sit up to half a pixel apart.
    assert mean_abs_diff_0_255(ours, torchvision.datasets.ImageFolder(photos, transform=t)) < 1.0
    # Pixel noise makes that half-pixel shift count more: measured 1.84 on these 160x120 ones.
    noisy = mean_abs_diff_0_255(ImageFolder(jpeg_root, transform=t),
                                torchvision.datasets.ImageFolder(jpeg_root, transform=t))
    assert noisy < 3.0


def test_training_crops_and_flips_are_distributed_like_torchvision():
    """fastload's plan over many seeds vs torchvision's RandomResizedCrop.get_params."""
    t = T2.Compose([T2.RandomResizedCrop(24), T2.RandomHorizontalFlip(), T2.ToImage()])
    pipeline = compile_transform(t).pipeline
    width, height, n = 500, 375, 4000
    ours = [pipeline.plan(width, height, random.Random(seed)) for seed in range(n)]
    torch.manual_seed(0)
    image = torch.empty(3, height, width)
    theirs = [T1.RandomResizedCrop.get_params(image, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(n)]

    def stats(boxes):  # (area fraction, log aspect, centre x fraction)
        a = np.array(boxes, dtype=float)
        return a[:, 0] * a[:, 1] / (width * height), np.log(a[:, 1] / a[:, 0]), a[:, 2] / width

    mine = stats([(b[3] - b[1], b[2] - b[0], (b[0] + b[2]) / 2) for b, *_ in ours])
    ref = stats([(h, w, j + w / 2) for _, j, h, w in theirs])
    for m, r in zip(mine, ref):  # n = 4000: standard errors ~0.005 (area), ~0.003 (aspect)
        assert abs(m.mean() - r.mean()) < 0.02
        assert np.abs(np.quantile(m, [0.1, 0.5, 0.9]) - np.quantile(r, [0.1, 0.5, 0.9])).max() < 0.04
    flips = np.mean([p.flip for p in ours])
    assert abs(flips - 0.5) < 0.03  # ~4 standard errors


def test_flips_happen_about_half_the_time_on_real_samples(tmp_path):
    gradient = np.tile(np.linspace(0, 255, 64, dtype=np.uint8), (48, 1))
    path = tmp_path / "a" / "g.png"
    path.parent.mkdir()
    Image.fromarray(np.stack([gradient] * 3, -1)).save(path)
    ds = ImageFolder(tmp_path, transform=T1.Compose([T1.RandomHorizontalFlip(), T1.ToTensor()]), seed=1)
    flipped = [ds[SampleIndex(0, s)][0][0, 0, 0] > 0.5 for s in range(400)]
    assert 0.42 < np.mean(flipped) < 0.58


AUGMENTS = {
    "colorjitter-v1": T1.Compose([T1.RandomResizedCrop(32), T1.ColorJitter(0.4, 0.4, 0.4, 0.1), T1.ToTensor(), T1.Normalize(MEAN, STD)]),
    "randaugment-v2": T2.Compose([T2.RandomResizedCrop(32), T2.RandAugment(), T2.PILToTensor(),
                                  T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD), T2.RandomErasing(p=1.0)]),
    "trivialaugment-v1": T1.Compose([T1.Resize(40), T1.CenterCrop(32), T1.TrivialAugmentWide(), T1.PILToTensor()]),
    "randomchoice-v1": T1.Compose([T1.CenterCrop(32), T1.RandomChoice([T1.RandomRotation(30), T1.RandomInvert(1.0)]), T1.ToTensor()]),
}


@pytest.mark.parametrize("name", list(AUGMENTS))
def test_steps_in_the_middle_run_seeded_with_torchvision_shapes(name, jpeg_root):
    t = AUGMENTS[name]
    ds = ImageFolder(jpeg_root, transform=t, seed=3)
    assert ds.compiled.rest is not None
    ref, _ = torchvision.datasets.ImageFolder(jpeg_root, transform=t)[0]
    a, b = ds[SampleIndex(0, 11)][0], ds[SampleIndex(0, 11)][0]
    assert a.shape == ref.shape and a.dtype == ref.dtype
    assert torch.equal(a, b)  # same seed, same augmentation
    assert not all(torch.equal(a, ds[SampleIndex(0, s)][0]) for s in range(12, 16))
    before = torch.get_rng_state(), random.getstate()
    ds[SampleIndex(0, 11)]
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]


def test_four_threads_give_the_serial_results(jpeg_root):
    ds = ImageFolder(jpeg_root, transform=AUGMENTS["randaugment-v2"], seed=5)
    indices = [SampleIndex(i % len(ds), 100 + i) for i in range(48)]
    serial = [ds[i][0] for i in indices]
    results: dict[int, torch.Tensor] = {}

    def work(k: int) -> None:
        for j in range(k, len(indices), 4):
            results[j] = ds[indices[j]][0]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(torch.equal(serial[j], results[j]) for j in range(len(indices)))


def test_callables_before_to_tensor_get_a_pil_image(jpeg_root):
    seen = []
    t = T1.Compose([T1.Resize(40), T1.Lambda(lambda im: seen.append(type(im)) or im), T1.CenterCrop(32), T1.ToTensor()])
    ds = ImageFolder(jpeg_root, transform=t)
    assert isinstance(ds.compiled.rest.steps[0], OnPIL)
    image, _ = ds[0]
    assert seen == [Image.Image] or issubclass(seen[0], Image.Image)
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_have_torchvision_shapes(workers, jpeg_root):
    t = AUGMENTS["colorjitter-v1"]
    ds = ImageFolder(jpeg_root, transform=t, seed=0)
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=workers, backend="torch")
    images, labels = next(iter(loader))
    ref = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(jpeg_root, transform=t), batch_size=8)
    ref_images, ref_labels = next(iter(ref))
    assert images.shape == ref_images.shape and images.dtype == ref_images.dtype
    assert labels.dtype == ref_labels.dtype and torch.equal(labels, ref_labels)


@pytest.mark.parametrize("name", ["compiled", "colorjitter-v1"])
def test_device_loader_moves_the_trailing_normalize(name, jpeg_root):
    t = (T2.Compose([T2.RandomResizedCrop(32), T2.RandomHorizontalFlip(), *to_float(T2), T2.Normalize(MEAN, STD)])
         if name == "compiled" else AUGMENTS[name])
    ds = ImageFolder(jpeg_root, transform=t, seed=4)
    raw, norm = ds.without_normalize()
    assert norm == Normalize(tuple(MEAN), tuple(STD))
    assert raw.pipeline.normalize is None and (raw.compiled.normalize is None)
    assert raw[SampleIndex(2, 9)][0].dtype == torch.uint8
    host = torch.stack([ds[SampleIndex(i, 9)][0] for i in range(3)])
    assert torch.allclose(host, norm.apply(torch.stack([raw[SampleIndex(i, 9)][0] for i in range(3)]), 1), atol=1e-5)
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=0, device="cpu", backend="torch")
    on_device, _ = next(iter(loader))
    on_host, _ = next(iter(fastload.DataLoader(ds, batch_size=8, num_workers=0, backend="torch")))
    assert on_device.dtype == torch.float32 and torch.allclose(on_device, on_host, atol=1e-5)


def test_bad_combinations_are_config_errors(jpeg_root):
    t = T1.Compose([T1.CenterCrop(32), T1.ToTensor()])
    for kwargs, named in (({"size": 64}, "size"), ({"train": True}, "train"), ({"normalize": True}, "normalize"),
                          ({"pipeline": fastload.ImagePipeline.standard(32)}, "pipeline")):
        with pytest.raises(ConfigError, match=rf"transform.*{named}"):
            ImageFolder(jpeg_root, transform=t, **kwargs)
    with pytest.raises(ConfigError, match="transform"):
        ImageFolder(jpeg_root, transform="RandomResizedCrop(224)")


def test_dataset_pickles_and_dali_is_refused(jpeg_root):
    import pickle

    from fastload.engines.base import EngineRequest
    from fastload.engines.registry import _dali_blocker

    ds = ImageFolder(jpeg_root, transform=AUGMENTS["colorjitter-v1"], seed=2)
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[SampleIndex(1, 5)][0], ds[SampleIndex(1, 5)][0])
    assert "ColorJitter" in repr(ds)
    why = _dali_blocker(EngineRequest(ds, None, True, None, None, None))
    assert why is not None and "ColorJitter" in why and "DALI" in why
    assert math.isfinite(float(ds[0][0].mean()))
