"""``fastload.DataLoader``: torch's DataLoader with settings chosen from the machine.

It *is* a ``torch.utils.data.DataLoader`` (a subclass): same arguments, same meaning, same
batches in the same order for the same seed. What differs:

* ``num_workers``, ``pin_memory``, ``prefetch_factor`` and ``persistent_workers`` default
  to "auto" and are resolved by :mod:`fastload.settings`; ``loader.settings`` shows each
  value and why. An explicit value always wins.
* ``device="cuda"`` returns batches already on the GPU, copied one batch ahead on a side
  stream (:mod:`fastload.device`).
* Declared datasets (:class:`fastload.ImageFolder`) get an epoch-seeded sampler, per-sample
  augmentation seeds, worker timings carried with each batch, and ``on_error="skip"``
  reporting at the end of each epoch.

Example::

    from fastload import DataLoader               # was: from torch.utils.data import DataLoader
    loader = DataLoader(dataset, batch_size=256, shuffle=True)
    print(loader.settings)
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

import torch
import torch.utils.data
from torch.utils.data import Dataset, IterableDataset, Sampler
from torch.utils.data.dataloader import default_collate, default_convert

from fastload import distributed
from fastload.data import batchinfo
from fastload.loader import resume
from fastload.engines import Backend, Choice, Engine, EngineContext, choose_backend, engine_class
from fastload.loader import prefetch
from fastload.device import DeviceFeeder, resolve_device
from fastload.errors import ConfigError
from fastload.data.images import ImageFolder
from fastload.meter import StarvationMeter
from fastload.data.sampling import EpochSampler
from fastload.settings import AUTO, LoaderSettings, resolve_settings

logger = logging.getLogger(__name__)

Auto = Literal["auto"]
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
        backend: the engine, "auto" (default), "torch" or "dali" (:mod:`fastload.engines`):
            auto runs a declared ImageFolder on DALI when nvidia-dali and a CUDA GPU are
            present, else on torch workers; a forced "dali" that cannot run raises
            :class:`~fastload.errors.BackendUnavailable` saying why.

    Attributes:
        settings: the resolved :class:`~fastload.settings.LoaderSettings` with reasons.
        epoch: how many times iteration has started (the current epoch is ``epoch - 1``).
        skipped: samples skipped in the last epoch under ``on_error="skip"``.
        meter: the :class:`~fastload.meter.StarvationMeter`, or None with ``meter=False``;
            ``print(loader.meter.summary())`` says whether the loop waited for data and why.
        backend: the engine that runs the epochs, "torch" or "dali".
        backend_reason: why that engine was chosen ("torch: no CUDA GPU, ...").

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
        meter: bool | StarvationMeter = True,
        backend: Backend = "auto",
    ) -> None:
        target = resolve_device(device)
        # The engine is chosen from what the user passed, before fastload wraps collate_fn.
        choice = choose_backend(
            backend, dataset, device=target, batched=batch_size is not None or batch_sampler is not None,
            collate_fn=collate_fn, worker_init_fn=worker_init_fn,
        )
        settings = resolve_settings(
            dataset,
            num_workers=num_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            device=target,
        )
        declared = isinstance(dataset, ImageFolder)
        ranks = distributed.rank_info()
        owns_sampler = sampler is None and batch_sampler is None and (
            declared or (ranks.distributed and not isinstance(dataset, IterableDataset))
        )
        if owns_sampler:
            # The sampler owns the epoch order, the rank's shard (NOTE [one seed for all ranks])
            # and the per-sample seeds of declared datasets (NOTE [per-sample seeds]).
            sampler = EpochSampler(
                dataset, shuffle=bool(shuffle),
                seed=distributed.agree_seed(_base_seed(dataset, generator), ranks),
                num_replicas=ranks.world_size, rank=ranks.rank, drop_last=drop_last,
                tag_seeds=declared,
            )
            shuffle = None
        feeder = None
        if declared:
            collate_fn = batchinfo.CollateWithInfo(
                collate_fn or (default_collate if (batch_size or batch_sampler) else default_convert)
            )
            if target is not None:
                dataset, norm = dataset.without_normalize()
                feeder = DeviceFeeder(target, norm, channel_dim=dataset.pipeline.channel_dim)
        elif target is not None:
            feeder = DeviceFeeder(target)

        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=settings.num_workers.value,
            collate_fn=collate_fn,
            pin_memory=settings.pin_memory.value,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=settings.prefetch_factor.value,
            persistent_workers=settings.persistent_workers.value,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self.settings: LoaderSettings = settings
        self.device = target
        self.epoch = 0
        self.skipped: list[batchinfo.Skipped] = []
        self._feeder = feeder
        self._declared = declared
        self._owns_sampler = owns_sampler  # only its own sampler gets set_epoch and resume
        self._progress: resume.Progress | None = None
        self._replay: resume.ReplayPlan | None = None
        self._loaded_state: dict[str, Any] | None = None
        self._iterations = 0  # iterators this object has started (torch reuses persistent ones)
        self._first_rng: torch.Tensor | None = None  # NOTE [persistent workers]
        self.meter: StarvationMeter | None = _attach_meter(meter, self, settings, target)
        self.backend: str = choice.name
        self.backend_reason: str = choice.reason
        self._engine = _build_engine(choice, self, settings, target)

    @property
    def engine(self) -> Engine:
        """The engine that runs this loader's epochs (:mod:`fastload.engines`); ``close()``
        on it stops its workers and threads."""
        return self._engine

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self.epoch > 0:
            _revalidate(self)
        if self._owns_sampler:
            self.sampler.set_epoch(self.epoch)
        progress = resume.start_epoch(self, self.epoch)
        self.epoch += 1
        plan, self._replay, self._loaded_state = self._replay, None, None
        if self._first_rng is None:
            self._first_rng = progress.rng_state
        first: list[Any] = []
        if plan is None:
            inner = self._epoch_batches()
        else:  # NOTE [two ways to resume]: replay
            inner, first = resume.begin(self, self._epoch_batches, plan)
            progress.batches = plan.batches
            if plan.rng_state is not None:
                progress.rng_state = plan.rng_state
            progress.reused = plan.warm is not None
        self._iterations += 1
        self._progress = progress
        return LoaderIterator(self, inner, progress, first)

    def _epoch_batches(self) -> Iterator[Any]:
        """This epoch's batches from the chosen engine (:mod:`fastload.engines`)."""
        return self._engine.epoch()

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch in progress and the batches already handed out.

        Save it with the model; :meth:`load_state_dict` on a new loader continues at the next
        unseen batch, in the same order, with the same augmentations (:mod:`fastload.loader.resume`).

        Example::

            >>> torch.save({"model": model.state_dict(), "data": loader.state_dict()}, path)
        """
        return resume.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the next ``iter(loader)`` resumes mid-epoch.

        Under torch.distributed every rank calls it; a different world size re-splits what is
        left of the epoch over the new ranks (see :func:`fastload.loader.resume.load_state_dict`).

        Example::

            >>> loader.load_state_dict(torch.load(path)["data"])
        """
        resume.load_state_dict(self, state_dict)


