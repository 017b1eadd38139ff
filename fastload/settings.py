"""Loader settings resolved from the machine: workers, pinned memory, prefetch, persistence.

The machine itself (cores, GPUs, ranks per node) is probed by :mod:`fastload.machine`.

A user who leaves ``num_workers``, ``pin_memory``, ``prefetch_factor`` or
``persistent_workers`` unset on :class:`fastload.DataLoader` gets the value chosen here, with
the reason::

    >>> loader = fastload.DataLoader(dataset, batch_size=256)
    >>> print(loader.settings)
    num_workers=8         auto         8 workers: min(8 per GPU, 15 of 16 usable cores / 1 rank) ...
    pin_memory=True       auto         a CUDA device is present ...

Precedence, resolved once when the loader is built: an explicit argument, then a
``FASTLOAD_<NAME>`` environment variable (``FASTLOAD_NUM_WORKERS=4``), then "auto".

An environment default applies only where it means something: with no worker processes,
``FASTLOAD_PREFETCH_FACTOR`` and ``FASTLOAD_PERSISTENT_WORKERS=1`` are ignored (torch refuses
both at ``num_workers=0``), and the setting's reason says so. The same values passed as
arguments reach torch unchanged, and torch's error with them: that is what the user wrote.

NOTE [auto never changes the batches]
"auto" may only pick what cannot change what a training loop receives. Worker processes
change results for datasets that draw random numbers from the main process's generator,
mutate themselves, return samples that cannot be pickled, create CUDA tensors or are not
safe to fork; persistent workers change results for datasets that change between epochs.

* Declared datasets: fastload's own (``ImageFolder``) and any whose class sets
  ``fastload_worker_safe = True`` get workers by the per-core/per-GPU rule, unprobed. For an
  ``IterableDataset`` the flag also promises that it splits its stream between workers (with
  ``torch.utils.data.get_worker_info()``), since otherwise each worker would yield every
  sample; undeclared iterable datasets keep torch's defaults (a probe cannot see duplicates).
  ``fastload_worker_safe = False`` declares a dataset unsafe: torch's defaults, no probe.
* Any other map-style dataset is probed (NOTE [the dataset probe] in
  ``fastload/tuning/probe.py``): a few samples fetched from a copy, the main process's RNG
  states compared and restored. Workers only when the probe shows they are safe (no
  mutation, pickles as the start method needs, CPU samples, no fork hazard, no exception)
  AND worth it (NOTE [workers from measurements] in ``fastload/tuning/workers.py``); else it
  stays in-process with the reason. A dataset whose samples depend only on the index gets
  the same batches either way. One that draws from the global RNG runs in workers seeded by
  torch exactly as torch's own (``num_workers`` from the cores only, so a seed reproduces
  it). Persistent workers only when the probe saw no mutation and there is no ``set_epoch``.
  ``FASTLOAD_PROBE=0`` turns the probe off: undeclared datasets then keep torch's defaults,
  with one warning per dataset type saying how to opt in.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import torch
from torch.utils.data import Dataset, IterableDataset

from fastload.errors import ConfigError

# Re-exported: `fastload.settings.Machine` (and the two probes) keep working.
from fastload.machine import Machine, local_world_size, usable_cpu_cores  # noqa: F401
from fastload.tuning import (
    DatasetProbe,
    choose_workers,
    probe_dataset,
    retune_workers,
    start_method,
)
from fastload.tuning.safety import (  # noqa: F401 - re-exported: fastload.settings.worker_safety
    WORKER_SAFE_ATTR,
    WorkerSafety,
    warn_undeclared,
    worker_safety,
)
from fastload.tuning.workers import MIN_SAMPLE_S, available_memory

logger = logging.getLogger(__name__)

AUTO: Literal["auto"] = "auto"
"""The default of every tunable loader argument: let fastload choose and explain why."""

WORKERS_PER_GPU = 8
"""Upper end of the common 4-8 workers per GPU rule; beyond it returns diminish."""

MAX_WORKERS_WITHOUT_GPU = 16

T = TypeVar("T")
Source = Literal["argument", "environment", "auto"]


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One resolved value, where it came from, and why."""

    value: T
    source: Source
    reason: str


