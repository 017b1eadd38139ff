"""Which torchvision and timm augmentation classes fastload compiles, and into what.

:func:`compile_augment` looks at one step of a user's transform: an instance of exactly one
of the classes below (a subclass may override ``forward``: it runs as the user wrote it)
becomes an :class:`~fastload.data.augment.base.Augment` built from the step's public
attributes, or None with the reason it is not compiled. The classes are looked up in
``sys.modules`` only (a script that built them has imported them).

Example::

    >>> compile_augment(v2.ColorJitter(0.4, 0.4, 0.4))
    (ColorJitter(name='ColorJitter', brightness=(0.6, 1.4), ...), '')
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fastload.data.augment import auto, color, erasing, geometry, timm_rand
from fastload.data.augment.base import Augment, RandomApply, RandomChoice, RandomOrder, pair

Builder = Callable[[Any], Augment]


def _jitter(step: Any) -> Augment:
    return color.ColorJitter(type(step).__name__, pair(step.brightness), pair(step.contrast),
                             pair(step.saturation), pair(step.hue))


def _chance(kernel_name: str, *args: str) -> Builder:
    def build(step: Any) -> Augment:
        from torchvision.transforms.v2 import functional as F

        kernel = color.grayscale if kernel_name == "grayscale" else getattr(F, kernel_name)
        kwargs = tuple((a, getattr(step, a)) for a in args)
        if kernel_name == "adjust_sharpness":
            kwargs = (("sharpness_factor", step.sharpness_factor),)
        return color.Chance(type(step).__name__, float(step.p), kernel, kwargs)
    return build


def _blur(step: Any) -> Augment:
    size = step.kernel_size
    size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    return color.GaussianBlur(type(step).__name__, size, (float(step.sigma[0]), float(step.sigma[1])))


def _erasing(step: Any) -> Augment:
    value = step.value
    if isinstance(value, str):  # v1's "random"
        value = None
    elif isinstance(value, (int, float)):
        value = [float(value)]
    values = None if value is None else tuple(float(v) for v in value)
    return erasing.RandomErasing(type(step).__name__, float(step.p), pair(step.scale), pair(step.ratio), values)


def _fill(step: Any) -> Any:
    if isinstance(step.fill, dict):
        raise TypeError("a per-type fill dictionary")
    return step.fill


def _rand(step: Any) -> Augment:
    return auto.RandAugment(type(step).__name__, step.interpolation, _fill(step), int(step.num_ops),
                            int(step.magnitude), int(step.num_magnitude_bins))


def _trivial(step: Any) -> Augment:
    return auto.TrivialAugmentWide(type(step).__name__, step.interpolation, _fill(step),
                                   int(step.num_magnitude_bins))


def _autoaugment(step: Any) -> Augment:
    if getattr(step.policy, "name", step.policy) != "IMAGENET":
        raise ValueError(f"policy {step.policy}: fastload compiles the ImageNet policy only")
    return auto.AutoAugment(type(step).__name__, step.interpolation, _fill(step))


def _augmix(step: Any) -> Augment:
    return auto.AugMix(type(step).__name__, step.interpolation, _fill(step), int(step.severity),
                       int(step.mixture_width), int(step.chain_depth), float(step.alpha), bool(step.all_ops))


def _timm_erasing(step: Any) -> Augment:
    if str(getattr(step, "device", "cpu")) != "cpu":
        raise ValueError(f"device={step.device!r}: fastload erases on the CPU (timm's create_transform passes 'cpu')")
    low, high = step.log_aspect_ratio
    return erasing.TimmRandomErasing(
        type(step).__name__, float(step.probability), float(step.min_area), float(step.max_area),
        (float(low), float(high)), str(step.mode), int(step.min_count), int(step.max_count),
    )


def _inner(step: Any) -> tuple[Augment, ...]:
    """A container's steps, each compiled; ValueError naming the first that is not."""
    inner = []
    for t in step.transforms:
        augment, why = compile_augment(t)
        if augment is None:
            raise ValueError(f"its {type(t).__name__} is not compiled{f' ({why})' if why else ''}")
        inner.append(augment)
    return tuple(inner)


def _random_apply(step: Any) -> Augment:
    return RandomApply(type(step).__name__, float(step.p), _inner(step))


def _random_choice(step: Any) -> Augment:
    weights = [1.0] * len(step.transforms) if step.p is None else [float(w) for w in step.p]
    total = sum(weights)
    return RandomChoice(type(step).__name__, tuple(w / total for w in weights), _inner(step))


def _random_order(step: Any) -> Augment:
    return RandomOrder(type(step).__name__, _inner(step))


def _rotation(step: Any) -> Augment:
    return geometry.RandomRotation(type(step).__name__, pair(step.degrees), step.interpolation,
                                   bool(step.expand), step.center, _fill(step))


def _affine(step: Any) -> Augment:
    shear = None if step.shear is None else tuple(float(v) for v in step.shear)
    translate = None if step.translate is None else pair(step.translate)
    return geometry.RandomAffine(type(step).__name__, pair(step.degrees), translate, pair(step.scale),
                                 shear, step.interpolation, step.center, _fill(step))


_TORCHVISION: dict[str, Builder] = {  # by class name, in torchvision.transforms and .v2
    "RandomApply": _random_apply,
    "RandomChoice": _random_choice,
    "RandomOrder": _random_order,
    "RandomRotation": _rotation,
    "RandomAffine": _affine,
    "ColorJitter": _jitter,
    "RandomGrayscale": _chance("grayscale"),
    "RandomSolarize": _chance("solarize", "threshold"),
    "RandomPosterize": _chance("posterize", "bits"),
    "RandomEqualize": _chance("equalize"),
    "RandomAutocontrast": _chance("autocontrast"),
    "RandomInvert": _chance("invert"),
    "RandomAdjustSharpness": _chance("adjust_sharpness"),
    "GaussianBlur": _blur,
    "RandomErasing": _erasing,
    "RandAugment": _rand,
    "TrivialAugmentWide": _trivial,
    "AutoAugment": _autoaugment,
    "AugMix": _augmix,
}


def _builders() -> dict[type, Builder]:
    """The classes present in ``sys.modules`` (v1, v2, timm), each with its builder."""
    found: dict[type, Builder] = {}
    for module_name in ("torchvision.transforms", "torchvision.transforms.v2"):
        module = sys.modules.get(module_name)
        for name, build in _TORCHVISION.items():
            cls = getattr(module, name, None) if module is not None else None
            if isinstance(cls, type):
                found[cls] = build
    for module_name, name, build in (("timm.data.random_erasing", "RandomErasing", _timm_erasing),
                                      ("timm.data.auto_augment", "RandAugment", timm_rand.TimmRandAugment.of)):
        module = sys.modules.get(module_name)
        cls = getattr(module, name, None) if module is not None else None
        if isinstance(cls, type):
            found[cls] = build
    return found


def compile_augment(step: Any) -> tuple[Augment | None, str]:
    """``step`` compiled (its draws fastload's, its kernels torchvision's), or None and why not
    ("" when fastload does not know the class at all)."""
    build = _builders().get(type(step))
    if build is None:
        return None, ""
    try:
        return build(step), ""
    except (AttributeError, TypeError, ValueError, IndexError) as exc:
        return None, f"fastload does not compile its arguments ({exc})"
