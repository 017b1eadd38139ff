"""The disk tier: a size-bounded cache directory that many processes share and restarts keep.

Layout of a cache directory::

    fastload-cache.json     marks the directory as a fastload cache (format, default budget)
    entries/ab/<hash>       one file per object, named by the xxh3-128 of its key
    locks/<stripe>.lock     per-key fetch locks, 4096 stripes (bounded number of files)
    tmp/                    files being written; moved into entries/ by os.replace
    used                    bytes in entries/ (updated under .index.lock)
    stats.json              hits, misses, puts... recorded by every process that used it

NOTE [disk tier across processes]
* Writes are atomic: an entry is written to tmp/ and ``os.replace``d into place, so a reader
  sees a whole entry or none. Each read validates size and xxh64 (:mod:`.entry`); a corrupt or
  truncated entry (a crash, a bad disk) is deleted and reported as a miss.
* The byte budget is kept in ``used``, read and written under ``.index.lock`` together with
  the entry's rename, so concurrent writers never overshoot it. ``rescan()`` (run by
  ``fastload cache stats`` and ``verify``) recounts it from the files.
* ``lock(key)`` is a file lock per key stripe: the cache holds it while it fetches a missing
  object, so processes on a node download each object once.
* A full disk (ENOSPC, EDQUOT, EFBIG) or, under policy "keep", an exhausted budget makes the
  tier pass-through in that process: one warning, reads go to the origin, training goes on.

Example::

    >>> tier = DiskTier("/nvme/fastload", size="500GB")
    >>> tier.put("s3://b/a.jpg#v=3", b"abc")
    True
    >>> tier.get("s3://b/a.jpg#v=3")
    b'abc'
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from fastload.cache import entry
from fastload.cache.config import POLICIES, Policy, parse_size
from fastload.cache.keys import digest
from fastload.cache.tier import Tier, TierStats
from fastload.errors import CacheError, ConfigError

logger = logging.getLogger(__name__)

MARKER = "fastload-cache.json"
FORMAT = 1
LOCK_STRIPES = 4096
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_FLUSH_EVERY_S = 5.0
_INDEX_TIMEOUT_S = 30.0
_OWN_NAMES = {MARKER, "entries", "locks", "tmp", "used", "stats.json", ".index.lock"}
_LRU_LOW_WATER = 0.9  # an LRU eviction frees down to 90% of the budget, so scans are rare


@dataclass
class CorruptReport:
    """What ``verify`` found: entries checked, their bytes, and the corrupt ones."""

    checked: int = 0
    bytes: int = 0
    corrupt: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (name, reason)


class DiskTier(Tier):
    """Objects in files below ``directory``, at most ``size`` bytes, under ``policy``.

    Args:
        directory: the cache directory; created if missing. An existing non-empty directory
            that is not a fastload cache is refused.
        size: byte budget ("500GB"); None = the default remembered in the directory (half
            the free space when it was created).
        policy: "keep" (admit until full) or "lru" (evict least recently read).
        create: False to open only an existing cache (the command line's stats/verify/clear).
    """

    name = "disk"
    shared = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        size: int | str | None = None,
        policy: Policy = "keep",
        create: bool = True,
    ) -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ConfigError(f"cache policy must be 'keep' or 'lru', got {policy!r}")
        self.directory = Path(os.path.expanduser(os.fspath(directory))).absolute()
        self.policy: Policy = policy
        self._size_arg = size
        self._index_mutex = threading.Lock()
        self._file_mode = 0o666 & ~_umask()  # new cache files get what open() would give
        marker = self._open_directory(create)
        self.budget = parse_size(size, name="disk_size") if size is not None else marker["default_size"]
        self._passthrough = False
        self._warned: set[str] = set()
        self._recorder = _StatsRecorder(self.directory, self.stats, self._file_mode)
        multiprocessing.util.Finalize(self, self._recorder.flush, exitpriority=10)

    def __reduce__(self):  # reopened in each process (workers), with fresh counters
        return (_reopen_disk_tier, (str(self.directory), self._size_arg, self.policy))

    def __repr__(self) -> str:
        return f"DiskTier({str(self.directory)!r}, budget={self.budget} bytes, policy={self.policy!r})"

    # -- the directory --------------------------------------------------------------------

    def _open_directory(self, create: bool) -> dict:
        marker_path = self.directory / MARKER
        if not marker_path.exists():
            if not create:
                raise CacheError(
                    f"{self.directory} is not a fastload cache directory (no {MARKER}); "
                    "check the path, or create the cache with `fastload cache warm`"
                )
            self._create_directory()
        try:
            marker = json.loads(marker_path.read_text())
        except (OSError, ValueError) as exc:
            raise CacheError(f"cannot read {marker_path}: {exc}; remove the directory to reset the cache") from exc
        if marker.get("format") != FORMAT:
            raise CacheError(
                f"{self.directory} holds a cache of format {marker.get('format')!r}, this fastload "
                f"writes format {FORMAT}; clear it with `fastload cache clear {self.directory}`"
            )
        return marker

    def _create_directory(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            foreign = set(os.listdir(self.directory)) - _OWN_NAMES
        except OSError as exc:
            raise CacheError(f"cannot create the cache directory {self.directory}: {exc}") from exc
        if foreign:
            raise CacheError(
                f"{self.directory} is not empty and not a fastload cache (it holds "
                f"{sorted(foreign)[:3]}...); give the cache an empty or new directory"
            )
        with self._index_lock():
            if (self.directory / MARKER).exists():
                return
            for sub in ("entries", "locks", "tmp"):
                (self.directory / sub).mkdir(exist_ok=True)
            default = shutil.disk_usage(self.directory).free // 2
            _write_atomic(
                self.directory, MARKER, json.dumps({"format": FORMAT, "default_size": default}),
                self._file_mode,
            )
            self._write_used(0)

    @contextlib.contextmanager
    def _index_lock(self) -> Iterator[None]:
        """The directory's index lock: threads queue in-process, processes on the file lock."""
        with self._index_mutex, filelock.FileLock(
            self.directory / ".index.lock",
            timeout=_INDEX_TIMEOUT_S,
            mode=self._file_mode,
            poll_interval=0.001,
            preserve_lock_file=True,
        ):
            yield


    def _read_used(self) -> int:
        """Bytes in entries/ (call under the index lock); recounted if the counter is unreadable."""
        try:
            return int((self.directory / "used").read_bytes().strip() or b"x")
        except (OSError, ValueError):
            return self._scan_bytes()

    def _write_used(self, used: int) -> None:
        """Rewrite the counter in place (call under the index lock): a fixed-width 20-byte
        number, one small write instead of a file creation and a rename per entry."""
        fd = os.open(self.directory / "used", os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            os.pwrite(fd, b"%020d" % max(0, used), 0)
        finally:
            os.close(fd)

    def _scan_bytes(self) -> int:
        return sum(size for _, size, _ in self._scan())

    def _scan(self) -> Iterator[tuple[Path, int, float]]:
        """(path, size, mtime) of every entry file."""
        root = self.directory / "entries"
        for sub in sorted(os.scandir(root), key=lambda e: e.name) if root.exists() else ():
            if not sub.is_dir():
                continue
            for f in os.scandir(sub.path):
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                yield Path(f.path), st.st_size, st.st_mtime

    def path_of(self, key: str) -> Path:
        """The entry file of ``key`` (inside the directory whatever the key holds)."""
        d = digest(key)
        return self.directory / "entries" / d[:2] / d

    # -- the Tier contract ----------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        path = self.path_of(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return self._miss()
        except OSError as exc:
            self._warn_once("read", "disk cache %s cannot be read (%s); reading the origin", self.directory, exc)
            return self._miss()
        try:
            value = entry.decode(blob, expect_key=key)
        except entry.KeyMismatch:
            return self._miss()
        except entry.CorruptEntry as why:
            self.stats.corrupt += 1
            logger.warning("dropping corrupt cache entry %s (%s) at %s; it is fetched again", key, why, path)
            self._drop(path)
            return self._miss()
        if self.policy == "lru":
            with contextlib.suppress(OSError):
                os.utime(path)
        self.stats.hits += 1
        self.stats.bytes_read += len(value)
        self._recorder.maybe_flush()
        return value

    def _miss(self) -> None:
        self.stats.misses += 1
        self._recorder.maybe_flush()
        return None

    def contains(self, key: str) -> bool:
        """Whether a complete entry of ``key`` is there: header and file size, no checksum."""
        path = self.path_of(key)
        try:
            with open(path, "rb") as f:
                header, start = entry.read_file_header(f)
                return header["key"] == key and os.fstat(f.fileno()).st_size == start + header["size"]
        except (OSError, entry.CorruptEntry):
            return False

    def put(self, key: str, value: bytes) -> bool:
        if self._passthrough:
            self.stats.rejected += 1
            return False
        header = entry.encode_header(key, value)
        n = len(header) + len(value)
        path = self.path_of(key)
        try:
            with self._index_lock():
                if path.exists():
                    return True
                used = self._read_used()
                if used + n > self.budget and self.policy == "lru":
                    used = self._evict(n)
                if used + n > self.budget:
                    self._exhausted(used, n)
                    return False
                self._write_entry(path, header, value)
                self._write_used(used + n)
        except filelock.Timeout:
            self._warn_once("lock", "disk cache %s: index lock busy for %ss; entry not stored", self.directory, _INDEX_TIMEOUT_S)
            self.stats.rejected += 1
            return False
        except OSError as exc:
            self._fault(exc)
            return False
        self.stats.puts += 1
        self.stats.bytes_written += len(value)
        self._recorder.maybe_flush()
        return True

    def _write_entry(self, path: Path, header: bytes, value: bytes) -> None:
        fd, tmp = _temp_file(self.directory, self._file_mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(value)
            try:
                os.replace(tmp, path)
            except FileNotFoundError:  # the first entry of its subdirectory
                path.parent.mkdir(exist_ok=True)
                os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _evict(self, need: int) -> int:
        """Delete least recently read entries (LRU) until ``need`` more bytes fit; new ``used``."""
        files = sorted(self._scan(), key=lambda e: e[2])
        used = sum(size for _, size, _ in files)
        target = min(self.budget - need, int(self.budget * _LRU_LOW_WATER))
        for path, size, _ in files:
            if used <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                used -= size
        return used

    def _exhausted(self, used: int, n: int) -> None:
        self.stats.rejected += 1
        if n > self.budget:
            return  # one oversized object; the tier stays useful for the others
        self._passthrough = True
        self._warn_once(
            "full",
            "disk cache %s is full (%d of %d bytes used); policy 'keep' keeps what it has and "
            "reads of other objects go to the origin. Raise disk_size to cache more",
            self.directory, used, self.budget,
        )

    def _fault(self, exc: OSError) -> None:
        self.stats.rejected += 1
        if exc.errno in _FULL_ERRNOS:
            self._passthrough = True
            self._warn_once(
                "nospace",
                "disk cache %s cannot write (%s); it is now pass-through: reads go to the "
                "origin and training goes on. Free space or lower disk_size",
                self.directory, exc,
            )
        else:
            self._warn_once("write", "disk cache %s cannot write (%s); entry not stored", self.directory, exc)

    def _warn_once(self, what: str, msg: str, *args: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(msg, *args)

    def delete(self, key: str) -> None:
        self._drop(self.path_of(key))

    def _drop(self, path: Path) -> None:
        try:
            with self._index_lock():
                try:
                    size = path.stat().st_size
                    path.unlink()
                except FileNotFoundError:
                    return
                self._write_used(self._read_used() - size)
        except (OSError, filelock.Timeout) as exc:
            self._warn_once("drop", "disk cache %s: cannot delete %s (%s)", self.directory, path, exc)

    def keys(self) -> Iterator[str]:
        for path, _, _ in self._scan():
            try:
                with open(path, "rb") as f:
                    yield entry.read_file_header(f)[0]["key"]
            except (OSError, entry.CorruptEntry):
                continue

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        """A cross-process lock on ``key``'s stripe (see :class:`~fastload.cache.tier.KeyLocking`)."""
        stripe = int(digest(key)[:3], 16) % LOCK_STRIPES
        return _held(
            filelock.FileLock(
                self.directory / "locks" / f"{stripe:03x}.lock",
                thread_local=False,
                mode=self._file_mode,
                preserve_lock_file=True,
            ),
            timeout,
        )

    def close(self) -> None:
        self._recorder.flush()

    # -- maintenance (the `fastload cache` command) ---------------------------------------

    def rescan(self) -> tuple[int, int]:
        """Recount entries and bytes from the files, store the count; (entries, bytes)."""
        with self._index_lock():
            files = list(self._scan())
            total = sum(size for _, size, _ in files)
            self._write_used(total)
        return len(files), total

    def verify(self, *, drop: bool = False) -> CorruptReport:
        """Check every entry's size and checksum; name the corrupt ones (and delete them if ``drop``)."""
        report = CorruptReport()
        for path, size, _ in self._scan():
            try:
                blob = path.read_bytes()
            except FileNotFoundError:
                continue  # deleted meanwhile by another process
            except OSError as exc:
                blob, why = b"", f"unreadable: {exc}"
            else:
                why = _problem(blob)
            report.checked += 1
            report.bytes += size
            if why is not None:
                name = path.name
                with contextlib.suppress(entry.CorruptEntry):
                    name = entry.read_header(blob)[0]["key"]
                report.corrupt.append((f"{name} ({path})", why))
                if drop:
                    self._drop(path)
        return report

    def clear(self) -> tuple[int, int]:
        """Delete every entry, stale temporary file and recorded counter; (entries, bytes) freed."""
        self._recorder.flush()
        freed = 0
        count = 0
        with self._index_lock():
            for path, size, _ in list(self._scan()):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    freed += size
                    count += 1
            for stale in os.scandir(self.directory / "tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(stale.path)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / "stats.json").unlink()
            self._write_used(0)
        self._recorder.reset()
        return count, freed

    def summary(self) -> dict[str, Any]:
        """Entries, bytes, budget and the counters recorded by every process (for ``cache stats``)."""
        entries, used = self.rescan()
        recorded = self.recorded_stats()
        lookups = recorded.hits + recorded.misses
        return {
            "directory": str(self.directory),
            "entries": entries,
            "bytes": used,
            "budget": self.budget,
            **dataclasses.asdict(recorded),
            "hit_rate": recorded.hits / lookups if lookups else None,
        }

    def recorded_stats(self) -> TierStats:
        """The counters every process has recorded in ``stats.json`` (plus this one's unflushed)."""
        self._recorder.flush()
        return _load_stats(self.directory)


def _problem(blob: bytes) -> str | None:
    try:
        entry.decode(blob)
    except entry.CorruptEntry as why:
        return str(why)
    return None


def _temp_file(directory: Path, mode: int) -> tuple[int, str]:
    """A new file in ``directory``/tmp (to be renamed into place), with ``mode``.

    mkstemp creates files 0600, which would keep a cache shared by a group's users (a
    setgid directory and umask 002) readable by its writer alone; ``mode`` is what ``open()``
    would give a new file under the umask.
    """
    fd, tmp = tempfile.mkstemp(dir=directory / "tmp")
    os.fchmod(fd, mode)
    return fd, tmp


def _write_atomic(directory: Path, name: str, text: str, mode: int) -> None:
    """Replace ``directory``/``name`` with ``text`` in one rename: readers see old or new."""
    fd, tmp = _temp_file(directory, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, directory / name)


def _umask() -> int:
    """The process umask, read without changing it where Linux reports it."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: the set-and-restore dance
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _held(lock: filelock.FileLock, timeout: float) -> Iterator[bool]:
    try:
        lock.acquire(timeout=timeout, poll_interval=0.002)
    except filelock.Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def _reopen_disk_tier(directory: str, size: int | str | None, policy: Policy) -> DiskTier:
    return DiskTier(directory, size=size, policy=policy)


def _load_stats(directory: Path) -> TierStats:
    try:
        data = json.loads((directory / "stats.json").read_text())
        return TierStats(**{k: int(v) for k, v in data.items() if k in TierStats.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return TierStats()


class _StatsRecorder:
    """Adds one process's counters to the directory's ``stats.json`` every few seconds and at exit."""

    def __init__(self, directory: Path, stats: TierStats, file_mode: int) -> None:
        self.directory = directory
        self.stats = stats
        self._file_mode = file_mode
        self.flushed = TierStats()
        self.last = time.monotonic()

    def maybe_flush(self) -> None:
        if time.monotonic() - self.last > _FLUSH_EVERY_S:
            self.flush()

    def reset(self) -> None:
        self.flushed = dataclasses.replace(self.stats)

    def flush(self) -> None:
        self.last = time.monotonic()
        now = dataclasses.replace(self.stats)
        delta = {
            f: getattr(now, f) - getattr(self.flushed, f) for f in TierStats.__dataclass_fields__
        }
        if not any(delta.values()) or not (self.directory / MARKER).exists():
            return
        try:
            with filelock.FileLock(
                self.directory / ".index.lock", timeout=5, mode=self._file_mode, preserve_lock_file=True
            ):
                total = _load_stats(self.directory)
                for f, d in delta.items():
                    setattr(total, f, getattr(total, f) + d)
                _write_atomic(
                    self.directory, "stats.json", json.dumps(dataclasses.asdict(total)),
                    self._file_mode,
                )
            self.flushed = now
        except (OSError, filelock.Timeout) as exc:
            logger.debug("could not record cache counters in %s: %s", self.directory, exc)
