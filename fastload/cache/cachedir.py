"""A disk cache directory opened safely: its marker, its fixed layout, its small root files
and locks, all without ever following a symlink. Its entry files are :attr:`CacheDir.entries`
(:class:`~fastload.cache.entryfiles.EntryFiles`). The disk tier (:mod:`.disk`), its stores,
its counters (:mod:`.diskstats`) and ``fastload cache`` (:mod:`.maintenance`) reach the
directory only through :class:`CacheDir`.

NOTE [a cache directory holds only fastload's files]
A cache directory is often shared by a group, and anyone who can write it can plant a name
in it (``entries/ab -> /home/you``, ``used -> ~/thesis.tex``). fastload never reads, writes
or deletes through such a name, and never takes a user's directory for a cache:

* A directory is a cache only if it holds ``fastload-cache.json`` with fastload's magic
  string, its format and the version that wrote it. fastload writes one only into an empty
  or new directory (atomically, with ``link``), so a directory of a user's files is refused,
  never adopted.
* The directory itself is opened once (it may be a symlink: that is the user's own path).
  ``entries/``, ``tmp/`` and ``locks/`` are opened once with ``O_DIRECTORY | O_NOFOLLOW``;
  every other name is opened relative to one of these descriptors (``dir_fd=``) with
  ``O_NOFOLLOW``, so no component below the root is ever resolved through a symlink.
* Files are opened with ``O_NONBLOCK`` (a planted FIFO cannot hang a process) and must be
  regular files (``fstat``); ``used``, written in place, must also have a single link. Lock
  files are opened without ``O_TRUNC`` (fastload's own ``flock``).
* Anything else is *foreign* (:class:`Foreign`): left alone, reported by
  ``fastload cache verify`` and ``clear``.

Example::

    >>> d = CacheDir(Path("/nvme/fastload"), create=True)
    >>> d.format, d.marker["budget"]
    ('packed', None)
    >>> with d.index_lock(timeout=30):
    ...     d.update_marker(budget=500 * 10**9)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastload.cache.entryfiles import EntryFiles
from fastload.cache.forks import after_fork
from fastload.cache.safefs import (
    TEMP_PREFIX,
    Foreign,
    Found,
    classify,
    close_all,
    describe,
    flock,
    listing,
    open_dir,
    open_file,
    write_temp,
)
from fastload.errors import CacheError

MARKER = "fastload-cache.json"
MAGIC = "fastload cache directory"
# NOTE [cache formats]: the marker's "format" says how small entries are kept. 1: one file
# per entry (every directory made before the packed store); 2: packed into the LMDB store in
# packed/ (fastload.cache.packed), objects of FILE_MIN bytes and more still a file each.
FORMATS = {1: "files", 2: "packed"}
FORMAT_NUMBERS = {name: number for number, name in FORMATS.items()}
FORMAT = 2  # what a new directory gets unless asked for another
PACKED = "packed"
SHARDS = "shards"  # whole shard files (NOTE [the shard store] in fastload/cache/shardstore.py)
SUBDIRS = ("entries", "locks", "tmp")
ROOT_FILES = (MARKER, "used", "stats.json", ".index.lock")
OWN_NAMES = frozenset(SUBDIRS + ROOT_FILES + (PACKED, SHARDS))
LOCK_NAME = re.compile(r"[0-9a-f]{3}\.lock")
SHARD_NAME = re.compile(r"[0-9a-f]{32}\.(data|json|lock)|budget\.lock")
PACKED_FILES = ("data.mdb", "lock.mdb")  # LMDB's two files
UNSYNCED = "unsynced-"  # NOTE [packed durability] in fastload/cache/packedsync.py
PACKED_NAME = re.compile(r"data\.mdb|lock\.mdb|unsynced-[0-9a-f-]{36}-\d+")
# NOTE [a store is checked before it is mapped] in fastload/cache/lmdbfile.py: a damaged packed
# store is moved, whole, into a directory of this name next to packed/ (never deleted there).
DAMAGED_NAME = re.compile(r"packed\.damaged-\d{8}T\d{6}-[0-9a-f]{4}")
_SMALL_FILE = 1 << 16  # the marker, used, stats.json
INDEX_TIMEOUT_S = 30.0  # how long the disk tier and its stores wait for the index lock

__all__ = ["INDEX_TIMEOUT_S", "MARKER", "CacheDir", "Foreign", "Found", "LockTimeout"]


class LockTimeout(CacheError):
    """The directory's index lock was not taken within its timeout (another process holds it)."""


