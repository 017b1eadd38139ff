"""Inventory of a dataset URL: how many files, how many bytes, how sizes spread, how long listing took.

Listing goes through fsspec (one recursive ``find`` with details, so object stores answer
with a few LIST calls and no HEAD per object). Hidden files (a name starting with ".") are
left out, as dataset loaders do.

Example::

    >>> inv = take_inventory(Storage("s3://bucket/train"))
    >>> inv.files, inv.total_bytes, inv.size_bytes_p50
    (1281167, 146901182464, 110592.0)
"""

from __future__ import annotations

import logging
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any

from fastload.bench.stats import percentiles
from fastload.errors import (
    EmptyDatasetError,
    ObjectNotFoundError,
    OriginUnavailableError,
    StorageError,
)
from fastload.io.errors import describe, storage_error
from fastload.io.origin import is_unavailable
from fastload.io.storage import Storage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileEntry:
    """One object below the URL: its filesystem path and its size in bytes."""

    path: str
    size: int


@dataclass(frozen=True)
class Inventory:
    """What ``take_inventory`` found below a URL."""

    url: str
    entries: tuple[FileEntry, ...] = field(repr=False)
    listing_s: float

    @property
    def files(self) -> int:
        return len(self.entries)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def size_bytes_p50(self) -> float:
        return percentiles([e.size for e in self.entries], (50,))["p50"]

    @property
    def size_bytes_p95(self) -> float:
        return percentiles([e.size for e in self.entries], (95,))["p95"]

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "total_bytes": self.total_bytes,
            "size_bytes_p50": self.size_bytes_p50,
            "size_bytes_p95": self.size_bytes_p95,
            "listing_s": self.listing_s,
        }


def take_inventory(storage: Storage) -> Inventory:
    """List every non-hidden file below ``storage``'s root with its size.

    Raises:
        ObjectNotFoundError: the URL does not exist.
        EmptyDatasetError: it exists but holds no file.
        OriginUnavailableError: the store cannot be reached (connection refused, timeouts).
        StorageError: listing failed otherwise (permissions, protocol not installed).
    """
    fs, root = storage.fs, storage.root
    start = time.perf_counter()
    try:
        found: dict[str, dict[str, Any]] = fs.find(root, withdirs=False, detail=True)
        exists = bool(found) or fs.exists(root)
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(f"{storage.url} does not exist; check the path or URL") from exc
    except Exception as exc:  # NOTE [storage errors] in fastload.io.errors: not only OSError
        error = storage_error(exc, "list", storage.url)
        if error is exc:  # already fastload's own error
            raise
        if is_unavailable(exc):
            raise _unreachable(storage.url, exc) from exc
        raise StorageError(
            f"{error}. Check that the endpoint is reachable and the credentials (storage "
            "options) are right."
        ) from exc
    listing_s = time.perf_counter() - start
    if not exists:
        _check_reachable(fs, root, storage.url)
        raise ObjectNotFoundError(f"{storage.url} does not exist; check the path or URL")
    entries = tuple(
        FileEntry(path, int(info.get("size") or 0))
        for path, info in sorted(found.items())
        if not posixpath.basename(path.rstrip("/")).startswith(".")
    )
    if not entries:
        raise EmptyDatasetError(
            f"{storage.url} holds no files to benchmark; point fastload bench at a folder with data"
        )
    logger.info("listed %d files below %s in %.3f s", len(entries), storage.url, listing_s)
    return Inventory(storage.url, entries, listing_s)


def _unreachable(url: str, exc: BaseException) -> OriginUnavailableError:
    return OriginUnavailableError(
        f"cannot list {url}: the store is unreachable ({describe(exc)}). Check that the "
        "endpoint is up and reachable from here, then run the same command again",
        url=url, last_error=describe(exc),
    )


def _check_reachable(fs: Any, root: str, url: str) -> None:
    """Raise OriginUnavailableError if the store behind ``fs`` cannot be reached at all.

    fsspec's HTTP ``find`` and ``exists`` answer "nothing there" when the connection is
    refused; one ``ls`` of the root shows the failure, so a store that is down is never
    reported as a wrong path.
    """
    try:
        fs.ls(root, detail=False)
    except FileNotFoundError:
        return
    except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
        if is_unavailable(exc):
            raise _unreachable(url, exc) from exc
