"""How fastload reads from its origin storage: one request per object, bounded in time.

NOTE [one GET per object]: s3fs's ``cat_file(path)`` first asks for the object's size (a HEAD
request, unless its listing cache already holds it) to decide whether to download the object
in concurrent chunks. For the objects a data loader reads (images, small records) that round
trip doubles the requests and the latency for nothing. A read from offset 0 sends one GET
with ``Range: bytes=0-`` and returns the whole object on every fsspec filesystem (local
files seek to 0; HTTP servers without range support answer 200 with the whole body).
Objects known to be large (sharded archives) are read by :mod:`fastload.bench.throughput`
through a file object instead.

NOTE [origin timeouts]: a store that stops answering must fail a read, not hang it. Three
layers bound every origin request:

1. :func:`with_timeouts` gives each filesystem connect and read (stall) timeouts and, where
   the client library retries, a bounded retry count, unless the user set them:
   s3fs gets botocore's ``connect_timeout``/``read_timeout`` and ``retries`` (standard mode,
   3 attempts with exponential backoff); HTTP gets aiohttp's ``ClientTimeout``.
2. :func:`read_whole` retries transient failures itself only where the client has no retry
   of its own (HTTP), a few times with backoff; never a missing or forbidden object.
3. s3fs retries timeouts in two nested loops of 5 that no option controls (25 attempts of
   up to ``read_timeout`` each), so :func:`read_whole` also bounds one whole read, retries
   included, by ``deadline`` seconds with fsspec's own ``timeout=`` (it cancels the request).

:func:`aread_whole` is the same read as a coroutine, for callers that keep many requests in
flight on the filesystem's own event loop (``cache warm``, :mod:`fastload.io.fetch`): the
same single GET, deadline, retries and errors, without a thread per request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from typing import Any

from fsspec.asyn import AsyncFileSystem
from fsspec.exceptions import FSTimeoutError
from fsspec.implementations.local import LocalFileSystem

from fastload.errors import StorageError
from fastload.io.versions import local_version, version_size

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
"""Seconds to open a connection to the origin before the attempt fails."""

READ_TIMEOUT_S = 10.0
"""Seconds without a byte from the origin before the attempt fails (a stall, not a total)."""

ATTEMPTS = 3
"""Attempts per request (the first one included) for transient errors."""

READ_DEADLINE_S = 30.0
"""Seconds one whole-object read may take, every retry included, on async filesystems."""

_BACKOFF_S = 0.5  # first pause between attempts where fastload retries; doubles each time
_RETRIED_HERE = frozenset({"http", "https"})  # clients without a retry of their own


def attempts_here(fs: Any) -> int:
    """Attempts fastload itself makes per read on ``fs``: ATTEMPTS where the client has no
    retry of its own (HTTP), else 1 (botocore retries s3fs's requests)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return ATTEMPTS if protocols & _RETRIED_HERE else 1


def backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1, 2...) before the next."""
    return _BACKOFF_S * 2 ** (attempt - 1)


def _deadline_error(deadline: float) -> TimeoutError:
    return TimeoutError(
        f"no complete answer within {deadline:g} s (the client's timeouts and retries "
        f"included); the store is down or stalled"
    )


def with_timeouts(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` for fsspec's ``url_to_fs(url, **options)`` with fastload's timeout defaults.

    Only what the user left unset is added; a chained URL (``latency::s3://...``) gets the
    defaults in each protocol's own dict. Unknown protocols are left as they are.

    Example::

        >>> with_timeouts("s3://bucket/train", {"anon": True})["config_kwargs"]["read_timeout"]
        10.0
    """
    options = dict(options or {})
    chain = [part.split("://", 1)[0] for part in url.split("::")]
    if len(chain) == 1:
        return _add_defaults(chain[0] if "://" in url else "file", options)
    for protocol in chain:
        if protocol in ("s3", "s3a", "http", "https"):
            options[protocol] = _add_defaults(protocol, dict(options.get(protocol) or {}))
    return options


