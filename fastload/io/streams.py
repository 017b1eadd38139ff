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

NOTE [a range that broke off]
A connection can break in the middle of a range's body (reset, closed, a read that timed
out): botocore retries a request until its answer begins, not the reading of its body, and
s3fs's own ``_cat_file`` retries the whole read, which streaming gives up. :func:`range_chunks`
raises :class:`StreamCutError` there, after the pieces that did arrive (they are good: S3
sends a range's bytes in order, and each request asks for the indexed version), and the
shard download asks for the rest of the range again, :data:`~fastload.cache.shardfetch.RESUMES`
times at most (:mod:`fastload.cache.shardfetch`), no byte twice.

NOTE [the version asked with each range]
The shard store asks the origin for a shard's version once, then downloads it in parts
(:mod:`fastload.cache.shardfetch`): a shard rewritten at the origin between the two, or
between two parts, was kept as a file of the new bytes, or of old and new ones mixed, under
the key of the version it was indexed at, and served as that version. On S3 each range
request now carries the indexed ETag (``If-Match``), so a rewritten object fails the request
(412) instead, raised as :class:`~fastload.io.versions.ObjectChangedError`; other stores
keep the one check before the download.

Example::

    >>> async for piece in range_chunks(fs, "bucket/train-000000.tar", 0, 8 << 20):
    ...     os.pwrite(fd, piece, offset); offset += len(piece)
"""

from __future__ import annotations

import asyncio
import errno
import http.client
import sys
from collections.abc import AsyncIterator
from typing import Any

from fastload.errors import StorageError
from fastload.io.versions import ObjectChangedError, etag_in

__all__ = ["CHUNK_BYTES", "StreamCutError", "range_chunks"]

CHUNK_BYTES = 1 << 20
"""The most bytes one piece of a streamed range holds."""


class StreamCutError(StorageError):
    """A range's body broke off after some of its bytes arrived (NOTE [a range that broke
    off]): those are good; ask for the rest."""


def range_chunks(fs: Any, path: str, start: int, end: int,
                 version: str | None = None) -> AsyncIterator[bytes]:
    """Bytes ``[start, end)`` of ``path`` on the async filesystem ``fs``, in pieces of at most
    :data:`CHUNK_BYTES` where it can stream them (NOTE [streamed ranges]), else in one. The
    pieces hold fewer bytes than asked when the object is shorter; errors are the backend's.
    Close it (``contextlib.aclosing``) when leaving it early: that ends the response. On S3
    a body whose connection breaks off raises :class:`StreamCutError` after the pieces that
    came (NOTE [a range that broke off]).

    ``version`` (a :func:`~fastload.io.versions.version_of` string): on S3 the request asks
    for that version's ETag (``If-Match``) and an object rewritten since raises
    :class:`~fastload.io.versions.ObjectChangedError` (NOTE [the version asked with each
    range]); other stores do not check it here."""
    own = getattr(fs, "_range_chunks", None)
    if own is not None:
        return own(path, start, end, version=version)
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None and isinstance(fs, s3fs.S3FileSystem) and end > start:
        return _s3_chunks(fs, path, start, end, version)
    return _whole(fs, path, start, end)


async def _whole(fs: Any, path: str, start: int, end: int) -> AsyncIterator[bytes]:
    yield await fs._cat_file(path, start=start, end=end)


async def _s3_chunks(fs: Any, path: str, start: int, end: int,
                     version: str | None) -> AsyncIterator[bytes]:
    bucket, key, version_id = fs.split_path(path)
    extra = {"VersionId": version_id} if version_id else {}
    etag = etag_in(version) if version else None
    if etag:
        extra["IfMatch"] = etag
    try:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key,
                                     Range=f"bytes={start}-{end - 1}", **extra, **fs.req_kw)
    except OSError as exc:
        if etag and _precondition_failed(exc):
            raise ObjectChangedError(
                f"s3://{bucket}/{key} is no longer the version {version} that was indexed "
                "(S3 answered a range request for its ETag with 412: rewritten at the "
                "origin meanwhile)") from exc
        raise
    body, received = response["Body"], 0
    try:
        while True:
            try:
                piece = await body.read(CHUNK_BYTES)
            except _broken_body() as exc:
                raise StreamCutError(
                    f"s3://{bucket}/{key}: the connection broke off {received} bytes into bytes "
                    f"{start}-{end} ({type(exc).__name__}: {exc})") from exc
            if not piece:
                return
            received += len(piece)
            yield piece
    finally:
        body.close()


def _broken_body() -> tuple[type[BaseException], ...]:
    """What reading a response's body raises when its connection breaks: aiohttp's payload
    and connection errors, botocore's (a read timeout, a reset stream), the socket's."""
    import aiohttp
    import botocore.exceptions

    return (aiohttp.ClientError, botocore.exceptions.HTTPClientError, ConnectionError,
            asyncio.IncompleteReadError, http.client.IncompleteRead, asyncio.TimeoutError)


def _precondition_failed(exc: OSError) -> bool:
    """Whether s3fs's error is S3's 412 (an ``If-Match`` not met): s3fs gives it as EINVAL,
    its botocore error (the cause) coded ``PreconditionFailed``."""
    if exc.errno != errno.EINVAL:
        return False
    cause = exc.__cause__ or exc.__context__
    code = (getattr(cause, "response", None) or {}).get("Error", {}).get("Code")
    return code in ("PreconditionFailed", "412") or "pre-condition" in str(exc).lower()
