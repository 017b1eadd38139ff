"""Storage access through fsspec: one place that opens URLs and turns failures into fastload errors.

``Storage("s3://bucket/train")`` lists and reads objects below a root URL with whatever
fsspec filesystem serves its protocol. The filesystem object is created lazily in each
process (fsspec filesystems with event loops or sockets must not cross a fork), so a
``Storage`` pickles cheaply into worker processes.

Example::

    >>> st = Storage("/data/imagenet/train")
    >>> files = st.find()                       # full paths below the root, sorted
    >>> data = st.read(files[0])                # bytes
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.registry import known_implementations

from fastload.cache.keys import version_of
from fastload.errors import ConfigError, ObjectNotFoundError, StorageError
from fastload.origin import read_whole

if TYPE_CHECKING:
    from fastload.cache.tiered import TieredCache

_INSTALL_HINTS = {
    "s3": "pip install 'fastload[s3]' (s3fs)",
    "s3a": "pip install 'fastload[s3]' (s3fs)",
    "gs": "pip install gcsfs",
    "gcs": "pip install gcsfs",
    "http": "pip install aiohttp",
    "https": "pip install aiohttp",
    "az": "pip install adlfs",
    "abfs": "pip install adlfs",
}


def protocol_of(url: str) -> str:
    """The outermost fsspec protocol of a URL ("file" for plain paths)."""
    if "::" in url:
        url = url.split("::", 1)[0] + "://"
    return url.split("://", 1)[0] if "://" in url else "file"


def install_hint(protocol: str) -> str:
    known = known_implementations.get(protocol, {})
    return _INSTALL_HINTS.get(protocol) or known.get("err") or f"an fsspec implementation of {protocol}://"


def target_filesystem(
    wrapper: str,
    target_protocol: str | None,
    target_options: dict[str, Any] | None,
    fs: fsspec.AbstractFileSystem | None,
) -> fsspec.AbstractFileSystem:
    """The filesystem below a chained wrapper protocol (``fastload::``, ``latency::``)."""
    if fs is not None:
        return fs
    if target_protocol is None:
        raise ConfigError(
            f"the {wrapper}:: protocol needs a storage below it: chain it like "
            f"'{wrapper}::s3://bucket/key', or pass fs= or target_protocol="
        )
    return fsspec.filesystem(target_protocol, **(target_options or {}))


class Storage:
    """Lists and reads objects below ``url`` through fsspec, with errors that name the URL."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        cache: TieredCache | None = None,
    ):
        self.url = os.fspath(url)
        # With a cache, reads go through it (fastload.cache); versions from the listing
        # spare a HEAD per object when cache keys are built (NOTE [cache keys]).
        self.cache = cache
        self.versions: dict[str, str] = {}
        if "://" not in self.url and "::" not in self.url:
            self.url = os.path.abspath(os.path.expanduser(self.url))
        self.storage_options = dict(storage_options or {})
        self._fs: fsspec.AbstractFileSystem | None = None
        self._root: str | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fs=None, _root=None, _pid=-1)
        return state

    @property
    def protocol(self) -> str:
        return protocol_of(self.url)

    def _open(self) -> tuple[fsspec.AbstractFileSystem, str]:
        if self._fs is None or self._pid != os.getpid():
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            except ImportError as exc:
                raise StorageError(
                    f"cannot open {self.url}: the {self.protocol}:// protocol is not installed; "
                    f"install it with: {install_hint(self.protocol)}"
                ) from exc
            except ValueError as exc:
                raise StorageError(
                    f"cannot open {self.url}: {exc}. Check the URL's protocol, or install "
                    f"{install_hint(self.protocol)}"
                ) from exc
            self._fs, self._root, self._pid = fs, root.rstrip("/") or "/", os.getpid()
        assert self._root is not None
        return self._fs, self._root

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._open()[0]

    @property
    def root(self) -> str:
        return self._open()[1]

    def to_url(self, path: str) -> str:
        """The URL of a filesystem path, for error messages and cache keys."""
        fs = self.fs
        return fs.unstrip_protocol(path) if self.protocol != "file" else path

    def resolve(self, path: str) -> str:
        """A path relative to the root, or already absolute, as a filesystem path."""
        root = self.root
        if "://" in path:
            return self.fs._strip_protocol(path)
        if path.startswith("/") or path.startswith(root):
            return path
        return f"{root}/{path}"

    def find(self, detail: bool = False) -> Any:
        """Every file below the root, sorted; raises ObjectNotFoundError if the root is missing.

        With ``detail`` a dict of path to fsspec info (size, etag...) in path order.
        """
        fs, root = self._open()
        try:
            if not fs.exists(root):
                raise ObjectNotFoundError(
                    f"dataset root {self.url} does not exist; check the path or URL"
                )
            if not fs.isdir(root):
                raise StorageError(f"dataset root {self.url} is a file, expected a directory")
            if self.cache is None and not detail:
                return sorted(fs.find(root, withdirs=False))
            found = fs.find(root, withdirs=False, detail=True)
            if self.cache is not None:
                self.versions = {path: version_of(info) for path, info in found.items()}
            return {p: found[p] for p in sorted(found)} if detail else sorted(found)
        except (ObjectNotFoundError, StorageError):
            raise
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"dataset root {self.url} does not exist") from exc
        except Exception as exc:  # NOTE [storage errors]
            raise StorageError(f"cannot list {self.url}: {_describe(exc)}") from exc

    def read(self, path: str) -> bytes:
        """The whole object at ``path``; a missing object raises ObjectNotFoundError with its URL."""
        fs = self.fs
        if self.cache is not None:
            version = self.versions.get(path)
            if version is None:  # not listed (an explicit file list): ask once per process
                version = self.versions[path] = self.cache.version(fs, path)
            return self.cache.read(fs, path, version)
        try:
            return read_whole(fs, path)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{self.to_url(path)} does not exist") from exc
        except Exception as exc:  # NOTE [storage errors]
            raise StorageError(f"cannot read {self.to_url(path)}: {_describe(exc)}") from exc


# NOTE [storage errors]
# Below fsspec, failures arrive in each backend's own types: OSError subclasses from most,
# but botocore's EndpointConnectionError or aiohttp's ClientError are not OSErrors. Every
# exception that crosses a Storage method therefore becomes a StorageError naming the URL,
# with the original kept as __cause__; callers never need the backend's exception types.


def _describe(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"
