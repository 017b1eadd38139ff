"""A recipe's "to tensor, to float, Normalize" as one table lookup per pixel.

NOTE [a float table]
torchvision's reference recipe puts ``PILToTensor(), ToDtype(float32, scale=True),
Normalize(mean, std)`` between its augmentations and ``RandomErasing``, so the Normalize is not
the last step and cannot move to the device. torch runs the block as four passes over the
image, each writing a new float buffer (about 360 us for a 224x224 image here). But each
output float depends only on one uint8 value and its channel: there are 3 x 256 of them. So
fastload runs the user's own block once on a ramp image (each channel holding 0..255) at
compile time, keeps the 3 x 256 floats, and looks each pixel up (:mod:`fastload.data._pixels`,
one pass, HWC PIL bytes or a CHW tensor in, CHW float out; 50-90 us). The table holds the
very floats the steps produce for each value (elementwise IEEE float32 arithmetic does not
depend on the image's size), so the output equals the steps' bit for bit; tests/test_augment.py
checks it against torchvision's own steps. Only exact torchvision classes join a block
(conversions fastload stands in for, and ``Normalize`` itself, not a subclass that may override
it); any other image (not 3-channel RGB, not uint8, no compiled extension) runs the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

try:
    from fastload.data import _pixels
except ImportError:  # an optional extension: without a compiler the steps run as they are
    _pixels = None

CHANNELS = 3


@dataclass(frozen=True)
class FloatTable:
    """Stands for ``steps``, a pointwise block from uint8 (PIL or tensor) to float CHW.

    ``steps`` are what runs without a table (fastload's stand-ins for the conversions, the
    user's Normalize); the table is made from the user's own steps (``user_step`` of a
    stand-in) on a ramp of the kind of image the block is given, on its first call.

    Example::

        >>> block = FloatTable((ToUint8Tensor(v2.PILToTensor()), ToFloat(to_dtype), normalize))
        >>> torch.equal(block(pil_image), normalize(to_dtype(v2.PILToTensor()(pil_image))))
        True
    """

    steps: tuple[Callable[[Any], Any], ...]
    tables: dict[bool, np.ndarray | None] = field(default_factory=dict, compare=False, repr=False)

    @property
    def names(self) -> list[str]:
        """The user's steps this block stands for (conversions left out), for messages."""
        return [type(s).__name__ for s in self.steps if type(s).__module__.startswith("torchvision")]

    def table(self, pil: bool) -> np.ndarray | None:
        """The 3 x 256 floats of the user's steps given a PIL image (``pil``) or a tensor,
        or None where they do not make a float32 image of the ramp's shape."""
        if pil not in self.tables:  # two threads may both make it: the same floats
            self.tables[pil] = _table_of([getattr(s, "user_step", None) or s for s in self.steps], pil)
        return self.tables[pil]

    def __call__(self, image: Any) -> Any:
        pixels, hwc = _pixels_of(image)
        table = self.table(hwc) if pixels is not None and _pixels is not None else None
        if table is None:
            for step in self.steps:
                image = step(image)
            return image
        out = torch.empty((CHANNELS, *pixels.shape[:2]) if hwc else pixels.shape, dtype=torch.float32)
        _pixels.lookup(pixels, out.numpy(), table, CHANNELS, hwc)
        return out


def _table_of(steps: Sequence[Callable[[Any], Any]], pil: bool) -> np.ndarray | None:
    ramp = np.tile(np.arange(256, dtype=np.uint8)[None, :, None], (1, 1, CHANNELS))  # HWC (1, 256, 3)
    out: Any = Image.fromarray(ramp) if pil else torch.from_numpy(ramp.transpose(2, 0, 1).copy())
    try:
        for step in steps:
            out = step(out)
    except Exception:  # noqa: BLE001 - a step that refuses this kind of input: the steps run as-is
        return None
    if not (isinstance(out, torch.Tensor) and out.dtype == torch.float32 and tuple(out.shape) == (CHANNELS, 1, 256)):
        return None
    return np.ascontiguousarray(out.as_subclass(torch.Tensor)[:, 0, :].numpy())


def _pixels_of(image: Any) -> tuple[np.ndarray | None, bool]:
    """An RGB image's uint8 pixels as a C-contiguous array and whether they are HWC, or None."""
    if isinstance(image, Image.Image):
        return (np.asarray(image), True) if image.mode == "RGB" else (None, True)
    plain = isinstance(image, torch.Tensor) and type(image) is torch.Tensor  # not a tv_tensors subclass
    if plain and image.dtype == torch.uint8 and image.dim() == 3 and image.shape[0] == CHANNELS:
        return image.contiguous().numpy(), False
    return None, False


def fuse(steps: list[Any], is_conversion: Callable[[Any], bool], is_to_float: Callable[[Any], bool],
         is_normalize: Callable[[Any], bool]) -> list[Any]:
    """``steps`` with each run of conversions holding a "to float" (and an exact Normalize
    right after it) replaced by one :class:`FloatTable` (NOTE [a float table])."""
    out: list[Any] = []
    i = 0
    while i < len(steps):
        j = i
        while j < len(steps) and is_conversion(steps[j]):
            j += 1
        if j > i and any(is_to_float(s) for s in steps[i:j]):
            j += 1 if j < len(steps) and is_normalize(steps[j]) else 0
            out.append(FloatTable(tuple(steps[i:j])))
            i = j
        else:
            out.append(steps[i])
            i += 1
    return out
