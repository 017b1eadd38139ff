"""What a stored listing was listed from, and what changed since: its freshness check.

NOTE [listing freshness]
A stored listing (NOTE [the stored listing]) is a snapshot; reused blindly it would train on
an old sample set without a word (a class folder added: other classes and other labels than
an uncached build of the same tree). So every listing records a *stamp* of what it listed,
taken just before the listing, and every reuse checks it first, cheaply:

* a local root: every folder of the tree (the root, the class folders, any folder below),
  each with its version (``os.stat``: size, mtime, inode, ctime in ns, as a file's). Adding,
  deleting or renaming an entry changes its folder's mtime and ctime (ctime cannot be set
  back, so ``touch -d`` or ``rsync -t`` do not hide it). The check is one ``stat`` per folder
  (ImageNet: 1,001 stats, a few ms), against a walk that reads every directory and stats
  every file. Any difference and the whole root is listed again. Taken *before* the listing,
  a stamp is never newer than what was listed: a change during the listing makes the next
  start list again, never miss it. Trees of more than :data:`MAX_FOLDERS` folders keep the
  root and its class folders only, and a reuse says, as a warning, what it did not check.
* a remote root (S3, GCS, HTTP...): a stat per folder would be a request per class, and an
  object store has no folder mtimes, so the stamp is the names of the root's folders (one
  ``ls`` of the root: one LIST request per 1,000 classes). A class added or removed is seen
  and listed again; files added to or deleted from a class are not, and every reuse says so
  in a WARNING with the listing's age (and ``loader.settings``). Deleted and changed objects
  are still caught by each epoch's revalidation (docs/reliability.md, "Consistency model").

A stamp that cannot be taken (the store fails) is left out, and an entry without one (or
from an older fastload) is always listed again.

Example::

    >>> stamp = take(Storage("/data/train"))           # before the listing
    >>> changes(Storage("/data/train"), stamp)         # at a later start: [] = unchanged
    ['class folders added: zebra']
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any

from fastload.cache.keys import digest
from fastload.io.storage import Storage
from fastload.io.versions import local_version

logger = logging.getLogger(__name__)

MAX_FOLDERS = 200_000
"""Most folders of a local root stamped one by one (a stamp costs about 30 bytes and one
``stat`` each); a larger tree keeps its root and class folders only."""

_SHOWN = 5  # changes named in a log line


def take(storage: Storage) -> dict[str, Any] | None:
    """The stamp of ``storage``'s root now (NOTE [listing freshness]); None if it cannot be
    taken (the listing that follows reports the store's error)."""
    try:
        if storage.is_local:
            return _local_stamp(storage.root)
        return {"kind": "remote", "folders": _remote_folders(storage)}
    except Exception as exc:  # noqa: BLE001 - any store's error: the listing names it properly
        logger.debug("%s: no freshness stamp (%s); the next start lists again", storage.url, exc)
        return None


def changes(storage: Storage, stamp: Any) -> list[str]:
    """What changed in ``storage``'s root since ``stamp`` was taken, in words; [] if nothing
    the stamp covers did (see :func:`unchecked` for what it does not cover)."""
    if not isinstance(stamp, dict) or stamp.get("kind") not in ("local", "remote"):
        return ["no record of its folders (made by an older fastload)"]
    try:
        if stamp["kind"] == "remote":
            return _named(set(stamp["folders"]), set(_remote_folders(storage)))
        return _local_changes(storage.root, stamp["folders"])
    except Exception as exc:  # noqa: BLE001 - cannot tell: list again, the listing reports it
        return [f"its folders could not be checked ({type(exc).__name__}: {exc})"]


def unchecked(stamp: Any) -> str | None:
    """What a check of ``stamp`` cannot see, for a reuse's warning; None: it sees every change
    to the sample set."""
    if isinstance(stamp, dict) and stamp.get("kind") == "local" and stamp.get("complete"):
        return None
    if isinstance(stamp, dict) and stamp.get("kind") == "local":
        return (f"its class folders were checked, but the tree has more than {MAX_FOLDERS} "
                "folders, so files added or deleted deeper than the class folders are not seen")
    return ("its class folders were checked (an object store has no folder times), so "
            "files added to or deleted from a class folder since are not seen")


# -- local roots -----------------------------------------------------------------------------


def _stamp_of(st: os.stat_result) -> str:
    return digest(local_version(st))[:12]


def _local_stamp(root: str) -> dict[str, Any]:
    """Every folder below ``root`` (symlinks followed, loops not) with its stamp, "" the root."""
    top = os.stat(root)
    folders = {"": _stamp_of(top)}
    base = len(root.rstrip("/")) + 1
    stack = [(root, frozenset({(top.st_dev, top.st_ino)}))]
    while stack:
        folder, ancestors = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = [e for e in it if e.is_dir()]  # the entry's type: no stat for most
        except OSError:
            continue  # the listing names it (or leaves it out under on_error="skip")
        for entry in entries:
            try:
                st = entry.stat()  # follows a symlink, as the listing does
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in ancestors:
                continue
            folders[entry.path[base:]] = _stamp_of(st)
            stack.append((entry.path, ancestors | {(st.st_dev, st.st_ino)}))
    complete = len(folders) <= MAX_FOLDERS
    if not complete:  # the root and its class folders only
        folders = {rel: s for rel, s in folders.items() if "/" not in rel}
        if len(folders) > MAX_FOLDERS:
            folders = {"": folders[""]}
    return {"kind": "local", "folders": folders, "complete": complete}


def _local_changes(root: str, folders: dict[str, str]) -> list[str]:
    found: list[str] = []
    for rel, was in folders.items():
        path = f"{root.rstrip('/')}/{rel}" if rel else root
        try:
            now = _stamp_of(os.stat(path))
        except OSError:
            now = None
        if now == was:
            continue
        if rel == "":
            found += _named(_class_folders(folders), _root_folders(root)) or [
                "the root's own entries changed (files added or removed directly in it)"
            ]
        else:
            how = "is gone" if now is None else "changed (files added, removed or renamed)"
            found.append(f"{rel}/ {how}")
        if len(found) >= _SHOWN:  # enough to say why; the whole root is listed again anyway
            break
    return found


def _class_folders(folders: dict[str, str]) -> set[str]:
    return {rel for rel in folders if rel and "/" not in rel}


def _root_folders(root: str) -> set[str]:
    try:
        with os.scandir(root) as it:
            return {e.name for e in it if e.is_dir()}
    except OSError:
        return set()


# -- remote roots ----------------------------------------------------------------------------


def _remote_folders(storage: Storage) -> list[str]:
    """The names of the folders directly below a remote root: one ``ls`` (fresh, not from a
    listing cache)."""
    fs, root = storage.fs, storage.root
    fs.invalidate_cache(root)
    names = {
        str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
        for info in fs.ls(root, detail=True)
        if info.get("type") == "directory"
    }
    return sorted(names)


def _named(was: set[str], now: set[str]) -> list[str]:
    """The class folders added and removed between two sets of names, in words."""
    said = []
    for what, names in (("added", now - was), ("removed", was - now)):
        if names:
            shown = sorted(names)
            more = f" and {len(shown) - _SHOWN} more" if len(shown) > _SHOWN else ""
            said.append(f"class folders {what}: {', '.join(shown[:_SHOWN])}{more}")
    return said
