"""The read-through cache over fsspec storage: tiers, policies, prefetch, the ``fastload::`` protocol.

Three ways in::

    ImageFolder("s3://bucket/train", cache="/nvme/fastload")            # a dataset
    fsspec.open("fastload::s3://bucket/key", fastload={"cache": "/nvme/fastload"})
    fastload cache warm s3://bucket/train --cache /nvme/fastload        # the command line

See docs/cache.md for the tiers, the policies and what is shared between processes.
"""

from fastload.lazy import attach as _attach

# Imported on first use, so `fastload cache stats` does not pay for fsspec and its asyncio.
_LAZY = {
    "CacheConfig": "fastload.cache.config",
    "DiskTier": "fastload.cache.disk",
    "KeyLocking": "fastload.cache.tier",
    "MemoryTier": "fastload.cache.memory",
    "Tier": "fastload.cache.tier",
    "TierStats": "fastload.cache.tier",
    "TieredCache": "fastload.cache.tiered",
    "open_cache": "fastload.cache.build",
    "parse_size": "fastload.cache.config",
    "ShardRef": "fastload.cache.shardstore",
    "ShardStore": "fastload.cache.shardstore",
    "open_shard_store": "fastload.cache.build",
}
__getattr__, __dir__ = _attach(__name__, _LAZY, globals())

__all__ = [
    "CacheConfig",
    "DiskTier",
    "KeyLocking",
    "MemoryTier",
    "ShardRef",
    "ShardStore",
    "Tier",
    "TierStats",
    "TieredCache",
    "open_cache",
    "open_shard_store",
    "parse_size",
]
