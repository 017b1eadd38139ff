"""The steps of torchvision's and timm's transforms that fastload knows, and what each becomes.

:func:`fastload.data.transforms.compile_transform` walks a user's transform and asks this
module about each step: is it geometry fastload's decode can do (:func:`geometric`), a
conversion (:func:`conversion`), a Normalize (:func:`normalize`)? The classes are looked up
in ``sys.modules`` only, never imported here: a script that built a torchvision or timm transform has imported them.

Example::

    >>> known = Known.find()                  # None when torchvision is not imported
    >>> geometric(timm.data.transforms.RandomResizedCropAndInterpolation(224), known)
    (RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ...), '')
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from PIL import Image

from fastload.data.pipeline import (
    CenterCrop,
    HorizontalFlip,
    Normalize,
    RandomResizedCrop,
    Resize,
    ResizeKeepRatio,
    Step,
)
from fastload.errors import ConfigError

_NAMED = {
    "bilinear": "bilinear", "bicubic": "bicubic", Image.BILINEAR: "bilinear", Image.BICUBIC: "bicubic",
}


class Known:
    """The torchvision (v1 and v2 side by side) and timm classes fastload recognises, as
    tuples for ``isinstance``; timm's are empty tuples when timm is not imported."""

    def __init__(self) -> None:
        import torchvision.transforms as v1  # only reached when torchvision is already imported
        from torchvision.transforms import v2

        def both(name: str, *more: str) -> tuple[type, ...]:
            return tuple(getattr(m, n) for n in (name, *more) for m in (v1, v2) if hasattr(m, n))

        timm = sys.modules.get("timm.data.transforms")  # imported with timm.data

        def of_timm(name: str) -> tuple[type, ...]:
            found = getattr(timm, name, None) if timm is not None else None
            return (found,) if isinstance(found, type) else ()

        self.compose, self.rrc = both("Compose"), both("RandomResizedCrop")
        self.timm_rrc = of_timm("RandomResizedCropAndInterpolation")
        self.timm_keep_ratio = of_timm("ResizeKeepRatio")
        self.resize, self.crop = both("Resize"), both("CenterCrop")
        self.hflip, self.normalize = both("RandomHorizontalFlip"), both("Normalize")
        # timm's MaybeToTensor is a torchvision ToTensor; MaybePILToTensor is a PILToTensor.
        self.to_tensor = both("ToTensor")
        self.to_uint8 = both("PILToTensor", "ToImage") + of_timm("MaybePILToTensor")
        self.to_dtype = both("ToDtype", "ConvertImageDtype")
        self.noop = both("ToPureTensor", "Identity")
        self.to_pil = both("ToPILImage")

    @staticmethod
    def find() -> Known | None:
        """The classes, or None when torchvision is not imported (then no step can be one)."""
        return Known() if "torchvision" in sys.modules else None


def flatten(transform: Any, known: Known | None) -> list[Any]:
    """The steps of ``transform``, nested Composes opened, in order."""
    if known is not None and isinstance(transform, known.compose):
        return [s for t in transform.transforms for s in flatten(t, known)]
    return [transform]


def interpolation(value: Any) -> str | None:
    """fastload's name for a resampling mode (torchvision's InterpolationMode, a PIL filter,
    a string, or timm's (bilinear, bicubic) pair drawn at random), or None if it has none."""
    if isinstance(value, (tuple, list)):
        named = [interpolation(v) for v in value]
        return "random" if len(named) == 2 and set(named) == {"bilinear", "bicubic"} else None
    return _NAMED.get(getattr(value, "value", value))


def _resampling(step: Any) -> tuple[str | None, str]:
    """``step``'s interpolation as fastload names it, or None and why fastload cannot do it."""
    mode = interpolation(step.interpolation)
    if mode is None:
        shown = getattr(step.interpolation, "value", step.interpolation)
        return None, f"interpolation={shown!r}, fastload's decode resizes bilinear or bicubic"
    # None: antialiased on the PIL images torchvision gets; timm's steps have no such switch.
    if getattr(step, "antialias", True) not in (True, None):
        return None, f"antialias={step.antialias!r}, fastload's decode always antialiases"
    return mode, ""


