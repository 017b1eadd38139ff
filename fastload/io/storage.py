"""Storage access through fsspec: one place that opens URLs and turns failures into fastload errors.

``Storage("s3://bucket/train")`` lists and reads objects below a root URL with whatever
fsspec filesystem serves its protocol. The filesystem object is created lazily in each
process (fsspec filesystems with event loops or sockets must not cross a fork), so a
``Storage`` pickles cheaply into worker processes.

Reads go through one fsspec filesystem, :attr:`Storage.reader`: the origin's own, or a layer
over it built by ``read_through`` (the ``fastload::`` cache filesystem, for instance, given
the listing's versions so that it needs no request per object to key them). Storage knows
nothing of what that layer does: listing and versions always come from the origin.

Example::

    >>> st = Storage("/data/imagenet/train")
    >>> files = st.find()                       # full paths below the root, sorted
    >>> data = st.read(files[0])                # bytes

Local roots are walked with ``os.scandir`` (:mod:`.localwalk`), not with fsspec's ``find``
(which leaves out folders it cannot read without a word): only regular files are listed,
symlinks to them are followed, and a folder that cannot be read is an error naming it (NOTE
[local listing]).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import fsspec
from fsspec.registry import known_implementations

from fastload.errors import ConfigError, MissingDependencyError, ObjectNotFoundError, StorageError
from fastload.io.errors import describe, raise_storage_error, storage_errors
from fastload.io.localwalk import Listing, OnListError, walk_local
from fastload.io.origin import read_whole, with_timeouts
from fastload.io.versions import local_version, version_of

logger = logging.getLogger(__name__)


ReadThrough = Callable[[fsspec.AbstractFileSystem, MutableMapping[str, str]], fsspec.AbstractFileSystem]
"""Builds the filesystem reads go through from the origin's and the versions (path ->
version: the listing's, kept up to date in place, or the caller's mapping). It must pickle.
Its ``cat_file(path, start=0, version=v)`` takes a version a caller already knows
(:meth:`Storage.read` with ``version=``), so the layer needs no lookup for it."""

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
    """Lists and reads objects below ``url`` through fsspec, with errors that name the URL.

    Args:
        url: the root, any fsspec URL or a local path.
        storage_options: passed to fsspec (fastload adds timeouts the user left unset).
        read_through: builds the filesystem reads go through over the origin's (see
            :data:`ReadThrough`); None reads the origin. With one, :attr:`versions` keeps the
            versions of the last listing.
        versions: the caller's own ``path -> version`` mapping for ``read_through``
            (``ImageFolder`` passes a view of its index, not a dict per path); listings
            then leave it alone and the caller keeps it current.

    Attributes:
        versions: path -> version from the last listing (or :meth:`current_versions`), kept
            only with ``read_through``; updated in place, never replaced. Or the mapping
            given as ``versions``.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        read_through: ReadThrough | None = None,
        versions: MutableMapping[str, str] | None = None,
    ):
        self.url = os.fspath(url)
        self.read_through = read_through
        self._keeps_versions = versions is None and read_through is not None
        self.versions: MutableMapping[str, str] = {} if versions is None else versions
        if "://" not in self.url and "::" not in self.url:
            self.url = os.path.abspath(os.path.expanduser(self.url))
        self.storage_options = dict(storage_options or {})
        self._fs: fsspec.AbstractFileSystem | None = None
        self._reader: fsspec.AbstractFileSystem | None = None
        self._root: str | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fs=None, _reader=None, _root=None, _pid=-1)
        return state

    @property
    def protocol(self) -> str:
        return protocol_of(self.url)

    def _open(self) -> tuple[fsspec.AbstractFileSystem, str]:
        if self._fs is None or self._pid != os.getpid():
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **with_timeouts(self.url, self.storage_options))
            except ImportError as exc:
                raise MissingDependencyError(
                    f"cannot open {self.url}: the {self.protocol}:// protocol is not installed; "
                    f"install it with: {install_hint(self.protocol)}"
                ) from exc
            except ValueError as exc:
                raise StorageError(
                    f"cannot open {self.url}: {exc}. Check the URL's protocol, or install "
                    f"{install_hint(self.protocol)}"
                ) from exc
            reader = fs if self.read_through is None else self.read_through(fs, self.versions)
            self._fs, self._reader, self._root = fs, reader, root.rstrip("/") or "/"
            self._pid = os.getpid()
        assert self._root is not None
        return self._fs, self._root

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The origin's filesystem: listing, versions, URLs."""
        return self._open()[0]

    @property
    def reader(self) -> fsspec.AbstractFileSystem:
        """The filesystem reads go through: the ``read_through`` layer, else :attr:`fs`."""
        self._open()
        assert self._reader is not None
        return self._reader

    @property
    def root(self) -> str:
        return self._open()[1]

    def to_url(self, path: str) -> str:
        """The URL of a filesystem path, for error messages and cache keys."""
        fs = self.fs
        return fs.unstrip_protocol(path) if self.protocol != "file" else path

    @property
    def is_local(self) -> bool:
        """Whether the root is a plain local path or ``file://`` URL (no chained protocol)."""
        return self.protocol == "file" and "::" not in self.url

    def find(self, detail: bool = False, *, on_error: OnListError = "raise") -> Any:
        """Every file below the root, sorted; raises ObjectNotFoundError if the root is missing.

        With ``detail`` a dict of path to fsspec info (size, etag...) in path order. A folder
        that cannot be listed raises StorageError naming it; with ``on_error="skip"`` it is
        left out (see :meth:`listing` for which ones).
        """
        found = self.listing(on_error=on_error).files
        return found if detail else list(found)

    def listing(
        self, *, on_error: OnListError = "raise", warn: bool = True, details: bool = True
    ) -> Listing:
        """One listing of the root: its regular files and what it had to leave out.

        ``details=False``: a local walk may leave out the files' sizes and versions (both
        None), which it gets only by a stat per file; a reader without a cache needs neither.

        With ``read_through`` (and no ``versions`` of the caller's) the files' versions are
        kept in ``self.versions``.
        Special files (FIFOs, sockets, devices) and dangling or looping symlinks are left out
        with one warning (``warn``) that names them. Example::

            >>> found = Storage("/data/train").listing(on_error="skip")
            >>> found.unreadable        # {'/data/train/cat': '[Errno 13] Permission denied'}
        """
        fs, root = self._open()
        try:
            if self.is_local:
                found = walk_local(root, self.url, on_error, details)
            else:
                found = Listing(files=self._find_remote(fs, root))
        except (ObjectNotFoundError, StorageError):
            raise
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"dataset root {self.url} does not exist") from exc
        except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
            raise StorageError(f"cannot list {self.url}: {describe(exc)}") from exc
        if self._keeps_versions:
            self._keep_versions({path: info["version"] for path, info in found.files.items()})
        if warn and found.skipped:
            shown = ", ".join(f"{p} ({why})" for p, why in list(found.skipped.items())[:10])
            more = f" and {len(found.skipped) - 10} more" if len(found.skipped) > 10 else ""
            logger.warning(
                "skipped %d entries below %s that are not regular files: %s%s. Remove them or "
                "point their symlinks at files", len(found.skipped), self.url, shown, more,
            )
        return found

    def _keep_versions(self, fresh: dict[str, str]) -> None:
        # In place: the read-through layer holds this very mapping. Stale paths go first, so
        # a reader never sees the mapping empty.
        for path in self.versions.keys() - fresh.keys():
            self.versions.pop(path, None)
        self.versions.update(fresh)

    def _find_remote(self, fs: fsspec.AbstractFileSystem, root: str) -> dict[str, dict[str, Any]]:
        # The listing alone, one request per page: it is repeated every epoch (revalidation).
        found = fs.find(root, withdirs=False, detail=True)
        if not found and not fs.exists(root):
            raise ObjectNotFoundError(
                f"dataset root {self.url} does not exist; check the path or URL"
            )
        if list(found) == [root] or (not found and not fs.isdir(root)):
            raise StorageError(f"dataset root {self.url} is a file, expected a directory")
        return {p: dict(found[p], version=version_of(found[p])) for p in sorted(found)}

    def current_versions(self, paths: list[str]) -> dict[str, str]:
        """The origin's versions of ``paths`` now; a missing one is left out.

        Local files are stat'ed; remote objects come from one listing per parent folder,
        never a request per object. Used to snapshot and revalidate explicit file lists.
        """
        fs = self.fs
        out: dict[str, str] = {}
        if self.is_local:
            for path in paths:
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise StorageError(
                        f"cannot stat {path}: {describe(exc)}; check its permissions"
                    ) from exc
                if stat.S_ISREG(st.st_mode):
                    out[path] = local_version(st)
            return out
        wanted = set(paths)
        for parent in sorted({p.rsplit("/", 1)[0] for p in paths}):
            try:
                with storage_errors("list", self.to_url(parent)):
                    entries = fs.ls(parent, detail=True)
            except FileNotFoundError:  # the folder is gone (ObjectNotFoundError is one too)
                continue
            for info in entries:
                name = fs._strip_protocol(info["name"])
                if name in wanted and info.get("type") != "directory":
                    out[name] = version_of(info)
        return out

    def read(self, path: str, version: str | None = None) -> bytes:
        """The whole object at ``path`` through :attr:`reader`, in one request.

        ``version``: the object's version where the caller knows it (a listing's); the
        ``read_through`` layer keys its cache by it without a lookup. Ignored without one.
        A missing object raises ObjectNotFoundError, any other failure StorageError, naming
        its URL (NOTE [storage errors] in :mod:`fastload.io.errors`).
        """
        try:
            if version is not None and self.read_through is not None:
                return self.reader.cat_file(path, start=0, version=version)
            return read_whole(self.reader, path)
        except Exception as exc:  # NOTE [storage errors]
            raise_storage_error(exc, "read", self.to_url(path))

    def read_many(self, paths: Sequence[str], versions: Sequence[str | None]) -> list[bytes | Exception]:
        """Whole objects through the ``read_through`` cache, a batch at once (NOTE [batched reads]
        in :mod:`fastload.cache.tiered`); a failed read's fastload error in its place, not raised."""
        if self.read_through is None:
            raise TypeError("Storage.read_many reads through a cache; without one, read() each object")
        return self.reader.read_many(paths, versions)

