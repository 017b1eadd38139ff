"""The on-disk format of one cache entry: a small header, then the object's bytes.

::

    b"FLC1" | header length (uint32, little-endian) | header (JSON) | value
    header = {"key": <the cache key>, "size": <len(value)>, "xxh64": <hex checksum of value>}

The header keeps the original key (the file is named by the key's hash, see NOTE [cache
keys]), so ``fastload cache verify`` can name a corrupt entry and a hash collision is told
apart from a hit. Every read checks the size and the checksum; a bad entry is never served.

Example::

    >>> blob = encode_header("s3://b/a.jpg#v=3", b"abc") + b"abc"
    >>> decode(blob, expect_key="s3://b/a.jpg#v=3")
    b'abc'
"""

from __future__ import annotations

import json
import struct
from typing import BinaryIO

import xxhash

from fastload.cache.keys import checksum

MAGIC = b"FLC1"
_LEN = struct.Struct("<I")
PREFIX = len(MAGIC) + _LEN.size
MAX_HEADER = 1 << 20


class CorruptEntry(Exception):
    """An entry failed validation; ``str(exc)`` says why (internal to the disk tier)."""


class KeyMismatch(Exception):
    """The entry is valid but holds another key (a hash collision): a miss, not corruption."""


def encode_header(key: str, value: bytes, *, mac: str | None = None) -> bytes:
    """The bytes written before ``value`` in an entry file; ``mac``: the Redis tier's
    authentication of the entry (NOTE [authenticated entries]), kept in the header."""
    fields = {"key": key, "size": len(value), "xxh64": checksum(value)}
    if mac is not None:
        fields["mac"] = mac
    header = json.dumps(fields, ensure_ascii=True).encode()
    return MAGIC + _LEN.pack(len(header)) + header


def read_header(blob: bytes) -> tuple[dict, int]:
    """The header of an entry and the offset where its value starts; CorruptEntry if unreadable."""
    if len(blob) < PREFIX or blob[: len(MAGIC)] != MAGIC:
        raise CorruptEntry("not a fastload cache entry (bad magic or truncated header)")
    (length,) = _LEN.unpack_from(blob, len(MAGIC))
    if length > MAX_HEADER or len(blob) < PREFIX + length:
        raise CorruptEntry("truncated header")
    try:
        header = json.loads(blob[PREFIX : PREFIX + length])
        if not isinstance(header, dict) or not {"key", "size", "xxh64"} <= header.keys():
            raise ValueError("missing fields")
    except ValueError as exc:
        raise CorruptEntry(f"unreadable header: {exc}") from exc
    return header, PREFIX + length


def read_file_header(f: BinaryIO) -> tuple[dict, int]:
    """The header of an open entry file (reads only the header); CorruptEntry if unreadable."""
    prefix = f.read(PREFIX)
    if len(prefix) < PREFIX or prefix[: len(MAGIC)] != MAGIC:
        raise CorruptEntry("not a fastload cache entry (bad magic or truncated header)")
    (length,) = _LEN.unpack_from(prefix, len(MAGIC))
    return read_header(prefix + f.read(min(length, MAX_HEADER)))


def decode(blob: bytes, *, expect_key: str | None = None) -> bytes:
    """The validated value of an entry file's bytes.

    Raises CorruptEntry when size or checksum are wrong, KeyMismatch when the entry is
    another key's.
    """
    header, start = read_header(blob)
    if expect_key is not None and header["key"] != expect_key:
        raise KeyMismatch(header["key"])
    value = blob[start:]
    if len(value) != header["size"]:
        raise CorruptEntry(f"size {len(value)} bytes, expected {header['size']} (truncated?)")
    if checksum(value) != header["xxh64"]:
        raise CorruptEntry("checksum mismatch (xxh64)")
    return value


# -- the packed store's records (fastload.cache.packed) -----------------------------------
#
# A record in the packed store is the same idea in binary, so a read costs a struct unpack
# and one xxh64 instead of a JSON parse:
#
#     b"FLP1" | key length (uint32) | size (uint64) | xxh64 (uint64) | key (UTF-8) | value
#
# The store's own key is the 16-byte xxh3-128 of the cache key (packed_digest); the record
# keeps the cache key, so a hash collision is a miss and `verify` can name the entry.

PACKED_MAGIC = b"FLP1"
_PACKED = struct.Struct("<4sIQQ")
PACKED_PREFIX = _PACKED.size


def _key_bytes(key: str) -> bytes:
    return key.encode("utf-8", "surrogatepass")


def packed_digest(key: str) -> bytes:
    """The packed store's 16-byte key of the cache key ``key`` (xxh3-128, as :func:`digest`)."""
    return xxhash.xxh3_128_digest(_key_bytes(key))


def encode_packed(key: str, value: bytes) -> bytes:
    """The packed store's record of ``key`` and ``value``: binary header, key, value."""
    raw = _key_bytes(key)
    return _PACKED.pack(PACKED_MAGIC, len(raw), len(value), xxhash.xxh64_intdigest(value)) + raw + value


def packed_item(key: str, value: bytes) -> tuple[bytes, bytes]:
    """(:func:`packed_digest`, :func:`encode_packed`) of ``key`` and ``value``, the key encoded once."""
    raw = _key_bytes(key)
    header = _PACKED.pack(PACKED_MAGIC, len(raw), len(value), xxhash.xxh64_intdigest(value))
    return xxhash.xxh3_128_digest(raw), header + raw + value


def packed_header(blob: bytes | memoryview) -> tuple[str, int, int, int]:
    """(key, size, xxh64, start of the value) of a packed record; CorruptEntry if unreadable."""
    if len(blob) < PACKED_PREFIX:
        raise CorruptEntry("truncated record header")
    magic, klen, size, xxh = _PACKED.unpack_from(blob)
    if magic != PACKED_MAGIC or klen > MAX_HEADER or len(blob) < PACKED_PREFIX + klen:
        raise CorruptEntry("not a fastload record (bad magic or truncated key)")
    try:
        key = bytes(blob[PACKED_PREFIX : PACKED_PREFIX + klen]).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise CorruptEntry(f"unreadable key: {exc}") from exc
    return key, size, xxh, PACKED_PREFIX + klen


def decode_packed(blob: bytes | memoryview, *, expect_key: str) -> bytes:
    """The validated value of a packed record (``blob`` may be a view into the store's map).

    Raises CorruptEntry when size or checksum are wrong, KeyMismatch (with the record's key)
    when the record is another key's.
    """
    if len(blob) < PACKED_PREFIX:
        raise CorruptEntry("truncated record header")
    magic, klen, size, xxh = _PACKED.unpack_from(blob)
    start = PACKED_PREFIX + klen
    if magic != PACKED_MAGIC or blob[PACKED_PREFIX:start] != _key_bytes(expect_key):
        raise KeyMismatch(packed_header(blob)[0])  # CorruptEntry if it is no record at all
    value = blob[start:]
    if len(value) != size:
        raise CorruptEntry(f"size {len(value)} bytes, expected {size} (truncated?)")
    if xxhash.xxh64_intdigest(value) != xxh:
        raise CorruptEntry("checksum mismatch (xxh64)")
    return bytes(value)