def geometric(step: Any, known: Known) -> tuple[Step | None, str]:
    """The fastload step for a torchvision or timm geometric step (or None), and why not."""
    try:
        if isinstance(step, known.rrc + known.timm_rrc):
            # timm's RandomResizedCropAndInterpolation draws its box by torchvision's algorithm
            # (from Python's random); "random" interpolation picks bilinear or bicubic after it.
            mode, why = _resampling(step)
            if mode is None:
                return None, why
            size, scale, ratio = tuple(step.size), tuple(step.scale), tuple(step.ratio)
            return RandomResizedCrop(size, scale, ratio, mode), ""  # type: ignore[arg-type]
        if isinstance(step, known.resize) and step.size is not None:  # v2: None with max_size
            size = [step.size] if isinstance(step.size, int) else list(step.size)
            mode, why = _resampling(step)
            if len(size) != 1:
                why = f"size={tuple(size)} sets both sides; fastload's Resize keeps the aspect ratio"
            elif step.max_size is not None:
                why = f"max_size={step.max_size} has no fastload equivalent"
            return (Resize(size[0], mode), "") if not why else (None, why)  # type: ignore[arg-type]
        if isinstance(step, known.timm_keep_ratio):
            return _keep_ratio(step)
        if isinstance(step, known.crop):
            return CenterCrop(tuple(step.size)), ""
        if isinstance(step, known.hflip):
            return HorizontalFlip(float(step.p)), ""
    except ConfigError as exc:  # e.g. scale=(0.5, 1.5): torchvision allows it, fastload does not
        return None, f"fastload refuses its arguments ({exc})"
    return None, ""  # not a geometric step


def _keep_ratio(step: Any) -> tuple[Step | None, str]:
    """timm's ResizeKeepRatio: compiled when it draws nothing (no random scale or aspect)."""
    if step.random_scale_prob > 0 or step.random_aspect_prob > 0:
        return None, "random_scale_prob/random_aspect_prob draw a scale fastload's decode does not"
    mode, why = _resampling(step)
    if mode is None:
        return None, why
    return ResizeKeepRatio(tuple(step.size), float(step.longest), mode), ""  # type: ignore[arg-type]


def conversion(step: Any, known: Known | None) -> str | None:
    """"float" (to float in [0, 1]), "uint8" (to a uint8 tensor), "noop", or None (not a conversion)."""
    if known is None:
        return None
    for kind, classes in (("float", known.to_tensor), ("uint8", known.to_uint8), ("noop", known.noop)):
        if isinstance(step, classes):
            return kind
    if isinstance(step, known.to_dtype) and getattr(step, "dtype", None) == torch.float32:
        # ConvertImageDtype always scales; ToDtype only with scale=True.
        return "float" if getattr(step, "scale", True) else None
    return None


def normalize(step: Any, known: Known | None) -> Normalize | None:
    """fastload's Normalize for a torchvision Normalize (mean/std as lists or tensors, as timm
    gives them), or None: not one, or not 3 channels or a std <= 0 (torchvision's then runs)."""
    if known is None or not isinstance(step, known.normalize):
        return None
    try:
        mean, std = _floats(step.mean), _floats(step.std)
    except (TypeError, ValueError, RuntimeError):
        return None
    mean, std = (mean * 3 if len(mean) == 1 else mean), (std * 3 if len(std) == 1 else std)
    try:
        return Normalize(tuple(mean), tuple(std))
    except ConfigError:
        return None


def is_exact_normalize(step: Any, known: Known | None) -> bool:
    """Whether ``step`` is torchvision's own Normalize (v1 or v2), not a subclass that may
    override what it does (NOTE [a float table] in :mod:`fastload.data.float_table`)."""
    return known is not None and type(step) in known.normalize


def _floats(values: Any) -> list[float]:
    """Numbers, or a tensor of them, as floats; a float32 tensor's by their shortest spelling
    (0.485, not 0.48500001430511475: the same float32 when Normalize makes its tensor)."""
    tensor = torch.as_tensor(values)
    floats = tensor.to(torch.float64).flatten().tolist()
    if tensor.dtype == torch.float32:
        floats = [float(str(np.float32(v))) for v in floats]
    return floats


def makes_float(step: Any, known: Known | None) -> bool:
    """Whether ``step`` turns the image into floats (any ToDtype/ConvertImageDtype to a float)."""
    dtype = getattr(step, "dtype", None)
    to_dtype = known is not None and isinstance(step, known.to_dtype)
    return conversion(step, known) == "float" or (to_dtype and getattr(dtype, "is_floating_point", False))


def is_to_pil(step: Any, known: Known | None) -> bool:
    """Whether ``step`` is torchvision's ToPILImage."""
    return known is not None and isinstance(step, known.to_pil)
