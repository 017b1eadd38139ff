"""A cache tier on Redis, shared by every node of a job: what one node fetched, others reuse.

Put it below the local tiers in a cache spec; objects then come from the origin about once
per job instead of once per node::

    >>> ds = ImageFolder("s3://bucket/train", cache={"disk": "/nvme/fastload",
    ...                                                  "redis": "redis://cache-host:6379/0"})

NOTE [redis layout]
Values are the object's raw bytes with a header (key, size, xxh64; the disk tier's entry
format, :mod:`fastload.cache.entry`), never pickles. Redis keys are
``<namespace>:{<xxh3 of the cache key>}:m`` for the *manifest* and ``...:c:<write id>:<n>``
for chunks; the cache key already holds the object's URL and version (NOTE [cache keys]), so
datasets and versions never collide, and the braces keep an entry's keys in one cluster slot.
A value up to ``chunk_size`` (4 MiB) lives inline in its manifest: one SET, atomic. A larger
one is written as chunks under a fresh write id first and its manifest last (SET NX), so a
reader sees the whole value or nothing, and a concurrent writer never touches chunks that a
reader is assembling. A reader that finds a chunk missing (evicted) treats the entry as a miss.

The budget is the server's ``maxmemory``: with ``maxmemory-policy noeviction`` a full Redis
refuses writes (a declined put, one warning: "keep" semantics); with ``allkeys-lru`` Redis
evicts by itself. When Redis is unreachable or fails mid-run, the tier logs one warning,
answers "miss" (reads fall through to the next tier or the origin) and does not try again for
``retry_after`` seconds; sockets time out after ``socket_timeout`` seconds.

A Redis Cluster works with the URL of any of its nodes (NOTE [one URL for a server or a
cluster]); each primary's ``maxmemory`` bounds the entries whose slots it serves.

With ``hmac_key`` every entry carries an HMAC of its key and bytes, and one read without a
valid one is dropped and fetched from the origin (NOTE [authenticated entries] in
:mod:`fastload.cache.redis_auth`). No secret is ever shown: logs, warnings, errors and the
``repr`` name the server by :func:`~fastload.cache.config.redact_url` (``redis://:***@host``).
An ACL user denied a command (NOPERM) loses what needs it, not the tier (NOTE [denied
commands]).
"""

from __future__ import annotations

import json
import logging
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

import redis
from redis.exceptions import NoPermissionError

from fastload.cache import entry
from fastload.cache.config import hmac_key_bytes, redact_url
from fastload.cache.keys import checksum, digest
from fastload.cache.redis_auth import EntryAuth, is_local_server
from fastload.cache.redis_conn import RedisConnection
from fastload.cache.tier import Tier
from fastload.errors import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CHUNK = 4 * 2**20
"""Bytes per chunk of a large value: far below Redis's 512 MiB value limit, small enough
to keep one slow client from blocking the server."""

PIPELINE_ENTRIES = 256
"""Most commands :meth:`RedisTier.put_many` / :meth:`RedisTier.contains_many` send in one
pipeline (one round trip); NOTE [redis batches]."""

PIPELINE_BYTES = 8 * 2**20
"""Most value bytes in one pipeline of :meth:`RedisTier.put_many` (one larger value still
goes alone); NOTE [redis batches]."""

_HEADER_PEEK = 64 * 2**10  # bytes of a manifest read to list its key (headers are small)
_LEN = struct.Struct("<I")  # the entry format's header length (fastload.cache.entry)
_UNAUTHENTICATED_WARNED: set[str] = set()  # servers warned about in this process


class Forged(entry.CorruptEntry):
    """An entry whose MAC is missing or wrong (NOTE [authenticated entries])."""


