"""The read-through cache over fsspec storage: tiers, policies, prefetch, the ``fastload::`` protocol.

Three ways in::

    ImageFolder("s3://bucket/train", cache="/nvme/fastload")            # a dataset
    fsspec.open("fastload::s3://bucket/key", fastload={"cache": "/nvme/fastload"})
    fastload cache warm s3://bucket/train --cache /nvme/fastload        # the command line

See docs/cache.md for the tiers, the policies and what is shared between processes.
"""

import fsspec

from fastload.cache.build import open_cache
from fastload.cache.config import CacheConfig, parse_size
from fastload.cache.disk import DiskTier
from fastload.cache.memory import MemoryTier
from fastload.cache.tier import KeyLocking, Tier, TierStats
from fastload.cache.tiered import TieredCache

# The pyproject entry point registers the protocol for installed packages; this covers
# source trees and editable installs made before the entry point existed.
fsspec.register_implementation(
    "fastload", "fastload.cache.filesystem.FastloadCacheFileSystem", clobber=True
)

__all__ = [
    "CacheConfig",
    "DiskTier",
    "KeyLocking",
    "MemoryTier",
    "Tier",
    "TierStats",
    "TieredCache",
    "open_cache",
    "parse_size",
]
