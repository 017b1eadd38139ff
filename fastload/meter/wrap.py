"""A meter around any iterable of batches: a stock torch DataLoader, a DALI iterator.

:func:`measure` wraps the iterable in :class:`Metered`, whose every ``iter()`` is one pass of
a :class:`~fastload.meter.StarvationMeter`; the batches themselves are untouched (see
:func:`measure` for an example).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch.utils.data

from fastload.meter.hotpath import MeteredIterator
from fastload.meter.recorder import StarvationMeter


class Metered(Iterable[Any]):
    """An iterable of batches with a meter around it; see :func:`measure`.

    Each ``iter()`` starts a pass. ``len()`` and any other attribute (a DALI iterator's
    ``reset()``, a DataLoader's ``dataset``) are those of the wrapped iterable.
    """

    def __init__(self, iterable: Iterable[Any], meter: StarvationMeter) -> None:
        self.iterable = iterable
        self.meter = meter

    def __iter__(self) -> MeteredIterator:
        return self.meter.track(iter(self.iterable))

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("iterable", "meter"):  # not yet set (unpickling)
            raise AttributeError(name)
        return getattr(self.iterable, name)


def measure(
    iterable: Iterable[Any],
    *,
    meter: StarvationMeter | None = None,
    num_workers: int | None = None,
    log_every: int | None = None,
    gpu: bool | None = None,
) -> Metered:
    """Wrap any iterable of batches with a starvation meter; what it yields is unchanged.

    Use it to measure a stock ``torch.utils.data.DataLoader`` or a DALI iterator before
    switching to fastload. ``num_workers`` defaults to the iterable's own ``num_workers``
    attribute when it has one (torch's DataLoader does).

    Example::

        >>> from fastload.meter import measure
        >>> batches = measure(torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4))
        >>> for x, y in batches:
        ...     step(x, y)
        >>> print(batches.meter.summary())
    """
    if meter is None:
        workers = num_workers
        if workers is None and isinstance(getattr(iterable, "num_workers", None), int):
            workers = iterable.num_workers  # type: ignore[attr-defined]
        # A torch DataLoader with batch_size=None yields single samples.
        unbatched = isinstance(iterable, torch.utils.data.DataLoader) and (
            iterable.batch_size is None and iterable.batch_sampler is None
        )
        batch_size = 1 if unbatched else None
        meter = StarvationMeter(
            log_every=log_every, gpu=gpu, num_workers=workers, batch_size=batch_size
        )
        if isinstance(iterable, torch.utils.data.DataLoader) and batch_size is None:
            meter.count_by_sampler(iterable)
    elif num_workers is not None:
        meter.num_workers = num_workers
    return Metered(iterable, meter)
