"""Augmentations compiled to draw from the sample's own generator and run torchvision's kernels.

NOTE [augmentations draw from the sample's generator]
torchvision's random transforms draw from torch's process-wide generator, which threads of
the training process would share with the training loop. fastload recognises the common
ones (:mod:`fastload.data.augment.registry`) and runs an equivalent
:class:`~fastload.data.augment.base.Augment`: the same draws (same calls, same order, so the
same distribution as torchvision's) from a ``torch.Generator`` seeded from the sample's seed
(:func:`sample_generator`), then torchvision's v2 kernels on the image. The same (seed,
epoch, index) thus gives the same augmented sample on every engine and worker count, and no
global generator moves. See docs/transforms.md and docs/engines.md.

Example::

    >>> augment, why = compile_augment(v2.TrivialAugmentWide())
    >>> out = augment.apply(image, sample_generator(seed))
"""

from __future__ import annotations

import torch

from fastload.data.augment.base import Augment
from fastload.data.augment.registry import compile_augment
from fastload.data.sampling import mix_seed

_AUGMENT_STREAM = 4  # after transforms.py's torch, Python and numpy streams (1, 2, 3)


def sample_generator(seed: int) -> torch.Generator:
    """The generator a sample's compiled augmentations draw from, in order, seeded from ``seed``."""
    return torch.Generator().manual_seed(mix_seed(seed, _AUGMENT_STREAM))


__all__ = ["Augment", "compile_augment", "sample_generator"]
