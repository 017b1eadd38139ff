"""The ``entries/`` directory of a cache directory: one file per entry, never through a symlink.

An entry file is named by the 32-hex xxh3-128 digest of its key (:func:`~fastload.cache.keys.digest`)
and lives in ``entries/<first two digits>/``. It is written to ``tmp/`` and renamed into place,
so a reader sees a whole entry or none. Every name is opened relative to a directory
descriptor with ``O_NOFOLLOW`` (NOTE [a cache directory holds only fastload's files] in
:mod:`.cachedir`); a name that is not fastload's raises :class:`~fastload.cache.safefs.Foreign`.
What an entry file holds is :mod:`.entry`'s business; this module only moves bytes.

Example::

    >>> files = CacheDir(Path("/nvme/fastload"), create=True).entries
    >>> files.store("ab" + "0" * 30, [b"header", b"value"])
    >>> files.open("ab" + "0" * 30).read()
    b'headervalue'
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from fastload.cache.safefs import (
    Foreign,
    Found,
    classify,
    close_all,
    describe,
    listing,
    open_dir,
    open_file,
    write_temp,
)

ENTRY_NAME = re.compile(r"[0-9a-f]{32}")
SUBDIR_NAME = re.compile(r"[0-9a-f]{2}")

__all__ = ["ENTRY_NAME", "EntryFiles", "entry_name_of"]


class EntryFiles:
    """The entry files below ``path`` (``<cache>/entries``), written through ``tmp_fd``.

    Args:
        path: where ``entries/`` is, for messages.
        entries_fd: a descriptor of ``entries/`` (duplicated: this object owns its own).
        tmp_fd: a descriptor of the cache's ``tmp/`` (duplicated too).

    The 256 subdirectory descriptors are opened on first use and stay open with the object:
    a cache read then costs one open of the entry file, not three of its directories too.
    """

    def __init__(self, path: Path, entries_fd: int, tmp_fd: int) -> None:
        self.path = path
        self._fds: list[int] = []
        # Descriptors close with the object, never at exit: a finalizer may still flush then.
        weakref.finalize(self, close_all, self._fds).atexit = False
        self._entries = os.dup(entries_fd)
        self._fds.append(self._entries)
        self._tmp = os.dup(tmp_fd)
        self._fds.append(self._tmp)
        self._subs: dict[str, int] = {}  # entries/<xx> descriptors, opened on first use

    def path_of(self, name: str) -> Path:
        """Where the entry file ``name`` (a 32-hex digest) lives, for messages."""
        return self.path / name[:2] / name

    @contextlib.contextmanager
    def _subdir(self, name: str, *, create: bool) -> Iterator[int | None]:
        """The descriptor of ``entries/<xx>`` for entry ``name`` (None: missing, not created).

        A store first checks that its directory is still linked, in case someone removed it
        meanwhile.
        """
        sub = name[:2]
        fd = self._subs.get(sub)
        if fd is not None and create and os.fstat(fd).st_nlink == 0:
            del self._subs[sub]  # removed under us: reopen (or recreate) it by name
            with contextlib.suppress(ValueError):
                self._fds.remove(fd)
                os.close(fd)
            fd = None
        if fd is None:
            try:
                fd = open_dir(self._entries, sub, self.path)
            except FileNotFoundError:
                if not create:
                    yield None
                    return
                with contextlib.suppress(FileExistsError):
                    os.mkdir(sub, dir_fd=self._entries)
                fd = open_dir(self._entries, sub, self.path)
            kept = self._subs.setdefault(sub, fd)  # another thread may have opened it too
            if kept != fd:
                os.close(fd)
                fd = kept
            else:
                self._fds.append(fd)
        yield fd

    def open(self, name: str) -> BinaryIO:
        """The entry file ``name``, open for reading; FileNotFoundError, or Foreign if not a file."""
        with self._subdir(name, create=False) as sub:
            if sub is None:
                raise FileNotFoundError(errno.ENOENT, "no such entry", str(self.path_of(name)))
            return os.fdopen(open_file(sub, name, os.O_RDONLY, self.path_of(name).parent), "rb")

    def stat(self, name: str) -> os.stat_result | None:
        """The entry file's lstat; None if missing, Foreign if not a regular file."""
        with self._subdir(name, create=False) as sub:
            if sub is None:
                return None
            try:
                st = os.stat(name, dir_fd=sub, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if not stat.S_ISREG(st.st_mode):
                raise Foreign(self.path_of(name), describe(sub, name))
            return st

    def store(self, name: str, parts: Iterable[bytes]) -> None:
        """Write ``parts`` to a file in tmp/ and rename it to the entry ``name``."""
        with self._subdir(name, create=True) as sub:
            tmp = write_temp(self._tmp, parts)
            try:
                os.replace(tmp, name, src_dir_fd=self._tmp, dst_dir_fd=sub)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self._tmp)
                raise

    def remove(self, name: str) -> int | None:
        """Delete the entry file ``name`` if it is a regular file; its size, None if missing."""
        with self._subdir(name, create=False) as sub:
            if sub is None:
                return None
            try:
                st = os.stat(name, dir_fd=sub, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise Foreign(self.path_of(name), describe(sub, name))
                os.unlink(name, dir_fd=sub)  # unlink never follows a symlink
            except FileNotFoundError:
                return None
            return st.st_size

    def touch(self, name: str) -> None:
        """Mark the entry as read now (the LRU policy's clock)."""
        with self._subdir(name, create=False) as sub:
            if sub is not None:
                os.utime(name, dir_fd=sub, follow_symlinks=False)

    def walk(self) -> Iterator[Found]:
        """Every name below entries/: entry files, and the foreign names with what they are."""
        for sub in listing(self._entries):
            try:
                if not SUBDIR_NAME.fullmatch(sub):
                    raise Foreign(self.path / sub, f"{describe(self._entries, sub)} fastload did not make")
                fd = open_dir(self._entries, sub, self.path)
            except Foreign as exc:
                yield Found(exc.path, sub, foreign=exc.why)
                continue
            except FileNotFoundError:
                continue
            try:
                for name in listing(fd):
                    found = classify(fd, name, self.path / sub, entry_name_of(sub))
                    if found is not None:
                        yield found
            finally:
                os.close(fd)


def entry_name_of(sub: str) -> Callable[[str], bool]:
    """Whether a file name in entries/``sub``/ is an entry's: 32 hex digits starting with ``sub``."""
    return lambda name: ENTRY_NAME.fullmatch(name) is not None and name.startswith(sub)