class CacheDir:
    """The cache directory at ``path``, opened (``create``: created) and checked.

    Raises CacheError, saying why and what to do, for a directory that is not a cache (a
    non-empty one without fastload's marker) or whose fixed names are not fastload's.
    """

    def __init__(self, path: Path, *, create: bool, format: str | None = None) -> None:
        self.path = path
        self._new_format = FORMAT_NUMBERS[format or FORMATS[FORMAT]]
        self._fds: list[int] = []
        # Descriptors close with the object, never at exit: a finalizer may still flush then.
        weakref.finalize(self, close_all, self._fds).atexit = False
        self._root = self._open_root(create)
        self.marker = self._marker(create)
        self._check_layout()
        entries, self._locks, self._tmp = (self._subdir(name) for name in SUBDIRS)
        self.entries = EntryFiles(self.path / "entries", entries, self._tmp)
        self.format: str = FORMATS[self.marker["format"]]
        self.packed_fd: int | None = self._subdir(PACKED) if self.format == "packed" else None
        self._shards: int | None = None
        self.read_only: str | None = self._read_only()
        """Why nothing can be written here (a read-only filesystem...), or None."""
        self._mutex = threading.Lock()
        self._shards_mutex = threading.Lock()
        after_fork(self, CacheDir._reset_after_fork)  # NOTE [locks across fork]

    def _reset_after_fork(self) -> None:
        """In a forked child: the index mutex a parent's thread may have held is new."""
        self._mutex = threading.Lock()
        self._shards_mutex = threading.Lock()

    @property
    def root_fd(self) -> int:
        """The descriptor of the directory itself (names below it are opened relative to it)."""
        return self._root

    # -- opening ---------------------------------------------------------------------------

    def _read_only(self) -> str | None:
        """Why this process cannot write the directory (or packed/), in words; None if it can."""
        for fd in (self._root, self.packed_fd):
            if fd is None:
                continue
            try:
                if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
                    return "its filesystem is mounted read-only"
                if not os.access(".", os.W_OK, dir_fd=fd):
                    return "this process may not write it: permissions or an immutable directory"
            except OSError as exc:
                return f"it cannot be checked for writing ({exc.strerror})"
        return None

    def _open_root(self, create: bool) -> int:
        try:
            if create:
                self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CacheError(
                f"{self.path} is not a fastload cache directory (it does not exist); check the "
                "path, or create the cache with `fastload cache warm`"
            ) from None
        except (FileExistsError, NotADirectoryError):
            raise CacheError(f"{self.path} is a file, not a directory; give the cache a new or empty directory") from None
        except OSError as exc:
            raise CacheError(f"cannot open the cache directory {self.path}: {exc.strerror}; check the path and its permissions") from exc
        self._fds.append(fd)
        return fd

    def _marker(self, create: bool) -> dict[str, Any]:
        marker = self._read_marker()
        if marker is not None:
            return marker
        try:
            names = sorted(n for n in os.listdir(self._root) if not n.startswith(TEMP_PREFIX))
        except OSError as exc:
            raise CacheError(f"cannot list {self.path}: {exc.strerror}; check its permissions") from exc
        if names:
            marker = self._read_marker()  # another process may have just made it a cache
            if marker is not None:
                return marker
            raise CacheError(
                f"{self.path} is not empty and not a fastload cache (no {MARKER}; it holds "
                f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); fastload makes a cache "
                "only in an empty or new directory, so your files are never touched: give the "
                "cache an empty or new directory"
            )
        if not create:
            raise CacheError(
                f"{self.path} is not a fastload cache directory (no {MARKER}); check the path, "
                "or create the cache with `fastload cache warm`"
            )
        try:
            self._create_marker()
        except OSError as exc:
            raise CacheError(f"cannot create a cache in {self.path}: {exc}; check its permissions and free space") from exc
        marker = self._read_marker()
        if marker is None:
            raise CacheError(f"{self.path / MARKER} vanished while the cache was created; run again")
        return marker

    def _read_marker(self) -> dict[str, Any] | None:
        where = self.path / MARKER
        try:
            raw = self._read_small(self._root, MARKER)
        except FileNotFoundError:
            return None
        except Foreign as exc:
            raise CacheError(f"{exc}: {self.path} is not used as a cache; remove {where} or give the cache a new directory") from None
        except OSError as exc:
            raise CacheError(f"cannot read {where}: {exc.strerror}; check its permissions") from exc
        try:
            marker = json.loads(raw)
        except ValueError:
            marker = None
        if not isinstance(marker, dict) or marker.get("magic") != MAGIC:
            raise CacheError(
                f"{where} was not written by this fastload (no magic {MAGIC!r}), so {self.path} is "
                "not used as a cache and nothing in it is touched; give the cache a new or empty "
                "directory (a cache of an older fastload: delete the directory and warm it again)"
            )
        if marker.get("format") not in FORMATS or not isinstance(marker.get("default_size"), int):
            raise CacheError(
                f"{self.path} holds a cache of format {marker.get('format')!r} (fastload "
                f"{marker.get('fastload_version')}); this fastload reads formats {sorted(FORMATS)}: delete "
                "the directory and warm it again, or use the fastload that wrote it"
            )
        return marker

    def _create_marker(self) -> None:
        from fastload.version import __version__

        st = os.fstatvfs(self._root)
        marker = {
            "magic": MAGIC,
            "format": self._new_format,
            "fastload_version": __version__,
            "default_size": st.f_bavail * st.f_frsize // 2,
            "budget": None,
        }
        tmp = write_temp(self._root, [json.dumps(marker, indent=1).encode()])
        try:
            # link(), unlike rename, fails when the name exists: the first process wins and
            # the marker it wrote stays.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, MARKER, src_dir_fd=self._root, dst_dir_fd=self._root, follow_symlinks=False)
        except OSError:  # a filesystem without hard links
            os.replace(tmp, MARKER, src_dir_fd=self._root, dst_dir_fd=self._root)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self._root)

    def _check_layout(self) -> None:
        wrong = {}
        for name in sorted(OWN_NAMES - {MARKER}):
            if name == PACKED and self.marker["format"] != FORMAT_NUMBERS["packed"]:
                continue  # not fastload's in a directory of format 1: foreign, listed by verify
            with contextlib.suppress(FileNotFoundError):
                mode = os.stat(name, dir_fd=self._root, follow_symlinks=False).st_mode
                if not (stat.S_ISDIR(mode) if name in (*SUBDIRS, PACKED, SHARDS) else stat.S_ISREG(mode)):
                    wrong[name] = describe(self._root, name)
        if wrong:
            raise CacheError(
                f"cache directory {self.path}: "
                + "; ".join(f"{name} is {what}" for name, what in wrong.items())
                + ". fastload never follows or replaces a name it did not make there: remove "
                + " ".join(str(self.path / name) for name in wrong)
                + " or give the cache a new directory"
            )

    def _subdir(self, name: str) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, dir_fd=self._root)
        try:
            fd = open_dir(self._root, name, self.path)
        except OSError as exc:
            raise CacheError(f"cannot open {self.path / name}: {exc}; remove it or give the cache a new directory") from exc
        self._fds.append(fd)
        return fd

    def has_shards(self) -> bool:
        """Whether ``shards/`` exists (a shard store has been used here)."""
        return SHARDS in listing(self._root)

    def shards_fd(self) -> int:
        """The descriptor of ``shards/`` (created on first use), where whole shards live."""
        with self._shards_mutex:
            if self._shards is None:
                self._shards = self._subdir(SHARDS)
            return self._shards

    # -- small files in the root -----------------------------------------------------------

    def _read_small(self, dir_fd: int, name: str) -> bytes:
        with os.fdopen(open_file(dir_fd, name, os.O_RDONLY, self.path), "rb") as f:
            return f.read(_SMALL_FILE)

    def read_json(self, name: str) -> Any:
        """The JSON in the root file ``name``; None if missing, unreadable or foreign."""
        try:
            return json.loads(self._read_small(self._root, name))
        except (OSError, ValueError):
            return None

    def write_json(self, name: str, value: Any) -> None:
        """Replace the root file ``name`` with ``value`` in one rename (readers see old or new)."""
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.stat(name, dir_fd=self._root, follow_symlinks=False).st_mode):
                raise Foreign(self.path / name, describe(self._root, name))
        tmp = write_temp(self._tmp, [json.dumps(value).encode()])
        try:
            os.replace(tmp, name, src_dir_fd=self._tmp, dst_dir_fd=self._root)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self._tmp)
            raise

    def remove_file(self, name: str) -> None:
        """Delete the root file ``name`` if it is a regular file (a symlink stays)."""
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.stat(name, dir_fd=self._root, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=self._root)

    def update_marker(self, **fields: Any) -> None:
        """Rewrite the marker with ``fields`` changed (call under the index lock)."""
        from fastload.version import __version__

        self.marker = {**(self._read_marker() or self.marker), **fields, "fastload_version": __version__}
        self.write_json(MARKER, self.marker)

    def read_used(self) -> int | None:
        """The byte counter ``used``; None if missing, unreadable or foreign."""
        try:
            return int(self._read_small(self._root, "used").strip() or b"x")
        except (OSError, ValueError):
            return None

    def write_used(self, used: int) -> None:
        """Rewrite ``used`` in place: a 20-digit number, one write instead of a rename per entry."""
        fd = open_file(self._root, "used", os.O_WRONLY | os.O_CREAT, self.path)
        try:
            if os.fstat(fd).st_nlink != 1:
                raise Foreign(self.path / "used", "a hard link to another file")
            os.pwrite(fd, b"%020d" % max(0, used), 0)
        finally:
            os.close(fd)

    # -- locks -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        """Hold the flock of ``locks/<name>``: yields True when taken, False after ``timeout`` s."""
        with flock(self._locks, name, timeout, self.path / "locks") as got:
            yield got

    def _busy(self, timeout: float) -> LockTimeout:
        return LockTimeout(
            f"{self.path / '.index.lock'} was held for {timeout} s by another thread or process "
            "using this cache; retry when it has finished"
        )

    @contextlib.contextmanager
    def index_lock(self, timeout: float) -> Iterator[None]:
        """The directory's index lock: threads queue on a mutex, processes on ``.index.lock``."""
        if not self._mutex.acquire(timeout=timeout):
            raise self._busy(timeout)
        try:
            with flock(self._root, ".index.lock", timeout, self.path) as got:
                if not got:
                    raise self._busy(timeout)
                yield
        finally:
            self._mutex.release()

    # -- tmp/ ------------------------------------------------------------------------------

    def remove_temp(self, name: str) -> None:
        """Delete tmp/``name`` if it is a regular file with fastload's temp prefix."""
        if name.startswith(TEMP_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.stat(name, dir_fd=self._tmp, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=self._tmp)

    # -- walking ---------------------------------------------------------------------------

    def packed_path(self) -> Path:
        """Where the packed store lives (the LMDB environment's directory)."""
        return self.path / PACKED

    def walk_others(self) -> Iterator[Found]:
        """The foreign names in the root, tmp/, locks/ and packed/; fastload's temp files too."""
        own = OWN_NAMES if self.packed_fd is not None else OWN_NAMES - {PACKED}
        for name in listing(self._root):
            damaged = (self.packed_fd is not None and DAMAGED_NAME.fullmatch(name)
                       and describe(self._root, name) == "a directory")  # listed by verify
            if name not in own and not name.startswith(TEMP_PREFIX) and not damaged:
                yield Found(self.path / name, name, foreign=f"{describe(self._root, name)} fastload did not make")
        for name in listing(self._tmp):
            found = classify(self._tmp, name, self.path / "tmp", lambda n: n.startswith(TEMP_PREFIX))
            if found is not None:
                yield found
        for name in listing(self._locks):
            found = classify(self._locks, name, self.path / "locks", LOCK_NAME.fullmatch)
            if found is not None and found.foreign:
                yield found
        if self.has_shards():
            shards = self.shards_fd()
            for name in listing(shards):
                found = classify(shards, name, self.path / SHARDS,
                                 lambda n: SHARD_NAME.fullmatch(n) or n.startswith(TEMP_PREFIX))
                if found is not None and found.foreign:
                    yield found
        if self.packed_fd is not None:
            for name in listing(self.packed_fd):
                found = classify(self.packed_fd, name, self.path / PACKED, PACKED_NAME.fullmatch)
                if found is not None and found.foreign:
                    yield found
