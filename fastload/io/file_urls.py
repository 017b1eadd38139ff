"""The files a shard dataset, ``fastload cache warm`` or ``fastload bench`` is given: brace
patterns, globs, URLs, local paths.

:class:`~fastload.TarShards` and :class:`~fastload.ParquetImages` take their files the same
way, and the two commands take the same patterns: one pattern or a list; a brace pattern
(``train-{000000..001281}.tar``, ``{a,b}``, as webdataset expands them) names each file in
order; a pattern with ``*``, ``?`` or ``[`` is globbed on its filesystem (sorted); a local
path becomes absolute. A local directory is refused with the pattern to pass instead (a
shard dataset reads files, not folders). The commands list the folder holding all the
files once (:func:`folder_of`) and keep the named ones (:func:`named_paths`).

Example::

    >>> expand_braces("s3://b/train-{000..002}.tar")
    ['s3://b/train-000.tar', 's3://b/train-001.tar', 's3://b/train-002.tar']
    >>> expand_urls("s3://b/train-*.tar", {}, owner="TarShards", kind="tar shard", suffix=".tar")
    ['s3://b/train-000.tar', 's3://b/train-001.tar', ...]
"""

from __future__ import annotations

import os
import re
from typing import Any

import fsspec

from fastload.errors import ConfigError, DatasetError, ObjectNotFoundError
from fastload.io.wids_index import is_shard_index, read_shard_index

__all__ = [
    "expand_braces", "expand_urls", "files_named", "folder_of", "is_pattern", "named_paths",
]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_GLOB = set("*?[")


def is_pattern(url: str) -> bool:
    """Whether ``url`` names files by a brace pattern or a glob rather than one file or
    folder (the protocol part and a chained URL's heads are not looked at)."""
    _, path = fsspec.core.split_protocol(url.rpartition("::")[2])
    return bool(_BRACE.search(path)) or bool(_GLOB & set(path))


def expand_braces(pattern: str) -> list[str]:
    """Every URL a brace pattern names, in order: ``{000..009}`` (zero padding kept from
    the wider bound), ``{a,b}``, nested and several per pattern, as webdataset expands them."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numbers = _RANGE.match(body)
    if numbers:
        lo, hi = numbers.group(1), numbers.group(2)
        width = max(len(lo), len(hi)) if lo.startswith("0") or hi.startswith("0") else 0
        step = 1 if int(hi) >= int(lo) else -1
        parts = [str(i).zfill(width) for i in range(int(lo), int(hi) + step, step)]
    else:
        parts = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [url for part in parts for url in expand_braces(head + part + tail)]


def expand_urls(files: Any, storage_options: dict[str, Any], *, owner: str, kind: str,
                suffix: str) -> list[str]:
    """Every file the patterns in ``files`` (one, or a list) name, in order (see the module's
    docstring). ``owner`` (the dataset class), ``kind`` ("tar shard", "Parquet file") and
    ``suffix`` (".tar", for the examples) word the errors: ConfigError for anything but paths
    and URLs, or a local directory; DatasetError for a glob that matches nothing."""
    try:
        given = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    except TypeError:  # not iterable
        given = []
    if not given or not all(isinstance(u, (str, os.PathLike)) for u in given):
        raise ConfigError(
            f"{owner} needs {kind} URLs: a glob ('s3://b/train-*{suffix}'), a brace pattern "
            f"('train-{{000..009}}{suffix}'), a URL, a local path or a list; got {files!r}")
    out: list[str] = []
    for pattern in map(os.fspath, given):
        for url in expand_braces(pattern):
            head, _, last = url.rpartition("::")
            protocol, path = fsspec.core.split_protocol(last)
            if not _GLOB & set(path):
                if not (protocol or head):
                    url = os.path.abspath(os.path.expanduser(url))
                    if os.path.isdir(url):
                        raise ConfigError(
                            f"{owner} reads files, and {url} is a directory: pass its "
                            f"{kind}s as a glob ('{os.path.join(url, '*' + suffix)}') or a list")
                out.append(url)
                continue
            _, _, found = fsspec.core.get_fs_token_paths(url, storage_options=storage_options)
            if not found:
                raise DatasetError(f"no file matches {url}: check the pattern and the storage")
            prefix = (head + "::" if head else "") + (f"{protocol}://" if protocol else "")
            out += [prefix + p if prefix and protocol not in ("file", "local") else p
                    for p in sorted(found)]
    return out


def folder_of(pattern: str, files: list[str]) -> str:
    """The deepest folder holding every file ``pattern`` named (``files``, expanded): what a
    command that takes a pattern lists once."""
    folder = os.path.commonprefix(files).rpartition("/")[0]
    if not folder or folder.endswith((":/", ":")):
        raise ConfigError(
            f"{pattern}: its files lie in more than one bucket ({files[0]}, {files[-1]}); "
            "give each bucket a pattern of its own")
    return folder


def named_paths(pattern: str, files: list[str], folder_url: str, folder_path: str,
                listed: Any) -> list[str]:
    """The paths of ``files`` (URLs below ``folder_url``, whose path on its filesystem is
    ``folder_path``) in their order, each once; ObjectNotFoundError naming the first the
    listing ``listed`` (a container of paths) lacks."""
    paths = list(dict.fromkeys(folder_path + f[len(folder_url):] for f in files))
    missing = [p for p in paths if p not in listed]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        first = folder_url + missing[0][len(folder_path):]
        raise ObjectNotFoundError(
            f"{first}{more} named by {pattern} do not exist; check the pattern (a brace range "
            "names every file in it)")
    return paths


def files_named(url: str, storage_options: dict[str, Any], *, owner: str) -> list[str] | None:
    """The files a command's URL names when it is not a folder: a brace pattern or glob,
    expanded, or a wids shard index file, the shards it lists (NOTE [a shard index file]);
    None for a folder or a single file (a ``.json`` that is no shard index is one)."""
    if is_shard_index(url):
        try:  # a missing file (ObjectNotFoundError, a StorageError) is raised as it is
            return [u for u, _ in read_shard_index(url, storage_options).shards]
        except DatasetError:
            return None
    if is_pattern(url):
        return expand_urls(url, storage_options, owner=owner, kind="file", suffix=".tar")
    return None
