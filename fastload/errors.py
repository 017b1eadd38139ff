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
    │   └── SampleError                   one sample failed; names its file and index
    │       └── CorruptSampleError
    ├── StorageError (OSError)            the storage failed below fastload
    │   └── ObjectNotFoundError (FileNotFoundError)
    └── CacheError                        the cache cannot be used as configured

Storage and engine errors are converted with ``raise ... from exc``, so the original
exception stays attached as ``__cause__``.
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

    def __reduce__(self):  # keeps index/path when a worker sends the error back
        return (_rebuild_sample_error, (type(self), str(self), self.index, self.path))


def _rebuild_sample_error(cls, message, index, path):
    return cls(message, index=index, path=path)


class CorruptSampleError(SampleError):
    """A sample's bytes could not be decoded (truncated or not an image)."""


class StorageError(FastloadError, OSError):
    """The storage below fastload failed (network, permissions, protocol not installed)."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object or directory does not exist at the given URL."""


class CacheError(FastloadError):
    """The cache cannot be used as configured."""
