"""The walk of a local dataset root: regular files, symlinks followed, faults named.

:class:`~fastload.io.storage.Storage` lists a local root with :func:`walk_local` instead of
fsspec's ``find`` (NOTE [local listing]); remote roots are listed through fsspec.

Example::

    >>> found = walk_local("/data/train", "file:///data/train", on_error="raise")
    >>> list(found.files)[:1], found.skipped
    (['/data/train/cat/1.jpg'], {'/data/train/cat/pipe.jpg': 'FIFO'})
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Literal

from fastload.errors import ObjectNotFoundError, StorageError
from fastload.io.errors import describe
from fastload.io.versions import local_version

OnListError = Literal["raise", "skip"]

__all__ = ["Listing", "OnListError", "walk_local"]


@dataclass
class Listing:
    """What one listing of a dataset root found.

    Attributes:
        files: regular files, sorted, path -> info (``size``, ``version``, the store's fields).
        unreadable: folders that could not be listed (``on_error="skip"``), path -> why.
        skipped: entries that are not regular files, path -> what they are ("FIFO",
            "dangling symlink", ...).
        folders: the folders directly below the root, empty ones too (a local walk's; a
            remote store has no empty folders, its listing leaves this empty).
    """

    files: dict[str, dict[str, Any]]
    unreadable: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    folders: list[str] = field(default_factory=list)


# NOTE [local listing]
# fsspec's LocalFileSystem.find lists a folder it cannot read as empty, without a word, so an
# unreadable class folder vanished and every later label shifted. The local walk below raises
# on any folder it cannot list (or, with on_error="skip", reports it so ImageFolder can keep
# the folder's label). It lists regular files only: a FIFO named x.jpg would block its reader
# forever, and sockets or devices are no images either. It follows symlinks like torchvision
# (os.walk(followlinks=True)): to files, and to folders unless the folder is one of its own
# ancestors (a loop). Dangling and looping symlinks are left out and reported.


def walk_local(root: str, url: str, on_error: OnListError, details: bool = True) -> Listing:
    """List the regular files below local folder ``root`` (NOTE [local listing]).

    Without ``details`` a regular file that is no symlink is known from its directory entry
    (its type comes with readdir): no stat, and no size or version (None). At 100,000 files
    the stats were a quarter of the walk.
    """
    try:
        top = os.stat(root)
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(
            f"dataset root {url} does not exist; check the path or URL"
        ) from exc
    if not stat.S_ISDIR(top.st_mode):
        raise StorageError(f"dataset root {url} is a file, expected a directory")
    found = Listing(files={})
    # Each folder to list, with the (device, inode) of the folders above it: a loop check.
    stack: list[tuple[str, frozenset[tuple[int, int]]]] = [
        (root, frozenset({(top.st_dev, top.st_ino)}))
    ]
    while stack:
        folder, ancestors = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as exc:
            if on_error == "raise" or folder == root:
                raise StorageError(
                    f"cannot list folder {folder} below dataset root {url}: {describe(exc)}; "
                    "check its permissions, or pass on_error='skip' to leave it out"
                ) from exc
            found.unreadable[folder] = describe(exc)
            continue
        for entry in entries:
            if not details and entry.is_file(follow_symlinks=False):
                found.files[entry.path] = {"name": entry.path, "size": None, "type": "file", "version": None}
                continue
            try:
                st = entry.stat()  # follows symlinks
            except OSError as exc:
                if entry.is_symlink():
                    looping = exc.errno == errno.ELOOP
                    found.skipped[entry.path] = "looping symlink" if looping else "dangling symlink"
                elif not isinstance(exc, FileNotFoundError):  # deleted meanwhile: not listed
                    found.skipped[entry.path] = f"cannot stat: {describe(exc)}"
                continue
            if stat.S_ISDIR(st.st_mode):
                ident = (st.st_dev, st.st_ino)
                if ident in ancestors:
                    found.skipped[entry.path] = "symlink loop to a folder above it"
                else:
                    stack.append((entry.path, ancestors | {ident}))
                    if folder == root:  # a class folder, even without a file below it
                        found.folders.append(entry.path)
            elif stat.S_ISREG(st.st_mode):
                found.files[entry.path] = {
                    "name": entry.path, "size": st.st_size, "type": "file",
                    "version": local_version(st),
                }
            else:
                found.skipped[entry.path] = _KINDS.get(stat.S_IFMT(st.st_mode), "special file")
    found.files = {p: found.files[p] for p in sorted(found.files)}
    found.skipped = {p: found.skipped[p] for p in sorted(found.skipped)}
    found.folders.sort()
    return found


_KINDS = {
    stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}
