"""Engines that run a declared dataset, found by name and imported only when used.

fastload runs a declared :class:`~fastload.ImageFolder` on one of two engines: ``"torch"``
(Pillow in torch's worker processes: the stock path of :class:`fastload.DataLoader`, which
is torch's own iterator and needs no entry here) or an optional engine from :data:`ENGINES`,
today ``"dali"`` (the same pipeline compiled to NVIDIA DALI). Like fsspec's protocol
registry, :data:`ENGINES` maps a name to a dotted import path and an install hint, so an
optional engine costs nothing until it is chosen and says what to install when it is missing.

:func:`choose_backend` is the facade's decision: the engine and the reason for it.

Example::

    >>> choice = choose_backend("auto", ImageFolder("data/train", size=224), device=None)
    >>> choice.name, choice.reason
    ('torch', 'torch: no CUDA GPU, so DALI would decode on the CPU ...')
    >>> engine_class("dali")
    <class 'fastload.backends.dali.DaliEngine'>
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from fastload.errors import BackendUnavailable, ConfigError

Backend = Literal["auto", "torch", "dali"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "dali")


@dataclass(frozen=True)
class EngineSpec:
    """Where an engine lives (``"module:Class"``) and how to install what it needs."""

    target: str
    install: str | None = None


ENGINES: dict[str, EngineSpec] = {
    "dali": EngineSpec(
        "fastload.backends.dali:DaliEngine",
        "pip install 'fastload[dali]' (nvidia-dali-cuda120; CPU-only DALI works without a GPU)",
    ),
}


def engine_class(name: str) -> Any:
    """The engine class registered as ``name``, imported now; a missing package says what to install."""
    try:
        spec = ENGINES[name]
    except KeyError:
        raise ConfigError(
            f"backend={name!r} is not an engine; use one of {', '.join(BACKENDS)}"
        ) from None
    module_name, class_name = spec.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(
            f"the {name} engine cannot be imported ({exc}); install it with: {spec.install}"
        ) from exc
    return getattr(module, class_name)


@dataclass(frozen=True)
class Choice:
    """The engine a loader runs on (``name``) and why (``reason``, shown as ``loader.backend_reason``)."""

    name: Literal["torch", "dali"]
    reason: str


def choose_backend(
    requested: str,
    dataset: Dataset,
    *,
    device: torch.device | None,
    batched: bool = True,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
    cuda_available: bool | None = None,
) -> Choice:
    """Pick the engine for a loader: ``requested`` is ``"auto"``, ``"torch"`` or ``"dali"``.

    "auto" picks DALI when nvidia.dali imports, a CUDA GPU is present and the dataset is a
    declared pipeline DALI can run; otherwise torch. A forced ``"dali"`` that cannot run
    raises :class:`~fastload.errors.BackendUnavailable` with the reason and the fix.

    Args:
        batched: whether the loader yields batches (``batch_size`` or ``batch_sampler`` set).
        collate_fn, worker_init_fn: the user's, if any (only torch workers can run them).
        cuda_available: whether a CUDA GPU can be used; None asks torch.
    """
    if requested not in BACKENDS:
        raise ConfigError(
            f"backend={requested!r} is not an engine; use one of {', '.join(map(repr, BACKENDS))}"
        )
    if requested == "torch":
        return Choice("torch", "torch: backend='torch' was requested")
    blocker = _dali_blocker(dataset, batched, collate_fn, worker_init_fn)
    if blocker is None:
        blocker = _dali_import_blocker()
    if requested == "dali":
        if blocker is not None:
            raise BackendUnavailable(
                f"backend='dali' cannot run this loader: {blocker}. Pass backend='torch' or "
                "backend='auto' to run it on torch workers."
            )
        where = "GPU (mixed) decoding" if gpu_decoding(device, cuda_available) else "CPU-only DALI"
        return Choice("dali", f"dali: backend='dali' was requested; {where}")
    if blocker is not None:
        return Choice("torch", f"torch: {blocker}")
    if not (cuda_available if cuda_available is not None else torch.cuda.is_available()):
        return Choice(
            "torch",
            "torch: no CUDA GPU, so DALI would decode on the CPU like torch workers do; "
            "pass backend='dali' to use CPU-only DALI anyway",
        )
    if device is not None and device.type == "cpu":
        return Choice(
            "torch", "torch: device='cpu' asks for host batches without the GPU; DALI's gain is GPU decoding"
        )
    return Choice("dali", "dali: CUDA GPU and nvidia-dali found; JPEGs decode on the GPU (nvJPEG)")


def gpu_decoding(device: torch.device | None, cuda_available: bool | None) -> bool:
    """Whether DALI decodes "mixed" (on the GPU): a GPU exists and the user did not ask for the CPU."""
    has_gpu = cuda_available if cuda_available is not None else torch.cuda.is_available()
    return has_gpu and not (device is not None and device.type == "cpu")


def _dali_blocker(
    dataset: Dataset,
    batched: bool,
    collate_fn: Callable[[list[Any]], Any] | None,
    worker_init_fn: Callable[[int], None] | None,
) -> str | None:
    """Why the DALI engine cannot give what torch would for this loader, or None if it can."""
    from fastload.images import ImageFolder
    from fastload.pipeline import STEP_TYPES

    if type(dataset) is not ImageFolder:
        return (
            f"the dataset is a {type(dataset).__name__}, not a declared fastload ImageFolder; "
            "only declared pipelines compile to DALI"
        )
    custom = [type(s).__name__ for s in dataset.pipeline.steps if type(s) not in STEP_TYPES]
    if custom:
        return f"pipeline steps {custom} have no DALI equivalent"
    if dataset.pipeline.output_size is None:
        return (
            "the pipeline ends without a crop, so images keep their own sizes; DALI batches "
            "need one size (end the pipeline with CenterCrop or RandomResizedCrop)"
        )
    if collate_fn is not None:
        return "a custom collate_fn runs only on torch workers"
    if worker_init_fn is not None:
        return "worker_init_fn runs only in torch worker processes"
    if not batched:
        return "batch_size=None yields single samples; the DALI engine yields batches"
    return None


def _dali_import_blocker() -> str | None:
    try:
        importlib.import_module("nvidia.dali")
    except ImportError as exc:
        return f"nvidia.dali does not import ({exc}); install it with: {ENGINES['dali'].install}"
    return None


__all__ = [
    "BACKENDS",
    "ENGINES",
    "Backend",
    "Choice",
    "EngineSpec",
    "choose_backend",
    "engine_class",
    "gpu_decoding",
]
