"""The parts a :class:`fastload.DataLoader` is assembled from, built once when it is made.

The dataset as the engine runs it and the collate and device stages around it
(:func:`stages`), this rank's plan (:func:`engine_plan`), the meter (:func:`attach_meter`)
and the engine (:func:`build_engine`). ``fastload/loader/dataloader.py`` calls them in order.

Example::

    >>> staged, collate, feeder = stages(folder, None, batched=True, device=None)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset
from torch.utils.data.dataloader import default_collate, default_convert

from fastload.data import batchinfo
from fastload.data.declared import is_declared
from fastload.device import DeviceFeeder
from fastload.engines import Choice, EngineContext, engine_class
from fastload.engines.probe import ProbeEngine
from fastload.errors import ConfigError
from fastload.loader.plan import Plan
from fastload.meter import StarvationMeter
from fastload.settings import Chosen, LoaderSettings

if TYPE_CHECKING:
    from fastload.loader.dataloader import DataLoader


def stages(
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], Any] | None,
    *,
    batched: bool,
    device: torch.device | None,
) -> tuple[Dataset, Callable[[list[Any]], Any] | None, DeviceFeeder | None]:
    """The dataset, collate function and device feeder the loader runs with.

    A declared dataset's collate carries worker timings and skips in an envelope, and with a
    device its Normalize moves from the workers onto the device, batched.
    """
    if not is_declared(dataset):
        return dataset, collate_fn, DeviceFeeder(device) if device is not None else None
    collate = batchinfo.CollateWithInfo(collate_fn or (default_collate if batched else default_convert))
    if device is None:
        return dataset, collate, None
    dataset, norm = dataset.without_normalize()
    return dataset, collate, DeviceFeeder(device, norm, channel_dim=dataset.pipeline.channel_dim)


def build_engine(
    choice: Choice, loader: DataLoader, settings: LoaderSettings, device: torch.device | None,
    dataset: Dataset, plan: Any,
) -> Any:
    """The engine that runs the loader's epochs (:mod:`fastload.engines`) over ``dataset`` as
    it runs (staged) and this rank's ``plan``."""
    context = EngineContext(
        loader=loader, dataset=dataset, batch_sampler=plan,
        batch_size=loader.batch_size, device=device, num_threads=settings.num_workers.value,
        pin_memory=settings.pin_memory.value,
        draws_like_torch=settings.persistent_workers.source == "auto", parts=loader.worker_parts,
    )
    if choice.name == "probe":
        return ProbeEngine.build(context, choice)
    return engine_class(choice.name).build(context)


def attach_meter(
    meter: bool | StarvationMeter,
    loader: DataLoader,
    settings: LoaderSettings,
    device: torch.device | None,
    feeder: DeviceFeeder | None,
    *,
    declared: bool,
    plan: Any,
) -> StarvationMeter | None:
    """The loader's meter, told what the diagnosis needs: workers, machine, device; ``plan``
    is this rank's, which the engine runs."""
    if meter is False or meter is None:  # None: a rebuild of a loader built with meter=False
        return None
    if meter is True:
        meter = StarvationMeter()
    elif not isinstance(meter, StarvationMeter):
        raise ConfigError(
            f"DataLoader(meter={meter!r}): expected True, False or a "
            "fastload.meter.StarvationMeter"
        )
    meter.num_workers = settings.num_workers.value
    meter.machine = meter.machine or settings.machine
    if loader.batch_size is None and loader.batch_sampler is None:
        meter.batch_size = 1  # torch yields single samples
    elif not declared:  # a declared dataset may skip samples: counted by looking
        meter.count_by_sampler(loader, batch_sampler=plan)
    if device is not None and device.type == "cuda":
        meter.on_device = True
        if meter.gpu is None:
            meter.gpu = True
    meter.copy_split = feeder is not None
    meter.fetch_fix = loader.dataset.fetch_fix() if declared else None
    meter.smaller_fix = loader.dataset.smaller_fix() if declared else None
    meter.engine_of = _engine_of(loader)
    # The workers' own counters (fastload.meter.workers), when torch was given our init.
    meter.watch_workers(loader.worker_parts.worker_init_fn if meter.num_workers else None)
    return meter


def _engine_of(loader: DataLoader) -> Callable[[], str | None]:
    """``loader.backend`` while the loader lives (the meter may outlive it)."""
    ref = weakref.ref(loader)

    def name() -> str | None:
        held = ref()
        return None if held is None else held.backend

    return name


def engine_plan(plan: Plan, loader: DataLoader) -> Any:
    """This rank's plan: fastload's (NOTE [the public plan and the rank's plan]), else the
    loader's own batch sampler (or, unbatched, its sampler) as torch built it."""
    if plan.batches is not None:
        return plan.batches
    return loader.batch_sampler if loader.batch_sampler is not None else loader.sampler


def as_set(setting: Any) -> Any:
    """A setting's value as the loader's public attribute: a count fastload chose is a
    :class:`~fastload.settings.Chosen` (NOTE [a rebuilt loader stays auto])."""
    value = setting.value
    if setting.source != "argument" and isinstance(value, int) and not isinstance(value, bool):
        return Chosen(value)
    return value
