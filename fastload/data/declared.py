"""The declared-dataset contract: what every fastload engine needs from an image dataset.

NOTE [a declared dataset]
fastload's in-process engines (threads, DALI) and its torch-worker path run a dataset whose
samples are *data*: the encoded bytes of sample ``i``, its label, and a declared
:class:`~fastload.data.pipeline.ImagePipeline` (plus the rest of a compiled user transform).
:class:`DeclaredImages` is that contract. A source implements four things:

* ``read_bytes(i)``: the encoded bytes of sample ``i`` (through the source's cache), raising
  :meth:`unreadable` on failure; ``read_batch(indices)`` optionally reads a batch at once;
* ``label(i)``: its integer label (``target_transform`` is applied here, in :meth:`target`);
* ``sample_name(i)`` and ``sample_url(i)``: what errors and skip records name;
* ``__len__``; and sets ``pipeline``, ``compiled``, ``on_error``, ``seed``,
  ``target_transform`` and ``cache`` (``reads_local_files`` says whether reads need threads
  of their own).

Everything else (seeded decode, ``on_error``, batches with skipped samples, errors crossing the
worker boundary, dropping Normalize for a device) lives here once, so
:class:`~fastload.ImageFolder`, its subclasses and :class:`~fastload.TarShards` behave
alike, and a new source needs no engine change. :func:`is_declared` is the engines' test.
A source may also give the loader an epoch order (:attr:`epoch_order`, e.g. shard-aware).

Example::

    >>> from fastload.data.declared import is_declared
    >>> is_declared(ImageFolder("data/train", size=224)), is_declared(range(3))
    (True, False)
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import torch
from torch.utils.data import Dataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from fastload.data import batchinfo, sample_errors
from fastload.data.folder_rules import READ_PATH, overridden
from fastload.data.pipeline import ImagePipeline, Normalize
from fastload.data.sample_errors import DECODE_ERRORS
from fastload.data.sampling import mix_seed
from fastload.data.transforms import CompiledTransform
from fastload.errors import CorruptSampleError, SampleError, StorageError, UnreadableSampleError

logger = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]

_each_sample = threading.local()  # .raising: a subclass's __getitem__ runs inside __getitems__

__all__ = ["DeclaredImages", "OnError", "is_declared"]


def source_class(cls: type) -> type:
    """fastload's own source class among ``cls`` and its bases (``ImageFolder``, ``TarShards``,
    ``ParquetImages``): what a user's subclass of it overrides is measured against it."""
    return next(c for c in cls.__mro__ if c.__module__.startswith("fastload."))


def is_declared(dataset: Any) -> bool:
    """Whether ``dataset`` meets the declared-dataset contract (NOTE [a declared dataset])."""
    return isinstance(dataset, DeclaredImages)


