"""The declared image pipeline: steps as data, and their Pillow implementation.

A pipeline is a frozen dataclass of steps, so any engine can run it: the torch engine runs
it here with Pillow inside worker processes; the DALI engine compiles the same steps into a
DALI graph. Both produce the same shape, dtype, layout and labels.

Example::

    >>> p = ImagePipeline.standard(size=224, train=False, normalize=True)
    >>> [type(s).__name__ for s in p.steps]
    ['Resize', 'CenterCrop', 'Normalize']
    >>> image = p.run(jpeg_bytes, seed=0)          # torch.float32, (3, 224, 224)

Every step checks its arguments when it is built: a bad one raises
:class:`~fastload.errors.ConfigError` (a ``ValueError``) naming the step, the parameter and
the value, never later inside a worker.
"""

from __future__ import annotations

import io
import math
import numbers
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, Union

import numpy as np
import torch
from PIL import Image

from fastload.arguments import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_pair,
    check_size,
    config_error,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EVAL_RESIZE_RATIO = 0.875  # the classic 256 -> 224 resize before the center crop

Size = tuple[int, int]  # (height, width), pixels

Interpolation = Literal["bilinear", "bicubic", "random"]
INTERPOLATIONS: tuple[str, ...] = ("bilinear", "bicubic", "random")
"""How a resizing step resamples, always antialiased (as Pillow does): "random" draws bilinear
or bicubic, with equal odds, from the sample's generator (timm's ``interpolation='random'``)."""


def as_size(size: int | Sequence[int], where: str = "ImagePipeline.standard", name: str = "size") -> Size:
    """``224`` or ``(h, w)`` as an ``(h, w)`` tuple of positive ints; else a ConfigError."""
    return check_size(where, name, size)


def _set(step: Any, name: str, value: Any) -> None:
    object.__setattr__(step, name, value)  # canonical form of a frozen dataclass field


def _check_interpolation(where: str, value: Any) -> str:
    return check_choice(where, "interpolation", value, INTERPOLATIONS)


@dataclass(frozen=True)
class Resize:
    """Scale so the shorter side is ``shorter`` pixels, keeping the aspect ratio."""

    shorter: int
    interpolation: Interpolation = "bilinear"

    def __post_init__(self) -> None:
        _set(self, "shorter", check_int("Resize", "shorter", self.shorter, minimum=1))
        _check_interpolation("Resize", self.interpolation)


@dataclass(frozen=True)
class ResizeKeepRatio:
    """Scale keeping the aspect ratio, to cover ``size`` (h, w) (``longest=0``: the side that
    needs the larger scale reaches its target), to fit inside it (``longest=1``), or a blend.

    timm's eval resize for a non-square ``crop_pct`` target: ``ResizeKeepRatio((256, 329))``
    then ``CenterCrop((224, 288))``. With a square ``size`` and ``longest=0`` it is ``Resize``.
    """

    size: Size
    longest: float = 0.0
    interpolation: Interpolation = "bilinear"

    def __post_init__(self) -> None:
        where = "ResizeKeepRatio"
        _set(self, "size", check_size(where, "size", self.size))
        _set(self, "longest", check_number(where, "longest", self.longest, low=0.0, high=1.0))
        _check_interpolation(where, self.interpolation)


@dataclass(frozen=True)
class CenterCrop:
    """Cut the central ``size`` (h, w) pixels (one int for a square)."""

    size: Size

    def __post_init__(self) -> None:
        _set(self, "size", check_size("CenterCrop", "size", self.size))


@dataclass(frozen=True)
class RandomResizedCrop:
    """Crop a random area fraction in ``scale`` with aspect ratio in ``ratio``, then resize."""

    size: Size
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    interpolation: Interpolation = "bilinear"

    def __post_init__(self) -> None:
        where = "RandomResizedCrop"
        _set(self, "size", check_size(where, "size", self.size))
        _set(self, "scale", check_pair(where, "scale", self.scale, low=0.0, high=1.0, low_open=True))
        _set(self, "ratio", check_pair(where, "ratio", self.ratio, low=0.0, low_open=True))
        _check_interpolation(where, self.interpolation)


@dataclass(frozen=True)
class HorizontalFlip:
    """Mirror left-right with probability ``p``."""

    p: float = 0.5

    def __post_init__(self) -> None:
        _set(self, "p", check_number("HorizontalFlip", "p", self.p, low=0.0, high=1.0))


@dataclass(frozen=True)
class Normalize:
    """``(x / 255 - mean) / std`` per channel, output float32. Runs on the device if one is set."""

    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        for name, positive in (("mean", False), ("std", True)):
            value = getattr(self, name)
            ok = isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 3
            ok = ok and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and (v > 0 or not positive)
                for v in value
            )
            if not ok:
                what = "positive numbers" if positive else "numbers"
                raise config_error("Normalize", name, value, f"3 {what}, one per RGB channel (0-1 scale)")
            _set(self, name, tuple(float(v) for v in value))

    def apply(self, images: torch.Tensor, channel_dim: int) -> torch.Tensor:
        """Normalize a uint8 image or batch whose channels lie on ``channel_dim``."""
        shape = [1] * images.dim()
        shape[channel_dim] = 3
        mean = torch.tensor(self.mean, device=images.device).view(shape) * 255.0
        inv_std = (1.0 / (torch.tensor(self.std, device=images.device) * 255.0)).view(shape)
        return (images.float() - mean) * inv_std


