"""The exceptions fastload raises.

Every error fastload raises on purpose derives from :class:`FastloadError`, so one
``except fastload.FastloadError`` catches them all. Where a standard exception type carries
meaning that callers already test for (``ValueError`` for a bad argument,
``FileNotFoundError`` for a missing object), the fastload error derives from that too::

    FastloadError
    ├── ConfigError (ValueError)          a bad argument or setting; the message says the fix
    ├── BackendUnavailable (RuntimeError) an engine was forced where it cannot run
    ├── BackendError (RuntimeError)      an engine (DALI) failed below fastload
    ├── MissingDependencyError (ImportError) an optional package (an extra) is not installed
    ├── DatasetError                      a dataset cannot be listed or read
    │   ├── EmptyDatasetError (ValueError)
    │   │   └── EmptyClassError (FileNotFoundError)   no class folder, or one without a valid
    │   │                                 file: torchvision's FileNotFoundError
    │   └── SampleError                   one sample failed; .index and .path name it
    │       ├── CorruptSampleError        its bytes do not decode (truncated, not an image,
    │       │                             a decompression bomb)
    │       └── UnreadableSampleError (StorageError)   its bytes cannot be read (permission
    │           │                         denied, a looping symlink, the storage failed)
    │           └── MissingSampleError (ObjectNotFoundError)   it was listed, now it is gone
    ├── StorageError (OSError)            the storage failed below fastload
    │   ├── ObjectNotFoundError (FileNotFoundError)
    │   └── OriginUnavailableError        the origin looks down: a warm gave up, with counts
    └── CacheError                        the cache cannot be used as configured

Storage and engine errors are converted with ``raise ... from exc``, so the original
exception stays attached as ``__cause__``.

Every failure of one sample is a :class:`SampleError` carrying ``.index`` and ``.path``
(``on_error="skip"`` skips exactly these). A sample that cannot be read is also a
:class:`StorageError`, and a missing one an :class:`ObjectNotFoundError` (so a
``FileNotFoundError``), so code written as ``except ObjectNotFoundError`` or
``except StorageError`` around a read keeps working::

    >>> try:
    ...     image, label = dataset[3]
    ... except fastload.SampleError as exc:
    ...     print(exc.index, exc.path, exc.__cause__)   # 3 /data/a/3.jpg [Errno 13] ...

A sample error keeps ``index`` and ``path`` when it is pickled (a worker process sending it
back); :class:`fastload.DataLoader` re-raises a worker's sample error as the same exception
with the worker's traceback attached as a note (:mod:`fastload.data.batchinfo`).
"""

from __future__ import annotations


class FastloadError(Exception):
    """Base of every error fastload raises on purpose."""


class ConfigError(FastloadError, ValueError):
    """An argument or setting is invalid; the message names it, the value and the fix."""


class BackendUnavailable(FastloadError, RuntimeError):
    """An engine was requested explicitly (``backend="dali"``) where it cannot run."""


class BackendError(FastloadError, RuntimeError):
    """An engine failed below fastload on data fastload can read (the engine's error is the cause)."""


class MissingDependencyError(FastloadError, ImportError):
    """An optional feature needs a package that is not installed; the message says which extra."""


class DatasetError(FastloadError):
    """A dataset cannot be listed or read."""


class EmptyDatasetError(DatasetError, ValueError):
    """A dataset root exists but holds no usable sample."""


class EmptyClassError(EmptyDatasetError, FileNotFoundError):
    """A root without class folders, or a class folder without a valid file.

    torchvision's ``ImageFolder`` raises ``FileNotFoundError`` for both, so this is one too;
    ``ImageFolder(..., allow_empty=True)`` keeps an empty class folder as a class instead.
    """


class SampleError(DatasetError):
    """One sample could not be loaded.

    Attributes:
        index: the dataset index of the sample.
        path: the file or URL of the sample.
    """

    def __init__(self, message: str, *, index: int | None = None, path: str | None = None):
        super().__init__(message)
        self.index = index
        self.path = path

    def __reduce__(self):  # keeps index, path and notes when a worker sends the error back
        state = {k: v for k, v in self.__dict__.items() if k not in ("index", "path")}
        return (_rebuild_sample_error, (type(self), str(self), self.index, self.path), state or None)


def _rebuild_sample_error(cls, message, index, path):
    return cls(message, index=index, path=path)


class CorruptSampleError(SampleError):
    """A sample's bytes could not be decoded (truncated or not an image)."""


class StorageError(FastloadError, OSError):
    """The storage below fastload failed (network, permissions, protocol not installed)."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object or directory does not exist at the given URL."""


class UnreadableSampleError(SampleError, StorageError):
    """A sample's bytes could not be read: permission denied, a symlink loop, a storage failure.

    The storage's own error (``PermissionError``, botocore's, ...) is the ``__cause__``.
    """


class MissingSampleError(UnreadableSampleError, ObjectNotFoundError):
    """A sample that was listed no longer exists (deleted or moved since the listing)."""


class OriginUnavailableError(StorageError):
    """The origin store looks down or stalled, so a bulk operation (``cache warm``) gave up.

    Raised instead of failing object after object. Running the same operation again resumes:
    what is cached stays cached.

    Attributes:
        url: the dataset root.
        files: objects in the run (this shard).
        done: objects finished (cached, already cached, or failed) when it gave up.
        cached: objects in the cache when it gave up (fetched now or before).
        failed: objects that failed.
        last_error: the last failure, as text.
        report: the caller's partial report (``fastload.cache.warm.WarmReport``), or None.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str,
        files: int = 0,
        done: int = 0,
        cached: int = 0,
        failed: int = 0,
        last_error: str = "",
        report: object | None = None,
    ):
        super().__init__(message)
        self.url, self.files, self.done, self.cached = url, files, done, cached
        self.failed, self.last_error, self.report = failed, last_error, report


class CacheError(FastloadError):
    """The cache cannot be used as configured."""
