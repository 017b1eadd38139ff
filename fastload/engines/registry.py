"""The engines fastload can run a loader on, found by name and imported only when used.

Like fsspec's protocol registry, :data:`ENGINES` maps a name to a dotted import path, the
package it needs and an install hint, so an optional engine costs nothing until it is chosen
and says what to install when it is missing. Today:

* ``"torch"``: torch's own iterator and worker processes (:mod:`fastload.engines.torch`);
  it runs every dataset.
* ``"dali"``: a declared :class:`~fastload.ImageFolder` pipeline compiled to NVIDIA DALI
  (:mod:`fastload.engines.dali`), decoding on the GPU where there is one.

:func:`choose_backend` is the facade's decision: it asks each engine whether it can run the
loader (its :class:`EngineSpec`'s ``blocker``, then its package) and returns the engine with the reason.

Example::

    >>> choice = choose_backend("auto", ImageFolder("data/train", size=224), device=None)
    >>> choice.name, choice.reason
    ('torch', 'torch: no CUDA GPU, so DALI would decode on the CPU ...')
    >>> engine_class("dali")
    <class 'fastload.engines.dali.DaliEngine'>
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from fastload.engines.base import EngineRequest
from fastload.errors import BackendUnavailable, ConfigError, FastloadError, MissingDependencyError

Backend = Literal["auto", "torch", "dali"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "dali")


@dataclass(frozen=True)
class EngineSpec:
    """Where an engine lives (``"module:Class"``), what it needs, and how to install it.

    Attributes:
        target: ``"module:Class"`` of the :class:`~fastload.engines.base.Engine`.
        install: the command that installs what it needs (None: nothing to install).
        requires: a module that must import for the engine to run.
        blocker: why the engine cannot run a loader (None if it can), answered without
            importing the engine; None for an engine that runs every loader.
    """

    target: str
    install: str | None = None
    requires: str | None = None
    blocker: Callable[[EngineRequest], str | None] | None = None


def _dali_blocker(request: EngineRequest) -> str | None:
    """Why the DALI engine cannot give what torch would for this loader, or None if it can."""
    compiled = getattr(request.dataset, "compiled", None)  # ImageFolder(transform=...)
    if compiled is not None and compiled.rest is not None:
        return (
            f"the transform's {', '.join(compiled.rest_names)} run on torch tensors; DALI runs "
            "only the declared steps"
        )
    from fastload.data.images import ImageFolder
    from fastload.data.pipeline import STEP_TYPES

    dataset = request.dataset
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
    if request.collate_fn is not None:
        return "a custom collate_fn runs only on torch workers"
    if request.worker_init_fn is not None:
        return "worker_init_fn runs only in torch worker processes"
    if not request.batched:
        return "batch_size=None yields single samples; the DALI engine yields batches"
    return None


ENGINES: dict[str, EngineSpec] = {
    "torch": EngineSpec("fastload.engines.torch:TorchEngine"),
    "dali": EngineSpec(
        "fastload.engines.dali:DaliEngine",
        "pip install 'fastload[dali]' (nvidia-dali-cuda120; CPU-only DALI works without a GPU)",
        requires="nvidia.dali",
        blocker=_dali_blocker,
    ),
}


def engine_class(name: str) -> Any:
    """The engine class registered as ``name``, imported now; a missing package says what to install."""
    try:
        spec = ENGINES[name]
    except KeyError:
        raise ConfigError(
            f"{name!r} is not an engine fastload has; use one of {', '.join(map(repr, ENGINES))}"
        ) from None
    module_name, class_name = spec.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingDependencyError(
            f"the {name} engine cannot be imported ({exc}); install it with: {spec.install}"
        ) from exc
    return getattr(module, class_name)


def blocker_of(name: str, request: EngineRequest) -> FastloadError | None:
    """Why engine ``name`` cannot run ``request``, as the error that forcing it raises.

    :class:`~fastload.errors.BackendUnavailable` for the engine's own limits (checked first),
    :class:`~fastload.errors.MissingDependencyError` for a package that is not installed;
    None when it can run.
    """
    spec = ENGINES[name]
    why = spec.blocker(request) if spec.blocker is not None else None
    if why is not None:
        return BackendUnavailable(why)
    if spec.requires is None:
        return None
    try:
        importlib.import_module(spec.requires)
    except ImportError as exc:
        return MissingDependencyError(
            f"{spec.requires} does not import ({exc}); install it with: {spec.install}"
        )
    return None


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
    declared pipeline DALI can run; otherwise torch. A forced engine that cannot run raises
    :class:`~fastload.errors.BackendUnavailable` with the reason and the fix.

    Args:
        batched: whether the loader yields batches (``batch_size`` or ``batch_sampler`` set).
        collate_fn, worker_init_fn: the user's, if any (only torch workers can run them).
        cuda_available: whether a CUDA GPU can be used; None asks torch.
    """
    if requested not in BACKENDS:
        raise ConfigError(
            f"backend={requested!r} is not an engine; use one of {', '.join(map(repr, BACKENDS))}"
        )
    request = EngineRequest(dataset, device, batched, collate_fn, worker_init_fn, cuda_available)
    if requested == "torch":
        return Choice("torch", "torch: backend='torch' was requested")
    blocker = blocker_of("dali", request)
    if requested == "dali":
        if blocker is not None:
            raise type(blocker)(
                f"backend='dali' cannot run this loader: {blocker}. Pass backend='torch' or "
                "backend='auto' to run it on torch workers."
            )
        where = "GPU (mixed) decoding" if gpu_decoding(device, cuda_available) else "CPU-only DALI"
        return Choice("dali", f"dali: backend='dali' was requested; {where}")
    if blocker is not None:
        return Choice("torch", f"torch: {blocker}")
    if not _has_cuda(cuda_available):
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
    return _has_cuda(cuda_available) and not (device is not None and device.type == "cpu")


def _has_cuda(cuda_available: bool | None) -> bool:
    return cuda_available if cuda_available is not None else torch.cuda.is_available()
