"""The packed store: the disk tier's small entries in one LMDB environment (``packed/``).

NOTE [packed store]
A cache directory of format "packed" (NOTE [cache formats] in :mod:`.cachedir`) keeps every
object below FILE_MIN bytes as one record in LMDB, keyed by the 16-byte xxh3-128 of its
cache key (:func:`~fastload.cache.entry.packed_digest`); the record is fastload's own
header (key, size, xxh64) and the value (:func:`~fastload.cache.entry.encode_packed`), so a
read validates it as it validates a file. Larger objects keep a file each in ``entries/``
(written by the disk tier as in format "files"), indexed here by a *pointer record*: the
same header, magic ``FLPF``, no value. So this store is the one index of the directory:

* ``used`` (bytes of records plus the pointed-to files) lives in the ``meta`` database and
  changes in the same write transaction as the records: LMDB has one writer at a time
  across processes, so concurrent writers never overshoot the budget.
* A put is one write transaction, a batch (:meth:`PackedStore.put_many`) too; a read is one
  read transaction, no lock, no system call (LMDB maps the file).
* Policy "lru": reads are noted in memory (``time.time_ns()``) and written to the
  ``atimes`` database with the next put's transaction, or when 4096 are pending, or every
  5 s; so a get never costs a write transaction, and the order another process sees is off
  by at most those 5 s of this process's reads (an eviction in this process sees them all).
  An eviction (in the put's transaction) reads every atime and deletes the oldest records
  down to 90% of the budget.
* One environment per process and directory, shared by the process's stores and opened
  anew in a forked child (NOTE [one LMDB environment per process] in :mod:`.lmdbenv`).
* Commits are not flushed; NOTE [packed durability] in :mod:`.packedsync` says what a
  crash can do and how the next process notices.
* The file is checked before it is mapped and before each transaction (NOTE [a store is
  checked before it is mapped] in :mod:`.lmdbfile`). A store that cannot be used (damaged
  and not repaired, not fastload's, LMDB failing to open it) leaves the instance without an
  environment: :attr:`PackedStore.problem` says why and every call raises it.

Example::

    >>> store = PackedStore(cache_dir, lru=False)
    >>> store.put_many([(entry.packed_digest("k"), entry.encode_packed("k", b"v"))], budget=10**6)
    ['stored']
    >>> store.get(entry.packed_digest("k"), "k")
    b'v'
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import lmdb

from fastload.cache import entry, lmdbenv
from fastload.cache.cachedir import CacheDir
from fastload.cache.entrystore import Status
from fastload.cache.keys import digest
from fastload.cache.lmdbenv import Env, StoreDamaged, StoreFault, open_env
from fastload.cache.lmdbfile import lmdb_fault, walk
from fastload.cache.packedrecord import FILE_MAGIC, accounted, is_pointer, pointer, record_key
from fastload.cache.safefs import open_file

logger = logging.getLogger(__name__)

FILE_MIN = 1 << 20
"""Objects of this many bytes or more get a file each (page-sized copies gain nothing)."""
LOW_WATER = 0.9
ATIMES_PENDING = 4096
ATIMES_EVERY_S = 5.0
_USED = b"used"
_NANOS = struct.Struct("<Q")
T = TypeVar("T")

__all__ = ["FILE_MIN", "IN_FILE", "PackedStore", "Status", "StoreDamaged", "StoreFault", "accounted",
           "is_pointer", "pointer", "record_key"]

IN_FILE = object()
"""What :meth:`PackedStore.get` returns for a large object: read its entry file."""


class PackedStore:
    """The LMDB environment in ``cache_dir/packed``: records, pointers, ``used``, atimes.

    Args:
        cache_dir: an opened directory of format "packed".
        lru: note reads and evict the least recently read records when a put needs room.
        repair: set a damaged store aside and make an empty one (False: report it, for
            ``fastload cache verify``).

    Attributes:
        problem: why the store cannot be used (a StoreFault; StoreDamaged when its file is
            damaged or not fastload's), or None.
    """

    def __init__(self, cache_dir: CacheDir, *, lru: bool, repair: bool = True) -> None:
        self.cache_dir = cache_dir
        self.lru = lru
        self.path = cache_dir.packed_path()
        self.repair = repair
        self.problem: StoreFault | None = None
        self._atimes: dict[bytes, int] = {}
        self._atimes_at = time.monotonic()
        self._env: Env | None = None
        self.pages_checked = False
        try:
            self._env = self._open(check=True)
        except StoreFault as exc:
            self.problem = exc
        else:
            self.lru = lru and not self._env.read_only  # a read-only store notes no reads
            self.pages_checked = not repair  # opened page by page (NOTE in lmdbfile)

    # -- the environment -----------------------------------------------------------------

    def _open(self, *, check: bool) -> Env:
        """This process's environment (:func:`~fastload.cache.lmdbenv.open_env`); the large
        objects' files indexed again when the store was made anew."""
        held, remade = open_env(self.cache_dir, check=check, repair=self.repair)
        if remade:
            self._reindex_files(held)
        return held

    def _held(self) -> Env:
        """This process's environment, its file checked (StoreFault: the store is unusable)."""
        held = self._env
        if held is not None and not held.inherited:
            guard = held.guard  # SizeGuard.check, inline: once per transaction
            size = os.lseek(guard.fd, 0, os.SEEK_END)
            if size == guard.size:
                return held
        return self._checked()

    def _checked(self) -> Env:
        """:meth:`_held` when the store is unusable, inherited at a fork, or changed in size."""
        held = self._env
        if held is None:
            assert self.problem is not None
            raise self.problem
        try:
            if held.inherited:  # a forked child: its own environment, no crash marks
                self._atimes.clear()
                held = self._env = self._open(check=False)
            held.guard.check()
        except StoreFault as exc:
            raise self._fault(exc) from None
        return held

    def _fault(self, exc: lmdb.Error | StoreFault, doing: str = "read") -> StoreFault:
        """``exc`` as a StoreFault; a damaged store is not used again by this instance."""
        fault = exc if isinstance(exc, StoreFault) else lmdb_fault(exc, self.path, doing)
        if isinstance(fault, StoreDamaged) or self._env is None:
            self._env, self.problem = None, fault
        return fault

    def check_pages(self) -> int:
        """Check every page of the store without mapping it (:func:`~fastload.cache.lmdbfile.walk`);
        pages checked (0 when the open checked them). Raises StoreDamaged (and the store is
        not used again) when one is wrong."""
        self._held()
        if self.pages_checked:
            return 0
        fd = open_file(self.cache_dir.packed_fd, "data.mdb", os.O_RDONLY, self.path)  # type: ignore[arg-type]
        try:
            return walk(fd, self.path / "data.mdb")
        except StoreDamaged as exc:
            raise self._fault(exc) from None
        finally:
            os.close(fd)

    def remake(self) -> Path:
        """Set the store aside as damaged and start an empty one (``verify --drop``, ``clear``);
        where the damaged one went. Never for a store fastload did not make."""
        if isinstance(self.problem, StoreDamaged) and self.problem.foreign:
            raise self.problem
        held, where = lmdbenv.remake(self.cache_dir)
        self._reindex_files(held)
        self._env, self.problem = held, None
        return where

    def _reindex_files(self, held: Env) -> None:
        """Point to every large object's entry file (after the store was made anew)."""
        files = self.cache_dir.entries
        with held.env.begin(write=True) as txn:  # a new, empty store: nothing to check
            used = 0
            for found in files.walk():
                if found.foreign is not None or found.size < FILE_MIN:
                    continue
                try:
                    with files.open(found.name) as f:
                        key = entry.read_file_header(f)[0]["key"]
                except (OSError, entry.CorruptEntry):
                    continue
                if isinstance(key, str) and digest(key) == found.name:
                    txn.put(entry.packed_digest(key), pointer(key, found.size), db=held.entries)
                    used += found.size
            txn.put(_USED, b"%d" % used, db=held.meta)

    # -- reads -----------------------------------------------------------------------------

    def get(self, d: bytes, key: str) -> bytes | object | None:
        """The validated value under ``d``, IN_FILE (a large object: read its file), or None.

        Raises CorruptEntry or KeyMismatch as :func:`~fastload.cache.entry.decode_packed`.
        """
        held = self._held()
        try:
            with held.env.begin(db=held.entries, buffers=True) as txn:
                blob = txn.get(d)
                if blob is None:
                    return None
                value = IN_FILE if is_pointer(blob) else entry.decode_packed(blob, expect_key=key)
        except lmdb.Error as exc:
            raise self._fault(exc) from exc
        if self.lru:
            self._note_read(d)
        return value

    def get_many(self, ds: Sequence[bytes], keys: Sequence[str]) -> list[bytes | object | None]:
        """:meth:`get` of each (digest, key) in one read transaction (a batch's reads); an
        entry that fails validation is its CorruptEntry or KeyMismatch, returned in its place."""
        held = self._held()
        out: list[bytes | object | None] = []
        try:
            with held.env.begin(db=held.entries, buffers=True) as txn:
                for d, key in zip(ds, keys):
                    blob = txn.get(d)
                    if blob is None or is_pointer(blob):
                        out.append(None if blob is None else IN_FILE)
                        continue
                    try:
                        out.append(entry.decode_packed(blob, expect_key=key))
                    except (entry.CorruptEntry, entry.KeyMismatch) as exc:
                        out.append(exc)
        except lmdb.Error as exc:
            raise self._fault(exc) from exc
        if self.lru:
            for d, value in zip(ds, out):
                if value is not None and not isinstance(value, Exception):
                    self._note_read(d)
        return out

    def contains(self, ds: list[bytes]) -> list[bool | object]:
        """Whether a record is stored under each digest, IN_FILE for a large object's pointer
        (check its file); one read transaction."""
        held = self._held()
        try:
            with held.env.begin(db=held.entries, buffers=True) as txn:
                found = [txn.get(d) for d in ds]
                return [IN_FILE if b is not None and is_pointer(b) else b is not None for b in found]
        except lmdb.Error as exc:
            raise self._fault(exc) from exc

    def _note_read(self, d: bytes) -> None:
        self._atimes[d] = time.time_ns()
        if len(self._atimes) >= ATIMES_PENDING or time.monotonic() - self._atimes_at > ATIMES_EVERY_S:
            self._commit(lambda held, txn: None)

    def used(self) -> int:
        """Bytes of records and pointed-to files, as committed."""
        held = self._held()
        try:
            with held.env.begin(db=held.meta) as txn:
                return int(txn.get(_USED) or 0)
        except lmdb.Error as exc:
            raise self._fault(exc) from exc

    def records(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (digest, record) stored, in digest order (one read transaction)."""
        held = self._held()
        try:
            with held.env.begin(db=held.entries) as txn:
                yield from txn.cursor()
        except lmdb.Error as exc:
            raise self._fault(exc) from exc

    # -- writes ----------------------------------------------------------------------------

    def _commit(self, write: Callable[[Env, lmdb.Transaction], T], *, flush: bool = False) -> T:
        """Run ``write(held, txn)`` in one write transaction with the pending atimes."""
        held = self._held()

        def with_atimes(txn: lmdb.Transaction) -> T:
            if self._atimes:
                pending, self._atimes = self._atimes, {}
                for d, t in pending.items():
                    if txn.get(d, db=held.entries) is not None:
                        txn.put(d, _NANOS.pack(t), db=held.atimes)
            return write(held, txn)

        try:
            result = held.commit(with_atimes, flush=flush)
        except StoreFault as exc:
            raise self._fault(exc) from exc
        self._atimes_at = time.monotonic()
        return result

    def put_many(self, records: list[tuple[bytes, bytes]], budget: int) -> list[Status]:
        """Store (digest, record) pairs in one transaction, within ``budget`` bytes; a status
        each. Under policy "keep" the first record that does not fit ends the admissions."""

        def write(held: Env, txn: lmdb.Transaction) -> list[Status]:
            used = int(txn.get(_USED, db=held.meta) or 0)
            now = _NANOS.pack(time.time_ns())
            out: list[Status] = []
            full = False
            entries, lru = held.entries, self.lru
            for d, rec in records:
                n = len(rec) if rec[:4] != FILE_MAGIC else accounted(rec)  # accounted(), inline
                if full or used + n > budget:
                    if txn.get(d, db=entries) is not None:
                        out.append("exists")
                        continue
                    if lru and n <= budget:
                        used = self._evict(held, txn, used, n, budget)
                    if full or used + n > budget:
                        out.append("oversized" if n > budget else "full")
                        full = full or (n <= budget and not lru)
                        continue
                if not txn.put(d, rec, db=entries, overwrite=False):  # one lookup, not two
                    out.append("exists")
                    continue
                if lru:
                    txn.put(d, now, db=held.atimes)
                used += n
                out.append("stored")
            txn.put(_USED, b"%d" % used, db=held.meta)
            return out

        return self._commit(write)

    def _evict(self, held: Env, txn: lmdb.Transaction, used: int, need: int, budget: int) -> int:
        """Delete the least recently read records until ``need`` more bytes fit; new ``used``."""
        target = min(budget - need, int(budget * LOW_WATER))
        ages = sorted((_NANOS.unpack(t)[0], d) for d, t in txn.cursor(db=held.atimes))
        for _, d in ages:
            if used <= target:
                break
            rec = txn.get(d, db=held.entries)
            txn.delete(d, db=held.atimes)
            if rec is not None:
                used -= accounted(rec)
                txn.delete(d, db=held.entries)
                if is_pointer(rec):
                    self._remove_file(record_key(rec))
        return used

    def _remove_file(self, key: str) -> None:
        try:
            self.cache_dir.entries.remove(digest(key))
        except OSError as exc:
            logger.debug("disk cache %s: cannot delete the file of %s: %s", self.cache_dir.path, key, exc)

    def delete(self, d: bytes) -> bytes | None:
        """Delete the record under ``d``; the record (a pointer: its file is the caller's)."""

        def write(held: Env, txn: lmdb.Transaction) -> bytes | None:
            rec = txn.pop(d, db=held.entries)
            txn.delete(d, db=held.atimes)
            if rec is not None:
                used = int(txn.get(_USED, db=held.meta) or 0) - accounted(rec)
                txn.put(_USED, b"%d" % max(0, used), db=held.meta)
            return rec

        return self._commit(write)

    def clear(self) -> tuple[int, int, list[str]]:
        """Delete every record: (records, their bytes, the keys of the pointed-to files)."""

        def write(held: Env, txn: lmdb.Transaction) -> tuple[int, int, list[str]]:
            n, size, files = 0, 0, []
            for _, rec in txn.cursor(db=held.entries):
                n += 1
                size += accounted(rec)
                if is_pointer(rec):
                    files.append(record_key(rec))
            txn.drop(held.entries, delete=False)
            txn.drop(held.atimes, delete=False)
            txn.put(_USED, b"0", db=held.meta)
            return n, size, files

        return self._commit(write, flush=True)

    def rescan(self, *, write: bool = True) -> tuple[int, int]:
        """Recount records and bytes and store the count in ``used`` if it was wrong (and
        ``write``); (records, bytes)."""
        held = self._held()
        try:
            with held.env.begin(db=held.entries) as txn:
                sizes = [accounted(rec) for _, rec in txn.cursor()]
                right = int(txn.get(_USED, db=held.meta) or 0) == sum(sizes)
        except lmdb.Error as exc:
            raise self._fault(exc) from exc
        if not write or right:
            return len(sizes), sum(sizes)

        def recount(held: Env, txn: lmdb.Transaction) -> tuple[int, int]:
            sizes = [accounted(rec) for _, rec in txn.cursor(db=held.entries)]
            txn.put(_USED, b"%d" % sum(sizes), db=held.meta)
            return len(sizes), sum(sizes)

        return self._commit(recount)

    def flush(self) -> None:
        """Write the pending atimes and put every commit of this process on disk."""
        if self._env is None or self._env.read_only:
            return
        held = self._held()
        if self._atimes:
            self._commit(lambda held, txn: None, flush=True)
        else:
            held.flush()
