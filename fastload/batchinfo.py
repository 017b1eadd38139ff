"""Per-batch facts measured inside workers, carried back with the batch itself.

Declared datasets record how long they spent fetching bytes and decoding, and which samples
they skipped, into a process-local :class:`BatchInfo`. The loader's collate wrapper
(:class:`CollateWithInfo`) runs in the same worker right after those samples were read, so
it drains the record into an :class:`Envelope` next to the collated batch: no extra IPC
round trip. The loader unwraps the envelope in the main process before the user sees it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fastload.device import map_tensors


@dataclass
class Skipped:
    """A sample dropped under ``on_error="skip"``."""

    index: int
    path: str
    reason: str


@dataclass
class BatchInfo:
    """Seconds spent in one batch's samples, per phase, in the process that read them."""

    fetch_s: float = 0.0
    decode_s: float = 0.0
    collate_s: float = 0.0
    samples: int = 0
    skipped: list[Skipped] = field(default_factory=list)


_current = BatchInfo()


def record(fetch_s: float = 0.0, decode_s: float = 0.0, samples: int = 0) -> None:
    """Add one sample's timings to this process's running record."""
    _current.fetch_s += fetch_s
    _current.decode_s += decode_s
    _current.samples += samples


def record_skip(skipped: Skipped) -> None:
    _current.skipped.append(skipped)


def drain() -> BatchInfo:
    """Return this process's record and start a new one."""
    global _current
    info, _current = _current, BatchInfo()
    return info


@dataclass
class Envelope:
    """A collated batch with the :class:`BatchInfo` of the worker that made it."""

    batch: Any
    info: BatchInfo

    def pin_memory(self, device: Any = None) -> Envelope:
        # torch's pin-memory thread calls this; pin the payload, keep the record.
        return Envelope(map_tensors(lambda t: t.pin_memory(), self.batch), self.info)


class CollateWithInfo:
    """Wraps a collate function so each batch leaves its worker inside an :class:`Envelope`."""

    def __init__(self, collate_fn: Callable[[Any], Any]):
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> Envelope:
        start = time.perf_counter()
        # Under on_error="skip" a batch can lose every sample; it travels as None.
        batch = self.collate_fn(samples) if len(samples) else None
        info = drain()
        info.collate_s = time.perf_counter() - start
        return Envelope(batch, info)
