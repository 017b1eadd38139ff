"""The loader's first epoch: the probe's kept samples are served instead of fetched again.

NOTE [probe samples reused] (:mod:`fastload.tuning.reuse`) says when the probe keeps its
samples. Here the loader hands them over once, on its first iteration:

* the user's dataset is checked against the state the probe saw (changed: fetched again);
* in-process (``num_workers=0``) torch's single-process iterator has one fetcher, made when
  the iterator is built; the samples are attached to it (its ``_dataset_fetcher``, the one
  private attribute of torch's iterators read here);
* with worker processes the loader's ``worker_init_fn`` (a
  :class:`~fastload.meter.workers.MeasuredWorkerInit`) carries them into every worker of
  the first epoch: forked workers inherit them, spawned ones get them pickled when they
  start. Once the epoch's iterator exists the main process drops them, so workers started
  later (the next epoch's, or after a re-tune) never get them.

In-process they are kept only where serving pays (:meth:`KeptSamples.pays`): the main
process looks for kept indices in every batch until all are served.

Example::

    >>> kept = planned(loader, loader.settings.probe.kept)   # when the loader is built
    >>> make = epoch_maker(loader, kept)
    >>> inner = make()          # engine.epoch(), serving the kept samples
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fastload.tuning.reuse import KeptSamples

if TYPE_CHECKING:
    from fastload.loader.dataloader import DataLoader


def planned(loader: DataLoader, samples: KeptSamples | None) -> KeptSamples | None:
    """The samples the first epoch will serve: ``samples``, unless in-process serving would
    cost more than it saves (then dropped, and the probe's line says so)."""
    if samples is None or not samples.held or loader.num_workers > 0:
        return samples
    try:
        batches = len(loader)
    except Exception:  # noqa: BLE001 - a sampler without a (working) length: the cost is unknown
        batches = None
    size = loader.batch_size or 1
    if batches is None or not samples.pays(batches, size):
        samples.drop(
            f"samples fetched again: in-process, looking for them in every batch would cost "
            f"more than the {samples.fetch_s * 1e3:.2f} ms they took"
        )
        return None
    return samples


def epoch_maker(loader: DataLoader, samples: KeptSamples | None) -> Callable[[], Iterator[Any]]:
    """``loader.engine.epoch``, serving ``samples`` in the first iterator it makes."""
    make = loader.engine.epoch
    if samples is None or not samples.check(loader.dataset):
        return make
    pending = [samples]

    def first_epoch() -> Iterator[Any]:
        held, pending[0] = pending[0], None
        if held is None:  # a second call (a resume warming persistent workers): plain
            return make()
        try:
            inner = make()
            if loader.backend != "torch":
                held.drop(f"samples fetched again: the {loader.backend} engine fetches its own")
            elif loader.num_workers == 0:
                fetcher = getattr(inner, "_dataset_fetcher", None)
                if getattr(fetcher, "dataset", None) is not loader.dataset or not held.serve(fetcher):
                    held.drop("samples fetched again: torch's iterator has no fetcher to serve them")
        finally:
            held.drop()  # the workers have their own now; the main process keeps none
        return inner

    return first_epoch
