"""Bad user arguments are ConfigErrors naming the parameter; env defaults apply only where torch takes them."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

import fastload
from fastload import (
    CenterCrop,
    DataLoader,
    HorizontalFlip,
    ImageFolder,
    ImagePipeline,
    Normalize,
    RandomResizedCrop,
    Resize,
)

BAD_IMAGEFOLDER = [
    ("size", "big"), ("size", 0), ("size", (224, -1)), ("size", (1, 2, 3)), ("size", True),
    ("train", "yes"), ("train", None),
    ("normalize", "imagenet"),
    ("pipeline", "standard"),
    ("on_error", "ignore"),
    ("extensions", ".jpg"), ("extensions", []), ("extensions", [".jpg", 3]),
    ("seed", "7"), ("seed", 1.5),
    ("storage_options", "anon=True"), ("storage_options", [("anon", True)]),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "value"), BAD_IMAGEFOLDER)
def test_imagefolder_names_the_bad_argument(jpeg_root, name, value):
    with pytest.raises(fastload.ConfigError) as info:
        ImageFolder(jpeg_root, **{name: value})
    message = str(info.value)
    assert f"ImageFolder({name}={value!r}" in message and "expected" in message
    assert isinstance(info.value, ValueError)  # callers' `except ValueError` keeps working


@pytest.mark.timeout(30)
@pytest.mark.parametrize("root", [42, None, [("a.jpg", "cat")], [("a.jpg", -1)], ["a.jpg"]])
def test_imagefolder_root_must_be_a_path_or_pairs(root):
    with pytest.raises(fastload.ConfigError, match=r"ImageFolder\(root="):
        ImageFolder(root)


@pytest.mark.timeout(30)
def test_good_arguments_are_accepted_in_their_canonical_form(jpeg_root):
    ds = ImageFolder(jpeg_root, size=[40, 48], extensions=[".JPG"], storage_options=None, seed=3)
    assert ds[0][0].shape == (3, 40, 48)
    assert ds.extensions == (".jpg",)
    assert CenterCrop(8).size == (8, 8)
    assert Normalize([0, 0, 0], [1, 1, 1]) == Normalize((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


BAD_STEPS = [
    ("Resize", "shorter", lambda: Resize(0)),
    ("Resize", "shorter", lambda: Resize("256")),
    ("CenterCrop", "size", lambda: CenterCrop("224")),
    ("RandomResizedCrop", "size", lambda: RandomResizedCrop((0, 4))),
    ("RandomResizedCrop", "scale", lambda: RandomResizedCrop(4, scale=(0.9, 0.1))),
    ("RandomResizedCrop", "scale", lambda: RandomResizedCrop(4, scale=(0.0, 1.0))),
    ("RandomResizedCrop", "ratio", lambda: RandomResizedCrop(4, ratio=(-1.0, 1.0))),
    ("HorizontalFlip", "p", lambda: HorizontalFlip(1.5)),
    ("Normalize", "mean", lambda: Normalize(mean=(0.5, 0.5))),
    ("Normalize", "std", lambda: Normalize(std=(0.2, 0.0, 0.2))),
    ("ImagePipeline", "steps", lambda: ImagePipeline((Resize,))),
    ("ImagePipeline", "steps", lambda: ImagePipeline("Resize(256)")),
    ("ImagePipeline", "layout", lambda: ImagePipeline((), layout="NCHW")),
    ("ImagePipeline.standard", "size", lambda: ImagePipeline.standard("big")),
    ("ImagePipeline.standard", "layout", lambda: ImagePipeline.standard(8, layout="chw")),
    ("ImagePipeline.standard", "normalize", lambda: ImagePipeline.standard(8, normalize="yes")),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("where", "name", "build"), BAD_STEPS)
def test_pipeline_steps_name_the_bad_argument(where, name, build):
    with pytest.raises(fastload.ConfigError) as info:
        build()
    assert str(info.value).startswith(f"{where}({name}=")


def tensors() -> TensorDataset:
    return TensorDataset(torch.arange(6))


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("name", "value"),
    [("device", "gpu"), ("device", "mps"), ("meter", "yes"), ("backend", "jax"),
     ("num_workers", "four"), ("pin_memory", "Auto"), ("prefetch_factor", "2"),
     ("persistent_workers", "true")],
)
def test_loader_arguments_are_config_errors_naming_them(name, value):
    with pytest.raises(fastload.ConfigError) as info:
        DataLoader(tensors(), batch_size=2, **{name: value})
    assert f"{name}=" in str(info.value) and repr(value) in str(info.value)


@pytest.mark.timeout(30)
def test_env_prefetch_factor_is_ignored_without_workers(monkeypatch):
    monkeypatch.setenv("FASTLOAD_PREFETCH_FACTOR", "4")
    monkeypatch.setenv("FASTLOAD_PERSISTENT_WORKERS", "1")
    loader = DataLoader(tensors(), batch_size=2)  # TensorDataset: 0 workers
    assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    settings = loader.settings
    assert settings.num_workers.value == 0
    assert settings.prefetch_factor.value is None and loader.prefetch_factor is None
    assert "FASTLOAD_PREFETCH_FACTOR=4 ignored" in settings.prefetch_factor.reason
    assert "num_workers > 0" in settings.prefetch_factor.reason
    assert settings.persistent_workers.value is False
    assert "FASTLOAD_PERSISTENT_WORKERS=True ignored" in settings.persistent_workers.reason
    assert "ignored" in str(settings)


@pytest.mark.timeout(60)
def test_env_prefetch_factor_applies_with_workers(monkeypatch, jpeg_root):
    monkeypatch.setenv("FASTLOAD_PREFETCH_FACTOR", "4")
    loader = DataLoader(ImageFolder(jpeg_root, size=16), batch_size=8, num_workers=1)
    assert loader.settings.prefetch_factor.value == 4 == loader.prefetch_factor
    assert loader.settings.prefetch_factor.source == "environment"
    assert sum(len(labels) for _, labels in loader) == 48


@pytest.mark.timeout(30)
def test_explicit_prefetch_factor_without_workers_keeps_torchs_error():
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(tensors(), batch_size=2, num_workers=0, prefetch_factor=4)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("variable", "value"), [("FASTLOAD_NUM_WORKERS", "-1"), ("FASTLOAD_PREFETCH_FACTOR", "0")])
def test_env_ints_below_torchs_minimum_name_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(fastload.ConfigError, match=f"{variable}='{value}' is below"):
        DataLoader(tensors(), batch_size=2)
