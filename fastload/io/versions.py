"""An object's version: what its origin says about it, so a changed object is told apart.

NOTE [object versions]
A version is a string built from the object's fsspec ``info()`` (or its listing entry, which
carries the same fields): its size, plus the etag where the store has one, else its
modification time, else (the Hugging Face Hub's filesystem) its git blob id
(:func:`version_of`). Local files get a stronger one from ``os.stat``
(:func:`local_version`): size, mtime, inode and ctime, in nanoseconds. A user can set a
file's size and mtime back (``touch -d``, ``cp -p``, an ``rsync`` that keeps times), but not
its ctime, which the kernel sets on every write, and a file replaced by rename has a new
inode; so a rewrite that keeps size and mtime still changes the version. Every path that
versions a local file (the listing, the ``fastload::`` protocol's ``info``, ``cache warm``)
uses :func:`local_version`.

The cache keys objects by URL plus version (NOTE [cache keys] in
:mod:`fastload.cache.keys`); the version itself is a storage fact and lives here, below the
cache.

Example::

    >>> version_of({"size": 10, "ETag": '"abc"'})
    '10:"abc"'
    >>> version_size('10:"abc"')
    10
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fastload.errors import StorageError

# Fields that fsspec implementations use for an object's version, most specific first.
_ETAG_FIELDS = ("ETag", "etag", "md5Hash", "md5", "generation", "version_id", "VersionId")
_MTIME_FIELDS = ("mtime", "LastModified", "last_modified", "updated", "modified", "created")


def version_of(info: Mapping[str, Any]) -> str:
    """The version of an object from its fsspec ``info()`` or listing entry: size + etag/mtime
    (+ git blob id on the Hugging Face Hub)."""
    size = info.get("size", info.get("Size"))
    for field in _ETAG_FIELDS + _MTIME_FIELDS:
        value = info.get(field)
        if value not in (None, ""):
            if "ino" in info:  # a local file seen through a wrapper (latency::): ino + ctime too
                return f"{size}:{value}:{info['ino']}:{info.get('created')}"
            return f"{size}:{value}"
    # huggingface_hub's filesystem has neither; its git blob id (or LFS sha256) tells a
    # rewritten file of the same size apart.
    lfs = info.get("lfs")
    blob = info.get("blob_id") or (lfs.get("sha256") if isinstance(lfs, Mapping) else None)
    return f"{size}:{blob}" if blob else f"{size}"


class ObjectChangedError(StorageError):
    """The object at the origin is no longer the version a read asked for (it was rewritten)."""


def etag_in(version: str) -> str | None:
    """The etag in a :func:`version_of` string (``'10:"abc"'`` gives ``'"abc"'``): S3's quoted
    ETag, what an ``If-Match`` header asks for; None when the version holds none."""
    _, _, rest = version.partition(":")
    return rest if len(rest) > 2 and rest[0] == rest[-1] == '"' and ":" not in rest else None


def local_version(st: os.stat_result) -> str:
    """The version of a local file from its ``os.stat``: size, mtime, inode, ctime (ns).

    Example::

        >>> local_version(os.stat("/data/train/cat/1.jpg"))
        '48213:1764403200000000000:5308443:1764403200123456789'
    """
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"


def version_size(version: str) -> int | None:
    """The size in bytes a version records (its first field), or None when it has none."""
    head = version.split(":", 1)[0]
    return int(head) if head.isdigit() else None