Step = Union[Resize, ResizeKeepRatio, CenterCrop, RandomResizedCrop, HorizontalFlip, Normalize]

STEP_TYPES: tuple[type, ...] = (
    Resize, ResizeKeepRatio, CenterCrop, RandomResizedCrop, HorizontalFlip, Normalize,
)
"""Every step an engine must know; a pipeline holding anything else runs on Pillow only."""


class Plan(NamedTuple):
    """Where a sample's pixels come from and where they go: the output of every step's geometry.

    ``box`` is (left, top, right, bottom) in pixels of the decoded original, fractional;
    the box is scaled to ``out_w`` x ``out_h`` in one resampling pass with ``interpolation``
    ("bilinear" or "bicubic", antialiased: the last resizing step's, drawn if it says
    "random"), then mirrored if ``flip``.
    """

    box: tuple[float, float, float, float]
    out_w: int
    out_h: int
    flip: bool
    interpolation: str = "bilinear"


@dataclass(frozen=True)
class ImagePipeline:
    """Decode, then ``steps`` in order, then a tensor in ``layout`` (uint8 unless normalized).

    Images of any mode (grayscale, palette, CMYK, RGBA) come out as 3-channel RGB.
    """

    steps: tuple[Step, ...] = field(default_factory=tuple)
    layout: Literal["CHW", "HWC"] = "CHW"

    def __post_init__(self) -> None:
        steps = self.steps
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
            raise config_error("ImagePipeline", "steps", steps, "a tuple of steps such as Resize(256)")
        for step in steps:
            if step is None or isinstance(step, (str, bytes, numbers.Number, type)):
                fix = f"Build the step: {step.__name__}(...)" if isinstance(step, type) else ""
                raise config_error(
                    "ImagePipeline", "steps", steps,
                    "a tuple of step objects such as Resize(256), CenterCrop(224)", fix,
                )
        _set(self, "steps", tuple(steps))
        check_choice("ImagePipeline", "layout", self.layout, ("CHW", "HWC"))

    @classmethod
    def standard(
        cls,
        size: int | Sequence[int] = 224,
        *,
        train: bool = False,
        normalize: bool | Normalize = False,
        layout: Literal["CHW", "HWC"] = "CHW",
    ) -> ImagePipeline:
        """The ImageNet recipe: train = random-resized-crop + flip; eval = resize + center crop."""
        where = "ImagePipeline.standard"
        hw = as_size(size, where)
        train = check_bool(where, "train", train)
        if not isinstance(normalize, (bool, Normalize)):
            raise config_error(
                where, "normalize", normalize, "True (ImageNet mean/std), False or a Normalize"
            )
        if train:
            steps: list[Step] = [RandomResizedCrop(hw), HorizontalFlip()]
        else:
            shorter = int(round(min(hw) / EVAL_RESIZE_RATIO))
            steps = [Resize(shorter), CenterCrop(hw)]
        if normalize:
            steps.append(normalize if isinstance(normalize, Normalize) else Normalize())
        return cls(tuple(steps), check_choice(where, "layout", layout, ("CHW", "HWC")))

    @property
    def normalize(self) -> Normalize | None:
        return next((s for s in self.steps if isinstance(s, Normalize)), None)

    @property
    def is_random(self) -> bool:
        return any(
            isinstance(s, (RandomResizedCrop, HorizontalFlip))
            or getattr(s, "interpolation", None) == "random"
            for s in self.steps
        )

    @property
    def output_size(self) -> Size | None:
        """(h, w) of every output image, or None if images keep their own sizes."""
        size = None
        for s in self.steps:
            if isinstance(s, (CenterCrop, RandomResizedCrop)):
                size = s.size
            elif isinstance(s, (Resize, ResizeKeepRatio)):
                size = None
        return size

    @property
    def channel_dim(self) -> int:
        """Index of the channel axis in one image (add 1 for a batch)."""
        return 0 if self.layout == "CHW" else 2

    def without_normalize(self) -> ImagePipeline:
        return replace(self, steps=tuple(s for s in self.steps if not isinstance(s, Normalize)))

    def run(self, data: bytes, seed: int | None = None) -> torch.Tensor:
        """Decode ``data`` and apply every step; ``seed`` fixes the random steps."""
        img = self.decode(data, seed)
        # One copy out of Pillow's buffer, straight into the output layout. numpy, not torch,
        # does the transpose: torch would spread this small copy over its intra-op threads,
        # which costs more than it saves (3x slower on 2 cores, main process).
        pixels = np.asarray(img)
        if self.layout == "CHW":
            pixels = pixels.transpose(2, 0, 1)
        tensor = torch.from_numpy(np.array(pixels, order="C"))  # writable, in layout order
        norm = self.normalize
        return norm.apply(tensor, self.channel_dim) if norm is not None else tensor

    def decode(self, data: bytes, seed: int | None = None) -> Image.Image:
        """The RGB PIL image of ``data`` after every geometric step (Normalize is not applied):
        what :meth:`run` turns into a tensor, for steps that take a PIL image next."""
        with Image.open(io.BytesIO(data)) as img:
            return self._decode(img, random.Random(seed))

    def plan(self, width: int, height: int, rng: random.Random) -> Plan:
        """The geometry of every step on a ``width`` x ``height`` image, before any pixel work.

        Every engine runs this one plan (Pillow here, threads in :mod:`fastload.data.render`,
        DALI in :mod:`fastload.engines.dali`), so a sample gets the same crop, flip and
        interpolation from the same seed on any engine.
        """
        box = (0.0, 0.0, float(width), float(height))  # region of the original, in pixels
        out_w, out_h = width, height
        flip, interpolation = False, "bilinear"
        for step in self.steps:
            if isinstance(step, Resize):
                bw, bh = box[2] - box[0], box[3] - box[1]
                scale = step.shorter / min(bw, bh)
                out_w, out_h = max(1, round(bw * scale)), max(1, round(bh * scale))
            elif isinstance(step, ResizeKeepRatio):  # timm's rule, on the image as it is now
                rh, rw = out_h / step.size[0], out_w / step.size[1]
                ratio = max(rh, rw) * step.longest + min(rh, rw) * (1.0 - step.longest)
                out_w, out_h = max(1, round(out_w / ratio)), max(1, round(out_h / ratio))
            elif isinstance(step, CenterCrop):
                box, out_w, out_h = _center_crop(box, out_w, out_h, step.size)
            elif isinstance(step, RandomResizedCrop):
                box = _random_crop_box(box, step, rng)
                out_h, out_w = step.size
            elif isinstance(step, HorizontalFlip):
                flip = flip ^ (rng.random() < step.p)
            if isinstance(step, (Resize, ResizeKeepRatio, RandomResizedCrop)):
                # After the step's own draws, as timm draws its interpolation after the crop.
                interpolation = step.interpolation
                if interpolation == "random":
                    interpolation = rng.choice(("bilinear", "bicubic"))
        return Plan(box, out_w, out_h, flip, interpolation)

    def _decode(self, img: Image.Image, rng: random.Random) -> Image.Image:
        """Geometry first on the header, so JPEG draft mode can decode at reduced scale."""
        width, height = img.size
        box, out_w, out_h, flip, interpolation = self.plan(width, height, rng)
        # Draft: let libjpeg decode at 1/2, 1/4 or 1/8 scale if the crop stays >= output size.
        bw, bh = box[2] - box[0], box[3] - box[1]
        if img.format == "JPEG" and (bw > 2 * out_w and bh > 2 * out_h):
            want = (math.ceil(width * out_w / bw), math.ceil(height * out_h / bh))
            img.draft("RGB", want)
            fx, fy = img.size[0] / width, img.size[1] / height
            box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
        if img.mode != "RGB":
            img = _to_rgb(img)
        img = img.resize((out_w, out_h), _PIL_FILTERS[interpolation], box=box)
        if flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return img


_PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


def _center_crop(
    box: tuple[float, float, float, float], out_w: int, out_h: int, size: Size
) -> tuple[tuple[float, float, float, float], int, int]:
    """Crop the centre ``size`` of an (out_w x out_h) view of ``box``; returns the new box."""
    ch, cw = min(size[0], out_h), min(size[1], out_w)
    sx, sy = (box[2] - box[0]) / out_w, (box[3] - box[1]) / out_h
    left = box[0] + (out_w - cw) / 2 * sx
    top = box[1] + (out_h - ch) / 2 * sy
    return (left, top, left + cw * sx, top + ch * sy), cw, ch


def _random_crop_box(
    box: tuple[float, float, float, float], step: RandomResizedCrop, rng: random.Random
) -> tuple[float, float, float, float]:
    """torchvision's RandomResizedCrop parameters: 10 tries, then a centre crop fallback."""
    width, height = box[2] - box[0], box[3] - box[1]
    area = width * height
    log_ratio = (math.log(step.ratio[0]), math.log(step.ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*step.scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            x = rng.randint(0, int(width - w))
            y = rng.randint(0, int(height - h))
            return (box[0] + x, box[1] + y, box[0] + x + w, box[1] + y + h)
    in_ratio = width / height
    if in_ratio < step.ratio[0]:
        w, h = width, round(width / step.ratio[0])
    elif in_ratio > step.ratio[1]:
        h, w = height, round(height * step.ratio[1])
    else:
        w, h = width, height
    x, y = (width - w) / 2, (height - h) / 2
    return (box[0] + x, box[1] + y, box[0] + x + w, box[1] + y + h)
