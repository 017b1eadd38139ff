"""The ``fastload::`` fsspec protocol: any fsspec-using code reads through the cache.

Chain it in front of any URL; the options of the cache go under ``fastload=``, those of the
storage under its protocol::

    >>> import fsspec
    >>> with fsspec.open("fastload::s3://bucket/train/a.jpg",
    ...                  fastload={"cache": "/nvme/fastload"}, s3={"anon": True}) as f:
    ...     data = f.read()

Each open asks the origin for the object's version (one ``info`` request, so a changed
object is never served stale) and reads the bytes from the fastest tier that has them,
unless the filesystem was given the versions from a listing (:attr:`versions`, as
``ImageFolder`` does through :class:`CachedReads`: a view of its index) or the read names
one (``cat_file(path, version=...)``, what ``Storage.read(path, version)`` sends). Listing (``ls``, ``find``, ``info``)
goes to the origin. The protocol is read-only.

Over a cache made with :meth:`~fastload.cache.tiered.TieredCache.deriving` (a transcoded
tier, for instance) reads return the derived values (NOTE [derived entries]).

NOTE [large objects through fastload::]
``open`` used to read every object whole into memory through the cache (one GET, one entry),
which is what an image wants and not what a shard does: webdataset opening
``fastload::s3://bucket/train-000000.tar`` (:func:`fastload.register_gopen`) held each ~1 GB
shard in memory, per worker, downloaded in one stream bounded by a 30 s deadline, and wrote
it as one entry. An object of at least ``large_bytes`` (64 MiB by default; its size is in the
version the open asks for anyway) is now downloaded into the cache's shard store, the way
``TarShards`` reads shards (NOTE [the shard store] in :mod:`.shardstore`: concurrent range
requests, each asking for that version, resumed where a connection broke or stalled, one
download per node, validated, under the shard budget, shared through Redis), and read as a
stream from its download as it lands, then from its local copy (NOTE [a shard read as a
stream] in :mod:`.shardstream`). Without a writable disk tier the object is read whole as
before.
"""

from __future__ import annotations

import functools
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFile

from fastload.cache.build import open_cache, open_shard_store
from fastload.cache.config import DEFAULT_DIR
from fastload.cache.shardsource import ShardRef
from fastload.cache.shardstore import ShardStore
from fastload.cache.shardstream import open_stream
from fastload.cache.tiered import TieredCache
from fastload.errors import ConfigError
from fastload.io.storage import target_filesystem
from fastload.io.versions import version_size

LARGE_BYTES = 64 << 20
"""Objects at least this large open from a local copy (NOTE [large objects through fastload::])."""


