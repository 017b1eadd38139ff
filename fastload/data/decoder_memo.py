"""The decoder choice, measured once per process for JPEGs of the same sizes.

NOTE [one decoder measurement per process]
:func:`fastload.data.decoders.choose` spends up to 0.3 s timing every decoder on a loader's
first samples, before its first batch. A script builds more than one loader over the same
images: a validation loader beside the training one, Lightning's loaders rebuilt each epoch
(``reload_dataloaders_every_n_epochs``), a benchmark's fresh loaders; each would pay it
again for the same verdict, and on a first epoch of a thousand images that is a quarter of
it. So the verdict is kept for the process, keyed on what decides it: the output size and
the samples' (width, height, format, mode); a loader over JPEGs of other sizes measures
afresh. The reason says the figures are from an earlier loader of this process.

Example::

    >>> first = choose_once(samples, out_size=(224, 224))      # measures
    >>> again = choose_once(samples, out_size=(224, 224))      # the same verdict, no timing
    >>> again.reason.endswith("(measured by an earlier loader in this process)")
    True
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from PIL import Image

from fastload.data import decoders

_REMEMBERED = " (measured by an earlier loader in this process)"
_choices: dict[tuple[object, ...], decoders.DecoderChoice] = {}
_lock = threading.Lock()


def _key(samples: Sequence[bytes], out_size: tuple[int, int]) -> tuple[object, ...] | None:
    shapes = set()
    for data in samples:
        try:
            header = decoders.read_header(data)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, decoders.Unsupported):
            continue
        shapes.add((header.width, header.height, header.format, header.mode))
    return (tuple(out_size), tuple(sorted(shapes))) if shapes else None


def choose_once(
    samples: Sequence[bytes], *, out_size: tuple[int, int] = (224, 224)
) -> decoders.DecoderChoice:
    """:func:`decoders.choose` on these samples, or its earlier verdict in this process for
    samples of the same sizes (NOTE [one decoder measurement per process])."""
    key = _key(samples, out_size)
    with _lock:
        known = _choices.get(key) if key is not None else None
    if known is not None:
        return known
    choice = decoders.choose(samples, out_size=out_size)
    if key is not None and choice.ms_per_image:  # a verdict with figures, not a fallback
        with _lock:
            _choices.setdefault(key, dataclasses.replace(choice, reason=choice.reason + _REMEMBERED))
    return choice


def forget() -> None:
    """Drop the kept verdicts: the next loader measures again."""
    with _lock:
        _choices.clear()
