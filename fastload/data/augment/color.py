"""Colour augmentations: ColorJitter, RandomGrayscale, GaussianBlur and the random-apply ones.

Each draws what torchvision's class draws, in its order (NOTE [augmentations draw from the
sample's generator] in :mod:`fastload.data.augment`), and runs torchvision's v2 kernel
(GaussianBlur on uint8: the same blur in two 1-D passes, NOTE [a separable blur]).

Example::

    >>> jitter = ColorJitter("ColorJitter", (0.6, 1.4), (0.6, 1.4), (0.6, 1.4), None)
    >>> out = jitter.apply(image, torch.Generator().manual_seed(3))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torchvision.transforms.v2 import functional as F

from fastload.data.augment.base import Augment, chance, uniform
from fastload.data.augment.blur import gaussian_blur


@dataclass(frozen=True)
class ColorJitter(Augment):
    """torchvision's ColorJitter: the four factors in an order drawn by ``randperm(4)``.

    Each range is (low, high) or None (that part is off); torchvision draws the order, then
    brightness, contrast, saturation, hue (each only when on), then applies them in that order.
    """

    brightness: tuple[float, float] | None
    contrast: tuple[float, float] | None
    saturation: tuple[float, float] | None
    hue: tuple[float, float] | None

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        order = torch.randperm(4, generator=g).tolist()
        ranges = (self.brightness, self.contrast, self.saturation, self.hue)
        factors = [None if r is None else uniform(g, r[0], r[1]) for r in ranges]
        kernels = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
        for k in order:
            if factors[k] is not None:
                image = kernels[k](image, factors[k])
        return image


@dataclass(frozen=True)
class Chance(Augment):
    """A kernel applied with probability ``p`` (RandomGrayscale, RandomSolarize,
    RandomPosterize, RandomEqualize, RandomAutocontrast, RandomInvert, RandomAdjustSharpness):
    one ``torch.rand(1)`` draw, nothing else."""

    p: float
    kernel: Callable[..., torch.Tensor]
    kwargs: tuple[tuple[str, Any], ...] = field(default=())

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if not chance(g, self.p):
            return image
        return self.kernel(image, **dict(self.kwargs))


def grayscale(image: torch.Tensor) -> torch.Tensor:
    """RandomGrayscale's kernel: grey with as many channels as the image has."""
    return F.rgb_to_grayscale(image, num_output_channels=F.get_dimensions(image)[0])


@dataclass(frozen=True)
class GaussianBlur(Augment):
    """torchvision's GaussianBlur: sigma uniform in ``sigma``, the same on both axes."""

    kernel_size: tuple[int, int]
    sigma: tuple[float, float]

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        s = uniform(g, self.sigma[0], self.sigma[1])
        return gaussian_blur(image, self.kernel_size, (s, s))
