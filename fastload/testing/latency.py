"""Emulated remote storage: an fsspec wrapper that adds a fixed latency to every request.

Chain ``latency::`` in front of any URL to make local or loopback storage behave like an
object store across a network (10-20 ms per request), and to count the requests made::

    >>> import fsspec
    >>> fs, root = fsspec.core.url_to_fs("latency::s3://bucket/train",
    ...                                  latency={"latency": 0.015}, s3={...})
    >>> data = fs.cat_file(root + "/a.jpg")      # 15 ms later
    >>> fs.requests["cat_file"], fs.total_requests
    (1, 1)

Each metadata call (``info``, ``ls``, ``find``), each whole read (``cat_file``, ``cat``,
per path) and each ``open`` sleeps ``latency`` seconds first, then calls the target. Reads
from an opened file are not delayed further. URLs keep naming the target (``s3://...``), so
cache keys and error messages are those of the real store. Counts are per process.

:meth:`LatencyFileSystem.hold` makes it a store that stops answering: every request waits
until :meth:`LatencyFileSystem.release` (a hung NFS server, a stalled connection), so a test
can make a read that only a timeout or Ctrl-C ends, whatever the machine's speed::

    >>> fs.hold()                                # requests from now on wait ...
    >>> fs.release()                             # ... until this

It is also an async filesystem for whole reads (``async_impl``; NOTE [latency async]):
``await fs._cat_file(path)`` on ``fs.loop`` sleeps with ``asyncio.sleep``, so many requests
wait at once on one event loop as they do against a real object store, and counts as a
``cat_file`` request like the sync call; ``_range_chunks`` streams a range of an async
target through (NOTE [streamed ranges])::

    >>> fs = fsspec.filesystem("latency", target_protocol="file", latency=0.015)
    >>> data = fsspec.asyn.sync(fs.loop, fs._cat_file, "/data/a.jpg")
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import fsspec
import fsspec.asyn
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.implementations.local import LocalFileSystem

from fastload.errors import ConfigError
from fastload.io.storage import target_filesystem
from fastload.io.streams import range_chunks

DEFAULT_LATENCY_S = 0.015


class LatencyFileSystem(ChainedFileSystem):
    """A target filesystem with ``latency`` seconds added to each request (protocol ``latency``).

    Args:
        target_protocol: the protocol below (set by URL chaining: ``latency::s3://...``).
        target_options: options of the target filesystem.
        fs: an already built target filesystem, instead of the two above.
        latency: seconds added to every request (default 0.015).

    Attributes:
        requests: a Counter of requests by method name, in this process (a held request
            counts when it arrives).
    """

    protocol = "latency"
    async_impl = True     # _cat_file is a coroutine (NOTE [latency async])
    asynchronous = False  # every sync method stays a plain blocking call

    def __init__(
        self,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        latency: float = DEFAULT_LATENCY_S,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("fo", None)
        super().__init__(**kwargs)
        if latency < 0:
            raise ConfigError(f"latency must be >= 0 seconds, got {latency}")
        self.fs = target_filesystem("latency", target_protocol, target_options, fs)
        self.latency = float(latency)
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._answering = threading.Event()
        self._answering.set()

    @property
    def total_requests(self) -> int:
        """All requests counted in this process."""
        return sum(self.requests.values())

    def reset_counts(self) -> None:
        """Start counting from zero."""
        with self._count_lock:
            self.requests.clear()

    def hold(self) -> None:
        """Stop answering: every request from now on waits until :meth:`release`.

        fsspec shares one instance between all users of the same options in a process, so a
        test that holds must release (in a ``finally``)."""
        self._answering.clear()

    def release(self) -> None:
        """Answer again: the requests waiting since :meth:`hold` go on, after their latency."""
        self._answering.set()

    def _request(self, method: str) -> None:
        self._count(method)
        self._answering.wait()
        if self.latency:
            time.sleep(self.latency)

    def _count(self, method: str) -> None:
        with self._count_lock:
            self.requests[method] += 1

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop :meth:`_cat_file` runs on: the target's if it is async, else
        fsspec's own IO loop."""
        if getattr(self.fs, "async_impl", False):
            return self.fs.loop
        return fsspec.asyn.get_loop()

    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """:meth:`cat_file` as a coroutine on :attr:`loop` (NOTE [latency async])."""
        await self._arrive("cat_file")
        target = self._target_path(path)
        if getattr(self.fs, "async_impl", False):
            return await self.fs._cat_file(target, start=start, end=end, **kwargs)
        if type(self.fs) is LocalFileSystem and not start and end is None and not kwargs:
            with open(target, "rb") as f:  # noqa: ASYNC230 - NOTE [latency async]
                return f.read()
        return self.fs.cat_file(target, start=start, end=end, **kwargs)

    async def _range_chunks(self, path: str, start: int, end: int,
                            version: str | None = None) -> AsyncIterator[bytes]:
        """A range as its target streams it (NOTE [streamed ranges]; ``version`` passed on),
        after the latency; a ``cat_file`` request."""
        if not getattr(self.fs, "async_impl", False):
            yield await self._cat_file(path, start=start, end=end)
            return
        await self._arrive("cat_file")
        target = self._target_path(path)
        async with contextlib.aclosing(range_chunks(self.fs, target, start, end,
                                                    version)) as pieces:
            async for piece in pieces:
                yield piece

    async def _arrive(self, method: str) -> None:
        """A request on :attr:`loop`: counted, held while :meth:`hold` says so, delayed."""
        self._count(method)
        while not self._answering.is_set():  # held: poll, the loop serves other requests
            await asyncio.sleep(0.05)
        if self.latency:
            await asyncio.sleep(self.latency)

    def _target_path(self, path: str) -> str:
        return self.fs._strip_protocol(self._strip_protocol(path))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        self._request("cat_file")
        return self.fs.cat_file(self._target_path(path), start=start, end=end, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._request("info")
        return self.fs.info(self._target_path(path), **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        self._request("ls")
        return self.fs.ls(self._target_path(path), detail=detail, **kwargs)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kwargs: Any):
        self._request("find")
        return self.fs.find(self._target_path(path), maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any):
        self._request("open")
        return self.fs.open(self._target_path(path), mode=mode, **kwargs)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self._request("pipe_file")
        self.fs.pipe_file(self._target_path(path), value, **kwargs)

    def rm_file(self, path: str) -> None:
        self._request("rm_file")
        self.fs.rm_file(self._target_path(path))

    def unstrip_protocol(self, name: str) -> str:
        return self.fs.unstrip_protocol(self._target_path(name))


# NOTE [latency async]
# The wrapper stands in for a remote store, whose clients (s3fs, HTTP) are async: a reader
# that keeps many requests in flight on one event loop (fastload.io.fetch) must see the
# latency overlap as it would there, not serialise on a blocking sleep. So the whole read
# has a coroutine form: `asyncio.sleep(latency)`, then the target's own `_cat_file` when
# the target is async. A sync target (local files, memory) is read on the loop itself:
# its reads take microseconds, less than a hand-over to a thread would cost, and a thread
# pool of the loop's would outlive every caller. A whole local file is read with a plain
# open(): the bytes LocalFileSystem.cat_file returns without its ~40 us of Python layers,
# which a real store spends on its own machine, not in the reader's process (it made the
# stand-in, not the reader, the bound of a warm at 15 ms and 128 requests in flight).
# Everything else stays synchronous.


fsspec.register_implementation("latency", "fastload.testing.latency.LatencyFileSystem", clobber=True)
