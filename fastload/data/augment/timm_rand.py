"""timm's RandAugment (``rand-m9-mstd0.5-inc1`` and kin) with its draws made per sample.

timm's RandAugment picks its ops with numpy's global ``np.random.choice`` and each op draws
from Python's global ``random`` (apply or not, magnitude noise, sign, the resampling filter
of a geometric op), then runs one of timm's PIL functions. :class:`TimmRandAugment` makes the
same draws in the same order from a per-sample ``random.Random`` (seeded from the sample's
generator; with ``augment``, from a ``random.Random`` and a ``numpy.random.RandomState``
standing for timm's globals) and calls timm's own op functions (``op.aug_fn``) with the filter
already chosen, so they draw nothing themselves. The ops are picked uniformly with
replacement, as timm's unweighted ``np.random.choice``; ``apply`` draws those picks from the
``random.Random`` too (the same distribution, without a 0.1 ms RandomState per sample).
Magnitude-to-argument rules (:func:`level_args`) follow timm's ``LEVEL_TO_ARG``. A geometric
op whose filter is BILINEAR, on an RGB image, runs fastload's kernel on the matrix timm's
function would hand Pillow instead: the same bytes in half to two thirds of the time
(NOTE [a bilinear affine] in :mod:`fastload.data.augment.affine`).

Example::

    >>> aug = TimmRandAugment.of(rand_augment_transform("rand-m9-mstd0.5-inc1", {}))
    >>> out = aug.apply(pil_image, torch.Generator().manual_seed(5))
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from fastload.data.augment import affine
from fastload.data.augment.base import Augment

_DENOM = 10.0  # timm's magnitude scale: M10 is the full range
_GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
_ENHANCE = {"Color", "Contrast", "Brightness", "Sharpness"}
KNOWN_OPS = (_GEOMETRIC | _ENHANCE | {f"{n}Increasing" for n in _ENHANCE}
             | {"AutoContrast", "Equalize", "Invert", "Posterize", "PosterizeIncreasing",
                "PosterizeOriginal", "Solarize", "SolarizeIncreasing", "SolarizeAdd"})


# timm.data.auto_augment's geometric functions, by name: the matrix each hands to Image.transform
# for (image size, its argument); rotate's is Image.rotate's (fastload.data.augment.affine).
_TIMM_MATRICES = {
    "shear_x": lambda size, factor: (1, factor, 0, 0, 1, 0),
    "shear_y": lambda size, factor: (1, 0, 0, factor, 1, 0),
    "translate_x_rel": lambda size, pct: (1, 0, pct * size[0], 0, 1, 0),
    "translate_y_rel": lambda size, pct: (1, 0, 0, 0, 1, pct * size[1]),
    "translate_x_abs": lambda size, pixels: (1, 0, pixels, 0, 1, 0),
    "translate_y_abs": lambda size, pixels: (1, 0, 0, 0, 1, pixels),
    "rotate": affine.rotate_matrix,
}


def bilinear_affine(fn: Any, img: Any, arg: float, fill: Any) -> Any:
    """timm's geometric ``fn(img, arg, fillcolor=fill, resample=BILINEAR)`` by fastload's
    kernel (NOTE [a bilinear affine]): the same pixels; None where ``fn`` must run instead
    (not one of timm's functions, not an RGB PIL image, no extension, a Pillow fast path)."""
    known = getattr(fn, "__module__", None) == "timm.data.auto_augment"
    matrix_of = _TIMM_MATRICES.get(getattr(fn, "__name__", "")) if known else None
    if matrix_of is None or not isinstance(img, Image.Image) or img.mode != "RGB":
        return None
    matrix = matrix_of(img.size, arg)
    return None if matrix is None else affine.affine(img, matrix, fill)


def _negate(rng: random.Random, value: float) -> float:
    return -value if rng.random() > 0.5 else value


def level_args(name: str, level: float, hparams: dict[str, Any], rng: random.Random) -> tuple[Any, ...]:
    """The op's arguments for magnitude ``level`` (0..10), drawing its sign from ``rng``."""
    frac = level / _DENOM
    if name in ("AutoContrast", "Equalize", "Invert"):
        return ()
    if name == "Rotate":
        return (_negate(rng, frac * 30.0),)
    if name in ("ShearX", "ShearY"):
        return (_negate(rng, frac * 0.3),)
    if name in ("TranslateX", "TranslateY"):
        return (_negate(rng, frac * float(hparams["translate_const"])),)
    if name in ("TranslateXRel", "TranslateYRel"):
        return (_negate(rng, frac * hparams.get("translate_pct", 0.45)),)
    if name in _ENHANCE:
        return (frac * 1.8 + 0.1,)
    if name.endswith("Increasing") and name[: -len("Increasing")] in _ENHANCE:
        return (max(0.1, 1.0 + _negate(rng, frac * 0.9)),)
    bits = int(frac * 4)
    solarize = min(256, int(frac * 256))
    return {"Posterize": (bits,), "PosterizeIncreasing": (4 - bits,), "PosterizeOriginal": (bits + 4,),
            "Solarize": (solarize,), "SolarizeIncreasing": (256 - solarize,),
            "SolarizeAdd": (min(128, int(frac * 110)),)}[name]


@dataclass(frozen=True)
class Op:
    """One of timm's AugmentOps, as its public attributes give it."""

    name: str
    prob: float
    magnitude: float
    magnitude_std: float
    magnitude_max: float | None
    hparams: tuple[tuple[str, Any], ...]
    fill: Any
    resample: Any  # a PIL filter, or a sequence of them drawn from per call
    fn: Any  # timm's op function (op.aug_fn), e.g. timm.data.auto_augment.rotate

    def run(self, img: Any, rng: random.Random) -> Any:
        """timm's AugmentOp.__call__'s draws, in its order, from ``rng``; then timm's function
        (a geometric one with BILINEAR on an RGB image by :func:`bilinear_affine`)."""
        if self.prob < 1.0 and rng.random() > self.prob:
            return img
        magnitude = self.magnitude
        if self.magnitude_std == float("inf"):
            magnitude = rng.uniform(0, magnitude)
        elif self.magnitude_std > 0:
            magnitude = rng.gauss(magnitude, self.magnitude_std)
        magnitude = max(0.0, min(magnitude, self.magnitude_max or _DENOM))
        args = level_args(self.name, magnitude, dict(self.hparams), rng)
        if self.name not in _GEOMETRIC:
            return self.fn(img, *args)
        resample = self.resample
        if isinstance(resample, (list, tuple)):
            resample = rng.choice(resample)
        if resample == Image.Resampling.BILINEAR:  # NOTE [a bilinear affine]: no draws in it
            fast = bilinear_affine(self.fn, img, args[0], self.fill)
            if fast is not None:
                return fast
        return self.fn(img, *args, fillcolor=self.fill, resample=resample)


@dataclass(frozen=True)
class TimmRandAugment(Augment):
    """timm's RandAugment: ``num_layers`` ops chosen by numpy (with replacement unless
    weighted), each run as :class:`Op` does; on a PIL image (a tensor is taken as one)."""

    ops: tuple[Op, ...]
    num_layers: int
    weights: tuple[float, ...] | None

    @staticmethod
    def of(step: Any) -> TimmRandAugment:
        """From a ``timm.data.auto_augment.RandAugment``; ValueError for an op it does not know."""
        ops = []
        for op in step.ops:
            if op.name not in KNOWN_OPS:
                raise ValueError(f"timm op {op.name} is not compiled")
            ops.append(Op(op.name, float(op.prob), float(op.magnitude), float(op.magnitude_std),
                          op.magnitude_max, tuple(sorted(op.hparams.items())), op.kwargs["fillcolor"],
                          op.kwargs["resample"], op.aug_fn))
        weights = None if step.choice_weights is None else tuple(float(w) for w in step.choice_weights)
        return TimmRandAugment(type(step).__name__, tuple(ops), int(step.num_layers), weights)

    def apply(self, image: Any, g: torch.Generator) -> Any:
        rng = random.Random(int(torch.randint(0, 2**62, (), generator=g)))
        if self.weights is None:  # timm's choice with replacement: uniform picks, from rng
            # (a numpy RandomState per sample costs 0.1 ms, a tenth of the whole augmentation)
            return self._run(image, [rng.randrange(len(self.ops)) for _ in range(self.num_layers)], rng)
        return self.augment(image, rng, np.random.RandomState(rng.getrandbits(32)))

    def augment(self, image: Any, rng: random.Random, choices: np.random.RandomState) -> Any:
        """The augmentation with ``choices`` for timm's np.random and ``rng`` for its random."""
        picked = choices.choice(len(self.ops), self.num_layers, replace=self.weights is None,
                                p=None if self.weights is None else list(self.weights))
        return self._run(image, [int(k) for k in picked], rng)

    def _run(self, image: Any, picked: list[int], rng: random.Random) -> Any:
        if isinstance(image, torch.Tensor):
            from torchvision.transforms.v2 import functional as F

            image = F.to_pil_image(image)
        for k in picked:
            image = self.ops[k].run(image, rng)
        return image
