"""The packed store's records: a small object's header and value, or a large object's pointer.

A record is fastload's own entry header (key, size, xxh64) and the value
(:func:`~fastload.cache.entry.encode_packed`). A large object keeps a file in ``entries/``
and the store holds a *pointer record* to it: the same header with magic ``FLPF`` and the
file's size in place of the value's xxh64, no value (NOTE [packed store] in :mod:`.packed`).

Example::

    >>> rec = pointer("s3://b/big.bin#v=1", 5 << 20)
    >>> is_pointer(rec), accounted(rec), record_key(rec)
    (True, 5242880, 's3://b/big.bin#v=1')
"""

from __future__ import annotations

import struct

from fastload.cache import entry

FILE_MAGIC = b"FLPF"

__all__ = ["FILE_MAGIC", "accounted", "is_pointer", "pointer", "record_key"]


def is_pointer(blob: bytes | memoryview) -> bool:
    """Whether a record points to an entry file (a large object) instead of holding the value."""
    return blob[:4] == FILE_MAGIC


def pointer(key: str, file_bytes: int) -> bytes:
    """The record that indexes a large object's entry file of ``file_bytes`` bytes."""
    raw = key.encode("utf-8", "surrogatepass")
    return FILE_MAGIC + struct.pack("<IQQ", len(raw), file_bytes, 0) + raw


def accounted(blob: bytes | memoryview) -> int:
    """Bytes a record counts in ``used``: its length, or the pointed-to file's size."""
    if is_pointer(blob):
        return struct.unpack_from("<Q", blob, 8)[0]
    return len(blob)


def record_key(blob: bytes | memoryview) -> str:
    """The cache key a record names (CorruptEntry if its header is unreadable)."""
    if is_pointer(blob):
        blob = entry.PACKED_MAGIC + bytes(blob[4:])
    return entry.packed_header(blob)[0]
