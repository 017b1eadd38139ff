"""Authenticated entries of the shared Redis tier: an HMAC over each entry's key and bytes.

NOTE [authenticated entries]
A cache entry's header carries an xxh64 of its bytes: a checksum, which anyone can compute,
so it catches damage, not forgery. Anyone who can write to a shared Redis could otherwise
store ``encode_header(key, evil) + evil`` under a key seen with ``SCAN`` and every node would
train on it (and copy it into its disk tier). With a key configured (``CacheConfig(
redis_hmac_key=...)`` or ``FASTLOAD_CACHE_HMAC_KEY``), each entry written to Redis carries
``"mac"``: HMAC-SHA256, under that key, of a domain tag, the cache key's length and bytes,
then the value (the whole value for a chunked one, verified once its chunks are joined).
A read checks it in constant time after the checksum; an entry whose MAC is missing or
wrong is dropped from Redis, counted (``stats.forged``), logged once, and read from the
next tier or the origin instead, which stores a genuine entry in its place. Never served.

What the key does not do: it does not encrypt (whoever reads the Redis reads the images)
and it does not stop deletion or eviction (a miss, the origin is read). A key change makes
every entry written under the old one a forgery to the new one: fetched again, once. Every
node of a job must share the key; a node without it writes entries the others drop.

Costs: HMAC-SHA256 runs at about 1-2 GB/s on one core with SHA extensions (about 60 µs for a
110 kB JPEG), on top of the network round trip, on writes and reads of Redis only.

Example::

    >>> auth = EntryAuth(b"a shared secret of 16+ bytes")
    >>> mac = auth.mac("s3://b/a.jpg#v=3", b"jpeg bytes")
    >>> auth.valid(mac, "s3://b/a.jpg#v=3", b"jpeg bytes")
    True
    >>> auth.valid(mac, "s3://b/a.jpg#v=3", b"evil bytes")
    False
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import struct
import urllib.parse
from typing import Any

_TAG = b"fastload-redis-entry-v1\0"  # the MAC of nothing else ever matches an entry's
_LEN = struct.Struct("<Q")


class EntryAuth:
    """Computes and checks the MAC of Redis entries with one secret ``key`` (bytes).

    The key is kept for the MAC only: it is never logged, and the tier's ``repr`` says
    only whether there is one.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        self._key = key

    def __repr__(self) -> str:
        return "EntryAuth(key=***)"

    def mac(self, key: str, value: bytes | memoryview) -> str:
        """The hex HMAC-SHA256 of cache key ``key`` and ``value``."""
        raw = key.encode("utf-8", "surrogatepass")
        h = hmac.new(self._key, _TAG, hashlib.sha256)
        h.update(_LEN.pack(len(raw)))
        h.update(raw)
        h.update(value)
        return h.hexdigest()

    def valid(self, mac: Any, key: str, value: bytes | memoryview) -> bool:
        """Whether ``mac`` (an entry header's ``"mac"``, perhaps absent) authenticates them."""
        return isinstance(mac, str) and hmac.compare_digest(mac, self.mac(key, value))


def is_local_server(url: str) -> bool:
    """Whether a Redis URL names this machine (a unix socket, localhost, a loopback address).

    A server only this machine can reach needs no warning that its entries are trusted
    as they are; one across a network does (docs/reliability.md, "Shared tiers").
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
