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
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import fsspec
from fsspec.implementations.chained import ChainedFileSystem

from fastload.errors import ConfigError
from fastload.io.storage import target_filesystem

DEFAULT_LATENCY_S = 0.015


class LatencyFileSystem(ChainedFileSystem):
    """A target filesystem with ``latency`` seconds added to each request (protocol ``latency``).

    Args:
        target_protocol: the protocol below (set by URL chaining: ``latency::s3://...``).
        target_options: options of the target filesystem.
        fs: an already built target filesystem, instead of the two above.
        latency: seconds added to every request (default 0.015).

    Attributes:
        requests: a Counter of requests by method name, in this process.
    """

    protocol = "latency"

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

    @property
    def total_requests(self) -> int:
        """All requests counted in this process."""
        return sum(self.requests.values())

    def reset_counts(self) -> None:
        """Start counting from zero."""
        with self._count_lock:
            self.requests.clear()

    def _request(self, method: str) -> None:
        with self._count_lock:
            self.requests[method] += 1
        if self.latency:
            time.sleep(self.latency)

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


fsspec.register_implementation("latency", "fastload.testing.latency.LatencyFileSystem", clobber=True)
