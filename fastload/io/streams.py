"""A byte range of a remote object, as its bytes arrive: for writing large ranges to a file.

NOTE [streamed ranges]
fsspec's ``_cat_file(path, start, end)`` answers with the range as one ``bytes``: the
client reads the body piece by piece, then joins the pieces into a new buffer of the whole
range, which the caller writes. A shard downloaded into the cache that way
(:mod:`fastload.cache.shardfetch`: 8 MiB parts, 8 in flight) held up to 64 MiB of joined
parts at once, each byte copied once more than needed. Written to the file in pieces of
at most :data:`CHUNK_BYTES` as they arrive, a download holds at most a piece per part, and
spends a little less CPU: ``benchmarks/shard_download.py`` (21 objects of 16 MB from moto +
15 ms) measured 0.43 s of client CPU for the shard store's download against 0.46 s for
joined parts and 1.52 s for s3fs's ``get_file`` (medians of 7 rounds; docs/shards.md).

:func:`range_chunks` streams where the filesystem lets it: s3fs (a ranged ``GetObject``
whose body is read :data:`CHUNK_BYTES` at a time), or any filesystem that defines the
async generator method ``_range_chunks(path, start, end)`` itself (fsspec names its
coroutines with a leading underscore; fastload's ``latency::`` stand-in does, to add its
latency and pass the stream of its target through). Any other async filesystem answers with
its ``_cat_file``, one piece.

Example::

    >>> async for piece in range_chunks(fs, "bucket/train-000000.tar", 0, 8 << 20):
    ...     os.pwrite(fd, piece, offset); offset += len(piece)
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["CHUNK_BYTES", "range_chunks"]

CHUNK_BYTES = 1 << 20
"""The most bytes one piece of a streamed range holds."""


def range_chunks(fs: Any, path: str, start: int, end: int) -> AsyncIterator[bytes]:
    """Bytes ``[start, end)`` of ``path`` on the async filesystem ``fs``, in pieces of at most
    :data:`CHUNK_BYTES` where it can stream them (NOTE [streamed ranges]), else in one. The
    pieces hold fewer bytes than asked when the object is shorter; errors are the backend's.
    Close it (``contextlib.aclosing``) when leaving it early: that ends the response."""
    own = getattr(fs, "_range_chunks", None)
    if own is not None:
        return own(path, start, end)
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None and isinstance(fs, s3fs.S3FileSystem) and end > start:
        return _s3_chunks(fs, path, start, end)
    return _whole(fs, path, start, end)


async def _whole(fs: Any, path: str, start: int, end: int) -> AsyncIterator[bytes]:
    yield await fs._cat_file(path, start=start, end=end)


async def _s3_chunks(fs: Any, path: str, start: int, end: int) -> AsyncIterator[bytes]:
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key,
                                 Range=f"bytes={start}-{end - 1}", **extra, **fs.req_kw)
    body = response["Body"]
    try:
        while piece := await body.read(CHUNK_BYTES):
            yield piece
    finally:
        body.close()