class FastloadCacheFileSystem(ChainedFileSystem):
    """A read-through cached view of a target filesystem (protocol ``fastload``).

    Args:
        target_protocol: the protocol below (set by URL chaining: ``fastload::s3://...``).
        target_options: options of the target filesystem.
        fs: an already built target filesystem, instead of the two above.
        cache: a cache spec (see :func:`fastload.cache.open_cache`); default
            ``~/.cache/fastload``.
        large_bytes: objects at least this large are opened from a local copy in the
            cache's shard store, not read into memory (NOTE [large objects through
            fastload::]); None: every object into memory.

    Attributes:
        versions: None (ask the origin at every read), or the versions of the target's
            paths from a listing, so a read keys the cache with no request; a path missing
            from it is asked once and remembered there. Set it through :meth:`over`, which
            gives the filesystem its own instance (fsspec shares instances built alike).
    """

    protocol = "fastload"

    def __init__(
        self,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        cache: Any = DEFAULT_DIR,
        large_bytes: int | None = LARGE_BYTES,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("fo", None)  # the chained path; each call gets its path anyway
        super().__init__(**kwargs)
        self.fs = target_filesystem("fastload", target_protocol, target_options, fs)
        self.cache = open_cache(cache)
        if self.cache is None:
            raise ConfigError(f"fastload:: needs a cache, got cache={cache!r}; pass a directory")
        if self.cache.config.transcode is not None and self.cache.derive is None:
            # The cache layer cannot re-encode images itself (fastload.data does); serving
            # originals from a spec that asks for transcoding would be a silent surprise.
            raise ConfigError(
                f"fastload:: got cache={cache!r} with transcode, which only ImageFolder and "
                "`fastload cache warm --transcode` apply; pass a cache that transcodes: "
                "cache=open_cache(spec).deriving(Transcode(**spec['transcode'])) with Transcode "
                "from fastload.data.transcode, or drop 'transcode' to read the original bytes"
            )
        self.versions: MutableMapping[str, str] | None = None
        self._local = type(self.fs) is LocalFileSystem and os.sep == "/"
        self.large_bytes = None if isinstance(self.fs, LocalFileSystem) else large_bytes

    @classmethod
    def over(
        cls,
        fs: fsspec.AbstractFileSystem,
        cache: TieredCache,
        versions: MutableMapping[str, str],
    ) -> FastloadCacheFileSystem:
        """A cached view of ``fs`` keyed by ``versions`` (path -> version), not shared."""
        view = cls(fs=fs, cache=cache, skip_instance_cache=True)
        view.versions = versions
        return view

    def _target_path(self, path: str) -> str:
        if self._local and path[:1] == "/" and path[-1:] != "/":
            return path  # what both strips return for an absolute POSIX path (the hot path)
        return self.fs._strip_protocol(self._strip_protocol(path))

    def cat_file(
        self,
        path: str,
        start: int | None = None,
        end: int | None = None,
        version: str | None = None,
        **kwargs: Any,
    ) -> bytes:
        """The object's bytes through the cache; ``version`` (a listing's) spares the lookup."""
        target = self._target_path(path)
        if version is None and self.versions is not None:
            version = self._version(target)
        data = self.cache.read(self.fs, target, version)
        return data if not start and end is None else data[start:end]  # no copy for a whole read

    def read_many(self, paths: Sequence[str], versions: Sequence[str | None]) -> list[bytes | Exception]:
        """Whole objects through the cache, a batch at once (NOTE [batched reads]); a failed
        read's error in its place. ``versions``: the listing's, or None to look them up."""
        targets = [self._target_path(p) for p in paths]
        known = self.versions
        if known is not None:
            versions = [v if v is not None else known.get(t) for v, t in zip(versions, targets)]
        return self.cache.read_many(self.fs, targets, versions)

    @functools.cached_property
    def _shards(self) -> ShardStore | None:
        """The cache's shard store, opened at the first large open (None: no writable disk)."""
        return open_shard_store(self.cache)

    def _version(self, target: str) -> str:
        """The listed version of ``target``, else the origin's (asked once per process where
        there is a listing to remember it in)."""
        if self.versions is None:
            return self.cache.version(self.fs, target)
        version = self.versions.get(target)
        if version is None:  # not listed (an explicit file list)
            version = self.versions[target] = self.cache.version(self.fs, target)
        return version

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise ConfigError(
                f"fastload:: is a read-only cache; open {path!r} with mode {mode!r} on the "
                "storage itself, without the fastload:: prefix"
            )
        if self.large_bytes is None:
            return MemoryFile(fs=self, path=path, data=self.cat_file(path))
        target = self._target_path(path)
        version = self._version(target)
        size = version_size(version)
        if size is not None and size >= self.large_bytes:
            if self._shards is not None:
                ref = ShardRef(url=self.fs.unstrip_protocol(target), path=target,
                               version=version, size=size)
                return open_stream(self._shards, self.fs, ref)
        return MemoryFile(fs=self, path=path, data=self.cat_file(path, version=version))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.fs.info(self._target_path(path), **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        return self.fs.ls(self._target_path(path), detail=detail, **kwargs)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kwargs: Any):
        return self.fs.find(self._target_path(path), maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)

    def unstrip_protocol(self, name: str) -> str:
        return "fastload::" + self.fs.unstrip_protocol(self._target_path(name))


@dataclass(frozen=True)
class CachedReads:
    """A :data:`fastload.io.storage.ReadThrough`: reads of a Storage go through ``cache``.

    Reads return what ``cache`` serves: over a deriving cache (``cache.deriving(...)``, as
    ``ImageFolder`` builds for ``cache={..., "transcode": ...}``) the derived values.

    Example::

        >>> storage = Storage("s3://bucket/train", read_through=CachedReads(open_cache("/nvme/c")))
        >>> storage.reader            # a FastloadCacheFileSystem over the s3 filesystem
    """

    cache: TieredCache

    def __call__(
        self, origin: fsspec.AbstractFileSystem, versions: MutableMapping[str, str]
    ) -> FastloadCacheFileSystem:
        return FastloadCacheFileSystem.over(origin, self.cache, versions)
