"""``fastload.DataLoader``: torch's DataLoader with settings chosen from the machine.

It *is* a ``torch.utils.data.DataLoader`` (a subclass): same arguments, same meaning, same
batches in the same order for the same seed. What differs:

* ``num_workers``, ``pin_memory``, ``prefetch_factor`` and ``persistent_workers`` default
  to "auto" and are resolved by :mod:`fastload.settings`; ``loader.settings`` shows each
  value and why. An explicit value always wins.
* ``device="cuda"`` returns batches already on the GPU, copied one batch ahead on a side
  stream (:mod:`fastload.device`).
* Declared datasets (:class:`fastload.ImageFolder`, :class:`fastload.TarShards`: NOTE [a
  declared dataset]) get an epoch-seeded sampler (a shard-aware order for shards), per-sample
  augmentation seeds, worker timings carried with each batch, and ``on_error="skip"``
  reporting at the end of each epoch.

Example::

    from fastload import DataLoader               # was: from torch.utils.data import DataLoader
    loader = DataLoader(dataset, batch_size=256, shuffle=True)
    print(loader.settings)
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, Literal, TypeVar

import torch
import torch.utils.data
from torch.utils.data import Dataset, Sampler
from torch.utils.data.dataloader import default_collate, default_convert

from fastload.data.declared import is_declared
from fastload.data.sampling import EpochSampler
from fastload.device import resolve_device
from fastload.engines import Backend, Engine, WorkerParts, choose_backend
from fastload.engines.probe import ProbeEngine
from fastload.engines.threads import ThreadEngine
from fastload.io import wds
from fastload.loader import assembly, autotune, first_epoch, resume
from fastload.loader.iterator import epoch_iterator
from fastload.loader.plan import epoch_plan
from fastload.loader.state import LoaderState
from fastload.meter import StarvationMeter
from fastload.settings import AUTO, LoaderSettings, resolve_settings

logger = logging.getLogger(__name__)

Auto = Literal["auto"]

WORKER_COUNT_WARNING = "This DataLoader will create"
"""torch's warning for more workers than cores. NOTE [more workers than cores]: fastload
gives samples that mostly wait (measured by its probe) more workers than cores on purpose,
and says so in ``loader.settings``; torch's warning is silenced only for a count fastload
chose, never for one the user set."""
T_co = TypeVar("T_co", covariant=True)


# Generic like torch's, so annotations such as ``DataLoader[list[Tensor]]`` keep working.
class DataLoader(torch.utils.data.DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader`` whose unset knobs are tuned to the machine.

    Every argument of torch's DataLoader is accepted with the same meaning. The four tunables
    default to ``"auto"`` (see :mod:`fastload.settings`); fastload-only arguments are
    keyword-only:

    Args:
        device: put batches on this device ("cuda", "cuda:1", "cpu"); None leaves them on
            the host like torch. On CUDA the copy runs one batch ahead on a side stream.
        meter: the starvation meter (:mod:`fastload.meter`): True (default) attaches a new
            one, a :class:`~fastload.meter.StarvationMeter` is used as given, False turns it
            off (iteration then only counts batches for state_dict() around torch's iterator).
        backend: the engine, "auto" (default), "torch", "threads" or "dali"
            (:mod:`fastload.engines`): auto runs a plain dataset on torch workers, and a
            declared ImageFolder on whichever of threads, torch workers and DALI measured
            fastest on the first epoch's first batches (:mod:`fastload.engines.probe`;
            ``FASTLOAD_ENGINE_PROBE=0`` skips the measurement and uses threads); a forced
            engine that cannot run raises :class:`~fastload.errors.BackendUnavailable` saying why.

    Attributes:
        settings: the resolved :class:`~fastload.settings.LoaderSettings` with reasons.
        epoch: how many times iteration has started (the current epoch is ``epoch - 1``).
        skipped: samples skipped in the last epoch under ``on_error="skip"``.
        meter: the :class:`~fastload.meter.StarvationMeter`, or None with ``meter=False``;
            ``print(loader.meter.summary())`` says whether the loop waited for data and why.
        backend: the engine that runs the epochs, "torch", "threads" or "dali"; "auto"
            until the first epoch's measurement has chosen.
        backend_reason: why that engine was chosen, with the measured figures.
        engine: the :class:`~fastload.engines.Engine` itself; ``loader.engine.close()``
            stops its workers and threads.
        state: where the loader is (:class:`~fastload.loader.state.LoaderState`).

    Example::

        >>> loader = DataLoader(ImageFolder("data/train", size=224, train=True),
        ...                     batch_size=64, shuffle=True, device="cuda")
        >>> loader.settings.num_workers.value, loader.settings.num_workers.reason
        (8, '8 = min(8 per GPU, 32 usable cores); ImageFolder declares ...')
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler[list] | Iterable[list] | None = None,
        num_workers: int | Auto = AUTO,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool | Auto = AUTO,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None | Auto = AUTO,
        persistent_workers: bool | Auto = AUTO,
        pin_memory_device: str = "",
        in_order: bool = True,
        device: str | torch.device | None = None,
        meter: bool | StarvationMeter | None = True,
        backend: Backend = "auto",
    ) -> None:
        target = resolve_device(device)
        # webdataset pipelines: fastload:: URLs open here and in the workers; no shuffle/sampler
        worker_init = wds.prepare_loader(dataset, shuffle=shuffle, sampler=sampler,
                                         worker_init_fn=worker_init_fn)
        batched = batch_size is not None or batch_sampler is not None
        if collate_fn is (default_collate if batched else default_convert):
            collate_fn = None  # torch's default, as a rebuild reads it back: not a custom one
        settings = resolve_settings(
            dataset, num_workers=num_workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, device=target,
            multiprocessing_context=multiprocessing_context, batch_size=batch_size,
        )
        # The engine is chosen from what the user passed, before fastload wraps collate_fn.
        choice = choose_backend(
            backend, dataset, device=target, batched=batched,
            collate_fn=collate_fn, worker_init_fn=worker_init_fn,
            probe=os.environ.get("FASTLOAD_ENGINE_PROBE", "1") != "0",
            workers_set=settings.num_workers.source == "argument",
        )
        declared = is_declared(dataset)
        plan = epoch_plan(  # NOTE [the public plan and the rank's plan] in fastload.loader.plan
            dataset, sampler, batch_sampler, shuffle=shuffle, generator=generator,
            drop_last=drop_last, batch_size=batch_size if batch_sampler is None else None,
        )
        if plan.public is not None:
            sampler, shuffle = plan.public, None
        staged, collate, feeder = assembly.stages(dataset, collate_fn, batched=batched, device=target)
        # NOTE [probe samples reused]: served in the first epoch (fastload.loader.first_epoch).
        kept = settings.probe.kept if settings.probe is not None else None
        workers = settings.num_workers.value
        with warnings.catch_warnings():
            if settings.num_workers.source == "auto":  # NOTE [more workers than cores]
                warnings.filterwarnings("ignore", message=WORKER_COUNT_WARNING)
            # torch gets the user's own values (NOTE [what a rebuild copies]); a count that
            # fastload chose stays marked as chosen (NOTE [a rebuilt loader stays auto]).
            super().__init__(
                dataset,
                batch_size=batch_size,
                shuffle=shuffle,
                sampler=sampler,
                batch_sampler=batch_sampler,
                num_workers=assembly.as_set(settings.num_workers),
                collate_fn=collate_fn,
                pin_memory=settings.pin_memory.value,
                drop_last=drop_last,
                timeout=timeout,
                worker_init_fn=worker_init_fn,
                multiprocessing_context=multiprocessing_context,
                generator=generator,
                prefetch_factor=assembly.as_set(settings.prefetch_factor),
                persistent_workers=settings.persistent_workers.value,
                pin_memory_device=pin_memory_device,
                in_order=in_order,
            )
        parts = WorkerParts(collate, StarvationMeter.worker_init(
            worker_init, workers, meter if meter is not None else False, in_order=in_order,
            samples=kept,
        ))
        # fastload's own attributes are set past torch's __setattr__ (NOTE [attributes a
        # rebuild replays]); ``device`` and ``meter`` stay in vars(), so a rebuild keeps them.
        _keep(
            self, _settings=settings, device=target, skipped=[], _plan=plan, _parts=parts,
            _stage_dataset=staged, state=LoaderState(owns_sampler=plan.owned),
            _declared=declared, _feeder=feeder, _choice=choice, _meter_asked=meter,
            _worker_init=worker_init,
            _asked=dict(num_workers=num_workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor,
                        persistent_workers=persistent_workers, device=target, batch_size=batch_size,
                        multiprocessing_context=multiprocessing_context),
        )
        _keep(self, _kept=first_epoch.planned(self, kept))
        runs = assembly.engine_plan(plan, self)
        _keep(self, meter=assembly.attach_meter(meter, self, settings, target, feeder,
                                                declared=declared, plan=runs))
        _keep(self, _engine=assembly.build_engine(choice, self, settings, target, staged, runs))

    def __len__(self) -> int:
        """Batches of one whole epoch on this rank, as torch counts them.

        Also after :meth:`load_state_dict` mid-epoch: the resumed iteration yields only
        what is left of the epoch, but the epoch's length stays what it is (as torchdata's
        StatefulDataLoader counts it; Lightning and Accelerate read ``len()`` as the epoch
        length).
        """
        rank_sampler = self._plan.rank_sampler
        if rank_sampler is None:
            return super().__len__()
        self._follow_ranks(agree=False)  # NOTE [a loader built before the process group]
        samples = rank_sampler.full_len()
        if self.batch_sampler is None:
            return samples
        size = self.batch_size or 1
        return samples // size if self.drop_last else -(-samples // size)

    def _follow_ranks(self, *, agree: bool) -> None:
        """This rank's share as the ranks are now; before the first epoch, settings for them.

        NOTE [a loader built before the process group] in :mod:`fastload.loader.plan`: a
        loader built as one process and first used as a rank of several resolves its
        "auto" settings again (workers per rank follow the ranks on the node) and builds its
        engine anew; nothing has run on the old one yet.
        """
        if not self._plan.follow_ranks(agree=agree) or self.state.iterations:
            return
        settings = resolve_settings(self.dataset, **self._asked)
        if settings.as_dict() == self._settings.as_dict():
            _keep(self, _settings=settings)
            return
        self._engine.close()
        workers = settings.num_workers.value
        _keep(self, _settings=settings, num_workers=assembly.as_set(settings.num_workers),
              prefetch_factor=assembly.as_set(settings.prefetch_factor),
              pin_memory=settings.pin_memory.value, persistent_workers=settings.persistent_workers.value,
              _kept=None)
        self._parts.worker_init_fn = StarvationMeter.worker_init(
            self._worker_init, workers, self._meter_asked if self._meter_asked is not None else False,
            in_order=self.in_order,
        )
        runs = assembly.engine_plan(self._plan, self)
        if self.meter is not None:
            self.meter.num_workers = workers
            self.meter.watch_workers(self._parts.worker_init_fn if workers else None)
        _keep(self, _engine=assembly.build_engine(self._choice, self, settings, self.device,
                                                  self._stage_dataset, runs))
        logger.info("settings resolved again for %s", settings.machine)

    @property
    def settings(self) -> LoaderSettings:
        """The resolved settings with their reasons, and the engine decision."""
        return replace(self._settings, engine=self._engine_line())

    @settings.setter
    def settings(self, value: LoaderSettings) -> None:
        _keep(self, _settings=value)

    @property
    def epoch_sampler(self) -> EpochSampler | None:
        """fastload's sampler of this rank's share, which its engine runs; None when the
        user's sampler or batch sampler decides the order (NOTE [the public plan and the
        rank's plan])."""
        return self._plan.rank_sampler

    @property
    def worker_parts(self) -> WorkerParts:
        """fastload's own collate and worker init, which torch's workers run around the
        user's (NOTE [what a rebuild copies]); re-tuning replaces ``worker_init_fn`` here."""
        return self._parts

    def _engine_line(self) -> str:
        name = self.backend
        if name == "auto":
            return (
                f"{self._choice.reason}; after the first batches loader.backend says which "
                "won and loader.backend_reason by how much"
            )
        reason = self.backend_reason
        return reason if reason.startswith(f"{name}:") else f"{name}: {reason}"

    @property
    def backend(self) -> str:
        """The engine that runs the epochs; "auto" while the first epoch is measuring."""
        engine = self._engine
        if isinstance(engine, ProbeEngine):
            return engine.chosen_name or "auto"
        return self._choice.name

    @property
    def backend_reason(self) -> str:
        """Why :attr:`backend` runs the epochs, with the figures it was measured by."""
        engine = self._engine
        reason = engine.reason if isinstance(engine, ProbeEngine) and engine.reason else self._choice.reason
        chosen = engine.chosen if isinstance(engine, ProbeEngine) else engine
        if isinstance(chosen, ThreadEngine):
            reason += f"; JPEG decoder {chosen.decoder_reason}"
        public = self._plan.public
        if public is not None and public.iterations:
            reason += (
                f"; note: another DataLoader iterated this loader's sampler {public.iterations} "
                "time(s) (a framework rebuilt it as a plain torch DataLoader, as Accelerate's "
                "prepare() does): fastload's engine and meter do not run there "
                "(docs/integrations.md)"
            )
        return reason

    @property
    def engine(self) -> Engine:
        """The engine that runs this loader's epochs (:mod:`fastload.engines`); ``close()``
        on it stops its workers and threads."""
        return self._engine

    @property
    def epoch(self) -> int:
        """How many times iteration has started (the current epoch is ``epoch - 1``)."""
        return self.state.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.state.epoch = int(value)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        state = self.state
        if state.iterations > 0:  # not the first epoch of this object (nor a resumed one)
            self._revalidate()
            autotune.retune(self)
        if state.owns_sampler:
            self._follow_ranks(agree=True)  # NOTE [a loader built before the process group]
            self._plan.rank_sampler.set_epoch(state.epoch)
            self._plan.public.set_epoch(state.epoch)
        progress = resume.start_epoch(self, state)
        state.epoch += 1
        plan, state.replay, state.loaded = state.replay, None, None
        if state.first_rng is None:
            state.first_rng = progress.rng_state
        first: list[Any] = []
        make_inner, self._kept = first_epoch.epoch_maker(self, self._kept), None
        if plan is None:
            inner = make_inner()
        else:  # NOTE [two ways to resume]: replay
            inner, first = resume.begin(self, state, make_inner, plan)
            progress.batches = plan.batches
            if plan.rng_state is not None:
                progress.rng_state = plan.rng_state
            progress.reused = plan.warm is not None
        state.iterations += 1
        state.progress = progress
        return epoch_iterator(self, inner, progress, first, declared=self._declared, feeder=self._feeder)

    def _revalidate(self) -> None:
        """Before a later epoch: re-read a cached remote dataset's versions (NOTE [consistency]).

        One listing per epoch (``ImageFolder.revalidate``); none for a local one, whose reads
        stat each file. A shard dataset stats its files, cached or not (NOTE [shards are
        checked every epoch] in :mod:`fastload.data.sharded`). When files changed, persistent
        workers hold the old versions, so the engine restarts them: this epoch starts fresh
        workers (logged at INFO).
        """
        dataset = self._stage_dataset
        if not self._declared or dataset.reads_current_versions:
            return  # ImageFolder without a cache reads whole current objects: it returns 0
        if dataset.revalidate():
            self._engine.restart()
            self.state.first_rng = None  # the new workers start from this epoch's state

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch in progress and the batches already handed out.

        Save it with the model; :meth:`load_state_dict` on a new loader continues at the next
        unseen batch, in the same order, with the same augmentations (:mod:`fastload.loader.resume`).

        Example::

            >>> torch.save({"model": model.state_dict(), "data": loader.state_dict()}, path)
        """
        return resume.state_dict(self, self.state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the next ``iter(loader)`` resumes mid-epoch.

        Under torch.distributed every rank calls it; a different world size re-splits what is
        left of the epoch over the new ranks (see :func:`fastload.loader.resume.load_state_dict`).

        Example::

            >>> loader.load_state_dict(torch.load(path)["data"])
        """
        self._follow_ranks(agree=True)  # every rank loads: the same moment for all
        _keep(self, state=resume.load_state_dict(self, self.state, state_dict))


# NOTE [consistency]
# A cached remote dataset's cache keys carry each object's version from its listing (NOTE
# [cache keys]). Without revalidation an object rewritten between epochs would be served from
# the cache with its old bytes for as long as the loader lives. So every epoch after the first
# starts with one listing that refreshes the versions in the main process (workers get them
# with the dataset, or are restarted when they persist); a changed object then gets a new key
# and its new bytes. A local dataset needs none of this: each read stats its file (NOTE [a stat
# per local read] in fastload.cache.tiered). The full model: docs/reliability.md.


def _keep(loader: DataLoader, **values: Any) -> None:
    """Set fastload's own attributes past the class's ``__setattr__``.

    NOTE [attributes a rebuild replays]
    Lightning patches ``__setattr__`` of every DataLoader class to record attributes set
    after torch's ``__init__`` and replays them on a loader it re-creates. Where fastload
    was imported after Lightning patched (its ``__init__`` not patched, torch's is), every
    attribute fastload sets after ``super().__init__`` would be copied onto the new loader,
    its engine and state included. Set this way, they are not: a rebuilt loader builds its
    own. torch's ``__setattr__`` checks only its own attributes, none of these.
    """
    for name, value in values.items():
        object.__setattr__(loader, name, value)
