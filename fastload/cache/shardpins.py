"""The shards one process holds open: a pin each, the least recently read let go first.

A :class:`ShardPin` is a shard's lock file held shared (no process evicts or refills the
shard while any holds it) and its data file's descriptor, which reads ``pread``. A process
keeps at most ``keep_open`` pins (:class:`Pins`); adding one past that lets go of the least
recently read, so a reader moving through the shards frees the ones behind it for eviction
(NOTE [the shard store] in :mod:`.shardstore`).

Reads count themselves in and out of a pin (``users``): a pin let go of while a thread reads
it closes its descriptors after that read, never under it (a reused descriptor number would
read another file).

Example::

    >>> pins = Pins(keep_open=6)
    >>> pin = pins.use(digest) or pins.add(digest, ShardPin(lock_fd, data_fd), use=True)
    >>> data = os.pread(pin.data_fd, length, offset)
    >>> pins.done(pin)
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading

__all__ = ["Holds", "Pins", "ShardPin"]


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class ShardPin:
    """A shard this process holds: its lock's descriptor (held shared) and its data file's."""

    def __init__(self, lock_fd: int, data_fd: int) -> None:
        self.lock_fd, self.data_fd = lock_fd, data_fd
        self.users = 0
        self.retired = False

    def close(self) -> None:
        """Close both descriptors (the lock goes with the last descriptor of its file)."""
        for fd in (self.data_fd, self.lock_fd):
            _close(fd)


class Pins:
    """At most ``keep_open`` pins of one process, by shard digest, least recently read first."""

    def __init__(self, keep_open: int) -> None:
        self.keep_open = max(1, int(keep_open))
        self._lock = threading.Lock()
        self._pins: collections.OrderedDict[str, ShardPin] = collections.OrderedDict()

    def __contains__(self, digest: str) -> bool:
        with self._lock:
            return digest in self._pins

    def use(self, digest: str, *, use: bool = True) -> ShardPin | None:
        """The shard's pin, now the most recently read (counted in a read when ``use``), or
        None when this process holds none."""
        with self._lock:
            pin = self._pins.get(digest)
            if pin is not None:
                self._pins.move_to_end(digest)
                pin.users += use
            return pin

    def add(self, digest: str, pin: ShardPin, *, use: bool = True) -> ShardPin:
        """Hold ``pin`` (counted in a read when ``use``); the oldest go past ``keep_open``."""
        with self._lock:
            self._pins[digest] = pin
            pin.users += use
            while len(self._pins) > self.keep_open:
                self._retire(self._pins.popitem(last=False)[1])
        return pin

    def done(self, pin: ShardPin) -> None:
        """A read of ``pin`` ended: its descriptors close if it was let go of meanwhile."""
        with self._lock:
            pin.users -= 1
            if pin.retired and pin.users == 0:
                pin.close()

    def release_oldest(self) -> bool:
        """Let go of the least recently read pin; False when there is none."""
        with self._lock:
            if not self._pins:
                return False
            self._retire(self._pins.popitem(last=False)[1])
            return True

    def release_all(self) -> None:
        """Let go of every pin (each closes now, or after the reads in progress)."""
        with self._lock:
            pins, self._pins = list(self._pins.values()), collections.OrderedDict()
            for pin in pins:
                self._retire(pin)

    def close_inherited(self) -> None:
        """In a forked child: close the descriptors of the parent's pins (the parent's own
        keep its locks) and forget them."""
        for pin in self._pins.values():
            pin.close()
        self._pins = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _retire(pin: ShardPin) -> None:
        pin.retired = True
        if pin.users == 0:
            pin.close()


class Holds:
    """Shards held for a reader that is not done with them: a lock descriptor each, held
    shared, so that no download evicts them meanwhile (NOTE [downloads ahead are held until
    read] in :mod:`.shardahead`). Unlike :class:`Pins`, not capped: the downloader ahead
    holds only what the budget let it download."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}

    def add(self, digest: str, lock_fd: int) -> None:
        """Keep ``lock_fd`` (the shard's lock, held shared) until :meth:`release`."""
        with self._lock:
            old = self._fds.pop(digest, None)
            self._fds[digest] = lock_fd
        if old is not None:
            _close(old)

    def release(self, digest: str) -> None:
        """Let go of the shard (it may be evicted from now on, unless a reader pins it)."""
        with self._lock:
            fd = self._fds.pop(digest, None)
        if fd is not None:
            _close(fd)

    def release_all(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            _close(fd)

    def close_inherited(self) -> None:
        """In a forked child: close the parent's descriptors (its locks stay the parent's)."""
        for fd in self._fds.values():
            _close(fd)
        self._fds = {}
        self._lock = threading.Lock()
