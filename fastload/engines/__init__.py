"""Engines: what runs a loader's epochs (torch workers, threads, NVIDIA DALI), behind one contract.

:mod:`fastload.engines.base` states the contract, :mod:`fastload.engines.registry` finds an
engine by name (importing it only when used) and chooses one for a loader with the reason;
:mod:`fastload.engines.probe` measures the candidates on a declared dataset's first epoch.
"""

from fastload.engines.base import Engine, EngineContext, EngineRequest, WorkerParts
from fastload.engines.registry import (
    BACKENDS,
    ENGINES,
    Backend,
    Choice,
    EngineSpec,
    blocker_of,
    choose_backend,
    engine_class,
    gpu_decoding,
)

__all__ = [
    "BACKENDS",
    "ENGINES",
    "Backend",
    "Choice",
    "Engine",
    "EngineContext",
    "EngineRequest",
    "EngineSpec",
    "WorkerParts",
    "blocker_of",
    "choose_backend",
    "engine_class",
    "gpu_decoding",
]
