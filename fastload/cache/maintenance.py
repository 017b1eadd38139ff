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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload.cache import entry
from fastload.cache.cachedir import Foreign, LockTimeout
from fastload.cache.diskstats import STATS_FILE, load_stats
from fastload.cache.filestore import FileStore, misnamed
from fastload.cache.keys import digest
from fastload.cache.packed import StoreDamaged, accounted, is_pointer, record_key
from fastload.cache.packedformat import PackedFormatStore
from fastload.cache.packedsync import damaged_copies, remove_damaged
from fastload.cache.shardfiles import ShardFiles
from fastload.cache.tier import TierStats
from fastload.errors import CacheError

if TYPE_CHECKING:
    from fastload.cache.disk import DiskTier

logger = logging.getLogger(__name__)

_LOCK_TIMEOUT_S = 30.0


@dataclass
class CorruptReport:
    """What ``verify`` found: entries checked, their bytes, the corrupt ones, the foreign names.

    ``corrupt`` holds ``("<key> (<path>)", why)``; ``foreign`` holds ``(path, what it is)``
    for every name fastload did not make (symlinks included), which is never touched;
    ``damaged`` holds ``(path, why)`` for a packed store whose file is damaged, and for each
    damaged store set aside by an earlier process (``packed.damaged-<time>``).
    """

    checked: int = 0
    bytes: int = 0
    corrupt: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    foreign: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    damaged: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@dataclass
class ClearReport:
    """What ``clear`` did: entries and bytes deleted, the damaged stores deleted (paths), and
    the names it left alone (and why)."""

    entries: int = 0
    bytes: int = 0
    foreign: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    damaged: list[str] = dataclasses.field(default_factory=list)


def rescan(tier: DiskTier) -> tuple[int, int]:
    """Recount entries and bytes (files, or the packed store's records) and store the count
    (unless the directory is read-only); (entries, bytes)."""
    return tier.store.rescan(write=tier.read_only is None)


def _writable(tier: DiskTier, doing: str) -> None:
    if tier.read_only is not None:
        raise CacheError(f"cannot {doing} {tier.directory}: it is read-only ({tier.read_only}); "
                         "run this where the cache directory can be written")


def verify(tier: DiskTier, *, drop: bool = False) -> CorruptReport:
    """Check every entry's header, size and checksum, and that its key digests to its file
    name; name the corrupt ones (deleted if ``drop``) and every foreign name (never deleted)."""
    if drop:
        _writable(tier, "delete entries of")
    report = CorruptReport()
    cache_dir, store = tier.cache_dir, tier.store
    if isinstance(store, PackedFormatStore):
        remade = _store_sound(store, report, drop=drop)
        if remade is not None:
            _verify_packed(store, report, drop=drop)
        for copy in damaged_copies(cache_dir):
            if copy.path != remade:  # the one just set aside is reported as the store
                report.damaged.append((str(copy.path), f"a damaged packed store set aside ({copy.size} bytes)"))
            if drop:
                report.foreign += [(str(f.path), f.foreign or "") for f in remove_damaged(cache_dir, copy.name)]
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


def _store_sound(store: PackedFormatStore, report: CorruptReport, *, drop: bool) -> Path | None:
    """Whether the LMDB store can be read record by record: its file whole and every page
    sound (checked without mapping it); None if not. A damaged one is reported, and with
    ``drop`` set aside (deleted with the other copies) for an empty one: then where it went.
    One not fastload's is foreign."""
    records = store.records
    if records.problem is None:
        with contextlib.suppress(StoreDamaged):
            records.check_pages()
    problem = records.problem
    if problem is None:
        return records.path  # no copy has this name
    where = str(records.path / "data.mdb")
    if isinstance(problem, StoreDamaged) and problem.foreign:
        report.foreign.append((where, f"{problem.why}; not fastload's, never used"))
    elif isinstance(problem, StoreDamaged):
        report.damaged.append((where, problem.why))
        if drop:
            return records.remake()
    else:
        report.damaged.append((where, f"it cannot be opened: {problem}"))
    return None


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
    _writable(tier, "clear")
    tier.recorder.flush()
    report = ClearReport()
    cache_dir, store = tier.cache_dir, tier.store
    packed = isinstance(store, PackedFormatStore)
    if isinstance(store, PackedFormatStore):
        if store.records.problem is None:  # its pages checked before LMDB walks them
            with contextlib.suppress(StoreDamaged):
                store.records.check_pages()
        problem = store.records.problem
        if problem is not None and not isinstance(problem, StoreDamaged):
            raise CacheError(f"cannot clear {tier.directory}: {problem}")
        if isinstance(problem, StoreDamaged) and problem.foreign:
            report.foreign.append((str(store.records.path / "data.mdb"), f"{problem.why}; not fastload's"))
        else:
            if problem is not None:
                store.records.remake()
            report.entries, report.bytes, _ = store.records.clear()
        for copy in damaged_copies(cache_dir):
            left = remove_damaged(cache_dir, copy.name)
            report.foreign += [(str(f.path), f.foreign or "") for f in left]
            if not left:
                report.damaged.append(str(copy.path))
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
        if cache_dir.has_shards():  # NOTE [the shard store]: the shards no process reads
            shards, freed = ShardFiles(cache_dir).clear()
            report.entries += shards
            report.bytes += freed
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
    shard store's files and bytes, the budget in effect and where it comes from, and the
    recorded counters."""
    entries, used = rescan(tier)
    recorded = recorded_stats(tier)
    lookups = recorded.hits + recorded.misses
    shard_bytes, shards = (ShardFiles(tier.cache_dir).stored() if tier.cache_dir.has_shards()
                           else (0, []))
    return {
        "directory": str(tier.directory),
        "format": tier.format,
        "format_description": tier.store.description,
        "entries": entries,
        "bytes": used,
        "shard_files": len(shards),  # NOTE [the shard store]: whole files, not entries
        "shard_bytes": shard_bytes,
        "budget": tier.budget,
        "budget_source": tier.budget_source,
        "read_only": tier.read_only,
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
