"""What ``fastload cache stats|verify|clear`` do to a disk cache directory.

Each function takes an open :class:`~fastload.cache.disk.DiskTier` and uses only its public
methods, its :class:`~fastload.cache.cachedir.CacheDir` and its store: a
:class:`~fastload.cache.filestore.FileStore` or, in format "packed", a
:class:`~fastload.cache.packedformat.PackedFormatStore`, whose records (the LMDB
:class:`~fastload.cache.packed.PackedStore`) are checked as files are; ``clear`` empties the
store's records and keeps LMDB's files, which are fastload's. Nothing here deletes a file it
cannot prove is fastload's (NOTE [a cache directory holds only fastload's files]): an entry
is a regular file in ``entries/<xx>/`` named by a 32-hex digest starting with ``xx`` whose
header, where readable, holds a key with that digest; a temporary file is a regular file in
``tmp/`` with fastload's prefix. Everything else is *foreign*: reported, left alone.

Example::

    >>> tier = DiskTier("/nvme/fastload", create=False)
    >>> report = verify(tier)
    >>> report.corrupt, report.foreign
    ([], [])
    >>> clear(tier).entries
    1200
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastload.cache import entry
from fastload.cache.cachedir import Foreign, LockTimeout
from fastload.cache.diskstats import STATS_FILE, load_stats
from fastload.cache.filestore import FileStore, misnamed
from fastload.cache.keys import digest
from fastload.cache.packed import accounted, is_pointer, record_key
from fastload.cache.packedformat import PackedFormatStore
from fastload.cache.tier import TierStats

if TYPE_CHECKING:
    from fastload.cache.disk import DiskTier

logger = logging.getLogger(__name__)

_LOCK_TIMEOUT_S = 30.0


@dataclass
class CorruptReport:
    """What ``verify`` found: entries checked, their bytes, the corrupt ones, the foreign names.

    ``corrupt`` holds ``("<key> (<path>)", why)``; ``foreign`` holds ``(path, what it is)``
    for every name fastload did not make (symlinks included), which is never touched.
    """

    checked: int = 0
    bytes: int = 0
    corrupt: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    foreign: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@dataclass
class ClearReport:
    """What ``clear`` did: entries and bytes deleted, and the names it left alone (and why)."""

    entries: int = 0
    bytes: int = 0
    foreign: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def rescan(tier: DiskTier) -> tuple[int, int]:
    """Recount entries and bytes (files, or the packed store's records) and store the count;
    (entries, bytes)."""
    return tier.store.rescan()


def verify(tier: DiskTier, *, drop: bool = False) -> CorruptReport:
    """Check every entry's header, size and checksum, and that its key digests to its file
    name; name the corrupt ones (deleted if ``drop``) and every foreign name (never deleted)."""
    report = CorruptReport()
    cache_dir, store = tier.cache_dir, tier.store
    if isinstance(store, PackedFormatStore):
        _verify_packed(store, report, drop=drop)
    for found in cache_dir.entries.walk():
        if found.foreign is not None:
            report.foreign.append((str(found.path), found.foreign))
            continue
        if not isinstance(store, FileStore):
            continue  # a large object's file: checked through its pointer above
        try:
            with cache_dir.entries.open(found.name) as f:
                blob = f.read()
        except FileNotFoundError:
            continue  # deleted meanwhile by another process
        except Foreign as exc:  # swapped for a symlink meanwhile
            report.foreign.append((str(exc.path), exc.why))
            continue
        except OSError as exc:
            blob, why = b"", f"unreadable: {exc}"
        else:
            why = _problem(blob, found.name)
        report.checked += 1
        report.bytes += found.size
        if why is not None:
            name = found.name  # the file's name, unless its header still names the key
            with contextlib.suppress(entry.CorruptEntry):
                name = entry.read_header(blob)[0]["key"]
            report.corrupt.append((f"{name} ({found.path})", why))
            if drop:
                _drop_file(store, found.name)
    report.foreign += [(str(f.path), f.foreign) for f in cache_dir.walk_others() if f.foreign]
    return report


def _drop_file(store: FileStore, name: str) -> None:
    try:
        store.drop_entry(name)
    except (OSError, LockTimeout) as exc:
        logger.warning("disk cache %s: cannot delete %s (%s)", store.cache_dir.path, name, exc)


def _verify_packed(store: PackedFormatStore, report: CorruptReport, *, drop: bool) -> None:
    """Check every record of the packed store (and the file of each large object's pointer)."""
    where = store.records.path / "data.mdb"
    bad = []
    for d, rec in store.records.records():
        report.checked += 1
        report.bytes += accounted(rec)
        try:
            key = record_key(rec)
        except entry.CorruptEntry as exc:
            bad.append((d, f"{d.hex()} ({where})", str(exc)))
            continue
        if entry.packed_digest(key) != d:
            why: str | None = "its header key does not digest to its record's name (an altered header); it would never be served"
        elif is_pointer(rec):
            why = _file_problem(store, key)
        else:
            try:
                entry.decode_packed(rec, expect_key=key)
                why = None
            except entry.CorruptEntry as exc:
                why = str(exc)
        if why is not None:
            bad.append((d, f"{key} ({where}, record {d.hex()})", why))
    for d, name, why in bad:
        report.corrupt.append((name, why))
        if drop:
            rec = store.records.delete(d)
            if rec is not None and is_pointer(rec):
                with contextlib.suppress(entry.CorruptEntry, OSError):
                    store.files.remove(digest(record_key(rec)))


def _file_problem(store: PackedFormatStore, key: str) -> str | None:
    name = digest(key)
    try:
        with store.files.open(name) as f:
            blob = f.read()
    except OSError as exc:
        return f"its file {store.files.path_of(name)} is missing or unreadable: {exc}"
    return _problem(blob, name)


def clear(tier: DiskTier) -> ClearReport:
    """Delete every entry, stale temporary file and the recorded counters; leave the rest."""
    tier.recorder.flush()
    report = ClearReport()
    cache_dir, store = tier.cache_dir, tier.store
    packed = isinstance(store, PackedFormatStore)
    if isinstance(store, PackedFormatStore):
        report.entries, report.bytes, _ = store.records.clear()
    with cache_dir.index_lock(_LOCK_TIMEOUT_S):
        left = 0
        for found in cache_dir.entries.walk():
            why = found.foreign or misnamed(cache_dir.entries, found.name)
            if why is None:
                try:
                    size = cache_dir.entries.remove(found.name)
                except Foreign as exc:
                    why = exc.why
                else:
                    if not packed:  # packed: counted as the pointers they had
                        report.entries += size is not None
                        report.bytes += size or 0
                    continue
            report.foreign.append((str(found.path), why))
            if found.foreign is None:
                left += found.size  # a misnamed entry file stays, and stays counted
        for found in cache_dir.walk_others():
            if found.foreign is None:
                cache_dir.remove_temp(found.name)
            else:
                report.foreign.append((str(found.path), found.foreign))
        cache_dir.remove_file(STATS_FILE)
        if not packed:
            cache_dir.write_used(left)
    tier.recorder.reset()
    return report


def recorded_stats(tier: DiskTier) -> TierStats:
    """The counters every process has recorded in stats.json (this one's flushed first)."""
    tier.recorder.flush()
    return load_stats(tier.cache_dir)


def summary(tier: DiskTier) -> dict[str, Any]:
    """The directory's format ("packed" or "files", and what that means), entries, bytes, the
    budget in effect and where it comes from, and the recorded counters."""
    entries, used = rescan(tier)
    recorded = recorded_stats(tier)
    lookups = recorded.hits + recorded.misses
    return {
        "directory": str(tier.directory),
        "format": tier.format,
        "format_description": tier.store.description,
        "entries": entries,
        "bytes": used,
        "budget": tier.budget,
        "budget_source": tier.budget_source,
        **dataclasses.asdict(recorded),
        "hit_rate": recorded.hits / lookups if lookups else None,
    }


def _problem(blob: bytes, name: str) -> str | None:
    """Why the entry file ``name`` with bytes ``blob`` cannot be served; None if it can."""
    try:
        entry.decode(blob)
        key = entry.read_header(blob)[0]["key"]
    except entry.CorruptEntry as why:
        return str(why)
    if not isinstance(key, str) or digest(key) != name:
        return "its header key does not digest to its file name (an altered header); it would never be served"
    return None