@dataclass(frozen=True)
class LoaderSettings:
    """The resolved tunables of one loader. ``print(loader.settings)`` shows a table."""

    num_workers: Setting[int]
    pin_memory: Setting[bool]
    prefetch_factor: Setting[int | None]
    persistent_workers: Setting[bool]
    machine: Machine = field(repr=False)
    probe: DatasetProbe | None = field(default=None, repr=False)
    """What the dataset probe measured (None: declared, explicit or FASTLOAD_PROBE=0)."""
    worker_limit: int | None = field(default=None, repr=False)
    """The most workers the probe's numbers allow (cores, memory); re-tuning stays below it."""
    engine: str | None = field(default=None, repr=False)
    """The engine decision as the loader states it (``loader.settings`` fills it in)."""
    dataset_note: str | None = field(default=None, repr=False)
    """What the dataset says about its samples (``ImageFolder.listing_note``: a reused
    listing's age and what it may leave out), shown last."""

    def items(self) -> list[tuple[str, Setting[Any]]]:
        return [
            ("num_workers", self.num_workers),
            ("pin_memory", self.pin_memory),
            ("prefetch_factor", self.prefetch_factor),
            ("persistent_workers", self.persistent_workers),
        ]

    def as_dict(self) -> dict[str, Any]:
        """Plain values, e.g. to log or to build a stock torch DataLoader with the same knobs."""
        return {name: s.value for name, s in self.items()}

    def __str__(self) -> str:
        rows = [f"{f'{name}={s.value}':<24} {s.source:<11} {s.reason}" for name, s in self.items()]
        m = self.machine
        rows.append(
            f"machine: {m.cpu_cores} usable CPU cores, {m.gpus} CUDA GPUs, "
            f"{m.local_world_size} rank(s) on this node"
        )
        if self.probe is not None:
            rows.append(self.probe.summary())
        if self.dataset_note:
            rows.append(f"dataset: {self.dataset_note}")
        if self.engine is not None:
            rows.append(f"engine: {self.engine}")
        return "\n".join(rows)


_ENV_MINIMUM = {"num_workers": 0, "prefetch_factor": 1}
"""The smallest value torch accepts for an integer setting read from the environment."""


def _from_env(name: str, parse: type) -> tuple[Any, Source] | None:
    raw = os.environ.get(f"FASTLOAD_{name.upper()}")
    if raw is None or raw.strip().lower() in ("", AUTO):
        return None
    raw = raw.strip()
    invalid = ConfigError(
        f"FASTLOAD_{name.upper()}={raw!r} is not a valid {parse.__name__}; "
        f"unset it or set it to 'auto' or a {parse.__name__}"
    )
    if parse is bool:
        lowered = raw.lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no"):
            raise invalid
        return lowered in ("1", "true", "yes"), "environment"
    try:
        value = parse(raw)
    except ValueError:
        raise invalid from None
    if name in _ENV_MINIMUM and value < _ENV_MINIMUM[name]:
        raise ConfigError(
            f"FASTLOAD_{name.upper()}={raw!r} is below {_ENV_MINIMUM[name]}, the least "
            f"{name} torch accepts; unset it or set it to 'auto' or an int >= "
            f"{_ENV_MINIMUM[name]}"
        )
    return value, "environment"


class Chosen(int):
    """An ``int`` that fastload chose for an "auto" setting, as the loader's public attribute
    shows it (``loader.num_workers``, ``loader.prefetch_factor``).

    NOTE [a rebuilt loader stays auto]
    Lightning and Accelerate re-create a DataLoader from its public attributes. A chosen
    count read back that way and passed to a new ``fastload.DataLoader`` is still fastload's
    choice, not the user's: :func:`resolve_settings` resolves it as "auto" again, so the
    rebuilt loader picks its engine as the first one did (an explicit ``num_workers`` would
    keep torch's workers). To torch and everyone else it is the plain number.
    """

    def __repr__(self) -> str:
        return int.__repr__(self)


def _explicit(name: str, value: Any, parse: type) -> tuple[Any, Source] | None:
    if isinstance(value, Chosen) or (isinstance(value, str) and value == AUTO):
        return _from_env(name, parse)
    if isinstance(value, str):  # any other value is torch's to check, but not a misspelt "auto"
        raise ConfigError(
            f"DataLoader({name}={value!r}): expected 'auto' or a {parse.__name__}, got a string; "
            f"pass {name}='auto' to let fastload choose"
        )
    return value, "argument"


