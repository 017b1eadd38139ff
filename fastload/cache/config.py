"""What a cache spec means: sizes in human units, the tiers it asks for, and its options.

Data and parsing only: :mod:`fastload.cache.build` turns a spec into tiers and a cache, so
the tiers may import this module without a cycle. ``ImageFolder(cache=...)``, the
``fastload::`` protocol and ``fastload cache`` all accept the same spec, resolved once by
:func:`fastload.cache.open_cache`:

* ``None`` or ``False``: no cache.
* ``True``: a disk tier in ``~/.cache/fastload``.
* a path such as ``"/nvme/fastload"``: a disk tier there, with the default budget.
* a :class:`CacheConfig` or a dict of its fields: memory and disk sizes, policy, extra tiers.
* a :class:`~fastload.cache.tiered.TieredCache`: used as it is.

``transcode`` (opt-in, changes pixels) asks readers that know images (``ImageFolder``,
``fastload cache warm --transcode``) to cache a re-encoded copy of each image instead of its
original bytes; this module only checks it as data (see :func:`transcode_spec`).

Example::

    >>> cache = open_cache({"memory": "2GB", "disk": "/nvme/fastload", "disk_size": "500GB"})
    >>> [t.name for t in cache.tiers]
    ['memory', 'disk']
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastload.errors import ConfigError

if TYPE_CHECKING:
    from fastload.cache.tier import Tier

Policy = Literal["keep", "lru"]
POLICIES = ("keep", "lru")
DiskFormat = Literal["packed", "files"]
DISK_FORMATS = ("packed", "files")
DEFAULT_DIR = "~/.cache/fastload"

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
    "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*$")

HMAC_KEY_ENV = "FASTLOAD_CACHE_HMAC_KEY"
"""The environment variable a Redis tier's HMAC key is read from when the spec sets none."""

MIN_HMAC_KEY = 16
"""Fewest bytes an HMAC key may have (a random secret: ``secrets.token_hex(32)``)."""

_SECRET_QUERY = re.compile(r"pass|secret|token|key", re.IGNORECASE)

TRANSCODE_QUALITY = 90
"""Default JPEG quality of a transcoded entry."""
_MAX_QUALITY = 95  # Pillow: above 95 JPEG grows a lot for next to no visible gain


def parse_size(value: int | str, *, name: str = "size") -> int:
    """Bytes from an int or a human size: ``"20GB"`` (10**9), ``"64KiB"`` (2**10), ``"1.5g"``.

    Example::

        >>> parse_size("20GB"), parse_size("64kib"), parse_size(512)
        (20000000000, 65536, 512)
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a size like '20GB' or a number of bytes, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name} must not be negative, got {value}")
        return value
    match = _SIZE.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"{name}={value!r} is not a size; write a number of bytes or a number with a unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '20GB'"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def redact_url(url: str) -> str:
    """``url`` with its secrets masked, for logs, warnings, errors and reprs.

    A password in the user part becomes ``***`` (the user name stays), and so does the value
    of a query parameter that names a secret (``password=``, ``ssl_password=``...).

    Example::

        >>> redact_url("redis://:hunter2@cache-host:6379/0")
        'redis://:***@cache-host:6379/0'
        >>> redact_url("rediss://trainer:hunter2@cache-host:6380/0?ssl_password=x")
        'rediss://trainer:***@cache-host:6380/0?ssl_password=***'
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # not a URL at all: nothing of it is safe to show
        return "<an unparsable URL>"
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name, colon, _ = user.partition(":")
        netloc = f"{name}:***@{host}" if colon else f"***@{host}"
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "?" + "&".join(f"{k}={'***' if _SECRET_QUERY.search(k) else v}" for k, v in pairs)
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    scheme = f"{parts.scheme}://" if parts.scheme else ""
    return f"{scheme}{netloc}{parts.path}{query}{fragment}"


