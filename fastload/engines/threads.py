"""The threaded image engine: a declared dataset decoded by threads of the loader's process.

No worker processes, no pickling, no per-sample tensors: a pool of threads reads each
sample's bytes (through the dataset's storage and cache), decodes only the region its crop
needs and resizes it straight into a preallocated uint8 batch (pinned when the batch goes
to a GPU). libjpeg-turbo and torch's kernels release the GIL, so the threads use every
core (:mod:`fastload.data.render` does the per-sample work).

Example::

    >>> loader = DataLoader(ImageFolder("data/train", size=224, train=True),
    ...                     batch_size=64, shuffle=True, backend="threads")
    >>> images, labels = next(iter(loader))      # uint8 (64, 3, 224, 224), int64 (64,)
    >>> loader.engine.decoder_reason
    'roi: 1.02 ms/image vs simplejpeg 1.41, pillow 1.58 (8 JPEGs, median)'

NOTE [two pools]
From a remote store, reads and pixels run on separate pools: reads wait and need many
threads in flight, pixel work needs one thread per core and no more, or the threads only
take turns. Both are queued chunk by chunk for ``AHEAD`` batches beyond the one the loop
consumes, so a pixel thread rarely waits for its chunk's bytes. Local files are read by the
pixel threads themselves (see READ_THREADS).

The order of samples and every augmentation come from the loader's batch plan and the
per-sample seeds (NOTE [one plan, two engines] in :mod:`fastload.engines.dali`), so this
engine gives the torch engine's labels, order, crops and flips. The rest of a user transform
that draws nothing (a Lambda, a Normalize fastload could not move: NOTE [which steps draw] in
:mod:`fastload.data.transforms`) runs on the pixel threads after the decode, concurrently and
touching no random generator; the batch is then collated from its outputs.

NOTE [abandoned reads]
torch's contract holds here as with worker processes: ``timeout=`` bounds the wait for
each batch (``RuntimeError: DataLoader timed out after N seconds``), and Ctrl-C ends an
epoch at once. The main thread only ever waits on futures (the first batch's decoder
measurement runs on a pixel thread too), and any exception out of ``__next__``
(KeyboardInterrupt, the timeout, a sample error) closes the epoch: queued reads and pixel
tasks are cancelled, running ones see the epoch closed and skip their remaining samples.
A read that never returns is abandoned: the pools' threads are daemon threads
(:mod:`fastload.engines.daemon_pool`), so it holds up neither the exit nor ``close()``
(which waits CLOSE_WAIT_S for running tasks, then leaves them to end on their own).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

import torch
from torch.utils.data import default_collate

from fastload.data import batchinfo, decoder_choice, decoders
from fastload.data.declared import DeclaredImages
from fastload.data.render import Renderer
from fastload.data.sample_errors import DECODE_ERRORS
from fastload.engines.base import Engine, EngineContext
from fastload.engines.daemon_pool import DaemonPool
from fastload.engines.intraop import one_intraop_thread
from fastload.engines.thread_batch import Batch, place
from fastload.errors import SampleError

logger = logging.getLogger(__name__)

READ_THREADS = 8
"""Reads in flight from a remote store; they release the GIL while they wait (NOTE [two pools]).
Local files are read by the pixel threads themselves: a read takes microseconds there, and
every extra Python thread competes with the pixel threads for the GIL (8 read threads cost
a third of the throughput on small images here: 2,076-2,392 img/s with 2, 1,700-1,802 with 8)."""

AHEAD = 2
"""Batches read and decoded ahead of the one the loop is consuming."""


PROBE_SAMPLES = 8
"""JPEGs of the first batch the decoders are measured on, before the epoch decodes them."""

CLOSE_WAIT_S = 1.0
"""How long :meth:`ThreadEngine.close` waits for running reads and decodes before leaving
them to end on their own (NOTE [abandoned reads])."""


class ThreadEngine(Engine):
    """Runs a declared dataset's epochs on threads (see the module's docstring).

    Args:
        dataset: the declared dataset (ImageFolder, TarShards, ParquetImages); its pipeline must end in a
            crop (one output size).
        batch_sampler: the loader's batch plan, iterated once per epoch.
        threads: pixel threads (one per usable core is right; see NOTE [two pools]).
        pin_memory: allocate batches in pinned memory (for a copy to a GPU).
        decoder: a decoder name of :data:`fastload.data.decoders.DECODERS`; None measures
            the available ones on the first batch's JPEGs and keeps the fastest.
        timeout: seconds to wait for a batch (0: forever), the loader's ``timeout`` as torch
            applies it to worker processes; past it, ``RuntimeError`` "DataLoader timed out
            after N seconds" (NOTE [abandoned reads]).
    """

    name = "threads"

    @classmethod
    def build(cls, context: EngineContext) -> ThreadEngine:
        return cls(
            context.dataset, context.batch_sampler, threads=context.num_threads,
            pin_memory=context.pin_memory and torch.cuda.is_available(),
            timeout=context.loader.timeout,
        )

    def __init__(
        self,
        dataset: DeclaredImages,
        batch_sampler: Iterable[list[int]],
        *,
        threads: int = 1,
        pin_memory: bool = False,
        decoder: str | None = None,
        timeout: float = 0,
    ) -> None:
        self.dataset = dataset
        self.timeout = timeout
        self.batch_sampler = batch_sampler
        self.threads = max(1, int(threads))
        self.pin_memory = pin_memory
        self.renderer: Renderer | None = None
        self.decoder_reason = "not chosen yet: measured on the first batch"
        if decoder is not None:
            self._use(decoders.by_name(decoder), f"{decoder}: requested")
        self._pools: tuple[DaemonPool | None, DaemonPool] | None = None
        # Weak: an epoch holds its engine, and a cycle would keep an abandoned loader's
        # threads alive until the cycle collector ran (the threads end when the pools go).
        self._current: weakref.ref[ThreadEpoch] | None = None
        self._setup_s = 0.0

    def _use(self, decoder: decoders.Decoder, reason: str) -> None:
        self.renderer = Renderer(self.dataset.pipeline, decoder)
        self.decoder_reason = reason
        logger.info("threaded engine: %d pixel threads; decoder %s", self.threads, reason)

    @property
    def ahead(self) -> int:
        return AHEAD + 1

    def pools(self) -> tuple[DaemonPool | None, DaemonPool]:
        """(reads, pixels); reads is None for local files, which the pixel threads read."""
        if self._pools is None:
            reads = None
            if not self.dataset.reads_local_files:
                reads = DaemonPool(READ_THREADS, "fastload-read")
            self._pools = (reads, DaemonPool(self.threads, "fastload-pixels", initializer=one_intraop_thread))
        return self._pools

    def epoch(self) -> ThreadEpoch:
        """An iterator over one epoch's batches, each a :class:`batchinfo.Envelope`."""
        self._close_current()
        epoch = ThreadEpoch(self)
        self._current = weakref.ref(epoch)
        return epoch

    def choose_decoder(self, data: list[bytes]) -> None:
        """Measure the decoders on these encoded samples and keep the fastest."""
        if self.renderer is not None:
            return
        size = self.dataset.pipeline.output_size or (224, 224)
        try:
            choice = decoder_choice.choose_once(data, out_size=size)
        except Exception as exc:  # no JPEG among them, or every one refused them
            logger.debug("decoder choice fell back to Pillow: %s", exc)
            self._use(decoders.DECODERS["pillow"], f"pillow: the measurement did not run ({exc})")
            return
        self._use(choice.decoder, choice.reason)

    def _close_current(self) -> None:
        epoch = self._current() if self._current is not None else None
        if epoch is not None:
            epoch.close()
        self._current = None

    def close(self) -> None:
        """Stop the epoch in progress and both thread pools: queued tasks are dropped,
        running ones get CLOSE_WAIT_S to end; a read that hangs is left to end on its own."""
        self._close_current()
        if self._pools is not None:
            deadline = time.monotonic() + CLOSE_WAIT_S
            left = []
            for pool in self._pools:
                if pool is not None:
                    left += pool.shutdown(wait_s=max(0.0, deadline - time.monotonic()))
            self._pools = None
            if left:
                logger.warning(
                    "threaded engine closed with %d threads still waiting on a read or a decode "
                    "(%s); they end when it returns and do not hold up the exit",
                    len(left), ", ".join(t.name for t in left))


