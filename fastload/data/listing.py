"""ImageFolder's listing: a root's files into a :class:`~fastload.data.index.DatasetIndex`.

:func:`scan` lists a root once (``Storage.listing``) and keeps the files below class
folders that torchvision's rules keep, labelled and ordered as torchvision does (NOTE
[torchvision's folder rules] in :mod:`.folder_rules`, NOTE [stable labels]);
:func:`index_of_pairs` makes the index of an explicit ``(path, label)`` list;
:func:`compare` sets a later listing's versions against an index (``ImageFolder.revalidate``).
The listing's Python objects live only while the index is built.

Example::

    >>> found = scan(Storage("/data/train"), FolderRules(), "raise")
    >>> found.index.classes[:2], len(found.index), found.complete
    (('cat', 'dog'), 25000, True)
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastload.data.folder_rules import (
    FolderRules,
    empty_classes,
    names_by_label,
    no_class_folder,
    walk_order,
)
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
    rules: FolderRules,
    on_error: OnListError,
    *,
    extra: dict[str, Any] | None = None,
    details: bool = True,
) -> Scanned:
    """One listing of ``storage``'s root as the index torchvision's rules give it (NOTE
    [torchvision's folder rules]): classes, their samples, labels and order.

    Raises :class:`~fastload.errors.EmptyClassError` for a root without class folders, or
    class folders without a valid file (unless ``rules.allow_empty``); ``extra`` is kept
    with the index (:attr:`DatasetIndex.extra`). ``details=False`` (no cache, so no
    versions needed): a local walk skips the stat per file (:meth:`Storage.listing`).
    """
    found = storage.listing(on_error=on_error, details=details)
    prefix = prefix_of(storage)
    files = [p for p in found.files if p.startswith(prefix)]  # sorted, as the listing is
    # NOTE [stable labels]: a class folder that could not be listed (on_error="skip") keeps
    # its class, with the images it could, and is not counted as empty.
    lost = {_top(f, prefix) for f in found.unreadable}
    if lost:
        shown = "; ".join(f"{f}: {why}" for f, why in list(found.unreadable.items())[:5])
        logger.warning(
            "ImageFolder(%r, on_error='skip'): could not list %d folders, their images are "
            "left out (%s); classes %s keep their labels. Check the folders' permissions",
            storage.url, len(found.unreadable), shown, sorted(lost),
        )
    class_to_idx = rules.class_to_idx
    if class_to_idx is None:
        names = sorted(_folders(files, prefix) | {_top(f, prefix) for f in found.folders} | lost)
        if not names:
            raise no_class_folder(storage.url)
        class_to_idx = {name: i for i, name in enumerate(names)}
    paths: list[str] = []
    labels: list[int] = []
    empty = []
    for name in sorted(class_to_idx):
        below = prefix + name + "/"
        # a folder's files are one run of the sorted listing: below <= path < below[:-1] + "0"
        chosen = rules.select(_run(files, below))
        if not chosen and name not in lost:
            empty.append(name)
        paths += walk_order(chosen, len(below))
        labels += [class_to_idx[name]] * len(chosen)
    if empty and not rules.allow_empty:
        raise empty_classes(storage.url, empty, rules)
    info = found.files
    index = DatasetIndex.build(
        prefix, [p[len(prefix) :] for p in paths], labels,
        classes=names_by_label(class_to_idx), versions=[info[p]["version"] for p in paths],
        sizes=[info[p].get("size") for p in paths], extra=extra,
    )
    return Scanned(index, complete=not found.unreadable)


def _run(files: list[str], below: str) -> list[str]:
    """The files of sorted ``files`` that start with the folder ``below`` (ends in "/"): one
    run of them, ``below <= path < below[:-1] + "0"`` ("0" follows "/")."""
    return files[bisect.bisect_left(files, below) : bisect.bisect_left(files, below[:-1] + "0")]


def _top(path: str, prefix: str) -> str:
    """The first name of ``path`` below the root ``prefix`` (its class folder)."""
    return path[len(prefix) :].split("/", 1)[0]


def _folders(files: list[str], prefix: str) -> set[str]:
    """The names of the folders directly below the root that hold one of ``files`` (sorted):
    one look per folder, then a jump past its run of files."""
    names, i, start = set(), 0, len(prefix)
    while i < len(files):
        path = files[i]
        slash = path.find("/", start)
        if slash < 0:  # a file of the root itself: no class
            i += 1
            continue
        names.add(path[start:slash])
        i = bisect.bisect_left(files, path[:slash] + "0", i + 1)
    return names


def from_pairs(pairs: Sequence[tuple[str | os.PathLike[str], int]], *, empty_ok: bool = False) -> tuple[list[str], list[int]]:
    """The paths (as strings) and labels of an explicit ``(path, label)`` list."""
    paths = [str(p) for p, _ in pairs]
    labels = [int(label) for _, label in pairs]
    if not paths and not empty_ok:
        raise EmptyDatasetError("ImageFolder got an empty list of (path, label) samples")
    return paths, labels


def index_of_pairs(
    storage: Storage, pairs: Sequence[tuple[str | os.PathLike[str], int]], *, snapshot: bool,
    class_to_idx: Mapping[str, int] | None = None,
) -> DatasetIndex:
    """The index of an explicit ``(path, label)`` list; with ``snapshot`` (a cached dataset)
    the files' versions now, a stat per local file (NOTE [consistency]).

    ``class_to_idx``: the classes of a subclass's ``make_dataset`` (which may return no
    sample, as torchvision's may); without it an empty list is an error and label ``i``'s
    class is named ``str(i)``.
    """
    paths, labels = from_pairs(pairs, empty_ok=class_to_idx is not None)
    found = None
    if snapshot:
        current = storage.current_versions(paths)
        found = [current.get(p) for p in paths]
    classes = names_by_label(class_to_idx or {}, labels)
    return DatasetIndex.build("", paths, labels, classes=classes, versions=found)


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


def count_images(paths: Mapping[str, Any] | Sequence[str], prefix: str, rules: FolderRules) -> int:
    """How many of ``paths`` (sorted) are samples by ``rules`` below the root ``prefix``."""
    files = [p for p in paths if p.startswith(prefix)]
    names = rules.class_to_idx if rules.class_to_idx is not None else _folders(files, prefix)
    return sum(len(rules.select(_run(files, prefix + name + "/"))) for name in names)


def revalidate(
    storage: Storage, index: DatasetIndex, *, listed_root: bool, on_error: OnListError,
    rules: FolderRules | None,
) -> tuple[int, bool]:
    """``ImageFolder.revalidate``: one listing, the index's versions replaced by the new ones.

    Returns how many samples changed or went missing since the last time, and whether the
    index took new versions. Deleted, changed and new files are logged (new ones counted by
    ``rules``; None: not counted).
    """
    started = time.time()
    if listed_root:
        found = storage.listing(on_error=on_error, warn=False).files
        current = {p: info["version"] for p, info in found.items()}
    else:
        current = storage.current_versions(list(index.paths()))
    seen = compare(index, current)
    added = 0
    if listed_root and rules is not None:
        present = len(index) - len(seen.missing)
        added = max(0, count_images(found, index.prefix, rules) - present)
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
