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

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import torch
import torch.utils.data
from torch.utils.data import Dataset, IterableDataset, Sampler
from torch.utils.data.dataloader import default_collate, default_convert

from fastload import batchinfo
from fastload.device import DeviceFeeder, resolve_device
from fastload.images import ImageFolder
from fastload.sampling import EpochSampler
from fastload.settings import AUTO, LoaderSettings, resolve_settings

logger = logging.getLogger(__name__)

Auto = Literal["auto"]


class DataLoader(torch.utils.data.DataLoader):
    """A drop-in ``torch.utils.data.DataLoader`` whose unset knobs are tuned to the machine.

    Every argument of torch's DataLoader is accepted with the same meaning. The four tunables
    default to ``"auto"`` (see :mod:`fastload.settings`); fastload-only arguments are
    keyword-only:

    Args:
        device: put batches on this device ("cuda", "cuda:1", "cpu"); None leaves them on
            the host like torch. On CUDA the copy runs one batch ahead on a side stream.

    Attributes:
        settings: the resolved :class:`~fastload.settings.LoaderSettings` with reasons.
        epoch: how many times iteration has started (the current epoch is ``epoch - 1``).
        skipped: samples skipped in the last epoch under ``on_error="skip"``.

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
    ) -> None:
        target = resolve_device(device)
        settings = resolve_settings(
            dataset,
            num_workers=num_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            device=target,
        )
        declared = isinstance(dataset, ImageFolder)
        feeder = None
        if declared:
            # The sampler owns the epoch order and the per-sample seeds (NOTE [per-sample seeds]).
            if sampler is None and batch_sampler is None:
                sampler = EpochSampler(
                    dataset, shuffle=bool(shuffle), seed=_base_seed(dataset, generator),
                    tag_seeds=True,
                )
                shuffle = None
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

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if isinstance(self.sampler, EpochSampler):
            self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        inner = super().__iter__()
        if not self._declared and self._feeder is None:
            return inner
        return LoaderIterator(self, inner)


def _base_seed(dataset: ImageFolder, generator: torch.Generator | None) -> int:
    """The seed of a declared dataset's order and augmentation.

    ``torch.initial_seed()`` follows ``torch.manual_seed`` without consuming random numbers,
    so a fastload loader leaves torch's global random stream exactly where torch would.
    """
    if dataset.seed is not None:
        return dataset.seed
    return generator.initial_seed() if generator is not None else torch.initial_seed()


class LoaderIterator(Iterator[Any]):
    """The iterator of a fastload loader: unwraps worker envelopes, feeds the device.

    Attributes it does not define are read from torch's iterator underneath, so code that
    inspects ``_workers`` or calls ``_shutdown_workers()`` keeps working.
    """

    def __init__(self, loader: DataLoader, inner: Iterator[Any]) -> None:
        self._loader = loader
        self._inner = inner
        loader.skipped = []
        source: Iterator[Any] = self._unwrap(inner)
        if loader._feeder is not None:
            source = loader._feeder(source)
        self._source = source

    def _unwrap(self, inner: Iterator[Any]) -> Iterator[Any]:
        for item in inner:
            if isinstance(item, batchinfo.Envelope):
                if item.info.skipped:
                    self._loader.skipped.extend(item.info.skipped)
                if item.batch is None:  # every sample of this batch was skipped
                    continue
                item = item.batch
            yield item
        self._report_skipped()

    def _report_skipped(self) -> None:
        skipped = self._loader.skipped
        if skipped:
            shown = "; ".join(f"#{s.index} {s.path}" for s in skipped[:5])
            more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
            logger.warning(
                "epoch %d skipped %d unreadable samples (on_error='skip'): %s%s",
                self._loader.epoch - 1, len(skipped), shown, more,
            )

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> Any:
        return next(self._source)

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
