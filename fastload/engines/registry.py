"""The engines fastload can run a loader on, found by name and imported only when used.

Like fsspec's protocol registry, :data:`ENGINES` maps a name to a dotted import path, the
package it needs and an install hint, so an optional engine costs nothing until it is chosen
and says what to install when it is missing. Today:

* ``"torch"``: torch's own iterator and worker processes (:mod:`fastload.engines.torch`);
  it runs every dataset.
* ``"threads"``: a declared :class:`~fastload.ImageFolder` decoded by threads of the
  loader's process straight into uint8 batches (:mod:`fastload.engines.threads`).
* ``"dali"``: a declared :class:`~fastload.ImageFolder` pipeline compiled to NVIDIA DALI
  (:mod:`fastload.engines.dali`), decoding on the GPU where there is one.

:func:`choose_backend` is the facade's decision: it asks each engine whether it can run the
loader (its :class:`EngineSpec`'s ``blocker``, then its package) and returns the engine with
the reason, or the candidates the first epoch measures (:mod:`fastload.engines.probe`).

Example::

    >>> choice = choose_backend("auto", ImageFolder("data/train", size=224), device=None)
    >>> choice.name, choice.candidates
    ('probe', ('threads', 'torch', 'dali'))
    >>> engine_class("threads")
    <class 'fastload.engines.threads.ThreadEngine'>
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

Backend = Literal["auto", "torch", "threads", "dali"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "threads", "dali")


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


def _declared_blocker(request: EngineRequest) -> str | None:
    """Why an in-process image engine (threads, DALI) cannot run this loader, or None.

    They run a declared dataset's pipeline (NOTE [a declared dataset] in
    :mod:`fastload.data.declared`: an ImageFolder, TarShards, ParquetImages, ...) with one output size,
    batched, with fastload's own collation: what torch would give, without torch's workers.
    """
    from fastload.data.declared import is_declared
    from fastload.data.pipeline import STEP_TYPES

    dataset = request.dataset
    if not is_declared(dataset):
        return (
            f"the dataset is a {type(dataset).__name__}, not a declared fastload dataset "
            "(ImageFolder, TarShards, ParquetImages); only declared pipelines run outside torch workers"
        )
    own = dataset.torch_only_reason()  # a custom loader=, a subclass's own __getitem__
    if own is not None:
        return own
    custom = [type(s).__name__ for s in dataset.pipeline.steps if type(s) not in STEP_TYPES]
    if custom:
        return f"pipeline steps {custom} run only on torch workers"
    if dataset.pipeline.output_size is None:
        return (
            "the pipeline ends without a crop, so images keep their own sizes; batches of one "
            "tensor need one size (end the pipeline with CenterCrop or RandomResizedCrop)"
        )
    if request.collate_fn is not None:
        return "a custom collate_fn runs only on torch workers"
    if request.worker_init_fn is not None:
        return "worker_init_fn runs only in torch worker processes"
    if not request.batched:
        return "batch_size=None yields single samples; this engine yields batches"
    return None


def _dali_blocker(request: EngineRequest) -> str | None:
    """Why the DALI engine cannot give what torch would for this loader, or None if it can."""
    rest = _transform_rest(request)
    if rest is not None:
        names = ", ".join(rest.rest_names)
        return f"the transform's {names} run on torch tensors; DALI runs only the declared steps"
    steps = getattr(getattr(request.dataset, "pipeline", None), "steps", ())
    resampled = {getattr(s, "interpolation", "bilinear") for s in steps} - {"bilinear"}
    if resampled:
        return (f"the pipeline resizes with interpolation {', '.join(sorted(resampled))}; "
                "fastload's DALI graph resizes bilinear only")
    return _declared_blocker(request)


def _threads_blocker(request: EngineRequest) -> str | None:
    """Why the threaded engine cannot give what torch would for this loader, or None if it can."""
    why = _declared_blocker(request)
    rest = _transform_rest(request)
    if why is not None or rest is None:
        return why
    draws = rest.global_draws  # runs the rest once on a test image (NOTE [which steps draw])
    if draws:
        # NOTE [the rest of a transform stays in workers]: a step that draws from a global
        # generator would share it with the training loop (dropout, sampling) in threads of
        # the training process, while a sample's seed is set: each worker process has its own.
        return (
            f"the transform's {'; '.join(draws)}, which threads would share with the training "
            "loop, so the transform's rest runs in torch worker processes"
        )
    return None  # a rest that draws nothing runs on the threads, after the decode


def _transform_rest(request: EngineRequest) -> Any:
    """The dataset's compiled transform when steps of it did not compile into the decode, or None."""
    compiled = getattr(request.dataset, "compiled", None)  # ImageFolder(transform=...)
    if compiled is None or compiled.rest is None:
        return None
    return compiled


