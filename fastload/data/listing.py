"""ImageFolder's listing: a root's files into a :class:`~fastload.data.index.DatasetIndex`.

:func:`scan` lists a root once (``Storage.listing``) and keeps the images below class
folders, labelled by the sorted class names (NOTE [stable labels]); :func:`from_pairs` makes
the index of an explicit ``(path, label)`` list; :func:`compare` sets a later listing's
versions against an index (``ImageFolder.revalidate``). The listing's Python objects live
only while the index is built.

Example::

    >>> found = scan(Storage("/data/train"), (".jpg",), "raise")
    >>> found.index.classes[:2], len(found.index), found.complete
    (('cat', 'dog'), 25000, True)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastload.data.index import DatasetIndex
from fastload.errors import EmptyDatasetError
from fastload.io.storage import OnListError, Storage

logger = logging.getLogger(__name__)


@dataclass
class Scanned:
    """What :func:`scan` found: the index, and whether every folder could be listed."""

    index: DatasetIndex
    complete: bool


def prefix_of(storage: Storage) -> str:
    """What every path below the storage's root starts with: the root and one slash."""
    return storage.root.rstrip("/") + "/"


def scan(
    storage: Storage,
    extensions: tuple[str, ...],
    on_error: OnListError,
    *,
    extra: dict[str, Any] | None = None,
    details: bool = True,
) -> Scanned:
    """One listing of ``storage``'s root as an index of ``root/<class>/<image>`` files.

    Raises :class:`~fastload.errors.EmptyDatasetError` when no image is found; ``extra``
    is kept with the index (:attr:`DatasetIndex.extra`). ``details=False`` (no cache, so no
    versions needed): a local walk skips the stat per file (:meth:`Storage.listing`).
    """
    found = storage.listing(on_error=on_error, details=details)
    base = storage.root.rstrip("/")
    prefix = base + "/"
    by_class: dict[str, list[str]] = {}
    start = len(base)
    for path in found.files:  # a million at ImageNet scale: kept to a few string operations
        if path.startswith(prefix):
            rel = path[start:].lstrip("/")
            name, slash, _ = rel.partition("/")
            if slash and rel.lower().endswith(extensions):
                by_class.setdefault(name, []).append(path)
    # NOTE [stable labels]: labels are positions in the sorted class names, so a class
    # folder that vanished from the listing would renumber every later class. A folder
    # that could not be listed (on_error="skip") keeps its class, with the images it could.
    lost = sorted({f[len(base) :].lstrip("/").split("/", 1)[0] for f in found.unreadable})
    for name in lost:
        by_class.setdefault(name, [])
    if lost:
        shown = "; ".join(f"{f}: {why}" for f, why in list(found.unreadable.items())[:5])
        logger.warning(
            "ImageFolder(%r, on_error='skip'): could not list %d folders, their images are "
            "left out (%s); classes %s keep their labels. Check the folders' permissions",
            storage.url, len(found.unreadable), shown, lost,
        )
    if not any(by_class.values()):
        unreadable = f" ({len(found.unreadable)} folders could not be listed)" if lost else ""
        raise EmptyDatasetError(
            f"no images found in {storage.url}{unreadable}: expected "
            f"<root>/<class>/<image> with one of {', '.join(extensions)}"
        )
    classes = sorted(by_class)
    paths, labels = [], []
    for label, name in enumerate(classes):
        chosen = sorted(by_class[name])
        paths += chosen
        labels += [label] * len(chosen)
    files = found.files
    index = DatasetIndex.build(
        prefix, [p[len(prefix) :] for p in paths], labels, classes=classes,
        versions=[files[p]["version"] for p in paths],
        sizes=[files[p].get("size") for p in paths], extra=extra,
    )
    return Scanned(index, complete=not found.unreadable)


def from_pairs(pairs: Sequence[tuple[str | os.PathLike[str], int]]) -> tuple[list[str], list[int]]:
    """The paths (as strings) and labels of an explicit ``(path, label)`` list."""
    paths = [str(p) for p, _ in pairs]
    labels = [int(label) for _, label in pairs]
    if not paths:
        raise EmptyDatasetError("ImageFolder got an empty list of (path, label) samples")
    return paths, labels


