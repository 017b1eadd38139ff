"""Random geometry after the crop: RandomRotation and RandomAffine, drawn per sample.

The angle, translation, scale and shear are drawn as torchvision's ``make_params`` /
``get_params`` draw them (v1 and v2 alike: the same calls in the same order), from the
sample's generator (NOTE [augmentations draw from the sample's generator] in
:mod:`fastload.data.augment`), and torchvision's v2 ``rotate`` / ``affine`` kernels run them.

Example::

    >>> RandomRotation("RandomRotation", (-15.0, 15.0), "nearest", False, None, 0).apply(image, g)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torchvision.transforms.v2 import functional as F

from fastload.data.augment.base import Augment, uniform


@dataclass(frozen=True)
class RandomRotation(Augment):
    """torchvision's RandomRotation: one angle uniform in ``degrees``."""

    degrees: tuple[float, float]
    interpolation: Any
    expand: bool
    center: Any
    fill: Any

    def apply(self, image: Any, g: torch.Generator) -> Any:
        angle = uniform(g, self.degrees[0], self.degrees[1])
        return F.rotate(image, angle, interpolation=self.interpolation, expand=self.expand,
                        center=self.center, fill=self.fill)


@dataclass(frozen=True)
class RandomAffine(Augment):
    """torchvision's RandomAffine: angle, then translation (whole pixels, rounded), scale and
    shear (x, then y when four bounds are given), each drawn only when set."""

    degrees: tuple[float, float]
    translate: tuple[float, float] | None
    scale: tuple[float, float] | None
    shear: tuple[float, ...] | None
    interpolation: Any
    center: Any
    fill: Any

    def apply(self, image: Any, g: torch.Generator) -> Any:
        height, width = F.get_size(image)
        angle = uniform(g, self.degrees[0], self.degrees[1])
        move = [0, 0]
        if self.translate is not None:
            max_dx, max_dy = float(self.translate[0] * width), float(self.translate[1] * height)
            move = [round(uniform(g, -max_dx, max_dx)), round(uniform(g, -max_dy, max_dy))]
        scale = 1.0 if self.scale is None else uniform(g, self.scale[0], self.scale[1])
        shear = [0.0, 0.0]
        if self.shear is not None:
            shear[0] = uniform(g, self.shear[0], self.shear[1])
            if len(self.shear) == 4:
                shear[1] = uniform(g, self.shear[2], self.shear[3])
        return F.affine(image, angle=angle, translate=move, scale=scale, shear=shear,
                        interpolation=self.interpolation, fill=self.fill, center=self.center)
