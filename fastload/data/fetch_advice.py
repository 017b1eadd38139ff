"""What to change when reading a declared dataset's bytes (or decoding them) holds the loop up.

NOTE [the source's own fix]
The meter's diagnosis (:mod:`fastload.meter.diagnosis`) measures how long a batch's reads
take against the loop's step, so it can tell that fetching is the bottleneck. What to change
then depends on where the bytes come from, which only the dataset knows: a remote folder
read with no cache makes one request per image and keeps nothing (a cache, or packing the
folder into shards, removes the requests); a cache that is on but was cold this epoch wants
warming before training, and a budget that holds the dataset; shards read without a disk
cache are read range by range (a disk cache downloads them whole ahead of the order);
local files that are slow to read are a slow disk or a network mount. Each declared dataset
says which of these it is (``DeclaredImages.fetch_fix``), naming its own URL and cache
directory, and a :class:`fastload.DataLoader` hands that sentence to its meter, which
prints it as the fix (without it the meter can only say "enable the cache"). The same
goes for decoding fewer pixels when decoding is the bottleneck: an ImageFolder's cache can
keep its images re-encoded smaller (the transcoded tier), while shards are kept whole, so a
shard dataset says to pack the images again with ``fastload pack --transcode``
(``DeclaredImages.smaller_fix``), and refuses a cache that asks for transcoding.

Example::

    >>> folder_fix("ImageFolder", "s3://b/train", local=False, cache_dir=None, cached=False)
    "ImageFolder reads each image of s3://b/train with a request of its own ..."
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

__all__ = ["cache_dir", "folder_fix", "shards_fix", "smaller_shards_fix"]

_DEFAULT_DIR = "~/.cache/fastload"


def cache_dir(cache: Any) -> str | None:
    """The directory of a :class:`~fastload.cache.TieredCache`'s disk tier, or None."""
    disk = None if cache is None else cache.config.disk
    return None if disk is None else os.fspath(disk)


def _cold_cache(directory: str | None, warm_url: str) -> str:
    if directory is None:
        return (
            "its cache has no disk tier, so nothing outlives the process: add one "
            f"(cache={_DEFAULT_DIR!r}) and fill it before training (`fastload cache warm "
            f"{warm_url} --cache {_DEFAULT_DIR}`)"
        )
    return (
        f"its cache at {directory} did not hold them yet (a first epoch) or had no room for "
        f"them: fill it before training (`fastload cache warm {warm_url} --cache {directory}`) "
        f"and check with `fastload cache stats {directory}` that its budget holds the "
        "dataset"
    )


def folder_fix(name: str, root: str | None, *, local: bool, cache_dir: str | None,
               cached: bool) -> str:
    """The fix for a fetch-bound folder dataset: ``name`` its class, ``root`` its URL (None:
    an explicit file list), ``cache_dir`` its disk tier, ``cached`` whether it has a cache."""
    what = f"each image of {root}" if root is not None else "each listed image"
    src = root if root is not None else "FILES.txt"  # pack takes a file of 'PATH LABEL' lines
    pack = (
        f"pack the images into tar shards once (`fastload pack {src} DST`) and read them with "
        "fastload.TarShards"
    )
    if cached:
        warm = root if root is not None else "URL"
        cold = _cold_cache(cache_dir, warm)
        return f"{name} read {what} through its cache, but {cold}; or {pack}"
    if local:
        return (
            f"{name} reads {what} from local files, and reading them is the slow part (a network "
            f"mount, or a cold disk): pass cache={_DEFAULT_DIR!r} on a fast local disk (it reads "
            f"the epoch's next files ahead), or {pack}, which reads them in order"
        )
    return (
        f"{name} reads {what} with a request of its own and keeps none of them: pass "
        f"cache={_DEFAULT_DIR!r} (the epoch's next files are fetched ahead, later epochs read "
        f"the local disk; `fastload cache warm {src} --cache DIR` fills it before training), "
        f"or {pack}: one download per shard instead of one request per image"
    )


def shards_fix(name: str, urls: list[str], *, local: bool, cache_dir: str | None,
               cached: bool, downloads: bool) -> str:
    """The fix for a fetch-bound shard dataset: ``urls`` its files, ``downloads`` whether it
    downloads them whole into a shard store (a remote dataset with a disk cache)."""
    first = urls[0] if urls else "its files"
    folder = posixpath.dirname(first) if "://" in first else os.path.dirname(first)
    files = f"{first} and its other {len(urls) - 1} files" if len(urls) > 1 else first
    if local:
        return (
            f"{name} reads {files} from local files, and reading them is the slow part (a "
            "network mount, or a cold disk): copy the shards to a fast local disk"
        )
    if downloads:
        return (
            f"{name} downloads {files} whole into the shard store at {cache_dir} ahead of the "
            "epoch's order, and the loop still waited for them: measure what the store "
            f"delivers (`fastload bench {folder}`), fill the cache before training (`fastload "
            f"cache warm {folder} --cache {cache_dir}`), and give it a shard budget that holds "
            "the dataset (shard_budget=), so later epochs download nothing"
        )
    if cached:
        return (
            f"{name} reads {files} range by range through a cache without a disk tier: give it "
            f"one (cache={_DEFAULT_DIR!r}), into which it downloads whole files ahead of the "
            "epoch's order"
        )
    return (
        f"{name} reads {files} range by range and keeps nothing: pass cache={_DEFAULT_DIR!r}, "
        f"into which it downloads whole files ahead of the epoch's order (`fastload cache warm "
        f"{folder} --cache DIR` fills it before training)"
    )


def smaller_shards_fix(name: str) -> str:
    """How a shard dataset (``name`` its class) decodes fewer pixels: the transcoded cache
    tier re-encodes an ImageFolder's files one by one, and shards are kept whole."""
    return (
        "pack the original images again with smaller sides (`fastload pack SRC DST "
        "--transcode 256`; it changes pixels: pick a side at least the size you crop to) and "
        f"read DST with fastload.TarShards; {name}'s shards are kept whole, so the transcoded "
        "cache tier does not apply to them"
    )