def _revalidate(loader: DataLoader) -> None:
    """Before a later epoch: re-read a cached dataset's versions (NOTE [consistency]).

    One listing per epoch (``ImageFolder.revalidate``). When files changed, persistent
    workers hold copies of the dataset with the old versions, so the engine restarts them:
    this epoch starts fresh workers from the dataset as it is now (logged at INFO).
    """
    dataset = loader.dataset
    revalidate = getattr(dataset, "revalidate", None)
    if revalidate is None or getattr(getattr(dataset, "storage", None), "cache", None) is None:
        return
    if revalidate() and loader._engine is not None:
        loader._engine.restart()


# NOTE [consistency]
# A cached dataset's cache keys carry each file's version from its listing (NOTE [cache
# keys]). Without revalidation a file rewritten between epochs would be served from the cache
# with its old bytes for as long as the loader lives. So every epoch after the first starts
# with one listing that refreshes the versions in the main process (workers get them with the
# dataset, or are restarted when they persist); a changed file then gets a new key and its
# new bytes. The full model, and what is guaranteed mid-epoch: docs/reliability.md.


def _build_engine(
    choice: Choice, loader: DataLoader, settings: LoaderSettings, device: torch.device | None
) -> Any:
    """The engine that runs the loader's epochs (:mod:`fastload.engines`)."""
    return engine_class(choice.name).build(EngineContext(
        loader=loader, dataset=loader.dataset, batch_sampler=loader.batch_sampler,
        batch_size=loader.batch_size, device=device, num_threads=settings.num_workers.value,
        pin_memory=settings.pin_memory.value,
        draws_like_torch=settings.persistent_workers.source == "auto",
    ))


