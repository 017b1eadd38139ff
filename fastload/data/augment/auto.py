"""The automatic augmentations: RandAugment, TrivialAugmentWide, AutoAugment (ImageNet), AugMix.

Each draws its ops, magnitudes and signs as torchvision v2's ``forward`` does (the same calls,
in the same order, on the sample's generator: NOTE [augmentations draw from the sample's
generator] in :mod:`fastload.data.augment`) from the same magnitude tables (the papers'
ranges, as torchvision spaces them), and applies them with torchvision's v2 kernels
(:func:`apply_op`). v1's classes draw the same distributions with other calls.

Example::

    >>> out = RandAugment("RandAugment", 2, 9, 31, "nearest", None).apply(image, g)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torchvision.transforms.v2 import functional as F

from fastload.data.augment.base import Augment, randint

# (num_bins, height, width) -> the magnitudes (None: the op has none), and whether signed.
Space = dict[str, tuple[Callable[[int, int, int], torch.Tensor | None], bool]]


def _linear(top: float) -> Callable[[int, int, int], torch.Tensor]:
    return lambda bins, h, w: torch.linspace(0.0, top, bins)


def _posterize(top: int, span: int) -> Callable[[int, int, int], torch.Tensor]:
    return lambda bins, h, w: (top - (torch.arange(bins) / ((bins - 1) / span))).round().int()


def _none(bins: int, h: int, w: int) -> None:
    return None


_SOLARIZE = (lambda bins, h, w: torch.linspace(1.0, 0.0, bins), False)
_TAIL: Space = {"AutoContrast": (_none, False), "Equalize": (_none, False)}

RAND_AUGMENT: Space = {
    "Identity": (_none, False),
    "ShearX": (_linear(0.3), True), "ShearY": (_linear(0.3), True),
    "TranslateX": (lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * w, bins), True),
    "TranslateY": (lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * h, bins), True),
    "Rotate": (_linear(30.0), True),
    "Brightness": (_linear(0.9), True), "Color": (_linear(0.9), True),
    "Contrast": (_linear(0.9), True), "Sharpness": (_linear(0.9), True),
    "Posterize": (_posterize(8, 4), False), "Solarize": _SOLARIZE, **_TAIL,
}
TRIVIAL_WIDE: Space = {
    "Identity": (_none, False),
    "ShearX": (_linear(0.99), True), "ShearY": (_linear(0.99), True),
    "TranslateX": (_linear(32.0), True), "TranslateY": (_linear(32.0), True),
    "Rotate": (_linear(135.0), True),
    "Brightness": (_linear(0.99), True), "Color": (_linear(0.99), True),
    "Contrast": (_linear(0.99), True), "Sharpness": (_linear(0.99), True),
    "Posterize": (_posterize(8, 6), False), "Solarize": _SOLARIZE, **_TAIL,
}
AUTO_AUGMENT: Space = {k: v for k, v in RAND_AUGMENT.items() if k != "Identity"}
AUTO_AUGMENT["Invert"] = (_none, False)
AUGMIX_PARTIAL: Space = {
    "ShearX": (_linear(0.3), True), "ShearY": (_linear(0.3), True),
    "TranslateX": (lambda bins, h, w: torch.linspace(0.0, w / 3.0, bins), True),
    "TranslateY": (lambda bins, h, w: torch.linspace(0.0, h / 3.0, bins), True),
    "Rotate": (_linear(30.0), True), "Posterize": (_posterize(4, 4), False),
    "Solarize": _SOLARIZE, **_TAIL,
}
AUGMIX_ALL: Space = {
    **AUGMIX_PARTIAL,
    "Brightness": (_linear(0.9), True), "Color": (_linear(0.9), True),
    "Contrast": (_linear(0.9), True), "Sharpness": (_linear(0.9), True),
}

# AutoAugment's ImageNet policy (Cubuk et al. 2018): pairs of (op, probability, magnitude bin).
IMAGENET_POLICY: tuple[tuple[tuple[str, float, int | None], ...], ...] = tuple(
    tuple((op, p, m) for op, p, m in pair) for pair in (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    )
)


def apply_op(image: torch.Tensor, op: str, magnitude: float, interpolation: Any, fill: Any) -> torch.Tensor:
    """One op with torchvision's v2 kernel, as torchvision's auto augmentations call it."""
    if op == "Identity":
        return image
    if op in ("ShearX", "ShearY"):
        degrees = math.degrees(math.atan(magnitude))
        shear = [degrees, 0.0] if op == "ShearX" else [0.0, degrees]
        return F.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=shear,
                        interpolation=interpolation, fill=fill, center=[0, 0])
    if op in ("TranslateX", "TranslateY"):
        move = [int(magnitude), 0] if op == "TranslateX" else [0, int(magnitude)]
        return F.affine(image, angle=0.0, translate=move, scale=1.0, interpolation=interpolation,
                        shear=[0.0, 0.0], fill=fill)
    if op == "Rotate":
        return F.rotate(image, angle=magnitude, interpolation=interpolation, fill=fill)
    adjust = {"Brightness": F.adjust_brightness, "Color": F.adjust_saturation,
              "Contrast": F.adjust_contrast, "Sharpness": F.adjust_sharpness}
    if op in adjust:
        return adjust[op](image, 1.0 + magnitude)
    if op == "Posterize":
        return F.posterize(image, bits=int(magnitude))
    if op == "Solarize":
        bound = 1.0 if isinstance(image, torch.Tensor) and image.dtype.is_floating_point else 255.0
        return F.solarize(image, threshold=bound * magnitude)
    plain = {"AutoContrast": F.autocontrast, "Equalize": F.equalize, "Invert": F.invert}
    return plain[op](image)


def _signed(g: torch.Generator, magnitude: float, signed: bool) -> float:
    return -magnitude if signed and torch.rand((), generator=g) <= 0.5 else magnitude


@dataclass(frozen=True)
class _Auto(Augment):
    interpolation: Any
    fill: Any

    def op(self, image: torch.Tensor, g: torch.Generator, space: Space, bins: int,
           pick: Callable[[], int]) -> torch.Tensor:
        """A random op of ``space``: its magnitude the ``pick()``-th of ``bins``, its sign drawn."""
        names = tuple(space)
        name = names[randint(g, len(names))]
        fn, signed = space[name]
        height, width = F.get_size(image)
        magnitudes = fn(bins, height, width)
        magnitude = 0.0 if magnitudes is None else _signed(g, float(magnitudes[pick()]), signed)
        return apply_op(image, name, magnitude, self.interpolation, self.fill)


@dataclass(frozen=True)
class RandAugment(_Auto):
    """torchvision's RandAugment: ``num_ops`` ops, each magnitude bin ``magnitude`` of ``bins``."""

    num_ops: int = 2
    magnitude: int = 9
    bins: int = 31

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        for _ in range(self.num_ops):
            image = self.op(image, g, RAND_AUGMENT, self.bins, lambda: self.magnitude)
        return image


