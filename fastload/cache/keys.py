"""Cache keys: an object's origin URL plus its version, and the file name a key is stored under.

NOTE [cache keys]
A key is ``"<url>#v=<version>"``. The version comes from the object's fsspec ``info()``
(or from the listing, which carries the same fields): its size, plus the etag where the
store has one, else its modification time. A changed object therefore gets a new key, and no
tier ever has to detect staleness. ``fastload cache warm``, ``ImageFolder(cache=...)`` and
the ``fastload::`` protocol build keys the same way, so they share one cache directory.

Local files get a stronger version from ``os.stat`` (:func:`local_version`): size, mtime,
inode and ctime, in nanoseconds. A user can set a file's size and mtime back (``touch -d``,
``cp -p``, an ``rsync`` that keeps times), but not its ctime, which the kernel sets on every
write, and a file replaced by rename has a new inode; so a rewrite that keeps size and mtime
still changes the key. Every path that builds a key for a local file (the listing, ``info``
of the ``fastload::`` protocol, ``cache warm``) uses :func:`local_version`. The version
is revalidated once per epoch by the loader (docs/reliability.md, "Consistency model").

Tiers never use a key as a path: the disk tier names a file by the key's 128-bit xxh3 hash
(:func:`digest`), so a hostile object name (``../../etc/passwd``) cannot leave the cache
directory.

Example::

    >>> make_key("s3://bucket/a.jpg", version_of({"size": 10, "ETag": '"abc"'}))
    's3://bucket/a.jpg#v=10:"abc"'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import xxhash

# Fields that fsspec implementations use for an object's version, most specific first.
_ETAG_FIELDS = ("ETag", "etag", "md5Hash", "md5", "generation", "version_id", "VersionId")
_MTIME_FIELDS = ("mtime", "LastModified", "last_modified", "updated", "modified", "created")


def version_of(info: Mapping[str, Any]) -> str:
    """The version of an object from its fsspec ``info()`` or listing entry: size + etag/mtime."""
    size = info.get("size", info.get("Size"))
    for field in _ETAG_FIELDS + _MTIME_FIELDS:
        value = info.get(field)
        if value not in (None, ""):
            if "ino" in info:  # a local file seen through a wrapper (latency::): ino + ctime too
                return f"{size}:{value}:{info['ino']}:{info.get('created')}"
            return f"{size}:{value}"
    return f"{size}"


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


def make_key(url: str, version: str) -> str:
    """The cache key of ``url`` at ``version`` (see NOTE [cache keys])."""
    return f"{url}#v={version}"


def digest(key: str) -> str:
    """A 32-character hex name for ``key``, safe as a file name (xxh3, 128 bits)."""
    return xxhash.xxh3_128_hexdigest(key.encode("utf-8", "surrogatepass"))


def checksum(data: bytes) -> str:
    """The xxh64 checksum of a cached value, as 16 hex characters."""
    return xxhash.xxh64_hexdigest(data)
