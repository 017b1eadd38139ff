"""The probe's samples, served once in the loader's first epoch instead of being fetched again.

    >>> probe = probe_dataset(dataset)            # fetched indices 0..7 from a copy
    >>> probe.kept.count, probe.kept.note
    (8, '8 samples reused')
    >>> probe.kept.check(dataset)                 # at the first iter(loader): unchanged?
    True
    >>> probe.kept.serve(fetcher)                 # torch's fetcher now serves them, once each

NOTE [probe samples reused]
The probe (NOTE [the dataset probe] in :mod:`fastload.tuning.probe`) fetches the first
indices from a copy of the dataset. When what it saw says those samples are exactly what the
real dataset returns for those indices, they are kept and served in the first epoch instead
of being fetched again. The conditions, each a reason the line in ``loader.settings`` gives
when it says "fetched again":

* The probe is usable (no exception, picklable CPU samples, no CUDA, no fork hazard), the
  fetches drew nothing from the main process's global RNGs, mutated nothing the probe can
  see, and raised no warning (the real fetches show warnings, as without the probe).
* The dataset has no ``set_epoch`` (its samples may follow the epoch) and no ``__getitems__``
  (torch would fetch the batch with it, not index by index; torch's ``Subset`` over a dataset
  without one is fine: it indexes one by one).
* No sample shares memory or objects with the dataset (a view of its tensor, an element of
  its list): torch hands those over as they are, and a training loop that changes one in
  place changes the dataset; a kept copy would not.
* Bounded: the samples' pickled bytes, at most :data:`MAX_KEPT_BYTES` in all (the first ones
  up to that). Kept pickled, each is unpickled once when served.
* In-process, only when it pays: until every kept index has been served (with shuffling,
  most of the first epoch) each batch is checked for one, about :data:`CHECK_BATCH_S` plus
  :data:`CHECK_INDEX_S` per index, paid by the main process. Samples cheap enough to be kept
  in-process can cost less to fetch again than that (:meth:`KeptSamples.pays`); then they
  are fetched again. In workers the check is paid beside samples of a millisecond or more.
* The user's dataset still has the state the probe saw when the first epoch starts (its
  bounded fingerprint, :func:`fastload.tuning.state.fingerprint`): a dataset changed between
  building the loader and iterating it is fetched again.

Served once each, in whichever process fetches that index first in the first epoch: torch's
fetcher (``_MapDatasetFetcher``) gets an instance ``fetch`` that hands over the kept sample
when a batch holds a kept index (an ``int``, as torch's samplers yield), and calls torch's own
``fetch`` for every other batch. Once all are served it is removed (in-process), or returns
at the cost of one empty check per batch (workers). In the main process (``num_workers=0``)
the loader attaches it to its in-process iterator; in worker processes the loader's
``worker_init_fn`` carries the samples (:class:`fastload.meter.workers.MeasuredWorkerInit`)
and attaches them to the first fetcher torch's worker loop makes. Later epochs, persistent
workers' later fetchers and a second iterator never see them; the main process drops them as
soon as the first epoch's iterator exists.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

from fastload.tuning.state import fingerprint

logger = logging.getLogger(__name__)

MAX_KEPT_BYTES = 4 << 20
"""Pickled bytes of the probe's samples kept at most (the first samples up to it)."""

# Measured on this project's 2-core VM (torch 2.14.1, Python 3.11): torch's own
# _MapDatasetFetcher over a dataset returning its index, identity collate, with and without
# 8 kept samples not yet served; minimum of 41 rounds of 2,000 batches: +0.76 us a batch of
# 8, +2.18 us a batch of 128.
CHECK_BATCH_S = 0.75e-6
"""Seconds per batch that looking for kept indices costs, besides the indices themselves."""

CHECK_INDEX_S = 0.012e-6
"""Seconds per index of a batch that looking for kept indices costs."""


