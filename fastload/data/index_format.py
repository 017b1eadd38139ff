"""The serialized form of a :class:`~fastload.data.index.DatasetIndex`: one validated blob.

::

    b"FLINDEX1" | header length (uint32, little-endian) | header (JSON) | padding | payload
    header = {"format": 1, "meta": {...}, "payload": <bytes>, "xxh64": <hex of the payload>,
              "columns": {name: {"dtype": "<u4", "length": n, "offset": o}}}

The payload holds the columns back to back, each aligned to 8 bytes: ``path_data`` and
``version_data`` (UTF-8 bytes of every relative path and version, concatenated),
``path_offsets`` and ``version_offsets`` (N + 1 positions into them), ``labels``, ``sizes``
and, when the sample order is not the paths' sorted order, ``order`` (the samples sorted by
path, for :meth:`~fastload.data.index.DatasetIndex.find`). Decoding makes numpy views into
the blob, no copy; it checks everything a reader relies on (checksum, bounds, monotonic
offsets, labels below the class count, ``order`` a permutation) and raises
:class:`IndexFormatError` naming what is wrong, so a damaged or foreign blob is never used.

Example::

    >>> meta, cols = decode(encode({"prefix": "", "classes": ["a"], "listed_at": 0.0,
    ...     "versions_at": 0.0}, Columns.pack([b"x.jpg"], [b"3"], [0], [3])))
    >>> cols.labels.tolist()
    [0]
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import xxhash

MAGIC = b"FLINDEX1"
FORMAT = 1
"""The format version; a blob of another version is refused (and relisted by its user)."""

_LEN = struct.Struct("<I")
_ALIGN = 8
_MAX_HEADER = 16 << 20  # a stored listing's folder stamps (NOTE [listing freshness]) live here
_DTYPES = frozenset({"|u1", "<u2", "<u4", "<u8", "|i1", "<i2", "<i4", "<i8"})
_META = {"prefix": str, "classes": list, "listed_at": float, "versions_at": float}


class IndexFormatError(ValueError):
    """A blob is not a valid dataset index of this format; ``str(exc)`` says why."""


def smallest_uint(top: int) -> np.dtype:
    """The smallest unsigned dtype that holds ``0..top``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def smallest_int(low: int, top: int) -> np.dtype:
    """The smallest signed dtype that holds ``low..top``."""
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= low and top <= info.max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def pack_strings(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``items`` as one uint8 array and N + 1 offsets (smallest unsigned dtype)."""
    data = np.frombuffer(b"".join(items), np.uint8)
    offsets = np.zeros(len(items) + 1, np.int64)
    if items:
        np.cumsum(np.fromiter((len(b) for b in items), np.int64, len(items)), out=offsets[1:])
    return data, offsets.astype(smallest_uint(int(offsets[-1])))


@dataclass(frozen=True)
class Columns:
    """The arrays of an index (views into its blob once decoded)."""

    path_data: np.ndarray
    path_offsets: np.ndarray
    version_data: np.ndarray
    version_offsets: np.ndarray
    labels: np.ndarray
    sizes: np.ndarray
    order: np.ndarray | None = None

    @classmethod
    def pack(
        cls,
        paths: Sequence[bytes],
        versions: Sequence[bytes],
        labels: Sequence[int] | np.ndarray,
        sizes: Sequence[int] | np.ndarray,
        order: Sequence[int] | np.ndarray | None = None,
    ) -> Columns:
        """Columns of N samples, each array in its smallest dtype."""
        path_data, path_offsets = pack_strings(paths)
        version_data, version_offsets = pack_strings(versions)
        return cls.of(path_data, path_offsets, version_data, version_offsets, labels, sizes, order)

    @classmethod
    def of(
        cls,
        path_data: np.ndarray,
        path_offsets: np.ndarray,
        version_data: np.ndarray,
        version_offsets: np.ndarray,
        labels: Sequence[int] | np.ndarray,
        sizes: Sequence[int] | np.ndarray,
        order: Sequence[int] | np.ndarray | None = None,
    ) -> Columns:
        """Columns from arrays, labels, sizes and order narrowed to their smallest dtypes."""
        labels = np.asarray(labels, np.int64)
        sizes = np.asarray(sizes, np.int64)
        n = len(labels)
        label_dtype = smallest_uint(int(labels.max()) if n else 0)
        size_dtype = smallest_int(int(sizes.min()) if n else 0, int(sizes.max()) if n else 0)
        kept = None if order is None else np.asarray(order, np.int64).astype(smallest_uint(max(n - 1, 0)))
        return cls(path_data, path_offsets, version_data, version_offsets,
                   labels.astype(label_dtype), sizes.astype(size_dtype), kept)


def encode(meta: dict[str, Any], cols: Columns) -> bytes:
    """The blob of ``meta`` (JSON-able; prefix, classes, listed_at, versions_at) and ``cols``."""
    table: dict[str, dict[str, Any]] = {}
    parts: list[bytes | memoryview] = []
    offset = 0
    for f in fields(cols):
        array = getattr(cols, f.name)
        if array is None:
            continue
        array = np.ascontiguousarray(array)
        raw = memoryview(array).cast("B") if array.size else memoryview(b"")
        table[f.name] = {"dtype": array.dtype.str, "length": int(array.size), "offset": offset}
        pad = -len(raw) % _ALIGN
        parts += [raw, b"\0" * pad]
        offset += len(raw) + pad
    payload = b"".join(parts)
    header = json.dumps({
        "format": FORMAT, "meta": meta, "columns": table, "payload": len(payload),
        "xxh64": xxhash.xxh64_hexdigest(payload),
    }, separators=(",", ":")).encode()
    head = MAGIC + _LEN.pack(len(header)) + header
    return head + b"\0" * (-len(head) % _ALIGN) + payload


def decode(blob: bytes) -> tuple[dict[str, Any], Columns]:
    """``(meta, columns)`` of a blob :func:`encode` wrote, the arrays viewing ``blob``.

    Raises :class:`IndexFormatError` when anything does not check out.
    """
    if not isinstance(blob, bytes) or blob[: len(MAGIC)] != MAGIC:
        raise IndexFormatError("not a fastload dataset index (no FLINDEX magic)")
    start = len(MAGIC) + _LEN.size
    if len(blob) < start:
        raise IndexFormatError("truncated before its header")
    (size,) = _LEN.unpack_from(blob, len(MAGIC))
    if size > _MAX_HEADER or start + size > len(blob):
        raise IndexFormatError(f"header of {size} bytes does not fit the blob")
    try:
        header = json.loads(blob[start : start + size])
    except ValueError as exc:
        raise IndexFormatError(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else None
        raise IndexFormatError(f"format {got!r}, this fastload reads format {FORMAT}")
    body = start + size + (-(start + size) % _ALIGN)
    payload = memoryview(blob)[body:]
    try:
        if len(payload) != header["payload"]:
            raise IndexFormatError(f"payload is {len(payload)} bytes, header says {header['payload']}")
        if xxhash.xxh64_hexdigest(payload) != header["xxh64"]:
            raise IndexFormatError("payload checksum does not match (a damaged blob)")
        meta = _check_meta(header["meta"])
        arrays = {name: _column(blob, body, len(payload), name, spec)
                  for name, spec in header["columns"].items()}
        cols = Columns(**arrays)
    except IndexFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise IndexFormatError(f"malformed header: {type(exc).__name__}: {exc}") from exc
    _check_columns(cols, len(meta["classes"]))
    return meta, cols


def _check_meta(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise IndexFormatError("meta is not an object")
    for key, kind in _META.items():
        value = meta.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind):
            raise IndexFormatError(f"meta {key!r} is {value!r}, expected a {kind.__name__}")
    if not all(isinstance(c, str) for c in meta["classes"]):
        raise IndexFormatError("class names are not all strings")
    return meta


def _column(blob: bytes, body: int, payload: int, name: str, spec: dict[str, Any]) -> np.ndarray:
    dtype = spec["dtype"]
    if dtype not in _DTYPES:
        raise IndexFormatError(f"column {name!r} has dtype {dtype!r}, not an integer dtype")
    dt = np.dtype(dtype)
    length, offset = int(spec["length"]), int(spec["offset"])
    if length < 0 or offset < 0 or offset % _ALIGN or offset + length * dt.itemsize > payload:
        raise IndexFormatError(f"column {name!r} lies outside the payload")
    return np.frombuffer(blob, dt, count=length, offset=body + offset)


def _check_columns(cols: Columns, classes: int) -> None:
    n = len(cols.labels)
    if len(cols.sizes) != n:
        raise IndexFormatError(f"{len(cols.sizes)} sizes for {n} labels")
    for name in ("path", "version"):
        data, offsets = getattr(cols, f"{name}_data"), getattr(cols, f"{name}_offsets")
        if data.dtype != np.uint8:
            raise IndexFormatError(f"{name}_data is {data.dtype}, expected uint8")
        if len(offsets) != n + 1 or offsets.dtype.kind != "u":
            raise IndexFormatError(f"{name}_offsets has {len(offsets)} entries for {n} samples")
        if offsets[0] != 0 or int(offsets[-1]) != len(data) or np.any(offsets[1:] < offsets[:-1]):
            raise IndexFormatError(f"{name}_offsets are not increasing from 0 to the data's end")
    if cols.labels.dtype.kind != "u" or (n and int(cols.labels.max()) >= classes):
        raise IndexFormatError(f"a label is not below the {classes} classes")
    if cols.order is not None:
        if len(cols.order) != n or cols.order.dtype.kind != "u":
            raise IndexFormatError(f"order has {len(cols.order)} entries for {n} samples")
        if n and (int(cols.order.max()) >= n or not np.array_equal(
            np.bincount(cols.order.astype(np.int64), minlength=n), np.ones(n, np.int64)
        )):
            raise IndexFormatError("order is not a permutation of the samples")
