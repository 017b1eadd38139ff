"""DALI's own webdataset reader for local tar shards, in exactly the loader's order.

NOTE [DALI's reader, exactly]
For a :class:`~fastload.TarShards` on local paths the DALI engine can let
``fn.readers.webdataset`` read the members instead of feeding it the bytes
(:mod:`fastload.engines.dali_feed`). The order, the rank's share, a resumed epoch and every
augmentation stay the loader's:

* The epoch's batches (the sampler's, as always) are cut into *runs*: consecutive samples of
  one shard. Each run gets an index file in DALI's ``wds2idx`` v1.2 format listing its
  members' offsets from the shard index, in the run's order, and the reader gets
  ``paths`` = each run's shard and ``index_paths`` = each run's index, in order, with
  ``random_shuffle=False``: DALI reads the listed members in the listed order (it seeks to
  each offset), so it reads exactly the sampler's sequence. DALI's own shuffling and
  sharding (``shard_id``/``num_shards``) are never used.
* The plan (crop box, output size, flip from the sample's seed) needs the image's size, so
  the read threads read each member's header (its first 64 KiB) and plan in Python, as the
  byte feed does with the whole member; the external source carries the plans only.
* The reader always fills a batch: a short last batch gets its plans padded with the last
  sample's and the outputs past it are dropped.

It is used only where that is exact and pays (:func:`reader_files`): local shards, batches of
the loader's batch size, ``on_error="raise"`` (a skipped sample would leave the reader's
sequence), and at most :data:`RUNS_PER_SHARD` runs per shard read (storage order,
``shuffle=False``, ``shuffle_window=1``, a rank's block, a resumed rest): a shuffled window
makes a run of about one sample, which would be an index file per sample. Anything else gets the byte feed. Measured on CPU
DALI (benchmarks/dali_shards_reader.py, 2 shared cores) it gives identical batches 4-18%
faster than the byte feed; the GPU path runs the same graph with a "mixed" decoder and has
not been run (no GPU where it was written).
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from fastload.data.declared import DeclaredImages
from fastload.data.sample_errors import DECODE_ERRORS
from fastload.data.shards import TarShards
from fastload.engines.dali_feed import Sample

logger = logging.getLogger(__name__)

RUNS_PER_SHARD = 2
"""Runs per shard read, at most, for DALI's reader; a shuffled window makes one per sample."""
PEEK_BATCHES = 4
"""Batches looked at before the epoch is taken whole: a shuffled order shows itself there."""
HEADER_BYTES = 65536
"""Bytes of a member read for its image size; more when its header does not fit."""
MEMBER_EXT = "img"
"""The extension the run index files give every image member (DALI reads it by that name)."""


@dataclass
class ReaderFiles:
    """What ``fn.readers.webdataset`` reads for one epoch: paths and run index files."""

    paths: list[str]
    index_paths: list[str]
    folder: str

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _runs(dataset: TarShards, order: list[int]) -> list[tuple[int, list[int]]]:
    runs: list[tuple[int, list[int]]] = []
    shards = dataset.index.shards
    for i in order:
        shard = int(shards[int(i)])
        if runs and runs[-1][0] == shard:
            runs[-1][1].append(i)
        else:
            runs.append((shard, [i]))
    return runs


def _few_runs(dataset: TarShards, runs: list[tuple[int, list[int]]]) -> bool:
    return len(runs) <= RUNS_PER_SHARD * len({shard for shard, _ in runs})


def why_not(dataset: DeclaredImages, batch_size: int | None) -> str | None:
    """Why DALI's reader cannot read this dataset at all (None: it may, per epoch)."""
    if not isinstance(dataset, TarShards):
        return "not tar shards"
    if not dataset.reads_local_files:
        return "remote shards: DALI's reader needs local paths"
    if dataset.on_error != "raise":
        return "on_error='skip' would leave the reader's sequence"
    if batch_size is None:
        return "a batch sampler of the user's decides the batch sizes"
    return None


def reader_files(
    dataset: DeclaredImages, batches: Iterable[list[int]], batch_size: int | None,
) -> tuple[ReaderFiles | None, Iterable[list[int]], str]:
    """Decide for one epoch (NOTE [DALI's reader, exactly]): the reader's files or None, the
    batches to run (the same ones, partly looked at), and the reason."""
    blocker = why_not(dataset, batch_size)
    if blocker is not None:
        return None, batches, f"byte feed: {blocker}"
    assert isinstance(dataset, TarShards)
    it = iter(batches)
    peeked = list(itertools.islice(it, PEEK_BATCHES))
    if not _few_runs(dataset, _runs(dataset, [i for b in peeked for i in b])):
        return None, itertools.chain(peeked, it), "byte feed: the order changes shards too often"
    whole = peeked + list(it)
    if any(len(b) != batch_size for b in whole[:-1]) or (whole and len(whole[-1]) > batch_size):
        return None, whole, "byte feed: batches of another size than the loader's"
    runs = _runs(dataset, [i for b in whole for i in b])
    if not runs or not _few_runs(dataset, runs):
        return None, whole, "byte feed: the order changes shards too often"
    folder = tempfile.mkdtemp(prefix="fastload-dali-runs-")
    paths, index_paths = [], []
    for k, (shard, rows) in enumerate(runs):
        lines = [f"v1.2 {len(rows)}"]
        lines += [f"{MEMBER_EXT} {int(dataset.index.offsets[int(i)])} "
                  f"{int(dataset.index.lengths[int(i)])} {k}-{n}.{MEMBER_EXT}"
                  for n, i in enumerate(rows)]
        path = os.path.join(folder, f"run-{k:06d}.idx")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        paths.append(dataset.paths[shard])
        index_paths.append(path)
    files = ReaderFiles(paths, index_paths, folder)
    return files, whole, f"DALI's webdataset reader: {len(runs)} runs over local shards"


def _header(dataset: TarShards, index: int, size: int) -> bytes:
    i = int(index)
    path = dataset.paths[int(dataset.index.shards[i])]
    length = int(dataset.index.lengths[i])
    with open(path, "rb") as f:
        return os.pread(f.fileno(), min(length, size), int(dataset.index.offsets[i]))


def prepare_plan(dataset: DeclaredImages, index: int) -> Sample:
    """One sample's plan from its member's header, no bytes kept (runs in a read thread)."""
    assert isinstance(dataset, TarShards)
    start = time.perf_counter()
    try:
        try:
            size = _image_size(_header(dataset, index, HEADER_BYTES))
        except DECODE_ERRORS:  # a header past 64 KiB (large EXIF): the whole member
            size = _image_size(dataset.read_bytes(index))
    except DECODE_ERRORS as exc:
        raise dataset.corrupt(index, exc) from exc
    except OSError as exc:
        raise dataset.unreadable(index, exc) from exc
    width, height = size
    plan = dataset.pipeline.plan(width, height, random.Random(dataset.sample_seed(index)))
    return Sample(int(index), dataset.label(index), None, plan, width, height,
                  time.perf_counter() - start)


def _image_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        return img.size


def sample_bytes(dataset: DeclaredImages, sample: Sample) -> np.ndarray:
    """A sample's encoded bytes: kept by the byte feed, read again for the reader's."""
    if sample.data is not None:
        return sample.data
    return np.frombuffer(dataset.read_bytes(sample.index), np.uint8)
