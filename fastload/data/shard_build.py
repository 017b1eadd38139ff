"""Building a :class:`~fastload.data.shard_index.ShardIndex` and keeping it in the cache.

Each shard is read concurrently (:data:`BUILD_JOBS` at once): one ``info`` for its size and
version, then its DALI index file when one sits beside it (``x.tar`` -> ``x.idx``; the labels
then come from ``fastload pack``'s labels file, NOTE [the labels file] in :mod:`.shard_labels`,
or else from the label members, read merged: NOTE [reading through small gaps]) or else its
headers (NOTE [the shard index] in :mod:`.shard_index`). The built index is stored in the
cache's shared tiers under a key of the shard URLs and options, and reused for
``listing_max_age`` seconds (as a folder's listing, NOTE [the stored listing]).

NOTE [an index file that is not the shard's]
An index file is trusted for where members are, so one left beside a shard written again
(another order, other samples) would send every read to the wrong bytes: wrong images, or
labels that silently belong to other samples. Before it is used, every member it lists must
lie inside the shard and the 512 bytes before its first and last members must be their tar
headers, with the sizes (and, in v1.2, the names) the index gives: one more range read per
shard, merged with the label members' when those are read. An index that fails is named in a
warning and the shard is indexed from its headers, as if it had none.

Example::

    >>> index = shard_index(fs, urls, paths, cache=None, storage_options={}, max_age=3600)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastload.cache.tiered import TieredCache
from fastload.data.index_blob import load_stored, store, stored_key
from fastload.data.shard_index import (
    FORMAT,
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    ShardIndex,
    ShardRows,
    parse_label,
)
from fastload.data.shard_labels import labels_url_of, parse_labels
from fastload.data.tarfiles import (
    BLOCK,
    index_url_of,
    member_header,
    parse_dali_index,
    split_key,
    walk_members,
)
from fastload.errors import DatasetError
from fastload.io.errors import storage_error
from fastload.io.ranges import read_ranges, read_through
from fastload.io.versions import version_of

logger = logging.getLogger(__name__)

__all__ = ["BUILD_JOBS", "group_rows", "shard_index"]

BUILD_JOBS = 16
"""Shards whose headers are read at once."""


def _is_label(name: str) -> bool:
    return split_key(name)[1].lower() in LABEL_EXTENSIONS


def group_rows(members: Sequence[tuple[str, int, int]], labels: dict[str, bytes]) -> ShardRows:
    """Samples of one shard from its members ``(name, offset, size)`` in tar order, and the
    bytes of its label members by name: one row per key that has an image member."""
    rows = ShardRows([], [], [], [])
    current: str | None = None
    image: tuple[int, int] | None = None
    label: int | str | None = None

    def close() -> None:
        if current is not None and image is not None:
            rows.keys.append(current)
            rows.offsets.append(image[0])
            rows.lengths.append(image[1])
            rows.labels.append(label)

    for name, offset, size in members:
        key, ext = split_key(name)
        ext = ext.lower()
        if key != current:
            close()
            current, image, label = key, None, None
        if ext in IMAGE_EXTENSIONS and image is None:
            image = (offset, size)
        elif ext in LABEL_EXTENSIONS and name in labels and label is None:
            label = parse_label(ext, labels[name])
    close()
    return rows


def _from_headers(fs: Any, path: str, size: int, url: str) -> ShardRows:
    def read_at(offset: int, length: int) -> bytes:
        return fs.cat_file(path, start=offset, end=offset + length)

    labels: dict[str, bytes] = {}
    members = []
    try:
        for m in walk_members(read_at, size, keep=_is_label, where=url, through=read_through(fs)):
            members.append((m.name, m.offset, m.size))
            if m.data is not None:
                labels[m.name] = m.data
    except ValueError as exc:
        raise DatasetError(f"{url} is not a readable tar shard: {exc}. Check that the URL names a "
                           "WebDataset .tar (uncompressed)") from exc
    return group_rows(members, labels)


def _from_index_file(fs: Any, path: str, text: str, url: str, size: int) -> ShardRows | None:
    """The shard's rows from its index file ``text``; None (and a warning) when the index does
    not describe the shard (NOTE [an index file that is not the shard's])."""
    samples = parse_dali_index(text, index_url_of(url))
    # v1.1 lists no names: a sample's key is then its position
    named = [[(name or f"{i:09d}.{ext}", off, length) for ext, off, length, name in sample]
             for i, sample in enumerate(samples)]
    members = [m for sample in named for m in sample]
    given = _labels_beside(fs, path, url, size, len(samples), text)
    wanted = [] if given is not None else [(n, o, s) for n, o, s in members if _is_label(n)]
    probes = members[:1] + members[-1:] if len(members) > 1 else members
    differs = next((f"member {n!r} at byte {o} is not within the shard's {size} bytes"
                    for n, o, s in members if o < BLOCK or o + s > size), None)
    if differs is None:
        data = read_ranges(fs, path, [(o - BLOCK, BLOCK) for _, o, _ in probes]
                           + [(o, s) for _, o, s in wanted])
        names_given = bool(samples) and bool(samples[0][0][3])
        differs = _probe_mismatch(probes, data[:len(probes)], names_given)
    if differs is not None:
        logger.warning("%s does not describe %s (%s): was the shard written again without its "
                       "index? It is indexed from its own headers instead; write the index again "
                       "(fastload pack, or DALI's wds2idx) or delete it to stop this warning",
                       index_url_of(url), url, differs)
        return None
    if given is not None:  # NOTE [the labels file]
        return group_rows(members, {n: str(label).encode() for sample, label in zip(named, given)
                                    for n, _, _ in sample if _is_label(n)})
    return group_rows(members, {n: d for (n, _, _), d in zip(wanted, data[len(probes):])})


def _probe_mismatch(probes: Sequence[tuple[str, int, int]], blocks: Sequence[bytes],
                    names_given: bool) -> str | None:
    """What differs between index members ``(name, offset, size)`` and the 512 bytes before
    each (the member's own tar header); None when nothing does."""
    for (name, offset, size), block in zip(probes, blocks):
        header = member_header(block)
        if header is None:
            return f"no tar header before member {name!r} at byte {offset}"
        found, found_size = header
        long_name = len(name.encode("utf-8", "surrogateescape")) > 100  # the header has a part
        if found_size != size or (names_given and not long_name and found != name):
            return (f"the header before byte {offset} is {found!r} of {found_size} bytes, "
                    f"the index says {name!r} of {size}")
    return None


def _labels_beside(fs: Any, path: str, url: str, size: int, samples: int,
                   index_text: str) -> list[int] | None:
    """The labels in the shard's labels file, if it has one that matches it and its index
    file ``index_text``."""
    try:
        text = fs.cat_file(labels_url_of(path)).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    try:
        return parse_labels(text, shard_bytes=size, samples=samples, index_text=index_text,
                            where=labels_url_of(url))
    except ValueError as exc:
        logger.warning("%s; the labels are read from the shard instead (pack the shards "
                       "again, or delete the labels file, to stop this warning)", exc)
        return None


def _one_shard(fs: Any, url: str, path: str) -> tuple[str, ShardRows]:
    try:
        info = fs.info(path)
        idx_path = index_url_of(path)
        text = fs.cat_file(idx_path).decode() if fs.exists(idx_path) else None
        rows = None if text is None else _from_index_file(fs, path, text, url, int(info["size"]))
        if rows is None:
            rows = _from_headers(fs, path, int(info["size"]), url)
    except DatasetError:
        raise
    except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
        raise storage_error(exc, "index the shard", url) from exc
    return version_of(info), rows


def shard_index(
    fs: Any, urls: Sequence[str], paths: Sequence[str], *, cache: TieredCache | None,
    storage_options: dict[str, Any], max_age: float,
) -> ShardIndex:
    """The index of the shards at ``urls`` (``paths`` on ``fs``): from the cache when a
    stored one is at most ``max_age`` seconds old, else built and stored (see the module doc)."""
    key = stored_key(FORMAT, list(urls), storage_options)
    if cache is not None and max_age > 0:
        found = load_stored(cache, key, ShardIndex.from_bytes, urls, max_age)
        if found is not None:
            logger.debug("shard index of %d shards reused from the cache", len(urls))
            return found
    start = time.perf_counter()
    jobs = min(BUILD_JOBS, max(1, len(urls)))
    with ThreadPoolExecutor(jobs, thread_name_prefix="fastload-index") as pool:
        built = list(pool.map(lambda up: _one_shard(fs, *up), zip(urls, paths)))
    index = ShardIndex.build(urls, [v for v, _ in built], [r for _, r in built], extra={"key": key})
    logger.info("indexed %d samples in %d shards in %.1f s",
                len(index), len(urls), time.perf_counter() - start)
    if cache is not None:
        store(cache, key, index.to_bytes())
    return index