def resolve_settings(
    dataset: Dataset,
    *,
    num_workers: int | Literal["auto"] = AUTO,
    pin_memory: bool | Literal["auto"] = AUTO,
    prefetch_factor: int | None | Literal["auto"] = AUTO,
    persistent_workers: bool | Literal["auto"] = AUTO,
    device: torch.device | None = None,
    machine: Machine | None = None,
    warn: bool = True,
    multiprocessing_context: Any = None,
    batch_size: int | None = 1,
) -> LoaderSettings:
    """Resolve the four tunables for ``dataset`` on ``machine`` (probed when not given).

    Explicit values are returned untouched (torch validates them); only "auto" is decided here.
    An undeclared map-style dataset is probed (NOTE [auto never changes the batches]) for
    workers started by ``multiprocessing_context`` (the loader's argument; None: the default
    start method) delivering batches of ``batch_size``.

    Example::

        >>> resolve_settings(folder, machine=Machine(cpu_cores=32, gpus=4)).num_workers.value
        8
    """
    machine = machine or Machine.probe()
    safety = worker_safety(dataset)
    safe, why_safe = safety.safe, safety.reason
    probe: DatasetProbe | None = None
    limit: int | None = None

    # num_workers
    chosen = _explicit("num_workers", num_workers, int)
    if chosen is not None:
        workers = Setting(chosen[0], chosen[1], "set by the user")
    elif safe:
        workers = _auto_workers(machine, why_safe)
    elif safety.known or isinstance(dataset, IterableDataset) or not probe_enabled():
        if warn and not safety.known:
            warn_undeclared(dataset, why_safe)
        hint = f"; declare {WORKER_SAFE_ATTR} = True to use workers" if not safety.known else ""
        if not safety.known and not isinstance(dataset, IterableDataset):
            hint += " (FASTLOAD_PROBE=0: not probed)"
        workers = Setting(0, "auto", f"torch's default kept: {why_safe}{hint}")
    else:
        probe = probe_dataset(dataset, context=start_method(multiprocessing_context))
        choice = choose_workers(
            probe, cores=machine.cores_per_rank, batch_size=batch_size,
            available_bytes=available_memory(),
        )
        workers, limit = Setting(choice.workers, "auto", choice.reason), choice.limit or None
        if warn and choice.workers == 0 and probe.blocker and (probe.wall_s or 0) >= MIN_SAMPLE_S:
            warn_undeclared(dataset, probe.blocker)  # it would gain from workers, but is not safe
    probed = probe is not None and workers.value > 0

    n = workers.value if isinstance(workers.value, int) else 0

    # prefetch_factor: more batches in flight absorb jitter; it never changes what is loaded.
    chosen = _explicit("prefetch_factor", prefetch_factor, int)
    if chosen is not None and chosen[1] == "environment" and n == 0:
        prefetch = _ignored("prefetch_factor", chosen[0], None, "nothing to prefetch")
    elif chosen is not None:
        prefetch = Setting(chosen[0], chosen[1], "set by the user")
    elif n == 0:
        prefetch = Setting(None, "auto", "no worker processes, nothing to prefetch")
    else:
        per_worker = min(8, max(2, math.ceil(8 / n)))
        prefetch = Setting(
            per_worker,
            "auto",
            f"{per_worker} batches per worker keep >= 8 batches in flight over {n} workers",
        )

    # pin_memory: pinned pages make host-to-device copies asynchronous and about 2x faster.
    chosen = _explicit("pin_memory", pin_memory, bool)
    if chosen is not None:
        pin = Setting(chosen[0], chosen[1], "set by the user")
    elif device is not None and device.type != "cuda":
        pin = Setting(False, "auto", f"batches stay on {device.type}: nothing to copy to a GPU")
    elif machine.gpus == 0:
        pin = Setting(False, "auto", "no CUDA device: pinned memory would only cost RAM")
    elif device is not None or safe:
        pin = Setting(True, "auto", "a CUDA device is present: pinned host memory copies async")
    elif probed:
        pin = Setting(True, "auto", "a CUDA device is present and the probe saw CPU samples: "
                      "pinned host memory copies async")
    else:
        pin = Setting(
            False,
            "auto",
            "torch's default kept: the dataset might return CUDA tensors, which cannot be "
            "pinned; pass pin_memory=True or device='cuda'",
        )

    # persistent_workers: keeps workers (and their open files and caches) between epochs.
    chosen = _explicit("persistent_workers", persistent_workers, bool)
    if chosen is not None and chosen[1] == "environment" and n == 0 and chosen[0]:
        persist = _ignored("persistent_workers", chosen[0], False, "no workers to keep")
    elif chosen is not None:
        persist = Setting(chosen[0], chosen[1], "set by the user")
    elif n == 0:
        persist = Setting(False, "auto", "no worker processes")
    elif safe and safety.keeps_state:
        persist = Setting(False, "auto", f"torch's default kept: {safety.keeps_state}")
    elif safe:
        persist = Setting(True, "auto", "declared dataset does not change between epochs")
    elif probed and probe is not None and probe.rng:
        persist = Setting(False, "auto", "torch's default kept: it draws from the global RNG, "
                          "and fresh workers each epoch are seeded as torch's are")
    elif probed and probe is not None and probe.set_epoch:
        persist = Setting(False, "auto", "torch's default kept: it has set_epoch, which "
                          "persistent workers would not see")
    elif probed:
        persist = Setting(True, "auto", "the probe saw no mutation: workers keep their copy "
                          "(and open files) between epochs")
    else:
        persist = Setting(
            False, "auto", "torch's default kept: the dataset may change between epochs"
        )

    try:
        note = getattr(dataset, "listing_note", None)
    except Exception:  # noqa: BLE001 - a __getattr__ that raises for any name: no note
        note = None
    return LoaderSettings(workers, pin, prefetch, persist, machine, probe, limit,
                          dataset_note=note if isinstance(note, str) else None)


