"""One batch in flight on the threaded engine, and how a pixel thread files a finished sample.

Example::

    >>> batch = Batch([0, 1, 2], torch.empty((3, 3, 224, 224), dtype=torch.uint8))
    >>> place(batch, 1, torch.zeros(3, 224, 224))      # batch.stacked[1] holds it now
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import torch

CHUNK = 8
"""Samples per read task and per pixel task: few enough tasks that queueing them costs
little, enough of them that the threads share a batch evenly."""


class Batch:
    """One batch in flight: its slots, and a read and a pixel task per chunk of samples.

    A task's result holds one entry per sample of its chunk: the bytes (reads) or the seconds
    spent (pixels), or the exception that sample raised, so one bad file fails only itself.
    """

    def __init__(self, indices: list[int], images: torch.Tensor) -> None:
        self.indices = indices
        self.images = images
        self.chunks = [(a, min(a + CHUNK, len(indices))) for a in range(0, len(indices), CHUNK)]
        self.finished: list[Any] = [None] * len(indices)  # the transform's rest's outputs, if any
        self.stacked: torch.Tensor | None = None  # NOTE [the rest's outputs stacked by the pixel threads]
        self.placed = [False] * len(indices)
        self.lock = threading.Lock()
        self.reads: list[Future[list[tuple[Any, float]]]] | None = None  # None: read by pixels
        self.pixels: list[Future[list[tuple[BaseException | None, float, float]]]] = []


def place(batch: Batch, k: int, sample: Any) -> None:
    """NOTE [the rest's outputs stacked by the pixel threads]: a transform's rest gives each
    sample as a new tensor, which torch's default collate would stack on the training loop's
    thread (a 38 MB copy for 64 float 224x224 images, run by torch's intra-op team there). The
    pixel thread that made sample ``k`` copies it into its row of the batch instead; the first
    one allocates the batch by its shape and dtype. Anything else (another shape or dtype, not
    a plain tensor: a tv_tensors subclass, a tuple) is kept for default collate, as before."""
    if type(sample) is torch.Tensor:
        if batch.stacked is None:  # the lock only until the batch exists
            with batch.lock:
                if batch.stacked is None:
                    batch.stacked = torch.empty((len(batch.indices), *sample.shape), dtype=sample.dtype)
        row = batch.stacked
        if row.shape[1:] == sample.shape and row.dtype == sample.dtype:
            row[k].copy_(sample)
            batch.placed[k] = True
            return
    batch.finished[k] = sample