class DeclaredImages(Dataset, abc.ABC):
    """Base of fastload's declared image datasets (NOTE [a declared dataset]).

    Subclasses set ``pipeline``, ``compiled``, ``on_error``, ``seed`` and
    ``target_transform`` and implement :meth:`read_bytes`, :meth:`label`,
    :meth:`sample_name`, :meth:`sample_url` and ``__len__``.
    """

    pipeline: ImagePipeline
    compiled: CompiledTransform | None
    on_error: OnError
    seed: int | None
    target_transform: Any

    # What a source implements ------------------------------------------------------------

    @abc.abstractmethod
    def read_bytes(self, index: int) -> bytes:
        """The encoded bytes of sample ``index``; a failed read raises :meth:`unreadable`."""

    def read_batch(self, indices: Sequence[int]) -> list[bytes | Exception | None]:
        """The bytes of a batch's samples (or each read's error) read at once, or Nones: then
        each :meth:`load` reads its own."""
        return [None] * len(indices)

    @abc.abstractmethod
    def label(self, index: int) -> int:
        """The integer label of sample ``index``."""

    @abc.abstractmethod
    def sample_name(self, index: int) -> str:
        """The short name of sample ``index`` (a path) that skip records and errors carry."""

    @abc.abstractmethod
    def sample_url(self, index: int) -> str:
        """Where sample ``index`` lives, as a URL, for messages."""

    @property
    def cache(self) -> Any:
        """The cache reads go through, or None."""
        return None

    @property
    def reads_local_files(self) -> bool:
        """Whether reads are local (an engine then needs no read threads of its own)."""
        return False

    def fetch_fix(self) -> str | None:
        """What to change when reading this dataset's bytes holds the loop up, naming its URL
        and cache (NOTE [the source's own fix] in :mod:`.fetch_advice`); the loader's meter
        prints it. None: the meter's general advice."""
        return None

    def smaller_fix(self) -> str | None:
        """How to decode fewer pixels of this dataset when decoding holds the loop up, for
        the meter to print; None: the transcoded cache tier (an ImageFolder's)."""
        return None

    @property
    def reads_current_versions(self) -> bool:
        """Whether each read checks its object's version (then no revalidation per epoch)."""
        return False

    def revalidate(self) -> int:
        """Re-read versions before an epoch; the number of samples that changed."""
        return 0

    @property
    def epoch_order(self) -> Any:
        """An order for the loader's sampler (``permutation(seed, epoch, shuffle, replicas)``),
        or None for a uniform permutation (NOTE [shard-aware order] in :mod:`.shard_order`)."""
        return None

    def torch_only_reason(self) -> str | None:
        """Why only torch workers can run this dataset's samples, or None: a subclass that
        overrides the read path (``__getitem__``, ``__getitems__``, ``load``, ``finish``),
        which the in-process engines do not call."""
        base = source_class(type(self))
        own = overridden(type(self), base, READ_PATH)
        if own:
            methods = ", ".join(f"{base.__name__}.{name}" for name in own)
            return (
                f"{type(self).__name__} overrides {methods}; only torch workers call it "
                "(threads and DALI run the declared files and pipeline)"
            )
        return None

    @property
    def fastload_worker_safe(self) -> bool | None:
        """True: workers run it unprobed (NOTE [auto never changes the batches])."""
        return None if self.torch_only_reason() else True

    # What the contract gives -------------------------------------------------------------

    def target(self, label: int) -> Any:
        """A label as its sample carries it: ``target_transform(label)`` when one is given."""
        return label if self.target_transform is None else self.target_transform(label)

    def batch_targets(self, indices: Sequence[int]) -> Any:
        """The targets of a batch, collated as torch's default collate collates them (an
        int64 tensor without ``target_transform``); the threads and DALI engines use it."""
        labels = [self.label(i) for i in indices]
        if self.target_transform is None:
            return torch.tensor(labels, dtype=torch.int64)
        return default_collate([self.target_transform(label) for label in labels])

    def unreadable(self, index: int, exc: BaseException) -> UnreadableSampleError:
        """The error for sample ``index`` whose bytes cannot be read (``exc`` says why)."""
        return sample_errors.unreadable(self.sample_url(index), index, self.sample_name(index),
                                        exc, dataset=type(self).__name__)

    def corrupt(self, index: int, exc: BaseException) -> CorruptSampleError:
        """The error for sample ``index`` whose bytes do not decode (``exc`` says why)."""
        return sample_errors.corrupt(self.sample_url(index), index, self.sample_name(index), exc)

    def sample_seed(self, index: int) -> int:
        """Seed of a sample's augmentation: from its SampleIndex, else from ``seed`` or torch."""
        seed = getattr(index, "seed", None)
        if seed is not None:
            return seed
        if self.seed is not None:
            return mix_seed(self.seed, int(index))
        return int(torch.randint(0, 2**62, (1,)).item())

    def load(self, index: int, data: bytes | Exception | None = None) -> tuple[Any, Any]:
        """Read and transform one sample; errors name the sample and the index. ``data``: its
        bytes, or its read's error, where :meth:`read_batch` read them already."""
        label = self.label(index)
        start = time.perf_counter()
        if data is None:
            data = self.read_bytes(index)
        elif isinstance(data, Exception):
            if isinstance(data, (StorageError, OSError)):
                raise self.unreadable(index, data) from data
            raise data
        fetched = time.perf_counter()
        seed = self.sample_seed(index)
        try:
            pil = self.compiled is not None and self.compiled.takes_pil  # no tensor round trip
            image = self.pipeline.decode(data, seed) if pil else self.pipeline.run(data, seed)
        except DECODE_ERRORS as exc:
            raise self.corrupt(index, exc) from exc
        # outside the try: a transform's error is not a corrupt file
        image = self.finish(image, seed)
        batchinfo.record(fetched - start, time.perf_counter() - fetched, 1)
        return image, self.target(label)

    def finish(self, image: torch.Tensor, seed: int) -> Any:
        """The sample from the pipeline's ``image``: the rest of a user ``transform`` applied.

        Every engine calls this after ``pipeline.run(data, seed)`` with the same seed, so they
        all give the same sample; without a transform (or with one fully compiled) it returns
        ``image`` unchanged. Safe from several threads (NOTE [one lock for the global
        generators] in :mod:`fastload.data.transforms`). Example::

            >>> image = ds.pipeline.run(ds.read_bytes(3), seed=11)
            >>> sample = ds.finish(image, seed=11)      # == ds.load(SampleIndex(3, 11))[0]
        """
        return image if self.compiled is None else self.compiled.apply_rest(image, seed)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        try:
            return self.load(index)
        except SampleError as exc:
            return self._failed(exc)

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[Any, Any]]:
        """A batch's samples; under ``on_error="skip"`` failed ones are left out and recorded.

        Under ``on_error="raise"`` the first failure raises a SampleError; inside a worker
        process it comes back as a :class:`~fastload.data.batchinfo.FailedBatch` that raises it
        when looked at (NOTE [sample errors cross the process boundary]). A subclass's own
        ``__getitem__`` is called for each sample, as torch calls it without this method.
        """
        if type(self).__getitem__ is not DeclaredImages.__getitem__:
            return self._each(indices)
        batch = self._batch_bytes(indices)
        if self.on_error == "raise":
            try:
                return [self.load(i, data) for i, data in zip(indices, batch)]
            except SampleError as exc:
                return self._failed(exc)
        out = []
        for i, data in zip(indices, batch):
            try:
                out.append(self.load(i, data))
            except SampleError as exc:  # every read or decode failure of one sample
                batchinfo.record_skip(self.skipped(i, exc))
        return out

    def _batch_bytes(self, indices: Sequence[int]) -> list[bytes | Exception | None]:
        """:meth:`read_batch`, unless a subclass overrides :meth:`read_bytes` and not
        :meth:`read_batch`: then Nones, so each :meth:`load` reads through the subclass's own
        ``read_bytes`` (a decryption, say) on torch workers as the in-process engines do."""
        base = source_class(type(self))
        if overridden(type(self), base, ("read_bytes", "read_batch")) == ["read_bytes"]:
            return [None] * len(indices)
        return self.read_batch(indices)

    def skipped(self, index: int, exc: SampleError) -> batchinfo.Skipped:
        """The record of sample ``index`` skipped under ``on_error="skip"`` for ``exc``."""
        path = exc.path or self.sample_name(index)
        logger.debug("skipped sample %d (%s): %s", int(index), path, exc)
        return batchinfo.Skipped(int(index), path, str(exc))

    def _each(self, indices: Sequence[int]) -> Any:
        """A batch by a subclass's ``__getitem__``, sample by sample, with ``on_error``."""
        out = []
        _each_sample.raising = True  # DeclaredImages.__getitem__ raises, even in a worker
        try:
            for i in indices:
                try:
                    out.append(self[i])
                except SampleError as exc:
                    if self.on_error == "raise":
                        _each_sample.raising = False
                        return self._failed(exc)
                    batchinfo.record_skip(self.skipped(i, exc))
        finally:
            _each_sample.raising = False
        return out

    @staticmethod
    def _failed(exc: SampleError) -> batchinfo.FailedBatch:
        """Raise ``exc`` here, or in a worker hand it to the main process intact (NOTE
        [sample errors cross the process boundary] in :mod:`fastload.data.batchinfo`)."""
        if get_worker_info() is None or getattr(_each_sample, "raising", False):
            raise exc
        return batchinfo.FailedBatch(exc)

    def with_pipeline(self, pipeline: ImagePipeline) -> Any:
        """A copy over the same samples with another pipeline (used to move steps to a device)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.pipeline = pipeline
        return clone

    def without_normalize(self) -> tuple[Any, Normalize | None]:
        """This dataset emitting uint8 images, and the Normalize step it dropped, if any."""
        if self.compiled is not None and self.compiled.normalize is not None:
            # A transform's trailing Normalize runs after its rest, not in the pipeline.
            clone = self.with_pipeline(self.pipeline)
            clone.compiled, norm = self.compiled.without_normalize()
            return clone, norm
        norm = self.pipeline.normalize
        if norm is None:
            return self, None
        return self.with_pipeline(replace(self.pipeline).without_normalize()), norm
