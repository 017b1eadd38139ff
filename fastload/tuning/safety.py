"""Whether worker processes provably cannot change a dataset's samples (NOTE [auto never
changes the batches] in :mod:`fastload.settings`).

A dataset declares it with a class attribute (:data:`WORKER_SAFE_ATTR`); wrappers
(``Subset``, ``ConcatDataset``, ``ChainDataset``) are as safe as what they wrap; a webdataset
pipeline says it by splitting its shards by worker (NOTE [a webdataset pipeline's settings]
in :mod:`fastload.io.wds`). Anything else is not known: :mod:`fastload.settings` probes it or
keeps torch's defaults, warning once per type (:func:`warn_undeclared`).

Example::

    >>> worker_safety(fastload.ImageFolder("/data/train")).safe
    True
    >>> worker_safety(torch.utils.data.TensorDataset(x)).reason
    'TensorDataset is already in memory: workers would only add IPC cost'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.utils.data import ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset

from fastload.io.wds import PIPELINE_STATE, pipeline_workers

logger = logging.getLogger(__name__)

__all__ = ["WORKER_SAFE_ATTR", "WorkerSafety", "warn_undeclared", "worker_safety"]

WORKER_SAFE_ATTR = "fastload_worker_safe"
"""Class attribute by which a dataset declares that worker processes cannot change its samples."""


@dataclass(frozen=True)
class WorkerSafety:
    """Whether worker processes provably cannot change a dataset's samples (``safe``), why,
    and whether that is known (``known=False``: fastload cannot tell, and warns once)."""

    safe: bool
    reason: str
    known: bool = True
    keeps_state: str | None = None
    """Why persistent workers could change its samples although workers cannot (None: they
    cannot): a webdataset pipeline's stages carry state from one epoch to the next."""


def worker_safety(dataset: Dataset) -> WorkerSafety:
    """Decide NOTE [auto never changes the batches] for one dataset."""
    try:
        declared = getattr(dataset, WORKER_SAFE_ATTR, None)
    except Exception:  # noqa: BLE001 - a __getattr__ that raises for any name: nothing declared
        declared = None
    if declared is not None:
        return WorkerSafety(bool(declared), f"{type(dataset).__name__} declares {WORKER_SAFE_ATTR}={bool(declared)}")
    pipeline = pipeline_workers(dataset)
    if pipeline is not None:  # NOTE [a webdataset pipeline's settings] in fastload.io.wds
        return WorkerSafety(pipeline.splits, pipeline.reason, keeps_state=PIPELINE_STATE)
    if isinstance(dataset, Subset):
        return worker_safety(dataset.dataset)
    if isinstance(dataset, (ConcatDataset, ChainDataset)):
        verdicts = [worker_safety(d) for d in dataset.datasets]
        unsafe = next((v for v in verdicts if not v.safe), None)
        return unsafe or WorkerSafety(True, "every part of the concatenation is declared worker-safe")
    if isinstance(dataset, torch.utils.data.TensorDataset):
        return WorkerSafety(False, "TensorDataset is already in memory: workers would only add IPC cost")
    kind = "IterableDataset" if isinstance(dataset, IterableDataset) else "dataset"
    return WorkerSafety(
        False,
        f"{kind} {type(dataset).__name__} is not declared worker-safe",
        known=False,
    )


_warned_types: set[type] = set()


def warn_undeclared(dataset: Dataset, why: str) -> None:
    """Say once per dataset type that fastload kept torch's single-process default for it,
    why, and how to declare it worker-safe."""
    kind = type(dataset)
    if kind in _warned_types:
        return
    _warned_types.add(kind)
    if kind.__module__ == "builtins":  # a list or tuple: no class of the user's to mark
        how = "wrap it in a Dataset class that declares it, or pass num_workers=N"
    else:
        how = f"set `{WORKER_SAFE_ATTR} = True` on {kind.__name__}, or pass num_workers=N"
    logger.warning(
        "fastload kept torch's single-process default for %s: %s. If its samples depend only "
        "on the index (no main-process random numbers, no mutation, picklable CPU tensors, "
        "safe to fork), %s.",
        kind.__name__,
        why,
        how,
    )