def index_of_pairs(
    storage: Storage, pairs: Sequence[tuple[str | os.PathLike[str], int]], *, snapshot: bool
) -> DatasetIndex:
    """The index of an explicit ``(path, label)`` list; with ``snapshot`` (a cached dataset)
    the files' versions now, a stat per local file (NOTE [consistency])."""
    paths, labels = from_pairs(pairs)
    found = None
    if snapshot:
        current = storage.current_versions(paths)
        found = [current.get(p) for p in paths]
    return DatasetIndex.build("", paths, labels, classes=[str(i) for i in range(max(labels) + 1)], versions=found)


@dataclass
class Comparison:
    """An index's samples against a later listing (``ImageFolder.revalidate``).

    Attributes:
        versions: every sample's version now (None: gone from the listing).
        changed: samples whose version changed.
        missing: samples the listing no longer has.
    """

    versions: list[str | None]
    changed: list[int]
    missing: list[int]


def compare(index: DatasetIndex, current: Mapping[str, str]) -> Comparison:
    """The samples of ``index`` looked up in ``current`` (path -> version now)."""
    versions: list[str | None] = []
    changed, missing = [], []
    for i in range(len(index)):
        path = index.path(i)
        now = current.get(path)
        versions.append(now)
        if now is None:
            missing.append(i)
        elif now != index.version(i):
            changed.append(i)
    return Comparison(versions, changed, missing)


def count_images(paths: Mapping[str, Any] | Sequence[str], prefix: str, extensions: tuple[str, ...]) -> int:
    """How many of ``paths`` are images below a class folder of the root ``prefix``."""
    return sum(
        1 for p in paths
        if p.startswith(prefix) and "/" in p[len(prefix) :].lstrip("/")
        and p.lower().endswith(extensions)
    )


def revalidate(
    storage: Storage, index: DatasetIndex, *, listed_root: bool, on_error: OnListError,
    extensions: tuple[str, ...],
) -> tuple[int, bool]:
    """``ImageFolder.revalidate``: one listing, the index's versions replaced by the new ones.

    Returns how many samples changed or went missing since the last time, and whether the
    index took new versions. Deleted, changed and new files are logged.
    """
    started = time.time()
    if listed_root:
        found = storage.listing(on_error=on_error, warn=False).files
        current = {p: info["version"] for p, info in found.items()}
    else:
        current = storage.current_versions(list(index.paths()))
    seen = compare(index, current)
    added = 0
    if listed_root:
        present = len(index) - len(seen.missing)
        added = max(0, count_images(found, index.prefix, extensions) - present)
    del current
    gone = [i for i in seen.missing if index.version(i) is not None]  # new since last time
    replaced = bool(seen.changed or gone)
    if replaced:
        index.replace_versions(seen.versions, at=started)
    n, url = len(index), storage.url
    if seen.missing:
        logger.warning(
            "%s: %d of %d images were deleted since the dataset was listed (%s); reading "
            "them raises ObjectNotFoundError (on_error='skip' skips them). Build a new "
            "ImageFolder to drop them from the sample set", url, len(seen.missing), n,
            _some(index, seen.missing),
        )
    if seen.changed:
        logger.info(
            "%s: %d of %d images changed since the last listing (%s); the cache reads "
            "their new versions", url, len(seen.changed), n, _some(index, seen.changed),
        )
    if added:
        logger.info(
            "%s: %d new images are not in the sample set, which is fixed when the "
            "ImageFolder is built; build a new one to include them (with listing_max_age=0 "
            "for a remote root)", url, added,
        )
    return len(seen.changed) + len(gone), replaced


def _some(index: DatasetIndex, which: list[int]) -> str:
    """The paths of the first five samples of ``which``, for a log line."""
    more = " ..." if len(which) > 5 else ""
    return ", ".join(index.path(i) for i in which[:5]) + more
