"""Format "packed": small objects as records of the packed store, large ones a file each.

An object below :data:`~fastload.cache.packed.FILE_MIN` bytes is one record of the LMDB
store (:class:`~fastload.cache.packed.PackedStore`); a larger one is an entry file in
``entries/`` (:mod:`.entryfiles`, the format of :mod:`.filestore`) that a pointer record
indexes, so the store's ``used`` counts both and its write transactions keep the budget
for both (NOTE [packed store]). A large put writes its file first and its pointer after;
a file whose pointer was refused is deleted by the same put.

Example::

    >>> store = PackedFormatStore(CacheDir(Path("/nvme/fastload"), create=True), lru=False)
    >>> store.groups([10, 2 << 20, 20])       # the small ones in one transaction
    [[0, 2], [1]]
    >>> store.put_group([("k", b"abc")], budget=10**6)
    [('stored', 28)]
    >>> store.read("k")
    b'abc'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from fastload.cache import entry
from fastload.cache.cachedir import CacheDir
from fastload.cache.entrystore import Damaged, Status
from fastload.cache.filestore import file_complete, read_file
from fastload.cache.keys import digest
from fastload.cache.packed import (
    FILE_MIN,
    IN_FILE,
    PackedStore,
    accounted,
    is_pointer,
    pointer,
    record_key,
)
from fastload.cache.safefs import Found

__all__ = ["PackedFormatStore"]


class PackedFormatStore:
    """The entries of a directory of format "packed" (an :class:`~fastload.cache.entrystore.EntryStore`).

    Args:
        cache_dir: the opened directory (of format "packed").
        lru: note reads and evict the least recently read entries when a put needs room.
        repair: set a damaged LMDB store aside and make an empty one (False: report it).

    Attributes:
        records: the LMDB store of the records and pointers (``fastload cache verify`` and
            ``clear`` go through it).
    """

    description = f"LMDB, objects under {FILE_MIN >> 20} MiB; larger ones one file each"

    def __init__(self, cache_dir: CacheDir, *, lru: bool, repair: bool = True) -> None:
        self.cache_dir = cache_dir
        self.files = cache_dir.entries
        self.records = PackedStore(cache_dir, lru=lru, repair=repair)

    @property
    def problem(self) -> OSError | None:
        """Why the LMDB store cannot be used (:attr:`PackedStore.problem`), or None."""
        return self.records.problem

    def read(self, key: str) -> bytes | None:
        d = entry.packed_digest(key)
        try:
            got = self.records.get(d, key)
        except (entry.KeyMismatch, entry.CorruptEntry) as exc:
            got = exc
        value = self._checked(key, d, got)
        if isinstance(value, Damaged):
            raise value
        return value

    def read_many(self, keys: Sequence[str]) -> list[bytes | Damaged | None]:
        """:meth:`read` of each key in one read transaction; a damaged entry is its Damaged."""
        ds = [entry.packed_digest(k) for k in keys]
        return [self._checked(k, d, got) for k, d, got in zip(keys, ds, self.records.get_many(ds, keys))]

    def _checked(self, key: str, d: bytes, got: object) -> bytes | Damaged | None:
        """What the store read for ``key`` (digest ``d``): the value, None, or why it is damaged."""
        if isinstance(got, entry.KeyMismatch):
            if entry.packed_digest(got.args[0]) == d:
                return None  # a true xxh3-128 collision: another key's record
            return Damaged(f"its header names key {got.args[0]!r}, not stored under this digest",
                           self.records.path)
        if isinstance(got, entry.CorruptEntry):
            return Damaged(str(got), self.records.path)
        if got is IN_FILE:
            try:
                return read_file(self.files, key)
            except Damaged as exc:
                return exc
        return got  # type: ignore[return-value]  # bytes or None

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """One read transaction for all (and a header read per large object's file)."""
        found = self.records.contains([entry.packed_digest(k) for k in keys])
        return [file_complete(self.files, k) if f is IN_FILE else bool(f) for k, f in zip(keys, found)]

    def groups(self, sizes: Sequence[int]) -> list[list[int]]:
        small = [i for i, n in enumerate(sizes) if n < FILE_MIN]
        return ([small] if small else []) + [[i] for i, n in enumerate(sizes) if n >= FILE_MIN]

    def put_group(self, items: Sequence[tuple[str, bytes]], budget: int) -> list[tuple[Status, int]]:
        """The objects below FILE_MIN in one write transaction, then each large one (its file,
        then its pointer)."""
        out: list[tuple[Status, int]] = [("full", 0)] * len(items)
        small = [i for i, (_, value) in enumerate(items) if len(value) < FILE_MIN]
        if small:
            records = [entry.packed_item(*items[i]) for i in small]
            for i, status, (_, rec) in zip(small, self.records.put_many(records, budget), records):
                out[i] = (status, len(rec))
        for i, (key, value) in enumerate(items):
            if len(value) >= FILE_MIN:
                out[i] = self._put_large(key, value, budget)
        return out

    def _put_large(self, key: str, value: bytes, budget: int) -> tuple[Status, int]:
        name, d = digest(key), entry.packed_digest(key)
        header = entry.encode_header(key, value)
        n = len(header) + len(value)
        if self.records.contains([d])[0] is IN_FILE and file_complete(self.files, key):
            return "exists", n
        if n > budget:
            return "oversized", n
        self.files.store(name, (header, value))
        status = self.records.put_many([(d, pointer(key, n))], budget)[0]
        if status in ("full", "oversized"):
            self.files.remove(name)  # the file this put wrote, never another's
        return status, n

    def drop(self, key: str) -> None:
        rec = self.records.delete(entry.packed_digest(key))
        if rec is not None and is_pointer(rec):
            self.files.remove(digest(key))

    def keys(self) -> Iterator[str]:
        for _, rec in self.records.records():
            with contextlib.suppress(entry.CorruptEntry):
                yield record_key(rec)

    def entries(self) -> Iterator[Found]:
        """One per record (the large objects' pointers included), named by the digest's hex."""
        where = self.records.path / "data.mdb"
        return (Found(where, d.hex(), accounted(rec)) for d, rec in self.records.records())

    def used(self) -> int:
        return self.records.used()

    def rescan(self, *, write: bool = True) -> tuple[int, int]:
        return self.records.rescan(write=write)

    def flush(self) -> None:
        self.records.flush()
