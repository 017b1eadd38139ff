"""A missed object, fetched from the origin once and stored in the cache's tiers.

:class:`~fastload.cache.tiered.TieredCache` looks an object up in its tiers; when none has
it, :meth:`MissFills.fill` fetches it. Threads of one process wait for each other per key
and processes for the per-key lock of the widest tier that offers one (the disk tier's file
lock, :class:`~fastload.cache.tier.KeyLocking`), then find the object there: one download
per object. A local file takes no lock (NOTE [no fetch lock for local files]) and its puts
are written behind (NOTE [write-behind] in :mod:`.writebehind`). What is stored for the
bytes read is decided by :class:`~fastload.cache.fills.FillRules` (NOTE [fetch-time
version check], NOTE [derived entries]).

Example::

    >>> misses = MissFills(tiers, FillRules(None), lock_timeout=60.0)
    >>> data, outcome = misses.fill(fs, "bucket/a.jpg", "s3://bucket/a.jpg", "1397:etag", tiers)
    >>> outcome
    'fetched'
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import fsspec
from fsspec.implementations.local import LocalFileSystem

from fastload.cache.fills import FillRules
from fastload.cache.forks import after_fork
from fastload.cache.tier import KeyLocking, Tier
from fastload.cache.writebehind import DefersPuts
from fastload.io.errors import raise_storage_error
from fastload.io.origin import read_local, read_whole

logger = logging.getLogger(__name__)

Outcome = Literal["hit", "fetched", "rejected"]

__all__ = ["MissFills", "Outcome"]


class MissFills:
    """Fetches missed objects into ``tiers`` (fastest first), once per key.

    Attributes:
        tiers: the cache's tiers.
        rules: what to store for the bytes read (:class:`~fastload.cache.fills.FillRules`).
        lock_timeout: seconds to wait for another thread's or process's fetch of a key.
        puts_later: per tier, how a put made without a fetch lock reaches it (``put_later``
            where the tier defers puts, else ``put``).
    """

    def __init__(self, tiers: list[Tier], rules: FillRules, *, lock_timeout: float) -> None:
        self.tiers = tiers  # the cache's own list: a fill into it may write behind
        self.rules = rules
        self.lock_timeout = lock_timeout
        lockers = [t for t in self.tiers if isinstance(t, KeyLocking)]
        self._locker: KeyLocking | None = lockers[-1] if lockers else None
        self.puts_later: list[Callable[[str, bytes], object]] = [
            t.put_later if isinstance(t, DefersPuts) else t.put for t in self.tiers
        ]
        self._mutex = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        after_fork(self, MissFills._reset_after_fork)  # NOTE [locks across fork]

    def _reset_after_fork(self) -> None:
        """In a forked child: no fetch of the parent's threads is in flight here."""
        self._mutex = threading.Lock()
        self._inflight = {}

    def fill(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        url: str,
        version: str,
        targets: list[Tier],
        *,
        later: bool = False,
    ) -> tuple[bytes, Outcome]:
        """Fetch a missed object once (per key across threads and processes) into ``targets``.

        ``later``: the caller ignores the outcome, so a put without a fetch lock may be
        written behind (NOTE [write-behind]); under a fetch lock it never is.
        """
        if self.rules.derive is None and isinstance(fs, LocalFileSystem):
            # NOTE [no fetch lock for local files]: the lock exists so that processes download
            # an object once; a local read costs less than taking it (a lock file's open and
            # flock: 25-500 us, more than a 1 KB read), and a second read of the same file
            # stores the same entry (puts are idempotent). A derivation's CPU work keeps it.
            return self._fetch_and_store(fs, path, url, version, targets, later=later)
        key = self.rules.key_of(url, version)
        with self._mutex:
            event = self._inflight.get(key)
            owner = event is None
            if owner:
                event = self._inflight[key] = threading.Event()
        if not owner:
            event.wait(self.lock_timeout)
            found = self._recheck(key, targets)
            if found is not None:
                return found, "hit"
            return self._fetch_and_store(fs, path, url, version, targets)
        try:
            with self._process_lock(key):
                found = self._recheck(key, targets)
                if found is not None:
                    return found, "hit"
                # stored at once (not later): the lock's waiters must find it when it is released
                return self._fetch_and_store(fs, path, url, version, targets)
        finally:
            with self._mutex:
                del self._inflight[key]
            event.set()

    def _recheck(self, key: str, targets: list[Tier]) -> bytes | None:
        """The object if another thread or process stored it while we waited."""
        for level, tier in enumerate(targets):
            if tier.contains(key):
                data = tier.get(key)
                if data is not None:
                    self._store(key, data, targets[:level])
                    return data
        return None

    @contextlib.contextmanager
    def _process_lock(self, key: str) -> Iterator[None]:
        if self._locker is None:
            yield
            return
        with self._locker.lock(key, self.lock_timeout) as got:
            if not got:
                logger.info(
                    "waited %.0f s for another process to fetch %s; fetching it here too",
                    self.lock_timeout, key,
                )
            yield

    def _fetch_and_store(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        url: str,
        version: str,
        targets: list[Tier],
        *,
        later: bool = False,
    ) -> tuple[bytes, Outcome]:
        try:  # NOTE [storage errors] in fastload.io.errors (as storage_errors, inline: per object)
            if isinstance(fs, LocalFileSystem):
                data, read_version = read_local(path, url, expect=version)
            else:
                data, read_version = read_whole(fs, path), None
        except Exception as exc:
            raise_storage_error(exc, "read", url)
        key, value, _ = self.rules.check(url, version, data, read_version)
        if key is None:
            return value, "fetched"
        if later and targets is self.tiers:  # NOTE [write-behind]: no fetch lock is held
            for put in self.puts_later:
                put(key, value)
            return value, "fetched"
        stored = self._store(key, value, targets)
        return value, "fetched" if stored or not targets else "rejected"

    @staticmethod
    def _store(key: str, data: bytes, tiers: Sequence[Tier]) -> bool:
        stored = False
        for tier in tiers:
            stored = tier.put(key, data) or stored
        return stored
