"""The one conversion of storage-backend failures into fastload's errors.

NOTE [storage errors]
Below fsspec, failures arrive in each backend's own types: OSError subclasses from most, but
botocore's EndpointConnectionError or aiohttp's ClientError are not OSErrors. Every exception
that crosses a storage call therefore becomes a :class:`~fastload.errors.StorageError` naming
the URL (an :class:`~fastload.errors.ObjectNotFoundError` for a missing object), with the
original kept as ``__cause__``; callers never need the backend's exception types. fastload's
own errors pass through unchanged.

Example::

    >>> with storage_errors("read", "s3://bucket/a.jpg"):
    ...     data = fs.cat_file("bucket/a.jpg")
    Traceback (most recent call last):
    fastload.errors.ObjectNotFoundError: cannot read s3://bucket/a.jpg: it does not exist ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NoReturn

from fastload.errors import FastloadError, ObjectNotFoundError, StorageError


def describe(exc: BaseException) -> str:
    """A one-line account of a backend error: its text, with its type where that is not OSError."""
    text = str(exc) or repr(exc)
    return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"


def storage_error(exc: BaseException, action: str, url: str) -> FastloadError:
    """The fastload error for ``exc``, raised while trying to ``action`` ``url``.

    Raise it ``from exc``. A fastload error is returned as it is; a missing object becomes
    :class:`ObjectNotFoundError`; anything else :class:`StorageError`.
    """
    if isinstance(exc, FastloadError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(f"cannot {action} {url}: it does not exist ({describe(exc)})")
    return StorageError(f"cannot {action} {url}: {describe(exc)}")


def raise_storage_error(exc: BaseException, action: str, url: str) -> NoReturn:
    """Raise :func:`storage_error` of ``exc`` from it (``exc`` itself when it is fastload's):
    :func:`storage_errors` without a context manager, for a per-object read path."""
    converted = storage_error(exc, action, url)
    if converted is exc:
        raise exc
    raise converted from exc


@contextlib.contextmanager
def storage_errors(action: str, url: str) -> Iterator[None]:
    """Convert every exception of the block into a fastload error (see NOTE [storage errors])."""
    try:
        yield
    except Exception as exc:  # NOTE [storage errors]
        raise_storage_error(exc, action, url)
