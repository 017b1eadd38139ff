"""Augmentations compiled to draw from the sample's own generator and run torchvision's kernels.

NOTE [augmentations draw from the sample's generator]
torchvision's random transforms draw from torch's process-wide generator (timm's from
Python's and numpy's), which threads of the training process would share with the training
loop. fastload recognises the common ones (:mod:`fastload.data.augment.registry`) and runs an
equivalent :class:`~fastload.data.augment.base.Augment`: the same draws (same calls, same
order, so the same distribution as torchvision's) from a ``torch.Generator`` seeded from the
sample's seed (:func:`fastload.data.transforms.augment_generator`), then torchvision's kernels
on the image. The same (seed, epoch, index) thus gives the same augmented sample on every
engine and worker count, and no global generator moves. This package imports torchvision:
:mod:`fastload.data.transforms` imports it only once a torchvision transform is compiled.
See docs/transforms.md and docs/engines.md.

Example::

    >>> augment, why = compile_augment(v2.TrivialAugmentWide())
    >>> out = augment.apply(image, torch.Generator().manual_seed(seed))
"""

from __future__ import annotations

from fastload.data.augment.base import Augment
from fastload.data.augment.registry import compile_augment

__all__ = ["Augment", "compile_augment"]
