"""Format "files": every object one entry file (:mod:`.entryfiles`), the budget in ``used``.

The byte budget is kept in the root file ``used`` (:meth:`~fastload.cache.cachedir.CacheDir.read_used`),
read and written under the directory's index lock together with the entry's rename, so
concurrent writers never overshoot it. Policy "lru": a read touches its file (the mtime is
the clock), and a put that needs room deletes the least recently read files down to 90% of
the budget. The functions below read one entry file and are shared with format "packed",
whose large objects are entry files too (:mod:`.packedformat`).

Example::

    >>> store = FileStore(CacheDir(Path("/nvme/fastload"), create=True, format="files"), lru=False)
    >>> store.put_group([("s3://b/a.jpg#v=3", b"abc")], budget=10**6)
    [('stored', 78)]
    >>> store.read("s3://b/a.jpg#v=3")
    b'abc'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from fastload.cache import entry
from fastload.cache.cachedir import INDEX_TIMEOUT_S, CacheDir
from fastload.cache.entryfiles import EntryFiles
from fastload.cache.entrystore import Damaged, Status
from fastload.cache.keys import digest
from fastload.cache.safefs import Found

LRU_LOW_WATER = 0.9  # an LRU eviction frees down to 90% of the budget, so scans are rare

__all__ = ["FileStore", "file_complete", "header_key", "misnamed", "read_file"]


def read_file(files: EntryFiles, key: str, *, touch: bool = False) -> bytes | None:
    """The validated value in ``key``'s entry file (``touch``: marked as read now); None when
    missing or another key's (a true xxh3-128 collision).

    Raises Damaged when the file fails validation, OSError when it cannot be read (Foreign
    too: a symlink is never read through).
    """
    name = digest(key)
    try:
        with files.open(name) as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    try:
        value = entry.decode(blob, expect_key=key)
    except entry.KeyMismatch as other:
        if digest(other.args[0]) == name:
            return None  # a true xxh3-128 collision: another key's entry
        why = f"its header names key {other.args[0]!r}, not stored under this name"
        raise Damaged(why, files.path_of(name)) from None
    except entry.CorruptEntry as exc:
        raise Damaged(str(exc), files.path_of(name)) from None
    if touch:
        with contextlib.suppress(OSError):
            files.touch(name)
    return value


def file_complete(files: EntryFiles, key: str) -> bool:
    """Whether ``key``'s entry file is whole: its header names ``key`` and its size matches."""
    try:
        with files.open(digest(key)) as f:
            header, start = entry.read_file_header(f)
            return header["key"] == key and os.fstat(f.fileno()).st_size == start + header["size"]
    except (OSError, entry.CorruptEntry):
        return False


def header_key(files: EntryFiles, name: str) -> Any:
    """The key in the header of the entry file ``name`` (as stored: check it is a str).

    Raises OSError when the file cannot be read, CorruptEntry when its header is unreadable.
    """
    with files.open(name) as f:
        return entry.read_file_header(f)[0]["key"]


def misnamed(files: EntryFiles, name: str) -> str | None:
    """Why the entry file ``name`` is not provably its key's (its header key digests to
    another name); None when it is, or when its header is unreadable (a damaged entry)."""
    try:
        key = header_key(files, name)
    except (OSError, entry.CorruptEntry):
        return None
    if isinstance(key, str) and digest(key) == name:
        return None
    return f"its header names key {key!r}, which is not stored under this file name"


class FileStore:
    """The entries of a directory of format "files" (an :class:`~fastload.cache.entrystore.EntryStore`).

    Args:
        cache_dir: the opened directory.
        lru: touch entries on read and evict the least recently read when a put needs room.
    """

    description = "one file per entry"
    problem = None  # files are checked one by one, as they are read

    def __init__(self, cache_dir: CacheDir, *, lru: bool) -> None:
        self.cache_dir = cache_dir
        self.files = cache_dir.entries
        self.lru = lru and cache_dir.read_only is None  # a read touches its file

    def read(self, key: str) -> bytes | None:
        return read_file(self.files, key, touch=self.lru)

    def read_many(self, keys: Sequence[str]) -> list[bytes | Damaged | None]:
        out: list[bytes | Damaged | None] = []
        for key in keys:
            try:
                out.append(read_file(self.files, key, touch=self.lru))
            except Damaged as exc:
                out.append(exc)
        return out

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        return [file_complete(self.files, key) for key in keys]

    def groups(self, sizes: Sequence[int]) -> list[list[int]]:
        return [[i] for i in range(len(sizes))]  # each put takes the index lock by itself

    def put_group(self, items: Sequence[tuple[str, bytes]], budget: int) -> list[tuple[Status, int]]:
        return [self._put(key, value, budget) for key, value in items]

    def _put(self, key: str, value: bytes, budget: int) -> tuple[Status, int]:
        header = entry.encode_header(key, value)
        n = len(header) + len(value)
        name = digest(key)
        with self.cache_dir.index_lock(INDEX_TIMEOUT_S):
            if self.files.stat(name) is not None:
                return "exists", n
            used = self.used()
            if used + n > budget and self.lru and n <= budget:  # an oversized one evicts nothing
                used = self._evict(n, budget)
            if used + n > budget:
                return ("oversized" if n > budget else "full"), n
            self.files.store(name, (header, value))
            self.cache_dir.write_used(used + n)
        return "stored", n

    def _evict(self, need: int, budget: int) -> int:
        """Delete least recently read entries (LRU) until ``need`` more bytes fit; new ``used``."""
        found = sorted(self.entries(), key=lambda f: f.mtime)
        used = sum(f.size for f in found)
        target = min(budget - need, int(budget * LRU_LOW_WATER))
        for f in found:
            if used <= target:
                break
            if misnamed(self.files, f.name) is None:
                with contextlib.suppress(OSError):
                    used -= self.files.remove(f.name) or 0
        return used

    def drop(self, key: str) -> None:
        self.drop_entry(digest(key))

    def drop_entry(self, name: str) -> None:
        """Delete the entry file ``name`` (a digest) and count its bytes out of ``used``."""
        with self.cache_dir.index_lock(INDEX_TIMEOUT_S):
            size = self.files.remove(name)
            if size is not None:
                self.cache_dir.write_used(self.used() - size)

    def keys(self) -> Iterator[str]:
        for f in self.entries():
            try:
                key = header_key(self.files, f.name)
            except (OSError, entry.CorruptEntry):
                continue
            yield key

    def entries(self) -> Iterator[Found]:
        return (f for f in self.files.walk() if f.foreign is None)

    def used(self) -> int:
        """Bytes of the entry files (call under the index lock; recounted if the counter is
        unreadable)."""
        used = self.cache_dir.read_used()
        return used if used is not None else sum(f.size for f in self.entries())

    def rescan(self, *, write: bool = True) -> tuple[int, int]:
        """Recount entries and bytes from the files and store the count (if ``write``);
        (entries, bytes)."""
        if not write:
            sizes = [f.size for f in self.entries()]
            return len(sizes), sum(sizes)
        with self.cache_dir.index_lock(INDEX_TIMEOUT_S):
            sizes = [f.size for f in self.entries()]
            self.cache_dir.write_used(sum(sizes))
        return len(sizes), sum(sizes)

    def flush(self) -> None:
        """Nothing to do: every put is a renamed file."""
