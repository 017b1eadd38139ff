"""A long command stopped by SIGINT (Ctrl-C) or SIGTERM (a job scheduler's stop) alike.

NOTE [stop signals]
A scheduler (Slurm, Kubernetes, systemd) stops a job with SIGTERM, then SIGKILL after a grace
period. Python's default for SIGTERM is to die at once: no message, and whatever a
``finally`` would have flushed stays unflushed. Inside :func:`stop_on_signals` both signals
raise ``KeyboardInterrupt`` in the main thread, so the command unwinds the same way for
either (its ``finally`` blocks close the cache, which flushes what is buffered), then says
what it kept and exits ``128 + signal``: 130 for SIGINT, 143 for SIGTERM, as a shell reports
a process killed by that signal. A second signal while it unwinds is ignored, so the
cleanup runs to its end; SIGKILL still ends the process (the cache's entries are whole
either way: each is written atomically).

Example::

    >>> with stop_on_signals() as stop:
    ...     try:
    ...         long_running()
    ...     except KeyboardInterrupt:
    ...         print(f"stopped by {stop.name}")
    ...         raise click.exceptions.Exit(stop.exit_code) from None
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
    """Which signal stopped the command, if one did (``signum`` None: none yet, or SIGINT
    arrived outside :func:`stop_on_signals`'s handlers, as in a thread)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum or signal.SIGINT).name

    @property
    def exit_code(self) -> int:
        """``128 + signal``: 130 for SIGINT (also when none was recorded), 143 for SIGTERM."""
        return 128 + (self.signum or signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """Within the block, SIGINT and SIGTERM raise ``KeyboardInterrupt`` once (NOTE [stop
    signals]); the previous handlers come back after it. Outside the main thread, where
    Python cannot install handlers, it changes nothing."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.signum is not None:
            return  # already stopping: let the cleanup finish
        stop.signum = signum
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