class KeptSamples:
    """The probe's samples of one dataset, by index, until the first epoch serves them.

    Picklable: it travels to spawned workers inside the loader's ``worker_init_fn``, with the
    samples it holds at that moment. ``note`` says what happens to them, for
    ``loader.settings``.

    Args:
        blobs: index -> the sample, pickled.
        state: the fingerprint of the user's dataset when the probe ran (None: unchecked).
        fetch_s: the wall seconds the probe took to fetch these samples (what serving saves).
        capped: samples fetched but not kept (over :data:`MAX_KEPT_BYTES`).
    """

    def __init__(
        self, blobs: dict[int, bytes], state: Any = None, *, fetch_s: float = 0.0, capped: int = 0
    ) -> None:
        self._blobs: dict[int, bytes] | None = dict(blobs)
        self._state = state
        self.fetch_s = fetch_s
        self.count = len(blobs)
        self.nbytes = sum(len(b) for b in blobs.values())
        self.note = f"{self.count} sample{'s' if self.count != 1 else ''} reused"
        if capped:
            self.note += f" ({capped} more over the {MAX_KEPT_BYTES >> 20} MB kept at most)"

    @property
    def held(self) -> int:
        """Samples still held here (0 once served, dropped or sent with the workers)."""
        return len(self._blobs) if self._blobs else 0

    def check(self, dataset: Any) -> bool:
        """Whether ``dataset`` still has the state the probe saw; drops the samples if not."""
        if not self._blobs:
            return False
        if self._state is not None and fingerprint(dataset) != self._state:
            self.drop("samples fetched again: the dataset changed after the probe")
            logger.debug("dataset probe: %s", self.note)
            return False
        return True

    def pays(self, batches: int, batch_size: int) -> bool:
        """Whether serving saves more than looking for the kept indices in ``batches``
        batches of ``batch_size`` costs (in-process; NOTE [probe samples reused])."""
        return self.fetch_s >= batches * (CHECK_BATCH_S + CHECK_INDEX_S * max(1, batch_size))

    def drop(self, note: str | None = None) -> None:
        """Forget the samples (the main process, once the first epoch's workers have them)."""
        self._blobs = None
        if note is not None:
            self.note = note

    def serve(self, fetcher: Any) -> bool:
        """Make torch's map-style ``fetcher`` hand over these samples once each; take them.

        Returns whether it did: False for a fetcher of another shape, or with nothing held.
        """
        blobs, self._blobs = self._blobs, None
        if not blobs or not hasattr(fetcher, "auto_collation") or not callable(
            getattr(fetcher, "collate_fn", None)
        ):
            return False
        try:
            fetcher.fetch = _serving_fetch(fetcher, blobs)
        except (AttributeError, TypeError):  # a fetcher without instance attributes
            return False
        return True

    def __reduce__(self) -> Any:
        return (_rebuild, (self._blobs, self._state, self.fetch_s, self.count, self.nbytes, self.note))

    def __repr__(self) -> str:
        return f"KeptSamples({self.count} samples, {self.nbytes} bytes, {self.held} held)"


def _rebuild(
    blobs: dict[int, bytes] | None, state: Any, fetch_s: float, count: int, nbytes: int, note: str
) -> KeptSamples:
    kept = KeptSamples.__new__(KeptSamples)
    kept._blobs, kept._state, kept.fetch_s = blobs, state, fetch_s
    kept.count, kept.nbytes, kept.note = count, nbytes, note
    return kept


def _serving_fetch(fetcher: Any, blobs: dict[int, bytes]) -> Callable[[Any], Any]:
    """A ``fetch`` for ``fetcher`` that serves ``blobs`` once each and else is torch's own."""
    fetch = fetcher.fetch  # torch's bound method (a timer may wrap this function later)
    kept = blobs.keys()
    batched = bool(fetcher.auto_collation)

    def serving_fetch(index: Any) -> Any:
        if not blobs:
            return fetch(index)
        if batched:
            # Lists (torch's BatchSampler) and tuples only: any other batch of indices (a
            # generator, an array) goes to torch's fetch untouched, as it came.
            if type(index) not in (list, tuple) or kept.isdisjoint(index):
                return fetch(index)
            data = [_take(blobs, i, fetcher) for i in index]
        elif type(index) is int and index in blobs:
            data = _take(blobs, index, fetcher)
        else:
            return fetch(index)
        if not blobs and vars(fetcher).get("fetch") is serving_fetch:
            del fetcher.fetch  # all served: torch's own fetch again, nothing in between
        return fetcher.collate_fn(data)

    return serving_fetch


def _take(blobs: dict[int, bytes], index: Any, fetcher: Any) -> Any:
    """The kept sample of ``index`` (once), else the dataset's, as torch's fetch gets it."""
    if type(index) is int:
        blob = blobs.pop(index, None)
        if blob is not None:
            return pickle.loads(blob)
    return fetcher.dataset[index]
