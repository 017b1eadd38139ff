"""From a cache spec to a cache: the one module that builds tiers from a :class:`CacheConfig`
(and a cache's shard store, :func:`open_shard_store`).

:mod:`fastload.cache.config` holds the spec's data and parsing; the tiers import it. This
module imports the tiers, so no cycle runs through the config.

Example::

    >>> cache = open_cache({"memory": "2GB", "disk": "/nvme/fastload", "disk_size": "500GB"})
    >>> [t.name for t in cache.tiers]
    ['memory', 'disk']
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from fastload.cache.config import DEFAULT_DIR, HMAC_KEY_ENV, CacheConfig, redact_url
from fastload.cache.disk import DiskTier
from fastload.cache.memory import MemoryTier
from fastload.cache.shardstore import ShardStore
from fastload.cache.tier import Tier
from fastload.cache.tiered import TieredCache
from fastload.errors import CacheError, ConfigError, MissingDependencyError

logger = logging.getLogger(__name__)


def build_tiers(config: CacheConfig) -> list[Tier]:
    """The tier stack of ``config``, fastest first: memory, disk, Redis, then its ``tiers``."""
    tiers: list[Tier] = []
    if config.memory:
        tiers.append(MemoryTier(config.memory, policy=config.policy))
    if config.disk:
        tiers.append(DiskTier(config.disk, size=config.disk_size, policy=config.policy,
                              format=config.disk_format))
    if config.redis:
        tiers.append(_redis_tier(config))
    tiers.extend(config.tiers)
    return tiers


def _redis_tier(config: CacheConfig) -> Tier:
    assert config.redis is not None
    try:
        from fastload.cache import redis_tier  # imports redis, an optional package
    except ImportError as exc:
        raise MissingDependencyError(
            f"cache redis={redact_url(config.redis)!r} needs the redis package ({exc}); "
            "install it with: pip install 'fastload[redis]'"
        ) from exc
    # The spec's key wins over the environment's (resolved here, once per cache).
    key = config.redis_hmac_key
    if key is None:
        key = os.environ.get(HMAC_KEY_ENV) or None
    return redis_tier.RedisTier(config.redis, hmac_key=key)


def open_cache(spec: Any) -> TieredCache | None:
    """The cache a spec describes (see :mod:`fastload.cache.config`), or None for no cache."""
    if spec is None or spec is False:
        return None
    if isinstance(spec, TieredCache):
        return spec
    if spec is True:
        config = CacheConfig(disk=DEFAULT_DIR)
    elif isinstance(spec, CacheConfig):
        config = spec
    elif isinstance(spec, Mapping):
        config = CacheConfig.from_mapping(spec)
    elif isinstance(spec, (str, os.PathLike)):
        config = CacheConfig(disk=spec)
    else:
        raise ConfigError(
            f"cache={spec!r} is not a cache spec; pass a directory, a dict such as "
            "{'memory': '2GB', 'disk': '/nvme/cache'}, a CacheConfig, or None"
        )
    return TieredCache(build_tiers(config), config=config)


def open_shard_store(cache: Any, *, keep_open: int = 8) -> ShardStore | None:
    """The shard store of a :class:`~fastload.cache.tiered.TieredCache`: in its disk tier's
    directory, budget ``config.shard_budget`` (else the disk tier's), its other shared tiers
    (Redis) shared; None without a writable disk tier (readers then cache ranges as entries).

    Example::

        >>> store = open_shard_store(open_cache({"disk": "/nvme/fastload", "shard_budget": "2TB"}))
    """
    disks = [t for t in getattr(cache, "tiers", []) if isinstance(t, DiskTier)]
    if not disks or disks[0].read_only is not None:
        return None
    disk = disks[0]
    config = cache.config
    budget = config.shard_budget if config.shard_budget is not None else disk.budget
    shared = [t for t in cache.tiers if t.shared and t is not disk]
    try:
        store = ShardStore(disk.directory, budget=budget, shared=shared, keep_open=keep_open,
                           lock_timeout=config.lock_timeout)
        store.files  # noqa: B018 - shards/ made now: a directory that refuses it fails open here
        return store
    except (OSError, CacheError) as exc:  # NOTE [a cache fails open]
        logger.warning("no shard store in %s (%s); shards are read by range from the origin",
                       disk.directory, exc)
        return None
