"""Cache keys: an object's origin URL plus its version, and the file name a key is stored under.

NOTE [cache keys]
A key is ``"<url>#v=<version>"``. The version is the object's as its storage reports it
(NOTE [object versions] in :mod:`fastload.io.versions`): size plus etag or mtime, and for
local files size, mtime, inode and ctime in nanoseconds. A changed object therefore gets a
new key, and no tier ever has to detect staleness. ``fastload cache warm``,
``ImageFolder(cache=...)`` and the ``fastload::`` protocol build keys the same way, so they
share one cache directory. The version is revalidated once per epoch by the loader
(docs/reliability.md, "Consistency model").

A value *derived* from an object (a transcoded image: NOTE [derived entries] in
:mod:`fastload.cache.fills`) is stored under ``"<url>#v=<version>#derived=<tag>"``
(:func:`derived_key`): the object's own key plus the derivation's tag, which names the
derivation and all its parameters. A derived entry never collides with the original's, a
changed object gets new derived keys too, and changed parameters never find old entries.

Tiers never use a key as a path: the disk tier names a file by the key's 128-bit xxh3 hash
(:func:`digest`), so a hostile object name (``../../etc/passwd``) cannot leave the cache
directory.

Example::

    >>> from fastload.io.versions import version_of
    >>> make_key("s3://bucket/a.jpg", version_of({"size": 10, "ETag": '"abc"'}))
    's3://bucket/a.jpg#v=10:"abc"'
"""

from __future__ import annotations

import xxhash

__all__ = ["checksum", "derived_key", "digest", "make_key"]


def make_key(url: str, version: str) -> str:
    """The cache key of ``url`` at ``version`` (see NOTE [cache keys])."""
    return f"{url}#v={version}"


def derived_key(key: str, tag: str) -> str:
    """The key of the value derived by the derivation named ``tag`` from the object at ``key``.

    Example::

        >>> derived_key('s3://b/a.jpg#v=10:"abc"', "transcode:max_side=256:quality=90:v1")
        's3://b/a.jpg#v=10:"abc"#derived=transcode:max_side=256:quality=90:v1'
    """
    return f"{key}#derived={tag}"


def digest(key: str) -> str:
    """A 32-character hex name for ``key``, safe as a file name (xxh3, 128 bits)."""
    return xxhash.xxh3_128_hexdigest(key.encode("utf-8", "surrogatepass"))


def checksum(data: bytes) -> str:
    """The xxh64 checksum of a cached value, as 16 hex characters."""
    return xxhash.xxh64_hexdigest(data)