class ThreadEpoch(Iterator[batchinfo.Envelope]):
    """One epoch on threads: envelopes in sampler order; ``len()`` is the batch count."""

    def __init__(self, engine: ThreadEngine) -> None:
        self._engine = engine
        self._dataset = engine.dataset
        self._batches = iter(engine.batch_sampler)
        self._len = len(engine.batch_sampler)  # type: ignore[arg-type]
        self._inflight: deque[Batch] = deque()
        self._closed = False
        self._exhausted = False
        self._timeout = engine.timeout
        self._served = 0  # batches handed out
        self._choice: Future[None] | None = None  # the first batch's decoder measurement
        self._collecting: Batch | None = None  # the batch __next__ waits for
        pipeline = self._dataset.pipeline
        size = pipeline.output_size
        assert size is not None, "the registry's blocker admits only pipelines that end in a crop"
        self._shape = (3, *size) if pipeline.layout == "CHW" else (*size, 3)
        self._norm = pipeline.normalize
        compiled = self._dataset.compiled  # the blocker admits only a rest that draws nothing
        self._rest = compiled if compiled is not None and compiled.rest is not None else None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> ThreadEpoch:
        return self

    def _submit(self) -> None:
        while not self._exhausted and len(self._inflight) <= AHEAD:
            try:
                indices = list(next(self._batches))  # SampleIndex: ints carrying their seeds
            except StopIteration:
                self._exhausted = True
                return
            reads, pixels = self._engine.pools()
            images = torch.empty((len(indices), *self._shape), dtype=torch.uint8,
                                 pin_memory=self._engine.pin_memory)
            batch = Batch(indices, images)
            if reads is not None:
                batch.reads = [reads.submit(self._read, indices[a:b]) for a, b in batch.chunks]
            if self._engine.renderer is None and self._choice is None:
                # The first batch: measure the decoders on it, on a pixel thread (the main
                # thread only waits on futures: NOTE [abandoned reads]). Queued before any
                # pixel task, so it runs first; every pixel task waits for it.
                self._choice = pixels.submit(self._choose, batch)
            batch.pixels = [pixels.submit(self._pixels, batch, c) for c in range(len(batch.chunks))]
            self._inflight.append(batch)

    def _choose(self, batch: Batch) -> None:
        """Measure the decoders on the first batch's readable bytes (at most PROBE_SAMPLES)."""
        if batch.reads is None:
            reads = self._read(batch.indices[:PROBE_SAMPLES])
        else:
            reads = [r for future in batch.reads for r in future.result()]
        if self._closed:  # the epoch ended while its reads waited: measure in the next one
            return
        readable = [d for d, _ in reads if isinstance(d, bytes) and d]
        self._engine.choose_decoder(readable[:PROBE_SAMPLES])

    def _read(self, indices: list[int]) -> list[tuple[Any, float]]:
        out: list[tuple[Any, float]] = []
        for index in indices:
            start = time.perf_counter()
            try:
                data: Any = b"" if self._closed else self._dataset.read_bytes(index)
            except SampleError as exc:  # this sample's failure, reported in its slot
                data = exc
            out.append((data, time.perf_counter() - start))
        return out

    def _pixels(self, batch: Batch, chunk: int) -> list[tuple[BaseException | None, float, float]]:
        first, stop = batch.chunks[chunk]
        if self._choice is not None:
            self._choice.result()  # the decoder measured on the first batch
        if self._closed:  # nobody reads this batch any more
            return []
        if batch.reads is not None:
            reads = batch.reads[chunk].result()
        else:
            reads = self._read(batch.indices[first:stop])
        renderer = self._engine.renderer
        assert renderer is not None
        out: list[tuple[BaseException | None, float, float]] = []
        for k, (data, fetch_s) in enumerate(reads, start=first):
            if self._closed or isinstance(data, BaseException):
                out.append((data if isinstance(data, BaseException) else None, fetch_s, 0.0))
                continue
            index = batch.indices[k]
            start = time.perf_counter()
            error: BaseException | None = None
            seed = self._dataset.sample_seed(index)
            try:
                renderer.render(data, seed, batch.images[k])
            except DECODE_ERRORS as exc:
                error = self._dataset.corrupt(index, exc)
                error.__cause__ = exc
            if error is None and self._rest is not None:
                try:
                    place(batch, k, self._rest.apply_rest(batch.images[k], seed, seeded=False))
                except Exception as exc:  # the user's step failed: raised as the torch engine would
                    error = exc
            out.append((error, fetch_s, time.perf_counter() - start))
        return out

    def __next__(self) -> batchinfo.Envelope:
        if self._closed:
            raise StopIteration
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        try:
            self._submit()
            if not self._inflight:
                raise StopIteration
            batch = self._collecting = self._inflight.popleft()
            self._submit()
            envelope = self._collect(batch, deadline)
            self._collecting = None
        except BaseException:  # Ctrl-C, a timeout, a sample error, the end: NOTE [abandoned reads]
            self.close()
            raise
        self._served += 1
        return envelope

    def _result(self, future: Future[Any], batch: Batch, deadline: float | None) -> Any:
        """A task's result, waiting at most until ``deadline`` (torch's timeout error past it)."""
        if deadline is None:
            return future.result()
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:  # TimeoutError itself from Python 3.11
            raise self._timed_out(batch) from None

    def _timed_out(self, batch: Batch) -> RuntimeError:
        """torch's timeout error, naming the sample the batch still waits for."""
        waiting, doing = None, "decoding"
        for c, (first, stop) in enumerate(batch.chunks):
            if batch.reads is not None and not batch.reads[c].done():
                waiting, doing = first, "reading"
                break
            if waiting is None and not batch.pixels[c].done():
                waiting = first
        where = ""
        if waiting is not None:
            index = batch.indices[waiting]
            url = self._dataset.storage.to_url(self._dataset.index.path(index))
            where = f": the threaded engine was still {doing} {url} (index {int(index)}) and more"
        return RuntimeError(
            f"DataLoader timed out after {self._timeout} seconds{where} for batch "
            f"{self._served + 1} of this epoch. Check that the storage answers, or raise timeout="
        )

    def _collect(self, batch: Batch, deadline: float | None = None) -> batchinfo.Envelope:
        dataset = self._dataset
        info = batchinfo.BatchInfo()
        keep: list[int] = []
        for (first, _), pixels in zip(batch.chunks, batch.pixels):
            results = self._result(pixels, batch, deadline)
            for k, (error, fetch_s, decode_s) in enumerate(results, start=first):
                info.fetch_s += fetch_s
                info.decode_s += decode_s
                if error is None:
                    keep.append(k)
                elif isinstance(error, SampleError) and dataset.on_error == "skip":
                    info.skipped.append(dataset.skipped(batch.indices[k], error))
                else:  # the first failure in sampler order, as the torch engine raises it
                    raise error
        info.samples = len(keep)
        if not keep:
            return batchinfo.Envelope(None, info)
        start = time.perf_counter()
        images = batch.images
        if self._rest is not None and batch.stacked is not None and all(batch.placed[k] for k in keep):
            images = batch.stacked if len(keep) == len(batch.indices) else batch.stacked[keep]
        elif self._rest is not None:
            images = default_collate([batch.stacked[k] if batch.placed[k] else batch.finished[k] for k in keep])
        elif len(keep) < len(batch.indices):
            images = images[keep]
        labels = dataset.batch_targets([batch.indices[k] for k in keep])  # with target_transform
        if self._norm is not None:
            images = self._norm.apply(images, dataset.pipeline.channel_dim + 1)
        info.collate_s = time.perf_counter() - start
        return batchinfo.Envelope([images, labels], info)

    def close(self) -> None:
        """Drop the batches in flight: their queued tasks are cancelled or return at once."""
        self._closed = True
        if self._choice is not None:
            self._choice.cancel()
        for batch in (*self._inflight, *([self._collecting] if self._collecting else [])):
            for future in (batch.reads or []) + batch.pixels:
                future.cancel()
        self._inflight.clear()
        self._collecting = None

    def __del__(self) -> None:
        self._closed = True
