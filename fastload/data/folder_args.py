"""The checks of ``ImageFolder``'s arguments that need more than :mod:`fastload.arguments`.

Each raises :class:`~fastload.errors.ConfigError` naming the argument, what it got, and
what to pass instead.

Example::

    >>> check_root([("a.jpg", -1)])
    Traceback (most recent call last):
    fastload.errors.ConfigError: ImageFolder(root=...): ... The item ('a.jpg', -1) is not a (path, label >= 0) pair
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from typing import Any

from fastload.arguments import config_error
from fastload.data.pipeline import ImagePipeline, Normalize
from fastload.errors import ConfigError


def check_root(root: Any) -> None:
    """A path or URL, or a non-empty list of (path, label) pairs with labels ints >= 0."""
    if isinstance(root, (str, os.PathLike)):
        return
    expected = "a path or URL (str, os.PathLike), or a list of (path, label) pairs"
    if not isinstance(root, Sequence) or isinstance(root, bytes):
        raise config_error("ImageFolder", "root", root, expected)
    for item in root:
        ok = isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and len(item) == 2
        if not (ok and isinstance(item[0], (str, os.PathLike))
                and isinstance(item[1], numbers.Integral) and not isinstance(item[1], bool)
                and item[1] >= 0):
            raise config_error(
                "ImageFolder", "root", root, expected,
                f"The item {item!r} is not a (path, label >= 0) pair",
            )


def check_transform_alone(pipeline: Any, size: tuple[int, int], train: bool, normalize: Any) -> None:
    """``transform=`` decides the geometry itself: pipeline/size/train/normalize conflict."""
    given = ["pipeline"] if pipeline is not None else []
    given += [name for name, value, default in (
        ("size", size, (224, 224)), ("train", train, False), ("normalize", normalize, False),
    ) if value != default]
    if given:
        raise ConfigError(
            f"ImageFolder(transform=..., {', '.join(f'{g}=...' for g in given)}): pass either "
            f"transform or {'/'.join(given)}, not both. The transform decides the crop, flip and "
            "normalization; put them in it (T.RandomResizedCrop(224), T.Normalize(...))"
        )


def check_steps(normalize: Any, pipeline: Any) -> None:
    """``normalize`` a bool or a Normalize, ``pipeline`` an ImagePipeline or None."""
    if not isinstance(normalize, (bool, Normalize)):
        raise config_error("ImageFolder", "normalize", normalize, "True (ImageNet mean/std), False or a Normalize")
    if pipeline is not None and not isinstance(pipeline, ImagePipeline):
        raise config_error(
            "ImageFolder", "pipeline", pipeline, "an ImagePipeline or None",
            "Build one with ImagePipeline.standard(224) or ImagePipeline((Resize(256), CenterCrop(224)))",
        )
