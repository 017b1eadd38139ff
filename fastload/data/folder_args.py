"""The checks of ``ImageFolder``'s arguments that need more than :mod:`fastload.arguments`,
and the decode they resolve to (:func:`decode_steps`).

Each check raises :class:`~fastload.errors.ConfigError` naming the argument, what it got, and
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
from fastload.data.folder_rules import is_default_loader
from fastload.data.pipeline import ImagePipeline, Normalize
from fastload.data.transforms import CompiledTransform, compile_transform
from fastload.errors import ConfigError


def check_root(root: Any, is_valid_file: Any = None) -> None:
    """A path or URL, or a non-empty list of (path, label) pairs with labels ints >= 0 (and
    then no ``is_valid_file``, which chooses among a listed root's files)."""
    if isinstance(root, (str, os.PathLike)):
        return
    if is_valid_file is not None:
        raise ConfigError(
            "ImageFolder([(path, label), ...], is_valid_file=...): is_valid_file chooses among "
            "the files of a listed root; filter the list itself instead"
        )
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


def _decode_args(pipeline: Any, size: tuple[int, int], train: bool, normalize: Any) -> list[str]:
    """Which of the declared decode's arguments were given (not left at their defaults)."""
    given = ["pipeline"] if pipeline is not None else []
    return given + [name for name, value, default in (
        ("size", size, (224, 224)), ("train", train, False), ("normalize", normalize, False),
    ) if value != default]


def check_transform_alone(pipeline: Any, size: tuple[int, int], train: bool, normalize: Any) -> None:
    """``transform=`` decides the geometry itself: pipeline/size/train/normalize conflict."""
    given = _decode_args(pipeline, size, train, normalize)
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


def check_callables(**given: Any) -> None:
    """Each of ``given`` (``target_transform``, ``loader``...) a callable, or None."""
    for name, value in given.items():
        if value is not None and not callable(value):
            raise config_error("ImageFolder", name, value, "a callable, or None")


def check_loader_alone(loader: Any, pipeline: Any, size: tuple[int, int], train: bool, normalize: Any,
                       cache: Any) -> None:
    """A custom ``loader=`` decodes each sample itself: the declared decode's arguments and
    a cache (which it would not read through) conflict with it."""
    given = _decode_args(pipeline, size, train, normalize)
    if cache is not None:
        given.append("cache")
    if given:
        name = getattr(loader, "__qualname__", type(loader).__name__)
        raise ConfigError(
            f"ImageFolder(loader={name}, {', '.join(f'{g}=...' for g in given)}): a custom "
            f"loader reads and decodes each file itself, so {'/'.join(given)} would not apply. "
            "Put the crop and normalization in transform=, or drop loader= to use fastload's "
            "decode (and its cache)"
        )


def decode_steps(
    loader: Any, transform: Any, pipeline: ImagePipeline | None, size: tuple[int, int], train: bool,
    normalize: Any, cache: Any,
) -> tuple[ImagePipeline, CompiledTransform | None]:
    """The declared pipeline and compiled transform of these arguments, checked together.

    A custom ``loader`` decodes itself (an empty pipeline; ``transform`` runs on its
    output as it is); a ``transform`` compiles into the decode; else ``pipeline`` or the
    standard one of ``size/train/normalize``.
    """
    if not is_default_loader(loader):
        check_loader_alone(loader, pipeline, size, train, normalize, cache)
        return ImagePipeline(()), None
    if transform is not None:
        check_transform_alone(pipeline, size, train, normalize)
        compiled = compile_transform(transform)
        return compiled.pipeline, compiled
    return pipeline or ImagePipeline.standard(size, train=train, normalize=normalize), None