ENGINES: dict[str, EngineSpec] = {
    "torch": EngineSpec("fastload.engines.torch:TorchEngine"),
    "threads": EngineSpec("fastload.engines.threads:ThreadEngine", blocker=_threads_blocker),
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
    """The engine a loader runs on (``name``) and why (``reason``, shown as ``loader.backend_reason``).

    ``name`` is ``"probe"`` when the first epoch measures ``candidates`` on its first batches
    and keeps the fastest, or a lighter one within 10% of it (:mod:`fastload.engines.probe`).
    """

    name: str
    reason: str
    candidates: tuple[str, ...] = ()


def choose_backend(
    requested: str,
    dataset: Dataset,
    *,
    device: torch.device | None,
    batched: bool = True,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
    cuda_available: bool | None = None,
    probe: bool = True,
    workers_set: bool = False,
) -> Choice:
    """Pick the engine for a loader: ``requested`` is ``"auto"`` or an engine's name.

    "auto" runs a plain dataset on torch. A declared dataset that the in-process engines
    can run gets measured: the threaded engine, torch workers and (when nvidia-dali imports)
    DALI each run a few batches of the first epoch and the fastest is kept, or a lighter
    one within 10% of it (``probe=False``: the threaded engine, without measuring). A forced
    engine that cannot run raises :class:`~fastload.errors.BackendUnavailable` (or
    MissingDependencyError) with the fix.

    Args:
        batched: whether the loader yields batches (``batch_size`` or ``batch_sampler`` set).
        collate_fn, worker_init_fn: the user's, if any (only torch workers can run them).
        cuda_available: whether a CUDA GPU can be used; None asks torch.
        probe: measure the candidates at the first epoch (``FASTLOAD_ENGINE_PROBE=0`` turns it off).
        workers_set: the user set ``num_workers`` (argument or ``FASTLOAD_NUM_WORKERS``):
            auto then runs torch's workers as asked.
    """
    if requested not in BACKENDS:
        raise ConfigError(
            f"backend={requested!r} is not an engine; use one of {', '.join(map(repr, BACKENDS))}"
        )
    request = EngineRequest(dataset, device, batched, collate_fn, worker_init_fn, cuda_available)
    if requested == "torch":
        return Choice("torch", "torch: backend='torch' was requested")
    if requested != "auto":
        blocker = blocker_of(requested, request)
        if blocker is not None:
            raise type(blocker)(
                f"backend={requested!r} cannot run this loader: {blocker}. Pass backend='torch' "
                "or backend='auto' to run it on torch workers."
            )
        return Choice(requested, f"{requested}: backend={requested!r} was requested{_where(requested, request)}")
    blocker = blocker_of("threads", request)
    if blocker is not None:
        return Choice("torch", f"torch: {blocker}")
    if workers_set:
        return Choice("torch", "torch: num_workers was set, so torch's workers run as asked "
                      "(leave it unset, or pass backend='threads', to use the threaded engine)")
    dali = blocker_of("dali", request) is None
    if not probe:
        return Choice("threads", "threads: the probe is off (FASTLOAD_ENGINE_PROBE=0); a declared "
                      "ImageFolder decodes on threads of this process, no workers to start or feed")
    candidates = ("threads", "torch", "dali") if dali else ("threads", "torch")
    return Choice(
        "probe",
        f"auto: the first epoch measures {', '.join(candidates)} on its first batches and keeps "
        "the fastest (a lighter one within 10% of it)",
        candidates,
    )


def _where(name: str, request: EngineRequest) -> str:
    if name != "dali":
        return ""
    gpu = gpu_decoding(request.device, request.cuda_available)
    return "; GPU (mixed) decoding" if gpu else "; CPU-only DALI"


def gpu_decoding(device: torch.device | None, cuda_available: bool | None) -> bool:
    """Whether DALI decodes "mixed" (on the GPU): a GPU exists and the user did not ask for the CPU."""
    return _has_cuda(cuda_available) and not (device is not None and device.type == "cpu")


def _has_cuda(cuda_available: bool | None) -> bool:
    return cuda_available if cuda_available is not None else torch.cuda.is_available()
