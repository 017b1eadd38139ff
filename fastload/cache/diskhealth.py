"""What a disk tier does when its directory fails it: one warning per kind, then the origin.

NOTE [a cache fails open]
A cache is only a cache: whatever goes wrong with the directory, training goes on reading
the origin. :class:`Health` is a disk tier's state towards its store, changed only by
faults, and says each kind of fault once per tier (a process), naming the directory and
what to do:

* ``reads`` off: the store cannot be read at all (damaged and not repaired, not fastload's,
  cut while in use, LMDB cannot open it): every lookup is a miss.
* ``writes`` off: nothing is stored (a read-only directory, a full disk, an exhausted
  budget under policy "keep", a failed commit), so the tier is pass-through.
* A read-only directory (:attr:`~fastload.cache.cachedir.CacheDir.read_only`) is read as it
  is: what it holds is served, corrupt entries are left where they are.

Example::

    >>> health = Health(Path("/nvme/fastload"), read_only=None)
    >>> health.write_failed(OSError(errno.ENOSPC, "No space left on device"))
    >>> health.writes
    False
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

from fastload.cache.lmdbfile import StoreDamaged, StoreFault
from fastload.cache.safefs import Foreign

logger = logging.getLogger(__name__)

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

__all__ = ["Health"]


class Health:
    """One disk tier's state towards its store: ``reads`` and ``writes`` (both on until a
    fault), ``read_only`` (why the directory cannot be written, or None)."""

    def __init__(self, directory: Path, read_only: str | None) -> None:
        self.directory = directory
        self.read_only = read_only
        self.reads = True
        self.writes = read_only is None
        self._warned: set[str] = set()

    def warn_once(self, what: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` as a warning, the first time a fault of kind ``what`` is seen."""
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(msg, *args)

    def opened(self, problem: OSError | None, *, warn: bool) -> None:
        """The tier opened its store, which cannot be used if ``problem``; one warning
        (``warn``) when the directory is read-only or the store unusable."""
        if problem is not None:
            self.reads = self.writes = False
        if not warn:
            return
        if self.read_only is None:
            if problem is not None:
                self.store_off(problem)
        elif problem is None:
            self.warn_once("readonly", "disk cache %s is read-only (%s): what it holds is served and "
                           "nothing new is stored; reads of other objects go to the origin",
                           self.directory, self.read_only)
        else:
            self.warn_once("readonly", "disk cache %s is read-only (%s) and %s: nothing is read from it "
                           "or stored; reads go to the origin", self.directory, self.read_only, problem)

    def store_off(self, exc: OSError) -> None:
        """The store cannot be used (any more) in this process: one warning, the origin."""
        self.reads = self.writes = False
        where = self.directory
        if isinstance(exc, StoreDamaged) and exc.foreign:
            self.warn_once("damaged", "disk cache %s: %s; it is left alone and not used, reads go to "
                           "the origin. Remove it, or give the cache a new directory", where, exc)
        elif isinstance(exc, StoreDamaged):
            self.warn_once("damaged", "disk cache %s: %s; it is not used and reads go to the origin. "
                           "Run `fastload cache verify %s --drop` (or `fastload cache clear %s`) to "
                           "set it right", where, exc, where, where)
        else:
            self.warn_once("damaged", "disk cache %s: %s; it is not used and reads go to the origin",
                           where, exc)

    def read_failed(self, exc: OSError) -> None:
        """A lookup failed: a damaged store is not read again; another fault is said once."""
        if isinstance(exc, StoreDamaged):
            self.store_off(exc)
        else:
            self.warn_once("read", "disk cache %s cannot be read (%s); reading the origin", self.directory, exc)

    def write_failed(self, exc: OSError) -> None:
        """A put failed: a full disk or a failed commit makes the tier pass-through."""
        if isinstance(exc, StoreDamaged):
            self.store_off(exc)
        elif exc.errno in _FULL_ERRNOS or isinstance(exc, StoreFault):
            self.writes = False
            self.warn_once(
                "nospace",
                "disk cache %s cannot write (%s); it is now pass-through: reads go to the "
                "origin and training goes on. Free space or lower disk_size",
                self.directory, exc,
            )
        elif isinstance(exc, Foreign):
            self.warn_once(
                "foreign", "disk cache %s: %s; entry not stored (see `fastload cache verify %s`)",
                self.directory, exc, self.directory,
            )
        else:
            self.warn_once("write", "disk cache %s cannot write (%s); entry not stored", self.directory, exc)

    def full(self, used: int, budget: int) -> None:
        """Policy "keep" spent the budget: pass-through from now on."""
        self.writes = False
        self.warn_once(
            "full",
            "disk cache %s is full (%d of %d bytes used); policy 'keep' keeps what it has and "
            "reads of other objects go to the origin. Raise disk_size to cache more",
            self.directory, used, budget,
        )

    def corrupt(self, key: str, why: str, where: Path) -> bool:
        """A corrupt entry was read: whether to delete it (not in a read-only directory)."""
        if self.read_only is not None:
            self.warn_once("corrupt", "disk cache %s: corrupt entry %s (%s) at %s is read from the origin",
                           self.directory, key, why, where)
            return False
        logger.warning("dropping corrupt cache entry %s (%s) at %s; it is fetched again", key, why, where)
        return True
