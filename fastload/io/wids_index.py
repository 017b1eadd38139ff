"""A wids shard index: the tar shards of a WebDataset dataset listed in one JSON file.

NOTE [a shard index file]
webdataset's ``wids`` names a dataset by a JSON file rather than a pattern
(``wids.ShardListDataset("train.json")``), and ``fastload pack`` writes one beside its
shards (``shards.json``). Its format (``wids_version`` 1)::

    {"wids_version": 1, "base": "s3://b/train",             # "base" optional
     "shardlist": [{"url": "shard-000000.tar", "nsamples": 216}, ...],
     "datasets": [{"shardlist": [...], "base": ...}, {"source_url": "other.json"}]}

:func:`read_shard_index` gives the shards in order with their sample counts, their URLs
resolved as wids resolves them: a URL with a protocol stands as it is; a path starting with
``/`` keeps the protocol and bucket of the base; any other joins the base, which is the
file's ``base`` or else the folder the index file lies in (a sub-dataset's own ``base``, or
its ``source_url``'s folder). A sub-dataset's ``source_url`` is followed once, as wids
follows it. ``TarShards`` takes such a file where it takes a pattern, and warns when a
shard's ``nsamples`` differs from what its headers hold (a stale index file). The file
``fastload pack`` writes also names the classes (``"fastload": {"classes": [...]}``, the
source folder's, in label order), which ``TarShards`` then gives as ``classes`` where the
shards' label members hold only numbers.

Example::

    >>> read_shard_index("s3://b/train/shards.json", {}).shards
    [('s3://b/train/shard-000000.tar', 216), ('s3://b/train/shard-000001.tar', 216), ...]
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from typing import Any

import fsspec

from fastload.errors import DatasetError, ObjectNotFoundError
from fastload.io.origin import read_whole, with_timeouts

__all__ = ["ShardList", "is_shard_index", "read_shard_index"]


def is_shard_index(files: Any) -> bool:
    """Whether ``files`` (a dataset's argument) names one shard index file (``*.json``)."""
    return isinstance(files, (str, os.PathLike)) and os.fspath(files).endswith(".json")


@dataclass(frozen=True)
class ShardList:
    """What a shard index file says: its shards (URL, ``nsamples``) in order, and the class
    names ``fastload pack`` recorded (label ``i`` is ``classes[i]``), else None."""

    shards: list[tuple[str, int]]
    classes: list[str] | None


def read_shard_index(url: str, storage_options: dict[str, Any]) -> ShardList:
    """The shards the wids index file at ``url`` lists (NOTE [a shard index file]). Raises
    ObjectNotFoundError when the file does not exist and DatasetError, naming it, when it is
    not such an index."""
    description = _load(url, storage_options)
    base = description.get("base", _folder(url))
    shards = _shardlist(description.get("shardlist", []), base, url)
    for component in description.get("datasets", []):
        if not isinstance(component, dict):
            raise _not_an_index(url, "a 'datasets' entry is not an object")
        source = component.get("source_url")
        if source is not None:
            source = _join(_folder(url), source)
            component = _load(source, storage_options)
        sub_base = component.get("base", _folder(source) if source else base)
        if "shardlist" not in component:
            raise _not_an_index(url, "a 'datasets' entry has no 'shardlist'")
        shards += _shardlist(component["shardlist"], sub_base, source or url)
    if not shards:
        raise _not_an_index(url, "it lists no shards")
    own = description.get("fastload")
    classes = own.get("classes") if isinstance(own, dict) else None
    named = isinstance(classes, list) and all(isinstance(c, str) for c in classes)
    return ShardList(shards, list(classes) if named else None)


def _load(url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    fs, path = fsspec.core.url_to_fs(url, **with_timeouts(url, storage_options))
    try:
        description = json.loads(read_whole(fs, path))
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(
            f"shard index {url} does not exist; check the path or URL") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_an_index(url, f"it is not JSON ({exc})") from exc
    if not isinstance(description, dict) or description.get("wids_version") != 1:
        raise _not_an_index(url, "it has no \"wids_version\": 1")
    return description


def _shardlist(entries: Any, base: str, url: str) -> list[tuple[str, int]]:
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("url"), str) for e in entries
    ):
        raise _not_an_index(
            url, "its 'shardlist' is not a list of {\"url\": ..., \"nsamples\": ...}")
    return [(_join(base, e["url"]), int(e.get("nsamples", -1))) for e in entries]


def _folder(url: str) -> str:
    return url.rpartition("/")[0]


def _join(base: str, url: str) -> str:
    """``url`` resolved against the folder ``base``, as wids' ``urlmerge`` does."""
    if "://" in url or "::" in url:
        return url
    head, sep, rest = base.rpartition("::")
    chain = head + sep
    protocol, _, path = rest.rpartition("://")
    if not protocol:  # a local base
        return os.path.normpath(url if url.startswith("/") else os.path.join(base, url))
    bucket = path.split("/", 1)[0]
    joined = url if url.startswith("/") else posixpath.join("/" + path, url)
    joined = posixpath.normpath(joined)
    if url.startswith("/"):
        joined = "/" + bucket + joined
    return f"{chain}{protocol}://{joined.lstrip('/')}"


def _not_an_index(url: str, why: str) -> DatasetError:
    return DatasetError(
        f"{url} is not a wids shard index: {why}. TarShards takes a .json file in wids' "
        "format (wids_version 1, a shardlist of url/nsamples; `fastload pack` writes one as "
        "shards.json), or the shards themselves as a pattern or a list")
