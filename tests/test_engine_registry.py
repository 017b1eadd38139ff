"""The engine registry and the facade's choice: auto, forced, and impossible cases."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import TensorDataset

from fastload import BackendUnavailable, ConfigError, DataLoader, ImageFolder
from fastload.engines import ENGINES, choose_backend, engine_class
from fastload.data.pipeline import ImagePipeline, Resize


@dataclass(frozen=True)
class Sharpen:
    """A step fastload's engines do not know."""

    amount: float = 1.0


@pytest.fixture
def folder(jpeg_root) -> ImageFolder:
    return ImageFolder(jpeg_root, size=32, seed=0)


def test_auto_with_num_workers_set_runs_torch_and_says_why(folder):
    loader = DataLoader(folder, batch_size=8, num_workers=0)
    assert loader.backend == "torch"
    assert "num_workers was set" in loader.backend_reason and "backend='threads'" in loader.backend_reason
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 32, 32)


def test_auto_rule(folder):
    """auto = a plain dataset on torch; a declared one measured on every engine that runs it."""
    has_dali = importlib.util.find_spec("nvidia.dali") is not None
    for cuda in (True, False):
        auto = choose_backend("auto", folder, device=None, cuda_available=cuda)
        assert auto.name == "probe" and "measures" in auto.reason
        assert auto.candidates == (("threads", "torch", "dali") if has_dali else ("threads", "torch"))
    off = choose_backend("auto", folder, device=None, probe=False)
    assert off.name == "threads" and "probe is off" in off.reason
    asked = choose_backend("auto", folder, device=None, workers_set=True)
    assert asked.name == "torch" and "num_workers was set" in asked.reason
    plain = choose_backend("auto", TensorDataset(torch.zeros(4, 1)), device=None, cuda_available=True)
    assert plain.name == "torch" and "TensorDataset" in plain.reason


def test_torch_forced(folder):
    loader = DataLoader(folder, batch_size=8, num_workers=0, backend="torch")
    assert loader.backend == "torch" and "requested" in loader.backend_reason


@pytest.mark.parametrize(
    "build, why",
    [
        (lambda ds: dict(dataset=TensorDataset(torch.zeros(4, 1))), "TensorDataset"),
        (lambda ds: dict(dataset=ds, collate_fn=lambda b: b), "collate_fn"),
        (lambda ds: dict(dataset=ds, worker_init_fn=lambda i: None), "worker_init_fn"),
        (lambda ds: dict(dataset=ds, batch_size=None), "batch_size=None"),
        (
            lambda ds: dict(dataset=ds.with_pipeline(ImagePipeline((Resize(40), Sharpen())))),
            "Sharpen",
        ),
        (
            lambda ds: dict(dataset=ds.with_pipeline(ImagePipeline((Resize(40),)))),
            "without a crop",
        ),
    ],
    ids=["plain-dataset", "collate_fn", "worker_init_fn", "unbatched", "custom-step", "no-crop"],
)
def test_impossible_cases(folder, build, why):
    """Forcing DALI where it cannot run fails with the reason; auto falls back with it."""
    kwargs = {"batch_size": 4, "num_workers": 0, **build(folder)}
    with pytest.raises(BackendUnavailable, match=why) as info:
        DataLoader(**kwargs, backend="dali")
    assert "backend='torch'" in str(info.value)  # the fix
    loader = DataLoader(**kwargs, backend="auto")
    assert loader.backend == "torch" and (why in loader.backend_reason or "no CUDA GPU" in loader.backend_reason)


def test_unknown_backend_is_a_config_error(folder):
    with pytest.raises(ConfigError, match="backend='tpu'"):
        DataLoader(folder, batch_size=4, backend="tpu")
    with pytest.raises(ConfigError, match="not an engine"):
        engine_class("tpu")


def test_registry_imports_lazily():
    """The registry names a dotted path and an install hint; the module loads on first use."""
    assert ENGINES["dali"].target == "fastload.engines.dali:DaliEngine"
    assert "fastload[dali]" in ENGINES["dali"].install
    code = "import sys, fastload; print('fastload.engines.dali' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_dali_installed_everything_else_works(jpeg_root):
    """A Python where nvidia.dali cannot import (sys.modules entry None, as Python blocks a
    module): auto runs torch, forcing or importing DALI raises MissingDependencyError naming
    the package to install."""
    code = f"""
import sys
sys.modules["nvidia.dali"] = None
from fastload import DataLoader, ImageFolder, MissingDependencyError
ds = ImageFolder({str(jpeg_root)!r}, size=32, seed=0)
loader = DataLoader(ds, batch_size=8, num_workers=0)
assert loader.backend == "torch", loader.backend_reason
images, labels = next(iter(loader))
assert images.shape == (8, 3, 32, 32)
try:
    DataLoader(ds, batch_size=8, backend="dali")
except MissingDependencyError as exc:
    assert isinstance(exc, ImportError)
    print("forced:", exc)
try:
    from fastload.engines.registry import engine_class
    engine_class("dali")
except MissingDependencyError as exc:
    print("imported:", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "nvidia.dali does not import" in out.stdout
    assert "pip install 'fastload[dali]'" in out.stdout
    forced, imported = out.stdout.splitlines()[-2:]  # both raised, each saying what to install
    assert forced.startswith("forced:") and "pip install 'fastload[dali]'" in forced
    assert imported.startswith("imported:") and "pip install 'fastload[dali]'" in imported