class RedisTier(Tier):
    """A shared cache tier in a Redis server (``redis://host:port/db``, ``rediss://`` for TLS).

    Args:
        url: the server's URL, as redis-py's ``Redis.from_url`` reads it.
        namespace: prefix of every Redis key this tier writes (one Redis can serve several
            caches); see NOTE [redis layout].
        chunk_size: bytes per chunk of large values.
        socket_timeout: seconds before a connect or a command counts as a failure.
        retry_after: seconds the tier stays off after a failure before trying again.
        hmac_key: a secret (at least 16 bytes) shared by every node: entries are written
            with an HMAC and read only with a valid one (NOTE [authenticated entries]).
            None: entries are trusted as they are, with one warning for a server across
            a network.

    Example::

        >>> tier = RedisTier("redis://127.0.0.1:6379/0")
        >>> tier.put("s3://b/x.jpg#v=3", b"...")
        True
        >>> tier.get("s3://b/x.jpg#v=3")
        b'...'
    """

    name = "redis"
    shared = True

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "fastload",
        chunk_size: int = DEFAULT_CHUNK,
        socket_timeout: float = 1.0,
        retry_after: float = 30.0,
        hmac_key: str | bytes | None = None,
    ) -> None:
        super().__init__()
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(
                f"redis={redact_url(url)!r} is not a Redis URL; write redis://host:6379/0 "
                "(rediss:// for TLS, unix:///path/to/socket for a local socket)"
            )
        if chunk_size < 1024:
            raise ConfigError(f"RedisTier chunk_size={chunk_size} bytes is too small; use >= 1024")
        self._conn = RedisConnection(url, socket_timeout=socket_timeout, retry_after=retry_after)
        key = hmac_key_bytes(hmac_key, name="RedisTier hmac_key")
        self._auth = None if key is None else EntryAuth(key)
        self.namespace = namespace
        self.chunk_size = chunk_size
        if self._auth is None and not is_local_server(url) and url not in _UNAUTHENTICATED_WARNED:
            _UNAUTHENTICATED_WARNED.add(url)
            logger.warning(
                "Redis cache %s: its entries are not authenticated, so anyone who can write "
                "to this Redis decides what every node reads from it. Set redis_hmac_key "
                "in the cache spec (or FASTLOAD_CACHE_HMAC_KEY) on every node to have "
                "forged entries refused (docs/reliability.md, 'Shared tiers')", self.shown_url,
            )

    def __repr__(self) -> str:
        auth = ", hmac_key=***" if self._auth is not None else ""
        return f"RedisTier({self.shown_url!r}, namespace={self.namespace!r}{auth})"

    @property
    def authenticated(self) -> bool:
        """Whether entries are written and read with an HMAC (NOTE [authenticated entries])."""
        return self._auth is not None

    # -- connection (fastload.cache.redis_conn) -------------------------------------------

    @property
    def url(self) -> str:
        return self._conn.url

    @property
    def shown_url(self) -> str:
        """The server's URL with its secrets masked: what logs and errors show."""
        return self._conn.shown_url

    @property
    def client(self) -> redis.Redis:
        return self._conn.client

    @property
    def available(self) -> bool:
        """False while the tier rests after a failure (``retry_after`` seconds)."""
        return self._conn.available

    def _call(self, what: str, op: Callable[[redis.Redis], T], fallback: T) -> T:
        return self._conn.call(what, op, fallback)

    # -- keys ------------------------------------------------------------------------------

    def _manifest_key(self, key: str) -> str:
        return f"{self.namespace}:{{{digest(key)}}}:m"

    def _chunk_keys(self, key: str, write_id: str, count: int) -> list[str]:
        base = f"{self.namespace}:{{{digest(key)}}}:c:{write_id}"
        return [f"{base}:{i}" for i in range(count)]

    # -- the Tier contract -----------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        value = self._call("get", lambda r: self._read(r, key), None)
        if value is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self.stats.bytes_read += len(value)
        return value

    def _read(self, r: redis.Redis, key: str) -> bytes | None:
        mkey = self._manifest_key(key)
        blob = r.get(mkey)
        if blob is None:
            return None
        try:
            header, _ = entry.read_header(blob)
            if header["key"] != key:  # another key with the same 128-bit hash: a miss
                return None
            if "chunks" not in header:
                return self._authentic(header, key, entry.decode(blob, expect_key=key))
            parts = r.mget(self._chunk_keys(key, header["write_id"], int(header["chunks"])))
            if any(p is None for p in parts):  # evicted under memory pressure
                r.delete(mkey)
                return None
            value = b"".join(parts)
            if len(value) != header["size"] or checksum(value) != header["xxh64"]:
                raise entry.CorruptEntry("size or checksum of the chunks do not match")
            return self._authentic(header, key, value)
        except Forged as exc:
            self.stats.forged += 1
            self._conn.warn_once(
                "forged",
                "dropping an entry of Redis cache %s that fails authentication (%s; key %s): "
                "it was not written with this cache's redis_hmac_key. It is read from the "
                "origin instead, never served; stats count them as 'forged'",
                self.shown_url, exc, key,
            )
            self._drop(r, key, blob)
            return None
        except (entry.CorruptEntry, KeyError, ValueError) as exc:
            self.stats.corrupt += 1
            logger.warning("dropping corrupt Redis cache entry %s (%s): %s", mkey, key, exc)
            self._drop(r, key, blob)
            return None

    def _authentic(self, header: dict[str, Any], key: str, value: bytes) -> bytes:
        """``value`` if the entry's MAC authenticates it (or no key is set); else Forged."""
        if self._auth is not None and not self._auth.valid(header.get("mac"), key, value):
            raise Forged("no MAC" if "mac" not in header else "wrong MAC")
        return value

    def _entry(self, key: str, value: bytes) -> bytes:
        """The stored form of an inline entry: its header (with its MAC) and ``value``."""
        mac = None if self._auth is None else self._auth.mac(key, value)
        return entry.encode_header(key, value, mac=mac) + value

    def put(self, key: str, value: bytes) -> bool:
        stored = self._call("put", lambda r: self._write(r, key, bytes(value)), None)
        if stored is None:
            self.stats.rejected += 1
            return False
        if stored:
            self.stats.puts += 1
            self.stats.bytes_written += len(value)
        return True

    def _write(self, r: redis.Redis, key: str, value: bytes) -> bool:
        """True if this call stored the value, False if an equal entry was already there."""
        mkey = self._manifest_key(key)
        if len(value) <= self.chunk_size:
            return bool(r.set(mkey, self._entry(key, value), nx=True))
        write_id = uuid.uuid4().hex[:16]
        count = -(-len(value) // self.chunk_size)
        ckeys = self._chunk_keys(key, write_id, count)
        pipe = r.pipeline(transaction=False)
        for i, ckey in enumerate(ckeys):
            pipe.set(ckey, value[i * self.chunk_size : (i + 1) * self.chunk_size])
        pipe.execute()
        mac = None if self._auth is None else self._auth.mac(key, value)
        if r.set(mkey, _manifest(key, value, count, write_id, mac), nx=True):
            return True
        r.delete(*ckeys)  # another writer got there first; its entry is the same object
        return False

    # NOTE [redis batches]
    # `cache warm` stores its downloads a batch at a time (Tier.put_many) and checks a resume
    # a batch of keys at a time (Tier.contains_many); one command per round trip would make
    # the network's latency the warm's limit. So a batch goes in pipelines without MULTI
    # (transaction=False: nothing needs all-or-nothing, and a cluster pipeline may span
    # nodes) of at most PIPELINE_ENTRIES commands and PIPELINE_BYTES of values: bounded so
    # that the client's packed copy and the server's query buffer stay small and one writer
    # never holds the server long against other clients. Each entry is still the single SET
    # NX of `put` (the same header and checksum), so a reader sees a whole entry or none.
    # Values above `chunk_size` take `put`'s own path (chunks first, manifest last: NOTE
    # [redis layout]). Replies come per command: a refused write (maxmemory, noeviction) is
    # a declined entry and the one "full" warning; a connection failure loses the
    # pipeline's replies, so its entries and every later one report False (some of them may
    # have been stored: a rerun finds them), the tier rests and warns once, as after a put.

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> list[bool]:
        """Store many entries, each as :meth:`put` would, a pipeline at a time.

        One result per item, in order: True if the entry is stored (now or before), False
        if the budget refused it or Redis failed (never raises). See NOTE [redis batches].

        Example::

            >>> tier.put_many([("s3://b/a.jpg#v=1", b"..."), ("s3://b/b.jpg#v=4", b"...")])
            [True, True]
        """
        pairs = [(key, bytes(value)) for key, value in items]
        results = [False] * len(pairs)
        inline: list[int] = []
        for i, (key, value) in enumerate(pairs):
            if len(value) > self.chunk_size:
                results[i] = self.put(key, value)
            else:
                inline.append(i)
        for batch in _pipelines(inline, [len(value) for _, value in pairs]):
            replies = self._call("put", partial(self._set_all, [pairs[i] for i in batch]), None)
            if replies is None:  # the tier is down (or just failed): nothing of it was stored
                self.stats.rejected += len(batch)
                continue
            fault: BaseException | None = None
            for i, reply in zip(batch, replies):
                if isinstance(reply, Exception):
                    self.stats.rejected += 1
                    if isinstance(reply, redis.OutOfMemoryError):
                        self._conn.full()
                    elif isinstance(reply, NoPermissionError):
                        self._conn.denied("put", reply)
                    else:
                        fault = fault or reply
                    continue
                results[i] = True
                if reply:  # None: an equal entry was already there
                    self.stats.puts += 1
                    self.stats.bytes_written += len(pairs[i][1])
            if fault is not None:
                self._conn.failed("put", fault)
        return results

    def _set_all(self, pairs: list[tuple[str, bytes]], r: redis.Redis) -> list[Any]:
        """One pipeline of `put`'s inline SET NX; a reply per entry (True, None or an error)."""
        pipe = r.pipeline(transaction=False)
        for key, value in pairs:
            pipe.set(self._manifest_key(key), self._entry(key, value), nx=True)
        return pipe.execute(raise_on_error=False)

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """:meth:`contains` of each key, PIPELINE_ENTRIES keys per round trip (uncounted).

        Example::

            >>> tier.contains_many(["s3://b/a.jpg#v=1", "s3://b/c.jpg#v=2"])
            [True, False]
        """
        found: list[bool] = []
        for start in range(0, len(keys), PIPELINE_ENTRIES):
            part = list(keys[start : start + PIPELINE_ENTRIES])
            replies = self._call("contains", partial(self._exists_all, part), [0] * len(part))
            found += [bool(reply) for reply in replies]
        return found

    def _exists_all(self, keys: list[str], r: redis.Redis) -> list[Any]:
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self._manifest_key(key))
        return pipe.execute()

    def delete(self, key: str) -> None:
        def op(r: redis.Redis) -> None:
            blob = r.get(self._manifest_key(key))
            if blob is not None:
                self._drop(r, key, blob)

        self._call("delete", op, None)

    def _drop(self, r: redis.Redis, key: str, blob: bytes) -> None:
        names = [self._manifest_key(key)]
        try:
            header, _ = entry.read_header(blob)
            if "chunks" in header:
                names += self._chunk_keys(key, header["write_id"], int(header["chunks"]))
        except (entry.CorruptEntry, KeyError, ValueError):
            pass  # unreadable manifest: its chunks (if any) cannot be named, Redis may evict them
        r.delete(*names)

    def keys(self) -> Iterator[str]:
        def op(r: redis.Redis) -> list[str]:
            found = []
            for mkey in r.scan_iter(match=f"{self.namespace}:{{*}}:m", count=1000):
                head = r.getrange(mkey, 0, _HEADER_PEEK - 1)
                try:
                    found.append(entry.read_header(head)[0]["key"])
                except entry.CorruptEntry:
                    continue
            return found

        return iter(self._call("keys", op, []))

    def contains(self, key: str) -> bool:
        return bool(self._call("contains", lambda r: r.exists(self._manifest_key(key)), 0))

    def maxmemory(self) -> int | None:
        """The server's memory budget in bytes (0 = unlimited); None if it cannot be read."""
        def op(r: redis.Redis) -> int | None:
            return int(r.config_get("maxmemory").get("maxmemory", 0))

        return self._call("maxmemory", op, None)

    def close(self) -> None:
        self._conn.close()


def _manifest(key: str, value: bytes, chunks: int, write_id: str, mac: str | None) -> bytes:
    """A chunked value's manifest: an entry header with the chunk fields, no inline value."""
    header: dict[str, Any] = {"key": key, "size": len(value), "xxh64": checksum(value),
                              "chunks": chunks, "write_id": write_id}
    if mac is not None:
        header["mac"] = mac
    raw = json.dumps(header, ensure_ascii=True).encode()
    return entry.MAGIC + _LEN.pack(len(raw)) + raw


def _pipelines(indexes: list[int], sizes: list[int]) -> Iterator[list[int]]:
    """``indexes`` in runs of at most PIPELINE_ENTRIES and PIPELINE_BYTES (of ``sizes``)."""
    run: list[int] = []
    nbytes = 0
    for i in indexes:
        if run and (len(run) >= PIPELINE_ENTRIES or nbytes + sizes[i] > PIPELINE_BYTES):
            yield run
            run, nbytes = [], 0
        run.append(i)
        nbytes += sizes[i]
    if run:
        yield run
