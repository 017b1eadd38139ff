"""Shared checks of a sharded declared dataset (TarShards, ParquetImages) on the engines.

Each takes a built dataset and asserts what every such source must give:
:func:`each_sample_once` (an epoch on one engine holds every label once, through
``target_transform``), :func:`threads_match_workers` (one seed: the threads engine and torch
workers give the same batches, pixels within ROI decode's rounding) and
:func:`subclass_runs_on_torch` (a subclass with its own ``__getitem__`` runs on torch
workers, which call it).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from fastload import DataLoader


def each_sample_once(ds: Any, backend: str) -> None:
    """An epoch of ``ds`` (its target_transform multiplies by 10) on ``backend``."""
    if backend == "dali" and importlib.util.find_spec("nvidia.dali") is None:
        pytest.skip("DALI is not installed")
    loader = DataLoader(ds, batch_size=8, shuffle=True, backend=backend,
                        num_workers=2 if backend == "torch" else 0)
    assert loader.backend == backend
    labels = torch.cat([y for _, y in loader])
    assert sorted(labels.tolist()) == sorted((ds.targets * 10).tolist())


def threads_match_workers(ds: Any) -> None:
    """The threads engine and two torch workers give ``ds``'s epoch alike."""
    threads = DataLoader(ds, batch_size=8, shuffle=True, backend="threads")
    workers = DataLoader(ds, batch_size=8, shuffle=True, backend="torch", num_workers=2)
    for (xa, ya), (xb, yb) in zip(threads, workers, strict=True):  # one seed: the same batches
        assert torch.equal(ya, yb)  # the threads engine's ROI decode differs by rounding only
        assert (xa.float() - xb.float()).abs().mean() < 3


def subclass_runs_on_torch(source: type, *args: Any, **kwargs: Any) -> None:
    """A subclass of ``source`` doubling labels in its own ``__getitem__``, built with
    ``args``/``kwargs``, runs on torch workers and its labels are doubled."""

    class Doubled(source):  # type: ignore[misc, valid-type]
        def __getitem__(self, index: int) -> Any:
            image, label = super().__getitem__(index)
            return image, label * 2

    ds = Doubled(*args, **kwargs)
    assert f"Doubled overrides {source.__name__}.__getitem__" in ds.torch_only_reason()
    loader = DataLoader(ds, batch_size=8)
    assert loader.backend == "torch"
    assert sorted(torch.cat([y for _, y in loader]).tolist()) == sorted((ds.targets * 2).tolist())