@dataclass(frozen=True)
class TrivialAugmentWide(_Auto):
    """torchvision's TrivialAugmentWide: one op, its magnitude bin uniform in [0, bins)."""

    bins: int = 31

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return self.op(image, g, TRIVIAL_WIDE, self.bins, lambda: randint(g, self.bins))


@dataclass(frozen=True)
class AutoAugment(_Auto):
    """torchvision's AutoAugment with the ImageNet policy: a random pair, each op with its
    probability, its magnitude the policy's bin of 10, its sign drawn."""

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        height, width = F.get_size(image)
        for name, probability, bin_ in IMAGENET_POLICY[randint(g, len(IMAGENET_POLICY))]:
            if not torch.rand((), generator=g) <= probability:
                continue
            fn, signed = AUTO_AUGMENT[name]
            magnitudes = fn(10, height, width)
            magnitude = 0.0 if magnitudes is None else _signed(g, float(magnitudes[bin_]), signed)
            image = apply_op(image, name, magnitude, self.interpolation, self.fill)
        return image


@dataclass(frozen=True)
class AugMix(_Auto):
    """torchvision's AugMix: ``width`` chains of 1-3 ops (or ``depth``) mixed with Dirichlet
    weights, then mixed with the image; the arithmetic in torchvision's order (float, then cast)."""

    severity: int = 3
    width: int = 3
    depth: int = -1
    alpha: float = 1.0
    all_ops: bool = True

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        space = AUGMIX_ALL if self.all_ops else AUGMIX_PARTIAL
        original, image = image, F.to_image(image).as_subclass(torch.Tensor)  # PIL: mixed as a tensor
        dims = list(image.shape)
        batch = image.reshape([1] * max(4 - image.ndim, 0) + dims)
        shape = [batch.size(0)] + [1] * (batch.ndim - 1)
        m = torch._sample_dirichlet(torch.tensor([self.alpha, self.alpha]).expand(shape[0], -1), generator=g)
        weights = torch._sample_dirichlet(
            torch.tensor([self.alpha] * self.width).expand(shape[0], -1), generator=g
        ) * m[:, 1].reshape([shape[0], -1])
        mix = m[:, 0].reshape(shape) * batch
        for i in range(self.width):
            aug = batch
            depth = self.depth if self.depth > 0 else int(torch.randint(1, 4, (1,), generator=g).item())
            for _ in range(depth):
                aug = self.op(aug, g, space, 10, lambda: randint(g, self.severity))
            mix.add_(weights[:, i].reshape(shape) * aug)
        mix = mix.reshape(dims).to(dtype=image.dtype)
        return mix if isinstance(original, torch.Tensor) else F.to_pil_image(mix)
