"""LMDB's data file read with ``pread``, never mapped: is it whole, is it LMDB's, is it ours?

NOTE [a store is checked before it is mapped]
LMDB maps ``data.mdb`` and follows page numbers into the mapping: a page past the end of a
file cut short (a full disk during a copy, an interrupted rsync, another tool) is a SIGBUS
that kills the process, not an error. So nothing reads through a mapping of a file whose
size is not what LMDB's own header says it needs:

* Before a process maps the store (:func:`read_header`, called by :mod:`.lmdbenv` for every
  open, a forked or spawned worker's included) the two meta pages at the start of the file
  are read with ``pread`` and checked as LMDB checks them (the meta flag, magic
  ``0xBEEFC0DE``, data version 1, a page size that is a power of two) and the file must
  hold every page either meta names: ``(last page + 1) * page size`` bytes.
* While a process uses it (:meth:`SizeGuard.check`, before every read or write
  transaction): one ``fstat`` of the mapped file; only when its size changed (a commit
  grows it; LMDB never shrinks it) are the meta pages read again and compared. A file cut
  in the microseconds between that check and the read can still fault the process: LMDB
  cannot protect a mapping from a file truncated under it, and neither can fastload.
* A file whose first bytes are not LMDB's, whose meta pages disagree with its size, or that
  LMDB itself finds corrupt is *damaged* (:class:`StoreDamaged`); one of LMDB's other byte
  order or data version, or one holding databases fastload does not make, is *foreign*
  (``foreign=True``): fastload never writes, moves or deletes it.
* Damage inside the pages (a B-tree page or a node header overwritten in place, the file
  still whole) is not visible in the header: LMDB may then follow a wrong page number.
  :func:`walk` checks every page of every database with ``pread`` (``fastload cache
  verify`` runs it before it reads a record through LMDB).

Example::

    >>> fd = os.open("/nvme/fastload/packed/data.mdb", os.O_RDONLY)
    >>> header = read_header(fd, Path("/nvme/fastload/packed/data.mdb"))
    >>> header.needed <= os.fstat(fd).st_size
    True
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import lmdb

__all__ = ["Header", "SizeGuard", "StoreDamaged", "StoreFault", "lmdb_fault", "read_header", "walk"]

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
OWN_DATABASES = frozenset({b"entries", b"atimes", b"meta"})

_PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper (16 bytes: PAGEHDRSZ)
# magic, version, address, map size, free db, main db, last page, txnid
_META = struct.Struct("<IIQQ48s48sQQ")
# pad (free db: the page size), flags, depth, branch, leaf and overflow pages, entries, root
_DB = struct.Struct("<IHHQQQQQ")
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size (8 bytes: NODESIZE)
_PGNO = struct.Struct("<Q")
_OVERFLOW_PAGES = struct.Struct("<I")
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
P_INVALID = (1 << 64) - 1
_HEADER_BYTES = _PAGE.size + _META.size
_MAX_DEPTH = 64


class StoreFault(OSError):
    """The packed store failed (LMDB's error is the cause); ENOSPC when its map is full."""

    def __str__(self) -> str:
        return str(self.strerror)  # the message, without OSError's "[Errno 5]"


class StoreDamaged(StoreFault):
    """The packed store's file is damaged (``foreign`` False) or not fastload's (True).

    ``why`` says what is wrong in words, ``path`` is ``data.mdb``.
    """

    def __init__(self, path: Path, why: str, *, foreign: bool = False) -> None:
        what = "not fastload's" if foreign else "damaged"
        super().__init__(errno.EIO, f"the packed store {path} is {what}: {why}")
        self.path = path
        self.why = why
        self.foreign = foreign


_DAMAGE = (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError)


def lmdb_fault(exc: lmdb.Error, path: Path, doing: str) -> StoreFault:
    """The StoreFault that ``exc``, raised by LMDB while ``doing`` (e.g. "read"), stands for:
    StoreDamaged when LMDB found its file corrupt or of another version."""
    data = path / "data.mdb"
    if isinstance(exc, _DAMAGE):
        return StoreDamaged(data, f"LMDB found it corrupt ({exc})")
    if isinstance(exc, lmdb.VersionMismatchError):
        return StoreDamaged(data, f"it was written by another version of LMDB ({exc})", foreign=True)
    if isinstance(exc, lmdb.MapFullError):
        return StoreFault(errno.ENOSPC, f"the packed store {path} is full: {exc}")
    return StoreFault(errno.EIO, f"cannot {doing} the packed store {path}: {exc}")


@dataclass(frozen=True)
class Header:
    """What LMDB's two meta pages say: page size, the last page either names, the map size."""

    page_size: int
    last_page: int
    map_size: int
    roots: tuple[bytes, bytes]
    """The free and main databases' records (48 bytes each) of the newer meta page."""

    @property
    def needed(self) -> int:
        """Bytes the file must have for every page LMDB may read."""
        return (self.last_page + 1) * self.page_size


def _meta(raw: bytes, which: int, path: Path) -> tuple[int, int, int, int, bytes, bytes]:
    """(page size, last page, txnid, map size, free db, main db) of meta page ``which``."""
    _, _, flags, _, _ = _PAGE.unpack_from(raw)
    magic, version, _, map_size, free, main, last, txnid = _META.unpack_from(raw, _PAGE.size)
    if magic == struct.unpack("<I", struct.pack(">I", MAGIC))[0]:
        raise StoreDamaged(path, "it was written on a machine of the other byte order", foreign=True)
    if magic != MAGIC or not flags & P_META:
        raise StoreDamaged(path, f"its {'first' if which == 0 else 'second'} header page is not LMDB's (overwritten)")
    if version != DATA_VERSION:
        raise StoreDamaged(path, f"it is an LMDB store of data version {version}; this LMDB reads {DATA_VERSION}",
                           foreign=True)
    page_size = _DB.unpack(free)[0]
    if not 256 <= page_size <= 65536 or page_size & (page_size - 1):
        raise StoreDamaged(path, f"its header names a page size of {page_size} bytes (overwritten)")
    return page_size, last, txnid, map_size, free, main


def read_header(fd: int, path: Path) -> Header | None:
    """The header of the data file open at ``fd`` (at ``path``, for messages), checked
    against its size; None for an empty file (a store LMDB has not made yet).

    Raises StoreDamaged: a file cut short, overwritten, or not fastload's.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    first = os.pread(fd, _HEADER_BYTES, 0)
    if len(first) < _HEADER_BYTES:
        raise StoreDamaged(path, f"cut short or overwritten: {size} bytes, less than LMDB's header")
    page_size, last0, txn0, map0, free0, main0 = _meta(first, 0, path)
    second = os.pread(fd, _HEADER_BYTES, page_size)
    if len(second) < _HEADER_BYTES:
        raise StoreDamaged(path, f"cut short: {size} bytes, less than LMDB's two header pages")
    size1, last1, txn1, map1, free1, main1 = _meta(second, 1, path)
    if size1 != page_size:
        raise StoreDamaged(path, f"its header pages disagree on the page size ({page_size}, {size1})")
    newer = (free1, main1, map1) if txn1 > txn0 else (free0, main0, map0)
    header = Header(page_size, max(last0, last1, 1), newer[2], (newer[0], newer[1]))
    size = os.fstat(fd).st_size  # after the header: a commit writes its pages, then its meta
    if size < header.needed:
        raise StoreDamaged(path, f"cut short: {size} bytes where its header needs {header.needed} "
                                 f"({header.last_page + 1} pages of {page_size} bytes)")
    return header


class SizeGuard:
    """Checks, before a transaction, that the mapped file still holds every page LMDB may read.

    :meth:`check` costs one ``lseek`` to the end (the size, about 0.4 us; ``fstat`` costs
    1.5) when the size is the one last checked; the meta pages are read again when it
    changed (NOTE [a store is checked before it is mapped]). ``size`` is that size.
    """

    def __init__(self, fd: int, path: Path, header: Header | None) -> None:
        self.fd = fd
        self.path = path
        self.size = os.fstat(fd).st_size if header is not None else -1

    def check(self) -> None:
        """Raise StoreDamaged if the file was cut below what its header needs."""
        size = os.lseek(self.fd, 0, os.SEEK_END)  # the descriptor is only ever pread
        if size != self.size:
            self.changed(size)

    def changed(self, size: int) -> None:
        """The file is ``size`` bytes now, not :attr:`size`: check it against its header.

        A smaller file is not damage by itself: another process's LMDB may set the file to
        its own map size when it opens the store. What matters is whether every page the
        header says exists is still in the file (a store set aside on a shrink that kept
        them sent every read of two workers and a prefetcher to the origin).
        """
        try:
            read_header(self.fd, self.path)
        except StoreDamaged as exc:
            if size < self.size:
                raise StoreDamaged(
                    self.path, f"cut short while in use: from {self.size} to {size} bytes ({exc.why})"
                ) from exc
            raise
        self.size = size

    def close(self) -> None:
        os.close(self.fd)


# -- the pages, for verify -------------------------------------------------------------------


class _Walk:
    """Every page reachable from the header, read with pread and checked (see :func:`walk`)."""

    def __init__(self, fd: int, path: Path, header: Header) -> None:
        self.fd, self.path, self.header = fd, path, header
        self.psize = header.page_size
        self.seen: set[int] = set()
        self.databases: list[tuple[str, bytes]] = []

    def bad(self, pgno: int, why: str) -> StoreDamaged:
        return StoreDamaged(self.path, f"page {pgno} {why}")

    def page(self, pgno: int) -> bytes:
        if pgno > self.header.last_page or pgno < 2:
            raise self.bad(pgno, f"is named but the store has pages 2 to {self.header.last_page}")
        if pgno in self.seen:
            raise self.bad(pgno, "is named twice (a loop in the tree)")
        self.seen.add(pgno)
        raw = os.pread(self.fd, self.psize, pgno * self.psize)
        if len(raw) < self.psize:
            raise self.bad(pgno, "lies past the end of the file (cut short)")
        if _PAGE.unpack_from(raw)[0] != pgno:
            raise self.bad(pgno, f"says it is page {_PAGE.unpack_from(raw)[0]} (overwritten)")
        return raw

    def tree(self, db: bytes, name: str) -> None:
        root, depth = _DB.unpack(db)[7], _DB.unpack(db)[2]
        if root != P_INVALID:
            if depth > _MAX_DEPTH:
                raise StoreDamaged(self.path, f"database {name} says it is {depth} levels deep (overwritten)")
            self.node_page(root, name, depth)

    def node_page(self, pgno: int, name: str, levels: int) -> None:
        raw = self.page(pgno)
        _, _, flags, lower, upper = _PAGE.unpack_from(raw)
        kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2)
        if kind not in (P_BRANCH, P_LEAF) or levels < 1 or (kind == P_LEAF) != (levels == 1):
            raise self.bad(pgno, f"of database {name} has flags {flags:#x} where a "
                                 f"{'leaf' if levels == 1 else 'branch'} page belongs (overwritten)")
        if not _PAGE.size <= lower <= upper <= self.psize or (lower - _PAGE.size) % 2:
            raise self.bad(pgno, f"has a broken layout (lower {lower}, upper {upper})")
        for i in range((lower - _PAGE.size) // 2):
            at = struct.unpack_from("<H", raw, _PAGE.size + 2 * i)[0]
            if not upper <= at <= self.psize - _NODE.size:
                raise self.bad(pgno, f"has its node {i} at offset {at}, outside the page")
            lo, hi, nflags, ksize = _NODE.unpack_from(raw, at)
            end = at + _NODE.size + ksize
            if kind == P_BRANCH:
                if end > self.psize:
                    raise self.bad(pgno, f"has its node {i} running past the page")
                self.node_page(lo | hi << 16 | nflags << 32, name, levels - 1)
            else:
                key = raw[at + _NODE.size:end] if end <= self.psize else b""
                self.leaf_node(raw, pgno, i, key, end, lo | hi << 16, nflags, name)

    def leaf_node(self, raw: bytes, pgno: int, i: int, key: bytes, end: int, size: int, flags: int,
                  name: str) -> None:
        if end > self.psize:
            raise self.bad(pgno, f"has its node {i} running past the page")
        if flags & F_DUPDATA:
            raise StoreDamaged(self.path, f"its {name} database holds duplicate keys, which fastload "
                                          "never writes", foreign=True)
        if flags & F_BIGDATA:
            if end + _PGNO.size > self.psize:
                raise self.bad(pgno, f"has its node {i} running past the page")
            first = _PGNO.unpack_from(raw, end)[0]
            head = self.page(first)
            pages = _OVERFLOW_PAGES.unpack_from(head, 12)[0]
            if not _PAGE.unpack_from(head)[2] & P_OVERFLOW or pages * self.psize < size + _PAGE.size:
                raise self.bad(first, f"is not the start of the overflow pages of {size} bytes that "
                                      f"page {pgno} names")
            if first + pages - 1 > self.header.last_page:
                raise self.bad(first, f"starts {pages} overflow pages that run past the store's end")
            self.seen.update(range(first + 1, first + pages))
            return
        if end + size > self.psize:
            raise self.bad(pgno, f"has its node {i} of {size} bytes running past the page")
        if name == "main":
            if key not in OWN_DATABASES or not flags & F_SUBDATA or size != _DB.size:
                shown = repr(key.decode(errors="replace"))
                raise StoreDamaged(self.path, f"it holds databases fastload never makes ({shown})",
                                   foreign=True)
            self.databases.append((key.decode(), bytes(raw[end:end + size])))
        elif name == "free" and size >= _PGNO.size:
            count = _PGNO.unpack_from(raw, end)[0]
            listed = raw[end + _PGNO.size:end + _PGNO.size * (count + 1)]
            if count * _PGNO.size > size - _PGNO.size or any(
                    p > self.header.last_page for (p,) in _PGNO.iter_unpack(listed)):
                raise self.bad(pgno, f"lists free pages that are not in the store (node {i})")


def walk(fd: int, path: Path) -> int:
    """Check every page of the store open at ``fd`` with pread: each page named by a tree is
    inside the file, says its own number, has its type and a layout whose nodes stay in the
    page; overflow runs end inside the store. Pages checked; raises StoreDamaged."""
    header = read_header(fd, path)
    if header is None:
        return 0
    state = _Walk(fd, path, header)
    state.tree(header.roots[0], "free")
    state.tree(header.roots[1], "main")
    for name, db in state.databases:
        state.tree(db, name)
    return len(state.seen)
