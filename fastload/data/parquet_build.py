"""Building a :class:`~fastload.data.parquet_index.ParquetIndex` and keeping it in the cache.

The URLs are expanded first (:func:`~fastload.io.file_urls.expand_urls`: brace patterns,
then globs on the filesystem). Each file is then read concurrently (:data:`BUILD_JOBS` at
once): one ``info`` for its size and version, one range read of its end for the footer (the
Parquet metadata: row groups, column chunks, the schema with Hugging Face's feature
metadata), and one ``cat_ranges`` call for its label column's chunks. No image byte is read.
The columns are chosen from the first file's schema (``image``/``img`` and
``label``/``labels`` unless named) and checked in every file; class names come from the
``huggingface`` schema metadata (a ``ClassLabel``'s names) when present. The index is stored
in the cache's shared tiers under a key of the URLs, the columns and the storage options,
and reused for ``listing_max_age`` seconds (NOTE [the stored listing]).

Example::

    >>> index = parquet_index(fs, urls, paths, columns=("auto", "auto"), cache=None,
    ...                       storage_options={}, max_age=3600)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastload.cache.tiered import TieredCache
from fastload.data.index_blob import load_stored, store, stored_key
from fastload.data.parquet_index import FORMAT, FileRows, ParquetIndex
from fastload.data.parquet_read import decode_column, footer_of, read_metadata
from fastload.errors import ConfigError, DatasetError
from fastload.io.errors import storage_error
from fastload.io.ranges import read_ranges
from fastload.io.versions import version_of

logger = logging.getLogger(__name__)

__all__ = [
    "BUILD_JOBS", "IMAGE_COLUMNS", "LABEL_COLUMNS", "column_name", "parquet_index",
]

BUILD_JOBS = 16
"""Files whose footers and labels are read at once."""

IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "labels")

Columns = tuple[str, "str | None"]  # (image column or "auto", label column, "auto" or None)


def column_name(where: str, name: str, value: Any, allow_none: bool) -> str | None:
    """A column argument (``image_column``, ``label_column``) checked: a name or "auto"."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}({name}={value!r}): pass a column name, or 'auto' to take "
                          f"the first of the usual names{' (None: no labels)' if allow_none else ''}")
    return value


