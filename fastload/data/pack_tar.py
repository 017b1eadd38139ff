"""A tar shard written as it goes, to a local file: the bytes ``tarfile`` writes, the data of a
local source file copied file to file by the kernel.

NOTE [pack's tar bytes]
A shard is the byte sequence ``tarfile.open(mode="w", format=tarfile.PAX_FORMAT)`` makes of
the same members, each a ``TarInfo(name)`` with ``size``, ``mtime=MTIME`` and ``mode=0o444``
(webdataset's ``TarWriter`` is such a tarfile): per member its header block(s), the data, NULs
to the next 512-byte block; at the end two NUL blocks and NULs to a multiple of tar's record
(10,240 bytes). :func:`member_header` builds the plain ustar header of a short ASCII name
itself (tarfile's header building took half of a copy-through pack's time) and leaves any
other name (longer than 100 bytes, or not ASCII: a pax extended header first) to tarfile's
own ``TarInfo.tobuf``. tests/test_pack.py compares shards with what tarfile writes.

Example::

    >>> shard = ShardFile("/data/shards/shard-000000.tar.tmp")
    >>> offset = shard.add("cat/1.cls", b"3")
    >>> shard.finish(sync=True)           # the end blocks, fsync, close
    10240
"""

from __future__ import annotations

import errno
import os
import tarfile

from fastload.errors import ConfigError, StorageError
from fastload.io.errors import describe

__all__ = ["MTIME", "ShardFile", "member_header"]

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
MTIME = 1_700_000_000
"""Every member's time: packing the same files gives the same bytes."""
_FLUSH = 1 << 20
"""Bytes of headers and in-memory data gathered before one write."""
_CHUNK = 1 << 30
"""Most bytes asked of one copy call."""

# The fields after the name, around size and mtime, as tarfile fills them for a regular file
# of mode 0o444 owned by uid/gid 0 without user/group names.
_MODE_IDS = b"0000444\0" + b"0000000\0" * 2
_MTIME_FIELD = b"%011o\0" % MTIME
_AFTER_CHECKSUM = (b"0" + b"\0" * 100 + tarfile.POSIX_MAGIC + b"\0" * (32 + 32 + 8 + 8 + 155)
                   + b"\0" * 12)
_FIXED_SUM = sum(_MODE_IDS) + sum(_MTIME_FIELD) + sum(_AFTER_CHECKSUM) + 8 * ord(" ")
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP,
                   errno.ENOTSOCK, errno.EBADF, errno.EPERM)
"""copy_file_range/sendfile errors that mean "not between these files": copy through memory."""


def member_header(name: str, size: int) -> bytes:
    """The header block(s) tarfile writes before member ``name`` of ``size`` bytes (NOTE
    [pack's tar bytes])."""
    if len(name) <= 100 and name.isascii() and size < 8 ** 11:
        encoded = name.encode("ascii")
        size_field = b"%011o\0" % size
        checksum = _FIXED_SUM + sum(encoded) + sum(size_field)
        return b"".join((encoded, b"\0" * (100 - len(encoded)), _MODE_IDS, size_field,
                         _MTIME_FIELD, b"%06o\0 " % checksum, _AFTER_CHECKSUM))
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, MTIME, 0o444
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


