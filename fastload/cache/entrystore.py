"""What the disk tier asks of the store of its directory's format (NOTE [cache formats]).

:class:`~fastload.cache.disk.DiskTier` keeps what every format shares: the budget, the
counters, one warning per kind of fault, pass-through after a full disk, the key locks. The
entries themselves live in an :class:`EntryStore`: :class:`~fastload.cache.filestore.FileStore`
(format "files") or :class:`~fastload.cache.packedformat.PackedFormatStore` (format
"packed"). A store raises what went wrong (OSError, :class:`Damaged`,
:class:`~fastload.cache.cachedir.LockTimeout`); the tier turns it into a miss or a refused
put, so a store never counts or warns.

Example::

    >>> store = FileStore(cache_dir, lru=False)
    >>> store.groups([3, 5])                    # format "files": one write per put
    [[0], [1]]
    >>> store.put_group([("k", b"abc")], budget=10**6)
    [('stored', 63)]
    >>> store.read("k")
    b'abc'
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol

from fastload.cache.safefs import Found

Status = Literal["stored", "exists", "full", "oversized"]
"""What a put did: stored, already there, refused (the budget is spent), too large for it."""


class Damaged(Exception):
    """A stored entry failed validation; the tier drops it and reads the origin.

    ``why`` says what is wrong with it, ``where`` is the file that holds it (for the warning).
    """

    def __init__(self, why: str, where: Path) -> None:
        super().__init__(f"{why} ({where})")
        self.why = why
        self.where = where


class EntryStore(Protocol):
    """The entries of one cache directory in one format, for :class:`~fastload.cache.disk.DiskTier`."""

    description: str
    """The format in a few words, for ``fastload cache stats``."""

    problem: OSError | None
    """Why the store cannot be used at all (a damaged LMDB store...), or None: the tier then
    reads the origin and stores nothing."""

    def read(self, key: str) -> bytes | None:
        """The validated value of ``key``; None when missing (or another key's: a hash collision).

        Raises Damaged for an entry that fails validation, OSError when the store cannot be read.
        """

    def read_many(self, keys: Sequence[str]) -> list[bytes | Damaged | None]:
        """:meth:`read` of each key (format "packed": one read transaction), a damaged entry
        its :class:`Damaged` in its place; OSError when the store cannot be read."""

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether a complete entry of each key is there (no checksum); OSError if unreadable."""

    def groups(self, sizes: Sequence[int]) -> list[list[int]]:
        """How the store writes a batch of puts of ``sizes`` bytes: lists of indexes, each list
        one write (:meth:`put_group`), in the order the tier should hand them over."""

    def put_group(self, items: Sequence[tuple[str, bytes]], budget: int) -> list[tuple[Status, int]]:
        """Store one group of :meth:`groups` within ``budget`` bytes: each item's status and the
        bytes it counts (or would count) in ``used``. Raises OSError or LockTimeout for the group."""

    def drop(self, key: str) -> None:
        """Delete ``key``'s entry (its file too) and count it out of ``used``; OSError, LockTimeout."""

    def keys(self) -> Iterator[str]:
        """The key of every readable entry."""

    def entries(self) -> Iterator[Found]:
        """fastload's entries, each with the bytes it counts in ``used``."""

    def used(self) -> int:
        """Bytes of the entries, as the store counts them against the budget."""

    def rescan(self, *, write: bool = True) -> tuple[int, int]:
        """Recount entries and bytes, store the count in ``used`` (if ``write``); (entries, bytes)."""

    def flush(self) -> None:
        """Put what this process wrote on disk (the tier closes)."""