def hmac_key_bytes(key: str | bytes | None, *, name: str = "redis_hmac_key") -> bytes | None:
    """The bytes of an HMAC key (a str as UTF-8), checked; None for none.

    Raises ConfigError for another type or a key shorter than :data:`MIN_HMAC_KEY` bytes,
    without showing the key.
    """
    if key is None:
        return None
    if not isinstance(key, (str, bytes)):
        raise ConfigError(f"{name} must be a str or bytes secret, got a {type(key).__name__}")
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) < MIN_HMAC_KEY:
        raise ConfigError(
            f"{name} is {len(raw)} bytes; use a random secret of at least {MIN_HMAC_KEY} "
            "bytes, e.g. python -c 'import secrets; print(secrets.token_hex(32))'"
        )
    return raw


def transcode_spec(value: Any, *, name: str = "transcode") -> dict[str, int]:
    """A transcode spec checked as plain data: ``{"max_side": int > 0, "quality": 1..95}``.

    ``quality`` defaults to 90. The same check serves ``CacheConfig(transcode=...)``,
    :class:`fastload.data.transcode.Transcode` and ``fastload cache warm --transcode``.

    Example::

        >>> transcode_spec({"max_side": 256})
        {'max_side': 256, 'quality': 90}
    """
    example = '{"max_side": 256, "quality": 90}'
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{name} must be a dict such as {example} (or None for no transcoding), got {value!r}"
        )
    unknown = sorted(set(value) - {"max_side", "quality"})
    if unknown:
        raise ConfigError(
            f"unknown {name} option(s) {unknown}; the options are ['max_side', 'quality'], "
            f"e.g. {example}"
        )
    if "max_side" not in value:
        raise ConfigError(f"{name} needs max_side (pixels of the longer side), e.g. {example}")
    max_side, quality = value["max_side"], value.get("quality", TRANSCODE_QUALITY)
    if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 1:
        raise ConfigError(
            f"{name} max_side must be a whole number of pixels >= 1 (the longer side of the "
            f"stored image, e.g. 256 for 224-pixel crops), got {max_side!r}"
        )
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= _MAX_QUALITY:
        raise ConfigError(
            f"{name} quality must be a JPEG quality from 1 to {_MAX_QUALITY} (default "
            f"{TRANSCODE_QUALITY}), got {quality!r}"
        )
    return {"max_side": max_side, "quality": quality}


