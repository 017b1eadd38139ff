"""GPU idle time per batch from CUDA events, read back lazily, never with a synchronize.

NOTE [GPU idle from two events]
Around each ``next()`` the meter records two events on the consuming (current) stream:
``before`` when the loop asks for a batch, after it has queued all of step ``i-1``'s work,
and ``after`` once the batch is handed over (after the copy stream's ``wait_stream``). The
GPU reaches ``before`` when it finishes step ``i-1``; it reaches ``after`` as soon as the
host has recorded it. If the host returned from ``next()`` while the GPU was still busy
(compute-bound), the two events are adjacent in the stream and their elapsed time is ~0;
if the host was still waiting for data, the GPU sat idle between them, and the elapsed time
is exactly that idle gap, including any wait for the host-to-device copy.

Reading an event's time before the GPU has reached it would block, so pairs wait in a
:class:`ReadbackQueue` and are read only once ``event.query()`` says they are done, checked
from the oldest a few batches later. ``flush()`` (called by the summary, off the hot path)
waits for the few pairs still pending, on those events only.

Example::

    >>> probe = CudaIdleProbe()
    >>> probe.before(); batch = next(it); probe.after(index=0)
    >>> probe.flush(); probe.idle_s
    {0: 0.0021}
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

H = TypeVar("H")

READBACK_LAG = 4
"""Batches an event pair waits before the meter asks the GPU whether it has passed it."""


class ReadbackQueue(Generic[H]):
    """FIFO of ``(batch index, handle)`` whose results are read only once they are done.

    Pure bookkeeping, independent of CUDA: a handle is whatever ``done`` can judge (a pair
    of CUDA events in the meter, plain numbers in the tests). Work on one stream completes
    in order, so the queue stops at the first handle that is not done yet.

    Example::

        >>> q = ReadbackQueue(lag=1)
        >>> q.push(0, 5.0); q.push(1, 9.0)
        >>> q.pop_done(lambda finish_time: finish_time <= 6.0)
        [(0, 5.0)]
    """

    def __init__(self, lag: int = READBACK_LAG) -> None:
        self.lag = lag
        self._items: deque[tuple[int, H]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, index: int, handle: H) -> None:
        self._items.append((index, handle))

    def pop_done(self, done: Callable[[H], bool]) -> list[tuple[int, H]]:
        """Items at least ``lag`` pushes old that ``done`` accepts, oldest first."""
        out: list[tuple[int, H]] = []
        items = self._items
        while len(items) > self.lag and done(items[0][1]):
            out.append(items.popleft())
        return out

    def pop_all(self) -> list[tuple[int, H]]:
        """Every pending item, oldest first (the caller waits for them)."""
        out = list(self._items)
        self._items.clear()
        return out


class CudaIdleProbe:
    """Records the event pair of NOTE [GPU idle from two events] for each batch.

    ``idle_s`` maps a batch index to the GPU's idle seconds before that batch's step; a
    batch appears there a few batches after it was delivered (or after :meth:`flush`).
    """

    def __init__(self, device: torch.device | int | None = None, lag: int = READBACK_LAG) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else
                                   (device if isinstance(device, int) else device.index or 0))
        self.idle_s: dict[int, float] = {}
        self._queue: ReadbackQueue[tuple[torch.cuda.Event, torch.cuda.Event]] = ReadbackQueue(lag)
        self._spare: list[torch.cuda.Event] = []
        self._before: torch.cuda.Event | None = None

    def _event(self) -> torch.cuda.Event:
        return self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)

    def before(self) -> None:
        """Mark, on the current stream, that the loop has queued its step and asks for data."""
        event = self._event()
        event.record(torch.cuda.current_stream(self.device))
        self._before = event

    def after(self, index: int) -> None:
        """Mark that batch ``index`` was handed over; read back pairs the GPU has passed."""
        before, self._before = self._before, None
        if before is None:
            return
        after = self._event()
        after.record(torch.cuda.current_stream(self.device))
        self._queue.push(index, (before, after))
        for done_index, pair in self._queue.pop_done(_pair_done):
            self._read(done_index, pair)

    def cancel(self) -> None:
        """Forget a ``before`` whose ``next()`` ended the pass instead of giving a batch."""
        if self._before is not None:
            self._spare.append(self._before)
            self._before = None

    def flush(self) -> None:
        """Read every pending pair, waiting on those events only (never the whole device)."""
        for index, pair in self._queue.pop_all():
            pair[1].synchronize()
            self._read(index, pair)

    def _read(self, index: int, pair: tuple[torch.cuda.Event, torch.cuda.Event]) -> None:
        before, after = pair
        self.idle_s[index] = max(0.0, before.elapsed_time(after) / 1000.0)
        self._spare.extend(pair)


def _pair_done(pair: tuple[torch.cuda.Event, torch.cuda.Event]) -> bool:
    return pair[1].query()
