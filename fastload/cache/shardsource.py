"""Where a shard's bytes come from besides the local disk: the origin, checked to still hold
the indexed version, or a tier shared across nodes (Redis), which a download is published
to (NOTE [the shard store] in :mod:`.shardstore`); and the errors that send a read to the
origin instead of the local copy.

Example::

    >>> ref = ShardRef("s3://b/train-000000.tar", "b/train-000000.tar", '104857600:"9a.."', 104857600)
    >>> check_version(fs, ref)                 # one info request; ShardChangedError if rewritten
    >>> from_shared([redis_tier], ref, fd)     # "shared" when Redis had it, written into fd
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastload.cache.keys import make_key
from fastload.cache.tier import Tier
from fastload.errors import CacheError
from fastload.io.errors import storage_error
from fastload.io.versions import ObjectChangedError, version_of

logger = logging.getLogger(__name__)

__all__ = [
    "ShardBusyError", "ShardChangedError", "ShardFillingError", "ShardRef", "changed_while",
    "check_version", "from_shared", "publish",
]


class ShardBusyError(CacheError):
    """Another process held a shard's lock past the timeout; read from the origin instead."""


class ShardFillingError(ShardBusyError):
    """This process is downloading the shard now and the range's part has not been requested
    yet: read the range from the origin meanwhile."""


class ShardChangedError(ObjectChangedError):
    """The shard at the origin is not the version its index recorded (it was rewritten)."""


@dataclass(frozen=True)
class ShardRef:
    """One shard: its URL (keys, messages), path on its filesystem, indexed version, size."""

    url: str
    path: str
    version: str
    size: int

    @property
    def key(self) -> str:
        """Its cache key: the whole object's, URL + version (NOTE [cache keys])."""
        return make_key(self.url, self.version)


def check_version(fs: Any, ref: ShardRef) -> None:
    """Raise :class:`ShardChangedError` unless the origin holds the shard at ``ref.version``."""
    try:
        now = version_of(fs.info(ref.path))
    except Exception as exc:  # NOTE [storage errors]: named, classified
        raise storage_error(exc, "read the version of", ref.url) from exc
    if now != ref.version:
        raise ShardChangedError(
            f"{ref.url} changed at the origin since it was indexed (version {ref.version} "
            f"then, {now} now); its old bytes are not served: build the dataset again "
            "(listing_max_age=0) to index the new shard")


@contextlib.contextmanager
def changed_while(ref: ShardRef) -> Iterator[None]:
    """Raise :class:`ShardChangedError` for a shard found rewritten at the origin while it was
    downloaded (NOTE [the version asked with each range] in :mod:`fastload.io.streams`)."""
    try:
        yield
    except ObjectChangedError as exc:
        raise ShardChangedError(
            f"{ref.url} changed at the origin while it was downloaded ({exc}); its bytes are "
            "not kept: build the dataset again (listing_max_age=0) to index the new shard"
        ) from exc


def from_shared(shared: Sequence[Tier], ref: ShardRef, fd: int) -> str | None:
    """Write the shard from the first shared tier that has it whole into ``fd``: "shared",
    or None when none has it (a tier that fails is skipped)."""
    for tier in shared:
        try:
            data = tier.get(ref.key)
        except Exception as exc:  # noqa: BLE001 - a shared tier that fails is skipped
            logger.debug("shared tier %s failed for %s: %s", tier.name, ref.url, exc)
            continue
        if data is not None and len(data) == ref.size:
            os.pwrite(fd, data, 0)
            return "shared"
    return None


def publish(shared: Sequence[Tier], ref: ShardRef, fd: int) -> None:
    """Put the shard in ``fd`` into each shared tier (best effort: a full one keeps none)."""
    if not shared:
        return
    data = os.pread(fd, ref.size, 0)
    for tier in shared:
        try:
            tier.put(ref.key, data)
        except Exception as exc:  # noqa: BLE001 - publishing is best effort
            logger.debug("could not publish %s to %s: %s", ref.url, tier.name, exc)