def _add_defaults(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        config.setdefault("read_timeout", READ_TIMEOUT_S)
        config.setdefault("retries", {"total_max_attempts": ATTEMPTS, "mode": "standard"})
        options["config_kwargs"] = config
    elif protocol in ("http", "https"):
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
        )
        client.setdefault("timeout", timeout)
        options["client_kwargs"] = client
    return options


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the origin is unreachable or failing, not that one object is bad.

    A missing object or a denied one (``FileNotFoundError``, ``PermissionError`` anywhere in
    the ``__cause__`` chain) is the object's own problem; anything else (connection refused,
    timeouts, 5xx answers) may be an outage.
    """
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and not any(cause is c for c in chain):  # a cycle ends the walk
        if isinstance(cause, (FileNotFoundError, PermissionError)):
            return False
        chain.append(cause)
        cause = cause.__cause__
    return True


def read_whole(fs: Any, path: str, *, deadline: float | None = READ_DEADLINE_S) -> bytes:
    """The whole object at ``path`` of fsspec filesystem ``fs``, in one request.

    On an async filesystem (s3fs, HTTP) the read, retries included, gives up after
    ``deadline`` seconds with a ``TimeoutError`` (NOTE [origin timeouts]).

    Example::

        >>> fs = fsspec.filesystem("s3")
        >>> data = read_whole(fs, "bucket/train/cat/0001.jpg")   # one GET, no HEAD
    """
    if type(fs) is LocalFileSystem:  # a FIFO named like an image must not block the read
        return read_local(path)[0]
    if not isinstance(fs, AsyncFileSystem) or fs.asynchronous or not deadline:
        return fs.cat_file(path, start=0)
    attempts = attempts_here(fs)
    end = time.monotonic() + deadline
    for attempt in range(1, attempts + 1):
        try:
            left = end - time.monotonic()
            if left <= 0:
                raise FSTimeoutError  # the deadline passed while backing off
            # fsspec's sync wrapper takes `timeout` and cancels the request when it passes.
            return fs.cat_file(path, start=0, timeout=left)
        except FSTimeoutError as exc:
            raise _deadline_error(deadline) from exc
        except Exception as exc:
            if attempt == attempts or not is_unavailable(exc):
                raise
            pause = backoff(attempt)
            logger.info("reading %s failed (%s); retrying in %.1f s", path, exc, pause)
            time.sleep(min(pause, max(end - time.monotonic(), 0)))
    raise AssertionError("unreachable")  # the loop returns or raises


async def aread_whole(fs: Any, path: str, *, deadline: float | None = READ_DEADLINE_S) -> bytes:
    """:func:`read_whole` as a coroutine on an async filesystem's own loop (``fs.loop``).

    One request (``_cat_file`` from offset 0: NOTE [one GET per object]); the read, retries
    included, gives up after ``deadline`` seconds with a ``TimeoutError``; transient failures
    are retried where the client does not retry (HTTP), never a missing or forbidden object
    (NOTE [origin timeouts]). Errors are the backend's, as :func:`read_whole` raises them:
    convert them with :func:`fastload.io.errors.storage_error`. Run it on ``fs.loop``::

        >>> fs = fsspec.filesystem("s3")
        >>> data = fsspec.asyn.sync(fs.loop, aread_whole, fs, "bucket/train/cat/0001.jpg")
    """
    if not deadline:
        return await fs._cat_file(path, start=0)
    attempts = attempts_here(fs)
    end = time.monotonic() + deadline
    for attempt in range(1, attempts + 1):
        try:
            return await within(fs._cat_file(path, start=0), end - time.monotonic())
        except DeadlinePassed as exc:
            raise _deadline_error(deadline) from exc
        except Exception as exc:
            if attempt == attempts or not is_unavailable(exc):
                raise
            pause = backoff(attempt)
            logger.info("reading %s failed (%s); retrying in %.1f s", path, exc, pause)
            await asyncio.sleep(min(pause, max(end - time.monotonic(), 0)))
    raise AssertionError("unreachable")  # the loop returns or raises


class DeadlinePassed(Exception):
    """:func:`within`'s time passed (told apart from a client's own timeout error)."""


async def within(coro: Any, seconds: float) -> Any:
    """``await coro`` (any awaitable), cancelled after ``seconds`` with :class:`DeadlinePassed`.

    What ``asyncio.timeout`` does in Python 3.11 (3.10 has none), with no task per read:
    ``wait_for`` could not tell its timeout from the client's own TimeoutError.
    """
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(max(seconds, 0.0), expire)
    try:
        result = await coro
        if expired and hasattr(task, "uncancel"):
            task.uncancel()  # the client swallowed our cancellation and answered anyway
        return result
    except asyncio.CancelledError:
        if not expired:
            raise  # cancelled from outside: so is this read
        if hasattr(task, "uncancel"):
            task.uncancel()  # this cancellation was ours, and it is over
        raise DeadlinePassed from None
    finally:
        timer.cancel()


_LOCAL_READ_TRIES = 3


def read_local(path: str, url: str | None = None, expect: str | None = None) -> tuple[bytes, str]:
    """A local file's bytes and the version they are, read while no writer changed it.

    A FIFO, socket or device is refused at once (opening a FIFO would wait for a writer).
    ``url`` names the file in errors (default: ``path``). Five system calls when nothing
    writes the file: open, fstat, one read of its size plus one byte, fstat, close (no
    buffered file object: its own fstat, ioctl and seeks cost more than a small file's read).

    ``expect``: the version an ``os.stat`` of ``path`` just gave (the cache's read: NOTE [a
    stat per local read]). The first try then stands it for the fstat before the read, so
    four calls; the fstat after the read must still equal it (a write, or a rename of
    another file into place, in between changes it), else the tries below run as usual.
    """
    url = url or path
    data = None if expect is None else _read_as_stated(path, expect)
    if data is not None:
        return data, expect  # type: ignore[return-value]  # expect is a str here
    for _ in range(_LOCAL_READ_TRIES):
        # O_NONBLOCK: opening a FIFO named like an image must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(
                    f"{url} is not a regular file (a FIFO, socket or device); only files are "
                    "objects: remove it from the dataset"
                )
            data = _read_fd(fd, st.st_size)
            now = os.fstat(fd)
        finally:
            os.close(fd)
        before, after = local_version(st), local_version(now)
        if before == after:
            return data, after
    raise StorageError(
        f"{url} changed while it was read, {_LOCAL_READ_TRIES} times in a row: something is "
        "writing it; finish writing the dataset before reading it, or write new files and "
        "rename them into place"
    )


def read_local_range(path: str, offset: int, length: int) -> bytes:
    """Up to ``length`` bytes of the local file ``path`` from ``offset`` (fewer only at its
    end): open, fstat, ``pread``, close. A member of a local tar shard is read this way, about
    13 µs for 72 KB where fsspec's ``cat_file`` (a buffered file object, its seek) takes 30.
    A FIFO, socket or device is refused at once, naming it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO named like a shard never waits
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StorageError(f"{path} is not a regular file (a FIFO, socket or device): "
                               "list only shard files in the dataset")
        parts = []
        while length > 0:  # one pread unless the range is over Linux's 2 GiB a call
            part = os.pread(fd, length, offset)
            if not part:
                break
            parts.append(part)
            offset, length = offset + len(part), length - len(part)
        return b"".join(parts)  # one part: that very bytes object, not a copy
    finally:
        os.close(fd)


def _read_as_stated(path: str, expect: str) -> bytes | None:
    """The bytes of ``path`` if the fstat after reading them still gives version ``expect``
    (a regular file); None otherwise, or when it cannot be read (read_local's tries say why)."""
    size = version_size(expect)
    if size is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = _read_fd(fd, size)
        now = os.fstat(fd)
    except OSError:  # a folder, say
        return None
    finally:
        os.close(fd)
    return data if stat.S_ISREG(now.st_mode) and local_version(now) == expect else None


def _read_fd(fd: int, size: int) -> bytes:
    """The bytes of the open file ``fd``, ``size`` bytes as its fstat said: one read when
    it holds that many (a regular file reads short only at its end), else up to its end
    (the version check after the read tells whether it changed meanwhile)."""
    data = os.read(fd, size + 1)
    if len(data) == size:
        return data
    chunks = [data]
    while chunks[-1]:
        chunks.append(os.read(fd, max(size, 1 << 16)))
    return b"".join(chunks)