class ShardFile:
    """A tar file being written at local ``path``, member by member (NOTE [pack's tar bytes]).

    :meth:`add` appends a member from bytes, :meth:`add_file` one from an open file (copied by
    ``os.copy_file_range``, else ``os.sendfile``, else through memory; ``copy`` picks where
    to start, for tests); small pieces are gathered into one write. :attr:`offset` is the
    tar's length so far. :meth:`finish` ends it; :meth:`discard` removes it. A failed write
    raises :class:`~fastload.errors.StorageError` naming ``shown_as``; a source file that
    ends before ``size`` raises :class:`EOFError`. Example::

        >>> shard = ShardFile("/tmp/x.tar")
        >>> shard.add_file("cat/1.jpg", fd, os.fstat(fd).st_size, "/data/cat/1.jpg")
        512
    """

    COPIES = ("copy_file_range", "sendfile", "memory")
    """How :meth:`add_file` can copy, best first; each falls back to the next where the
    system cannot copy between the two files that way."""

    def __init__(self, path: str, *, shown_as: str | None = None, copy: str | None = None):
        if copy is not None and copy not in self.COPIES:
            raise ConfigError(f"copy={copy!r}: expected one of {self.COPIES}")
        self.path = path
        self.shown_as = shown_as or path
        """The shard's name in error messages (its final URL, not the temporary file)."""
        self.offset = 0
        self._pending = bytearray()
        self._copy = copy or next(c for c in self.COPIES if c == "memory" or hasattr(os, c))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0)
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot write {self.shown_as}: {describe(exc)}") from exc

    def add(self, name: str, data: bytes) -> int:
        """Append member ``name`` holding ``data``; returns the offset of its data."""
        header = member_header(name, len(data))
        start = self.offset + len(header)
        self._pending += header
        self._pending += data
        self._pending += _padding(len(data))
        self.offset = start + len(data) + (-len(data) % BLOCK)
        if len(self._pending) >= _FLUSH:
            self._flush()
        return start

    def add_file(self, name: str, fd: int, size: int, source: str) -> int:
        """Append member ``name`` holding the first ``size`` bytes of the open file ``fd``
        (``source`` names it in errors); returns the offset of its data. A file shorter than
        ``size`` raises :class:`EOFError` (it changed since it was measured)."""
        header = member_header(name, size)
        start = self.offset + len(header)
        self._pending += header
        self._flush()
        try:
            self._copy_from(fd, size, source)
        except OSError as exc:
            raise StorageError(
                f"cannot write {self.shown_as}: copying {source} into it failed: {describe(exc)}"
            ) from exc
        self._pending += _padding(size)
        self.offset = start + size + (-size % BLOCK)
        return start

    def finish(self, *, sync: bool) -> int:
        """End the tar (two NUL blocks, NULs to a whole record), ``fsync`` it if ``sync`` and
        close it; returns its size in bytes."""
        end = self.offset + 2 * BLOCK
        self._pending += b"\0" * (end - self.offset + (-end % RECORD))
        self.offset = end + (-end % RECORD)
        self._flush()
        try:
            if sync:
                os.fsync(self._fd)
        except OSError as exc:
            raise StorageError(f"cannot write {self.shown_as}: {describe(exc)}") from exc
        finally:
            self._close()
        return self.offset

    def discard(self) -> None:
        """Close and remove the unfinished file (after an error)."""
        self._close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def _flush(self) -> None:
        view = memoryview(self._pending)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            raise StorageError(f"cannot write {self.shown_as}: {describe(exc)}") from exc
        finally:
            view.release()
        del self._pending[:]

    def _copy_from(self, fd: int, size: int, source: str) -> None:
        """``size`` bytes of ``fd`` from its start to this file's position, in the kernel
        where it can (the data never enters Python)."""
        copied = 0
        while copied < size:
            want = min(size - copied, _CHUNK)
            try:
                if self._copy == "copy_file_range":
                    n = os.copy_file_range(fd, self._fd, want, copied)
                elif self._copy == "sendfile":
                    n = os.sendfile(self._fd, fd, copied, want)
                else:
                    n = self._copy_through_memory(fd, want, copied)
            except OSError as exc:
                if self._copy == "memory" or exc.errno not in _NO_KERNEL_COPY:
                    raise
                self._copy = "sendfile" if self._copy == "copy_file_range" else "memory"
                continue
            if n == 0:
                raise EOFError(f"{source} ended after {copied} of its {size} bytes: it changed "
                               "while it was packed")
            copied += n

    def _copy_through_memory(self, fd: int, want: int, offset: int) -> int:
        data = os.pread(fd, min(want, 8 << 20), offset)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        return len(data)