@dataclass(frozen=True)
class CacheConfig:
    """The cache's tiers and options (all keyword-only; sizes in bytes or human units).

    Args:
        memory: size of the in-process memory tier; None = no memory tier. Each process
            (each loader worker) has its own; see docs/cache.md.
        disk: directory of the disk tier, shared by every process on the node; None = none.
        disk_size: budget of the disk tier; None = half the free space of its filesystem
            when the directory was created (remembered in the directory).
        policy: "keep" (default: admit until full, then keep what is there; thrash-free
            under shuffled epochs) or "lru" (evict the least recently used).
        disk_format: how the disk tier keeps small objects: "packed" (one LMDB store) or
            "files" (a file each); None = the directory's own, "packed" for a new one.
            Asking for another format than an existing directory's is a ConfigError.
        redis: URL of a shared Redis tier below the disk (``redis://host:6379/0``); needs the
            Redis tier module (``pip install 'fastload[redis]'``). A password in it is never
            shown (logs, errors, reprs: ``redis://:***@host``).
        redis_hmac_key: a secret (str or bytes, at least 16 bytes) every node of a job
            shares: entries written to the Redis tier carry an HMAC-SHA256 of their key and
            bytes, and an entry read without a valid one is dropped, counted and fetched
            from the origin, never served (NOTE [authenticated entries] in
            :mod:`fastload.cache.redis_tier`). None: the ``FASTLOAD_CACHE_HMAC_KEY``
            environment variable if set, else entries are not authenticated and the Redis
            must be trusted (docs/reliability.md, "Shared tiers").
        tiers: further :class:`~fastload.cache.tier.Tier` objects, below memory and disk.
        prefetch: let a loader fetch the epoch's next items into the cache ahead of its
            workers (clairvoyant prefetch).
        prefetch_jobs: requests the prefetcher keeps in flight.
        prefetch_ahead: how many samples ahead of the training loop it may fetch; None =
            enough for the loader's workers plus a margin.
        lock_timeout: seconds a reader waits for another process fetching the same object
            before it fetches the object itself.
        shard_budget: bytes of whole shards the disk tier's directory may hold (NOTE [the
            shard store] in :mod:`fastload.cache.shardstore`: ``TarShards`` from a remote
            store downloads whole shards and evicts the least recently used ones no process
            reads); None = the disk tier's budget. A dataset larger than it streams through.
        transcode: None (cache the original bytes), or ``{"max_side": 256, "quality": 90}``:
            opt-in, and it changes pixels. ``ImageFolder`` and ``fastload cache warm
            --transcode`` then cache each image re-encoded as a JPEG whose longer side is at
            most ``max_side`` (smaller images are kept as they are), keyed by the parameters,
            so later epochs decode fewer pixels. See docs/cache.md, "Transcoded tier".

    Example::

        >>> CacheConfig(memory="1GB", disk="/nvme/fastload", disk_size="200GB", policy="lru")
    """

    memory: int | str | None = None
    disk: str | os.PathLike[str] | None = None
    disk_size: int | str | None = None
    policy: Policy = "keep"
    disk_format: DiskFormat | None = None
    redis: str | None = None
    redis_hmac_key: str | bytes | None = field(default=None, repr=False)
    tiers: Sequence[Tier] = field(default_factory=tuple)
    prefetch: bool = True
    prefetch_jobs: int = 16
    prefetch_ahead: int | None = None
    lock_timeout: float = 60.0
    transcode: Mapping[str, int] | None = None
    shard_budget: int | str | None = None

    def __post_init__(self) -> None:
        hmac_key_bytes(self.redis_hmac_key)
        if self.transcode is not None:  # normalized: the default quality filled in
            object.__setattr__(self, "transcode", transcode_spec(self.transcode))
        if self.policy not in POLICIES:
            raise ConfigError(f"cache policy must be 'keep' or 'lru', got {self.policy!r}")
        if self.disk_format is not None and self.disk_format not in DISK_FORMATS:
            raise ConfigError(f"disk_format must be 'packed' or 'files', got {self.disk_format!r}")
        if self.memory is not None:
            parse_size(self.memory, name="memory")
        if self.disk_size is not None:
            parse_size(self.disk_size, name="disk_size")
        if self.shard_budget is not None:
            parse_size(self.shard_budget, name="shard_budget")
        if self.prefetch_jobs < 1:
            raise ConfigError(f"prefetch_jobs must be at least 1, got {self.prefetch_jobs}")
        if self.prefetch_ahead is not None and self.prefetch_ahead < 1:
            raise ConfigError(f"prefetch_ahead must be at least 1 sample, got {self.prefetch_ahead}")
        if not (self.memory or self.disk or self.redis or self.tiers):
            raise ConfigError(
                "the cache has no tier: give memory='2GB', disk='/path/to/cache', redis=... "
                "or tiers=[...]"
            )

    def __repr__(self) -> str:
        # No secret in a repr: the Redis URL's password masked, the HMAC key never shown.
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "redis" and value is not None:
                value = redact_url(value)
            elif f.name == "redis_hmac_key":
                if value is None:
                    continue
                shown.append(f"{f.name}='***'")
                continue
            shown.append(f"{f.name}={value!r}")
        return f"CacheConfig({', '.join(shown)})"

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> CacheConfig:
        """A config from a dict of its fields; an unknown field is an error naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(spec) - names)
        if unknown:
            raise ConfigError(
                f"unknown cache option(s) {unknown}; the options are {sorted(names)}"
            )
        return cls(**spec)
