"""The errors of one sample that cannot be read or decoded, with the fix in the message.

``ImageFolder.unreadable`` and ``.corrupt`` (and every engine, through them) build their
:class:`~fastload.errors.SampleError` here, so a failure reads the same whichever engine
met it. Each message names the file's URL and the sample's index, says what went wrong and
what to do.

Example::

    >>> unreadable("/data/train/cat/1.jpg", 3, "/data/train/cat/1.jpg", PermissionError(13, "denied"))
    UnreadableSampleError('cannot read image /data/train/cat/1.jpg (index 3): ... Make it readable ...')
"""

from __future__ import annotations

import errno

from PIL import Image, UnidentifiedImageError

from fastload.errors import (
    CorruptSampleError,
    MissingSampleError,
    StorageError,
    UnreadableSampleError,
)
from fastload.io.errors import describe
from fastload.io.versions import ObjectChangedError

DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)
"""Pillow's own decode errors; anything else (a bug, MemoryError) propagates unchanged."""

NOT_READ_ERRORS = (UnidentifiedImageError, SyntaxError, ValueError, Image.DecompressionBombError)
"""Of :data:`DECODE_ERRORS`, those a user ``loader`` raises for bytes it read but cannot
decode; any other ``OSError`` from it is a read that failed."""


def unreadable(
    url: str, index: int, path: str, exc: BaseException, *, dataset: str = "ImageFolder",
) -> UnreadableSampleError:
    """The error for sample ``index`` (file ``path`` at ``url``) whose bytes cannot be read.

    :class:`~fastload.errors.MissingSampleError` for a file gone since the listing, else an
    :class:`~fastload.errors.UnreadableSampleError` whose fix fits the cause in ``exc``.
    ``dataset``: the class to build again to re-list.
    """
    changed = isinstance(exc, ObjectChangedError)  # its own message says what changed
    root = exc.__cause__ if isinstance(exc, StorageError) and exc.__cause__ and not changed else exc
    if changed:
        kind, fix = UnreadableSampleError, f"Build the {dataset} again to index the new version"
    elif isinstance(exc, FileNotFoundError):
        kind: type[UnreadableSampleError] = MissingSampleError
        fix = (f"It was listed but is gone: restore it, or build the {dataset} again to re-list "
               "(with listing_max_age=0 for a remote root)")
    elif isinstance(root, PermissionError):
        kind, fix = UnreadableSampleError, "Make it readable by this process (chmod, chown)"
    elif isinstance(root, OSError) and root.errno == errno.ELOOP:
        kind, fix = UnreadableSampleError, "It is a symbolic link that loops: repoint or remove it"
    else:
        kind, fix = UnreadableSampleError, "Check the storage (network, credentials) and retry"
    return kind(
        f"cannot read image {url} (index {int(index)}): {describe(root)}. {fix}, or pass "
        "on_error='skip' to skip and count it.",
        index=int(index),
        path=path,
    )


def corrupt(url: str, index: int, path: str, exc: BaseException) -> CorruptSampleError:
    """The error for sample ``index`` (file ``path`` at ``url``) whose bytes do not decode."""
    # Pillow's text for an unknown format names a BytesIO by its address: say it plainly.
    why = "Pillow cannot identify it as an image" if isinstance(exc, UnidentifiedImageError) else exc
    if isinstance(exc, Image.DecompressionBombError):
        fix = (
            "It has more pixels than Pillow allows (PIL.Image.MAX_IMAGE_PIXELS guards "
            "against decompression bombs): raise that limit if the file is trusted, remove it"
        )
    else:
        fix = "Replace or remove the file"
    return CorruptSampleError(
        f"cannot decode image {url} (index {int(index)}): {why}. {fix}, or pass "
        "on_error='skip' to skip and count it.",
        index=int(index),
        path=path,
    )
