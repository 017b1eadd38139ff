"""The DALI engine: a declared ImageFolder pipeline compiled to an NVIDIA DALI graph.

:class:`fastload.DataLoader` builds a :class:`DaliEngine` when it chooses DALI (see
:func:`fastload.engines.choose_backend`); users only see ``loader.backend == "dali"`` and
the same batches as the torch engine would give: ``[images, labels]``, images in the
pipeline's dtype, shape and layout, on the loader's device.

Example::

    >>> ds = ImageFolder("s3://bucket/train", size=224, train=True)
    >>> loader = DataLoader(ds, batch_size=256, shuffle=True, device="cuda")   # auto -> dali
    >>> loader.backend, loader.backend_reason
    ('dali', 'dali: CUDA GPU and nvidia-dali found; JPEGs decode on the GPU (nvJPEG)')

NOTE [one plan, two engines]
The order of an epoch and every augmentation come from the loader's sampler and the
per-sample seeds (NOTE [per-sample seeds] in sampling.py), never from DALI's own random
operators. For each sample a read thread fetches the bytes through ``dataset.read_bytes``
(fastload's storage and cache), reads the image size from the header with Pillow (no pixel
decode), and runs :meth:`ImagePipeline.plan` with the sample's seed: the same crop box,
output size and flip the torch engine computes. The DALI graph then does the pixel work:

    external_source (bytes, slice, ROI, size, flip)      one batch per call, in order
      -> decoders.image_slice   decode only the crop box (plus a filter margin); "mixed" on a GPU
      -> resize                 the fractional box (ROI) to the output size, antialiased linear
      -> crop_mirror_normalize  flip, layout CHW/HWC, uint8 or normalized float32

So labels, order, crops and flips are identical between engines and only resampling differs
(see docs/dali.md for the measured difference). DALI's own file reader is not used for
files: the plan needs each file's header and seed in Python anyway, so reading the bytes there
once is cheaper than letting DALI read every file a second time, and it keeps the cache in
the path. Local tar shards are the exception (NOTE [DALI's reader, exactly] in
:mod:`fastload.engines.dali_reader`): there DALI's webdataset reader reads the members in
the loader's exact order while the read threads read only each member's header for the plan.

NOTE [finding the bad file]
DALI reports a failed decode as one generic ``RuntimeError`` for the whole batch and its
pipeline is unusable afterwards. The engine keeps the bytes of every batch in flight, so on
such an error it decodes those bytes with Pillow (``Image.load()``) to find which samples
are corrupt: ``on_error="raise"`` raises :class:`CorruptSampleError` for the first one,
``"skip"`` records them, rebuilds the pipeline and feeds the batches in flight again
without them. The error is never classified by its message text.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import feed_ndarray
from PIL import Image

from fastload.data import batchinfo
from fastload.data.declared import DeclaredImages
from fastload.data.sample_errors import DECODE_ERRORS
from fastload.engines.base import Engine, EngineContext
from fastload.engines.dali_feed import Feed, Reader
from fastload.engines.dali_reader import (
    MEMBER_EXT,
    ReaderFiles,
    prepare_plan,
    reader_files,
    sample_bytes,
)
from fastload.engines.registry import gpu_decoding
from fastload.errors import BackendError

logger = logging.getLogger(__name__)

PIPELINE_DEPTH = 2
"""Batches DALI works on ahead of the one being consumed (its ``prefetch_queue_depth``)."""

_TORCH_DTYPES = {types.UINT8: torch.uint8, types.FLOAT: torch.float32}


def graph(dataset: DeclaredImages, feed: Feed, *, batch_size: int, num_threads: int,
           device_id: int | None, files: ReaderFiles | None = None) -> Pipeline:
    """The DALI pipeline of ``dataset.pipeline``: decode the box, resize, flip, layout, dtype.

    ``files``: the bytes come from DALI's webdataset reader (NOTE [DALI's reader, exactly])
    and ``feed`` gives the plans only; else ``feed`` gives bytes and plans. Everything after
    the read is the same graph, on the CPU or the GPU."""
    pipe = Pipeline(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=PIPELINE_DEPTH,
    )
    norm = dataset.pipeline.normalize
    with pipe:
        if files is None:
            data, anchor, shape, roi_start, roi_end, size, flip = fn.external_source(
                source=feed, num_outputs=7, batch=True,
                dtype=[types.UINT8] + [types.FLOAT] * 5 + [types.INT32],
            )
        else:
            data = fn.readers.webdataset(
                paths=files.paths, index_paths=files.index_paths, ext=[MEMBER_EXT],
                random_shuffle=False, missing_component_behavior="error",
            )
            anchor, shape, roi_start, roi_end, size, flip = fn.external_source(
                source=feed, num_outputs=6, batch=True, dtype=[types.FLOAT] * 5 + [types.INT32],
            )
        images = fn.decoders.image_slice(
            data, anchor, shape,
            device="mixed" if device_id is not None else "cpu",
            output_type=types.RGB,
            axis_names="WH",
            normalized_anchor=False,
            normalized_shape=False,
            adjust_orientation=False,  # Pillow (the torch engine) ignores EXIF orientation too
        )
        images = fn.resize(
            images, size=size, roi_start=roi_start, roi_end=roi_end,
            interp_type=types.INTERP_LINEAR, antialias=True,
        )
        images = fn.crop_mirror_normalize(
            images,
            mirror=flip,
            output_layout=dataset.pipeline.layout,
            dtype=types.FLOAT if norm is not None else types.UINT8,
            mean=[m * 255.0 for m in norm.mean] if norm is not None else [0.0],
            std=[s * 255.0 for s in norm.std] if norm is not None else [1.0],
        )
        pipe.set_outputs(images)
    pipe.build()
    return pipe


class DaliEngine(Engine):
    """Runs a declared :class:`ImageFolder` on DALI with the loader's batches and device.

    Args:
        dataset: the declared dataset (its pipeline as the loader runs it: without
            Normalize when the loader normalizes on the device).
        batch_sampler: the loader's batch sampler; iterated once per epoch, so order,
            drop_last, sharding and resume are the sampler's.
        batch_size: the largest batch; None if a user batch sampler decides.
        device: where batches go (None: host memory, like torch).
        num_threads: DALI's CPU threads.
        pin_memory: put host batches in pinned memory.
        shard_reader: let DALI's webdataset reader read local tar shards where that is
            exact (NOTE [DALI's reader, exactly]); False: always the byte feed.

    Example::

        >>> engine = DaliEngine(ds, loader.batch_sampler, batch_size=64, device=None)
        >>> images, labels = next(iter(engine.epoch())).batch
    """

    name = "dali"

    @classmethod
    def build(cls, context: EngineContext) -> DaliEngine:
        return cls(
            context.dataset, context.batch_sampler, batch_size=context.batch_size,
            device=context.device, num_threads=context.num_threads, pin_memory=context.pin_memory,
        )

    def __init__(
        self,
        dataset: DeclaredImages,
        batch_sampler: Iterable[list[int]],
        *,
        batch_size: int | None,
        device: torch.device | None,
        num_threads: int = 1,
        pin_memory: bool = False,
        shard_reader: bool = True,
    ) -> None:
        self.dataset = dataset
        self.shard_reader = shard_reader
        self.reads = "byte feed"
        """How the last epoch's bytes reach DALI, and why (NOTE [DALI's reader, exactly])."""
        self.batch_sampler = batch_sampler
        self.batch_size = batch_size
        self.device = device
        self.num_threads = max(1, num_threads)
        self.pin_memory = pin_memory and torch.cuda.is_available() and device is None
        self.device_id: int | None = None
        self._current: DaliEpoch | None = None
        if gpu_decoding(device, None):
            self.device_id = device.index if device is not None and device.index is not None \
                else torch.cuda.current_device()
        logger.info(
            "DALI engine: %s decoding, %d threads",
            f"GPU {self.device_id} (mixed)" if self.device_id is not None else "CPU", self.num_threads,
        )

    @property
    def ahead(self) -> int:
        return 2 * PIPELINE_DEPTH + 1  # read ahead of DALI, and DALI's own queue

    def epoch(self) -> DaliEpoch:
        """An iterator over one epoch's batches, each a :class:`batchinfo.Envelope`."""
        if self._current is not None:
            self._current.close()
        self._current = DaliEpoch(self)
        return self._current

    def close(self) -> None:
        """Stop the epoch in progress, if any: its read threads and its pipeline."""
        if self._current is not None:
            self._current.close()
            self._current = None

    def _build(self, feed: Feed, batch_size: int, files: ReaderFiles | None) -> Pipeline:
        return graph(self.dataset, feed, batch_size=batch_size, num_threads=self.num_threads,
                     device_id=self.device_id, files=files)

    def _to_torch(self, images: Any) -> torch.Tensor:
        """Copy DALI's output batch into a new torch tensor on the loader's device."""
        if self.device_id is not None and (self.device is None or self.device.type != "cuda"):
            images = images.as_cpu()
        if not images.is_dense_tensor():
            # Only a CenterCrop larger than an image gives mixed sizes; torch's collate
            # fails on them the same way.
            if hasattr(images, "as_cpu"):
                images = images.as_cpu()
            return torch.stack([torch.from_numpy(np.array(images[i])) for i in range(len(images))])
        tensor = images.as_tensor()
        dtype = _TORCH_DTYPES[tensor.dtype]
        if self.device_id is not None and self.device is not None and self.device.type == "cuda":
            out = torch.empty(tensor.shape(), dtype=dtype, device=self.device)
            return feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(self.device))
        out = torch.empty(tensor.shape(), dtype=dtype, pin_memory=self.pin_memory)
        return feed_ndarray(tensor, out)