def _hf_class_names(schema: Any, label: str) -> list[str] | None:
    """A ``ClassLabel``'s names from the ``huggingface`` schema metadata, if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][label]
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) else None
    return [str(n) for n in names] if isinstance(names, list) and names else None


def _pick(names: list[str], wanted: str | None, defaults: tuple[str, ...], what: str, url: str,
          argument: str) -> str | None:
    if wanted is None:
        return None
    if wanted != "auto":
        if wanted not in names:
            raise DatasetError(f"{url} has no column {wanted!r} ({argument}); its columns: "
                               f"{', '.join(names)}. Pass {argument}= one of them")
        return wanted
    found = next((n for n in defaults if n in names), None)
    if found is None:
        none = " or label_column=None for no labels (-1)" if argument == "label_column" else ""
        raise DatasetError(
            f"{url} has no {what} column named {' or '.join(map(repr, defaults))}; its "
            f"columns: {', '.join(names)}. Pass {argument}='<name>'{none}")
    return found


def _image_leaf(schema: Any, column: str, url: str) -> str:
    """The path in the schema of ``column``'s image bytes: ``image.bytes`` for Hugging Face's
    ``Image`` struct, ``image`` for a binary column."""
    import pyarrow as pa

    kind = schema.field(column).type
    binary = (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or
              getattr(pa.types, "is_binary_view", lambda _: False)(kind))
    if binary:
        return column
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        inner = kind.field("bytes").type
        if pa.types.is_binary(inner) or pa.types.is_large_binary(inner):
            return f"{column}.bytes"
    raise DatasetError(
        f"column {column!r} of {url} is {kind}, not image bytes (binary, or a struct with a "
        "binary 'bytes' field as Hugging Face's Image feature writes). Pass "
        "image_column= the column that holds the encoded images")


def _chunk_range(row_group: Any, leaf: str, url: str) -> tuple[int, int]:
    for c in range(row_group.num_columns):
        chunk = row_group.column(c)
        if chunk.path_in_schema == leaf:
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
            return int(start), int(chunk.total_compressed_size)
    raise DatasetError(f"{url} has no column chunk {leaf!r} in a row group; write its row groups "
                       "with the same columns")


class _FileScan:
    """One file's part of the index (see the module doc)."""

    def __init__(self, fs: Any, url: str, path: str) -> None:
        self.fs, self.url, self.path = fs, url, path

    def read_at(self, offset: int, length: int) -> bytes:
        return self.fs.cat_file(self.path, start=offset, end=offset + length)

    def head(self) -> tuple[FileRows, Any]:
        info = self.fs.info(self.path)
        size = int(info["size"])
        try:
            footer = footer_of(self.read_at, size, self.url)
            metadata = read_metadata(footer)
        except (ValueError, OSError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise DatasetError(f"{self.url} is not a readable Parquet file: {exc}. Check that the "
                               "URL names a .parquet file") from exc
        return FileRows(version_of(info), size, footer), metadata

    def rows(self, found: FileRows, metadata: Any, leaf: str, label: str | None) -> FileRows:
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            found.group_rows.append(group.num_rows)
            found.group_ranges.append(_chunk_range(group, leaf, self.url))
        if label is None:
            found.labels = [-1] * sum(found.group_rows)
            return found
        ranges = [_chunk_range(metadata.row_group(g), label, self.url)
                  for g in range(metadata.num_row_groups)]
        data = read_ranges(self.fs, self.path, ranges)
        chunks = dict(zip([s for s, _ in ranges], data))
        for g in range(metadata.num_row_groups):
            values = decode_column(metadata, found.size, chunks, g, label, self.read_at)
            found.labels += values.to_pylist()
        bad = next((v for v in found.labels if v is not None and not isinstance(v, (int, str))),
                   None)
        if bad is not None:
            raise DatasetError(
                f"{self.url}: its label column {label!r} holds {type(bad).__name__} values "
                f"({bad!r}); labels are ints or class names. Pass label_column= a column of "
                "those, or label_column=None for no labels")
        return found


def _labels(files: Sequence[FileRows], names: list[str] | None) -> list[str]:
    """Labels made ints in place (names by their position among ``names`` or the sorted
    names; None -> -1); returns the class names."""
    raw = [v for f in files for v in f.labels]
    texts = {v for v in raw if isinstance(v, str)}
    if texts:
        names = names or sorted(texts | {str(v) for v in raw if isinstance(v, int)})
    position = {n: i for i, n in enumerate(names or [])}
    for f in files:
        f.labels = [-1 if v is None else position.get(str(v), -1) if texts else int(v)
                    for v in f.labels]
    top = max((v for f in files for v in f.labels), default=-1)
    return names or [str(i) for i in range(top + 1)]


def _scan(fs: Any, urls: Sequence[str], paths: Sequence[str], columns: Columns,
          ) -> tuple[list[FileRows], list[str], dict[str, Any]]:
    scans = [_FileScan(fs, u, p) for u, p in zip(urls, paths)]

    def guarded(url: str, step: Any) -> Any:
        try:
            return step()
        except DatasetError:
            raise
        except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
            raise storage_error(exc, "index the Parquet file", url) from exc

    with ThreadPoolExecutor(min(BUILD_JOBS, len(scans)), thread_name_prefix="fastload-index") as pool:
        heads = list(pool.map(lambda s: guarded(s.url, s.head), scans))
        schema = heads[0][1].schema.to_arrow_schema()
        names = schema.names
        image = _pick(names, columns[0], IMAGE_COLUMNS, "image", urls[0], "image_column")
        assert image is not None
        label = _pick(names, columns[1], LABEL_COLUMNS, "label", urls[0], "label_column")
        leaf = _image_leaf(schema, image, urls[0])
        for scan, (_, metadata) in zip(scans[1:], heads[1:]):
            other = metadata.schema.to_arrow_schema()
            for name in (image, label):
                if name is not None and name not in other.names:
                    raise DatasetError(f"{scan.url} has no column {name!r} (the first file, "
                                       f"{urls[0]}, has); its columns: {', '.join(other.names)}")
            if _image_leaf(other, image, scan.url) != leaf:
                raise DatasetError(
                    f"column {image!r} of {scan.url} is {other.field(image).type}, of the first "
                    f"file ({urls[0]}) {schema.field(image).type}: write the files with one "
                    "schema, or read them as separate datasets")
        files = list(pool.map(lambda sh: guarded(sh[0].url, lambda: sh[0].rows(
            sh[1][0], sh[1][1], leaf, label)), zip(scans, heads)))
    classes = _labels(files, _hf_class_names(schema, label) if label else None)
    return files, classes, {"image": image, "leaf": leaf, "label": label}


def parquet_index(
    fs: Any, urls: Sequence[str], paths: Sequence[str], *, columns: Columns,
    cache: TieredCache | None, storage_options: dict[str, Any], max_age: float,
) -> ParquetIndex:
    """The index of the Parquet files at ``urls`` (``paths`` on ``fs``): from the cache when a
    stored one is at most ``max_age`` seconds old, else built and stored (see the module doc).
    ``columns``: (image column or "auto", label column, "auto" or None)."""
    if not urls:
        raise ConfigError("ParquetImages needs at least one file")
    key = stored_key(FORMAT, [list(urls), list(columns)], storage_options)
    if cache is not None and max_age > 0:
        found = load_stored(cache, key, ParquetIndex.from_bytes, urls, max_age)
        if found is not None:
            logger.debug("Parquet index of %d files reused from the cache", len(urls))
            return found
    start = time.perf_counter()
    files, classes, chosen = _scan(fs, urls, paths, columns)
    index = ParquetIndex.build(urls, files, classes=classes, columns=chosen, extra={"key": key})
    logger.info("indexed %d rows in %d row groups of %d Parquet files in %.1f s",
                len(index), len(index.group_file), len(urls), time.perf_counter() - start)
    if cache is not None:
        store(cache, key, index.to_bytes())
    return index