def probe_enabled() -> bool:
    """Whether undeclared map-style datasets are probed: unless ``FASTLOAD_PROBE=0``."""
    return os.environ.get("FASTLOAD_PROBE", "1").strip().lower() not in ("0", "false", "no")


def retune(
    settings: LoaderSettings,
    *,
    input_bound: bool,
    workers_busy: float | None,
    cores: int,
    cpu_busy: float | None = None,
) -> Setting[int] | None:
    """The num_workers for the next epoch, or None to keep it (NOTE [workers from measurements]).

    ``input_bound``: the last epoch's loop waited on input; ``workers_busy``: the share of
    time the workers spent producing samples (0..1, None if unknown); ``cores``: usable
    cores now; ``cpu_busy``: the machine's CPU utilisation (0..1) if known. None when the
    user set num_workers (argument or environment), when the loader runs in-process, or for
    a dataset drawing from the global RNG (its batches depend on the worker count).

    Example::

        >>> retune(loader.settings, input_bound=True, workers_busy=0.95, cores=8)
        Setting(value=3, source='auto', reason='3 workers (was 2): ...')
    """
    current = settings.num_workers
    if current.source != "auto" or not isinstance(current.value, int):
        return None
    probe = settings.probe
    if probe is not None and probe.rng:
        return None
    limit = settings.worker_limit if settings.worker_limit is not None else max(1, cores)
    found = retune_workers(
        current.value, input_bound=input_bound, workers_busy=workers_busy, cores=cores,
        limit=limit, cpu_busy=cpu_busy,
    )
    return None if found is None else Setting(found[0], "auto", found[1])


def _ignored(name: str, env_value: Any, value: Any, why: str) -> Setting[Any]:
    """An environment default that does not apply with 0 workers (torch would refuse it)."""
    variable = f"FASTLOAD_{name.upper()}={env_value}"
    reason = (
        f"{variable} ignored: num_workers=0, {why}; torch accepts {name} only with "
        "num_workers > 0"
    )
    logger.info("%s: %s", name, reason)
    return Setting(value, "auto", reason)


def _auto_workers(machine: Machine, why_safe: str) -> Setting[int]:
    cores = machine.cores_per_rank
    ranks = f" / {machine.local_world_size} ranks" if machine.local_world_size > 1 else ""
    if machine.gpus > 0:
        n = max(1, min(WORKERS_PER_GPU, cores))
        reason = (
            f"{n} = min({WORKERS_PER_GPU} per GPU, {machine.cpu_cores} usable cores{ranks}); "
            f"{why_safe}"
        )
    else:
        n = max(1, min(MAX_WORKERS_WITHOUT_GPU, cores))
        reason = f"{n} = one per usable core ({machine.cpu_cores}{ranks}), no GPU; {why_safe}"
    return Setting(n, "auto", reason)