class DaliEpoch(Iterator[batchinfo.Envelope]):
    """One epoch on DALI: yields envelopes in sampler order; ``len()`` is the batch count.

    A fresh DALI pipeline serves each epoch (building one takes milliseconds), so an epoch
    abandoned half-way leaves nothing behind for the next.
    """

    def __init__(self, engine: DaliEngine) -> None:
        self._engine = engine
        batches: Iterable[list[int]] = engine.batch_sampler
        self._len = len(batches)  # type: ignore[arg-type]
        self._batch_size = engine.batch_size
        if self._batch_size is None:  # a user batch sampler: its largest batch sizes DALI
            batches = list(batches)
            self._batch_size = max((len(b) for b in batches), default=1)
        self._files: ReaderFiles | None = None
        if engine.shard_reader:
            self._files, batches, engine.reads = reader_files(engine.dataset, batches, engine.batch_size)
        if self._files is None:
            self._reader = Reader(engine.dataset, batches, ahead=PIPELINE_DEPTH + 1)
            self._feed = Feed(self._reader)
        else:
            self._reader = Reader(engine.dataset, batches, ahead=PIPELINE_DEPTH + 1,
                                  prepare=prepare_plan)
            self._feed = Feed(self._reader, plans_only=self._batch_size)
        self._pipe: Pipeline | None = None
        self._gen = self._run()

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> DaliEpoch:
        return self

    def __next__(self) -> batchinfo.Envelope:
        return next(self._gen)

    def close(self) -> None:
        """Stop the read threads and drop the pipeline (also done at the end of the epoch)."""
        self._gen.close()

    def __del__(self) -> None:
        self._gen.close()

    def _start(self) -> None:
        self._pipe = self._engine._build(self._feed, self._batch_size or 1, self._files)
        self._pipe.schedule_run()  # pulls the first PIPELINE_DEPTH batches from the feed

    def _run(self) -> Iterator[batchinfo.Envelope]:
        feed = self._feed
        try:
            self._start()
            first = True
            while True:
                while feed.pending and not feed.pending[0].fed:
                    slot = feed.pending.popleft()
                    if slot.error is not None:
                        raise slot.error
                    yield batchinfo.Envelope(None, slot.info)
                if not feed.pending:
                    if feed.done:
                        return
                    self._pipe.schedule_run()
                    continue
                if not first:
                    self._pipe.schedule_run()  # keep PIPELINE_DEPTH batches in flight
                first = False
                start = time.perf_counter()
                try:
                    (images,) = self._pipe.outputs()
                except RuntimeError as exc:
                    self._recover(exc)
                    first = True
                    continue
                waited = time.perf_counter() - start
                slot = feed.pending.popleft()
                converted = time.perf_counter()
                images = self._engine._to_torch(images)
                if len(images) > len(slot.samples):  # the reader's padded last batch
                    images = images[: len(slot.samples)]
                batch = [
                    images,
                    self._engine.dataset.batch_targets([s.index for s in slot.samples]),
                ]
                slot.info.decode_s = waited
                slot.info.collate_s = time.perf_counter() - converted
                slot.info.samples = len(slot.samples)
                yield batchinfo.Envelope(batch, slot.info)
        finally:
            self._pipe = None
            self._reader.close()
            if self._files is not None:
                self._files.remove()

    def _recover(self, exc: RuntimeError) -> None:
        """DALI failed on a batch in flight: find the corrupt samples with Pillow, then
        raise, or drop them and rebuild the pipeline (NOTE [finding the bad file])."""
        dataset = self._engine.dataset
        self._pipe = None  # a DALI pipeline is unusable after an error
        found = False
        for slot in self._feed.pending:
            if not slot.fed:
                continue
            kept = []
            for sample in slot.samples:
                problem = _pillow_decode_error(sample_bytes(dataset, sample))
                if problem is None:
                    kept.append(sample)
                    continue
                found = True
                error = dataset.corrupt(sample.index, problem)
                if dataset.on_error == "raise":
                    raise error from exc
                slot.info.skipped.append(dataset.skipped(sample.index, error))
            slot.samples = kept
        if not found:
            first = next(s for s in self._feed.pending if s.fed).samples[0]
            raise BackendError(
                f"DALI failed on a batch whose images Pillow decodes (first: "
                f"{dataset.sample_url(first.index)}, index {first.index}): "
                f"{exc}. Run this dataset with backend='torch'."
            ) from exc
        logger.info("DALI pipeline rebuilt after skipping corrupt samples")
        self._feed.replay()
        self._start()


def _pillow_decode_error(data: np.ndarray) -> BaseException | None:
    """Why Pillow cannot decode these bytes, or None if it can."""
    try:
        with Image.open(io.BytesIO(data.tobytes())) as img:
            img.load()
    except DECODE_ERRORS as exc:
        return exc
    return None
