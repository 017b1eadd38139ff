"""RandomErasing, torchvision's and timm's, with the rectangle and fill drawn per sample.

torchvision's draws its rectangle (and the normal noise of ``value="random"``) from torch's
generator; timm's draws its rectangle from Python's ``random`` and its noise from torch's.
Here both come from the sample's own generators (NOTE [augmentations draw from the sample's
generator] in :mod:`fastload.data.augment`).

Example::

    >>> erase = RandomErasing("RandomErasing", 0.25, (0.02, 0.33), (0.3, 3.3), None)
    >>> out = erase.apply(normalized_image, torch.Generator().manual_seed(3))
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torchvision.transforms.v2 import functional as F

from fastload.data.augment.base import Augment, chance, uniform


@dataclass(frozen=True)
class RandomErasing(Augment):
    """torchvision's RandomErasing (v1 and v2 draw alike): ``value`` None is "random"."""

    p: float
    scale: tuple[float, float]
    ratio: tuple[float, float]
    value: tuple[float, ...] | None

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if not chance(g, self.p):
            return image
        image = F.to_image(image).as_subclass(torch.Tensor)  # a PIL image (v2 takes one) as its tensor
        c, img_h, img_w = image.shape[-3:]
        log_ratio = torch.log(torch.tensor(self.ratio))
        area = img_h * img_w
        for _ in range(10):
            erase_area = area * uniform(g, self.scale[0], self.scale[1])
            aspect = math.exp(uniform(g, float(log_ratio[0]), float(log_ratio[1])))
            h = round(math.sqrt(erase_area * aspect))
            w = round(math.sqrt(erase_area / aspect))
            if not (h < img_h and w < img_w):
                continue
            if self.value is None:
                v = torch.empty([c, h, w], dtype=torch.float32).normal_(generator=g)
            else:
                v = torch.tensor(self.value)[:, None, None]
            i = int(torch.randint(0, img_h - h + 1, size=(1,), generator=g))
            j = int(torch.randint(0, img_w - w + 1, size=(1,), generator=g))
            return F.erase(image, i, j, h, w, v)
        return image


@dataclass(frozen=True)
class TimmRandomErasing(Augment):
    """timm's RandomErasing on one CHW image: ``mode`` "const", "rand" or "pixel", up to
    ``max_count`` rectangles; the geometry from a per-sample ``random.Random`` (timm uses
    Python's ``random``), the noise from the sample's torch generator. In place, as timm's."""

    probability: float
    min_area: float
    max_area: float
    log_aspect: tuple[float, float]
    mode: str
    min_count: int
    max_count: int

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        rng = random.Random(int(torch.randint(0, 2**62, (), generator=g)))
        return self.erase(image, rng, g)

    def erase(self, image: torch.Tensor, rng: random.Random, g: torch.Generator) -> torch.Tensor:
        """The erase with Python draws from ``rng`` and torch draws from ``g`` (timm's order)."""
        if rng.random() > self.probability:
            return image
        chan, img_h, img_w = image.shape[-3:]
        area = img_h * img_w
        count = self.min_count
        if self.min_count != self.max_count:
            count = rng.randint(self.min_count, self.max_count)
        for _ in range(count):
            for _attempt in range(10):
                target = rng.uniform(self.min_area, self.max_area) * area / count
                aspect = math.exp(rng.uniform(*self.log_aspect))
                h = round(math.sqrt(target * aspect))
                w = round(math.sqrt(target / aspect))
                if w < img_w and h < img_h:
                    top, left = rng.randint(0, img_h - h), rng.randint(0, img_w - w)
                    image[:, top:top + h, left:left + w] = self._pixels((chan, h, w), image.dtype, g)
                    break
        return image

    def _pixels(self, size: tuple[int, int, int], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
        if self.mode == "pixel":
            return torch.empty(size, dtype=dtype).normal_(generator=g)
        if self.mode == "rand":
            return torch.empty((size[0], 1, 1), dtype=dtype).normal_(generator=g)
        return torch.zeros((size[0], 1, 1), dtype=dtype)