def _attach_meter(
    meter: bool | StarvationMeter,
    loader: DataLoader,
    settings: LoaderSettings,
    device: torch.device | None,
) -> StarvationMeter | None:
    """The loader's meter, told what the diagnosis needs: workers, machine, device."""
    if meter is False:
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
    if device is not None and device.type == "cuda":
        meter.on_device = True
        if meter.gpu is None:
            meter.gpu = True
    meter.copy_split = loader._feeder is not None
    return meter


def _base_seed(dataset: Dataset, generator: torch.Generator | None) -> int:
    """The seed of an epoch-seeded order (and of a declared dataset's augmentation).

    ``torch.initial_seed()`` follows ``torch.manual_seed`` without consuming random numbers,
    so a fastload loader leaves torch's global random stream exactly where torch would.
    """
    seed = dataset.seed if isinstance(dataset, ImageFolder) else None
    if seed is not None:
        return seed
    return generator.initial_seed() if generator is not None else torch.initial_seed()


class LoaderIterator(Iterator[Any]):
    """The iterator of a fastload loader: unwraps worker envelopes, feeds the device, meters.

    Attributes it does not define are read from torch's iterator underneath, so code that
    inspects ``_workers`` or calls ``_shutdown_workers()`` keeps working. For a plain
    dataset without ``device=`` it calls torch's iterator directly (no generator between),
    so errors and ``StopIteration`` behave exactly as torch's.
    """

    def __init__(
        self,
        loader: DataLoader,
        inner: Iterator[Any],
        progress: resume.Progress | None = None,
        first: list[Any] | None = None,
    ) -> None:
        self._loader = loader
        self._inner = inner
        self._meter = loader.meter
        # NOTE [two ways to resume]: batches count when the user gets them; _unwrap records how
        # many of torch's items each one stands for (an all-skipped batch is never handed out).
        self._progress = progress or resume.Progress(loader.epoch - 1)
        self._counts: collections.deque[int] = collections.deque()
        loader.skipped = []
        source: Iterator[Any] = itertools.chain(first, inner) if first else inner
        if loader._declared or loader._feeder is not None:
            source = _unwrap(source, loader, self._meter, self._counts)
        if loader._declared:  # a cached ImageFolder: fetch the epoch's next items ahead
            source = prefetch.follow_loader(loader, source, start_batch=self._progress.batches)
        if loader._feeder is not None:
            source = loader._feeder(source)
        self._source = source
        self._next = (
            self._meter.track(source).__next__ if self._meter is not None else source.__next__
        )

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = self._next()
        except StopIteration:
            self._progress.done = True
            raise
        self._progress.batches += self._counts.popleft() if self._counts else 1
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _unwrap(
    inner: Iterator[Any],
    loader: DataLoader,
    meter: StarvationMeter | None,
    counts: collections.deque[int],
) -> Iterator[Any]:
    """Open worker envelopes: record their timings and skips, yield the bare batches.

    A module-level generator, not a method: it must not hold its LoaderIterator, or an
    abandoned iterator would live until the cycle collector runs and keep workers alive.
    """
    # With a feeder the meter splits the copy out of the wait: it needs the time spent
    # upstream of it (NOTE in fastload.meter.core on the copy column).
    upstream = meter if meter is not None and meter.copy_split else None
    perf = time.perf_counter
    pending = 0
    while True:
        began = perf()
        try:
            item = next(inner)
        except StopIteration:
            break
        finally:
            if upstream is not None:
                upstream.note_upstream(perf() - began)
        pending += 1
        if isinstance(item, batchinfo.Envelope):
            if meter is not None:
                info = item.info
                meter.note_work(info.fetch_s, info.decode_s, info.collate_s)
            if item.info.skipped:
                loader.skipped.extend(item.info.skipped)
            if item.info.error is not None:  # NOTE [sample errors cross the process boundary]
                raise item.info.error.exception()
            if item.batch is None:  # every sample of this batch was skipped
                continue
            item = item.batch
        counts.append(pending)
        pending = 0
        yield item
    _report_skipped(loader)


def _report_skipped(loader: DataLoader) -> None:
    skipped = loader.skipped
    if skipped:
        shown = "; ".join(f"#{s.index} {s.path}" for s in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        logger.warning(
            "epoch %d skipped %d unreadable samples (on_error='skip'): %s%s",
            loader.epoch - 1, len(skipped), shown, more,
        )
