"""Per-batch facts measured inside workers, carried back with the batch itself.

Declared datasets record how long they spent fetching bytes and decoding, and which samples
they skipped, into a process-local :class:`BatchInfo`. The loader's collate wrapper
(:class:`CollateWithInfo`) runs in the same worker right after those samples were read, so
it drains the record into an :class:`Envelope` next to the collated batch: no extra IPC
round trip. The loader unwraps the envelope in the main process before the user sees it.

NOTE [sample errors cross the process boundary]
torch sends a worker's exception to the main process as text and rebuilds it there as
``type(message)``, so a :class:`~fastload.errors.SampleError` would arrive without its
``index`` and ``path``. Under ``on_error="raise"`` a declared dataset's ``__getitems__`` in a
worker therefore returns a :class:`FailedBatch` instead of raising. Our collate wrapper
turns it into an :class:`Envelope` carrying a :class:`WorkerError` (the pickled exception
and the worker's traceback text), and the loader re-raises the very exception in the main
process. Any other collate function that looks at a ``FailedBatch`` gets the original
exception raised inside the worker, which is exactly torch's behaviour without fastload.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn

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
    error: WorkerError | None = None


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
class WorkerError:
    """An exception raised in a worker process, carried intact to the main process.

    ``payload`` is the pickled exception (a SampleError keeps index, path and message),
    ``cause`` its pickled ``__cause__`` when that pickles, ``traceback`` the worker's text.
    """

    payload: bytes
    cause: bytes | None
    traceback: str
    pid: int

    @classmethod
    def capture(cls, exc: BaseException) -> WorkerError | None:
        """The portable form of ``exc``, or None when it does not pickle."""
        try:
            payload = pickle.dumps(exc)
        except Exception:
            return None
        try:
            cause = pickle.dumps(exc.__cause__) if exc.__cause__ is not None else None
        except Exception:
            cause = None  # a backend error that does not pickle: its text is in the traceback
        text = "".join(traceback.format_exception(exc))
        return cls(payload, cause, text, os.getpid())

    def exception(self) -> BaseException:
        """The exception as the worker raised it, with the worker's traceback as a note."""
        exc = pickle.loads(self.payload)
        if self.cause is not None:
            exc.__cause__ = pickle.loads(self.cause)
        note = f"raised in DataLoader worker process {self.pid}; its traceback:\n{self.traceback}"
        if hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(note)
        return exc


class FailedBatch(Sequence[Any]):
    """The samples of a batch that failed in a worker: any look at them raises ``error``.

    See NOTE [sample errors cross the process boundary].

    Example::

        >>> batch = FailedBatch(CorruptSampleError("...", index=3, path="a.jpg"))
        >>> batch[0]
        Traceback (most recent call last):
        fastload.errors.CorruptSampleError: ...
    """

    def __init__(self, error: BaseException):
        self.error = error

    def raise_error(self) -> NoReturn:
        raise self.error

    def __getitem__(self, index: Any) -> NoReturn:
        self.raise_error()

    def __len__(self) -> int:
        self.raise_error()

    def __iter__(self) -> Iterator[Any]:
        self.raise_error()


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
        if isinstance(samples, FailedBatch):  # NOTE [sample errors cross the process boundary]
            error = WorkerError.capture(samples.error)
            if error is None:
                samples.raise_error()  # torch's path: type and message survive, not attributes
            info = drain()
            info.error = error
            return Envelope(None, info)
        # Under on_error="skip" a batch can lose every sample; it travels as None.
        batch = self.collate_fn(samples) if len(samples) else None
        info = drain()
        info.collate_s = time.perf_counter() - start
        return Envelope(batch, info)
