"""A user's torchvision transform, compiled: the leading geometry into the decode, the rest as-is.

``ImageFolder(root, transform=t)`` takes what a script hands ``torchvision.datasets.ImageFolder``.
:func:`compile_transform` splits it: the leading geometric steps become fastload's declared
:class:`~fastload.data.pipeline.ImagePipeline` (planned on the JPEG header, so the decode can
run at reduced scale); a trailing "to float (+ Normalize)" becomes fastload's ``Normalize``,
which ``DataLoader(device=...)`` moves to the device; the rest (ColorJitter, RandAugment,
lambdas, ...) runs unchanged, in the user's order, on the decoded uint8 CHW tensor.

Example::

    >>> c = compile_transform(T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
    ...     T.ColorJitter(0.4, 0.4, 0.4), T.ToImage(), T.ToDtype(torch.float32, scale=True),
    ...     T.Normalize(mean, std)]))                       # T: torchvision.transforms.v2
    >>> [type(s).__name__ for s in c.pipeline.steps], c.rest, c.normalize is not None
    (['RandomResizedCrop', 'HorizontalFlip'], Rest(steps=(ColorJitter(...),)), True)
    >>> sample = c.apply_rest(c.pipeline.run(jpeg_bytes, seed=5), seed=5)   # float32 (3, 224, 224)

torchvision is never imported here: only looked up in ``sys.modules`` (a script that built a
torchvision transform has imported it). See docs/transforms.md.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from fastload.arguments import config_error
from fastload.data.pipeline import (
    CenterCrop,
    HorizontalFlip,
    ImagePipeline,
    Normalize,
    RandomResizedCrop,
    Resize,
    Step,
)
from fastload.data.sampling import mix_seed
from fastload.errors import ConfigError

logger = logging.getLogger(__name__)

# NOTE [one lock for the global generators]
# torchvision transforms draw from torch's global generator (v1's RandomChoice/RandomOrder from
# Python's ``random``) and take no generator. So apply_rest seeds those generators from the
# sample's seed, runs ``rest`` and restores them, under one process-wide lock: two threads
# seeding one global generator would draw from each other's streams. ``rest`` thus runs one
# sample at a time per process (the decode runs outside the lock; each worker process has its
# own lock). Another thread drawing from torch's generator meanwhile (a training loop) draws
# from the seeded stream and may change that sample's augmentation.
_RNG_LOCK = threading.Lock()
_TORCH_STREAM, _PYTHON_STREAM, _NUMPY_STREAM = 1, 2, 3  # distinct seeds from one sample seed


def run_seeded(fn: Callable[[Any], Any], value: Any, seed: int) -> Any:
    """``fn(value)`` with torch's, Python's and numpy's global generators seeded from ``seed``
    and restored afterwards, under the process-wide lock (NOTE [one lock for the global
    generators]): the same draws for the same seed, from any thread."""
    with _RNG_LOCK, torch.random.fork_rng(devices=[]):
        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            torch.manual_seed(mix_seed(seed, _TORCH_STREAM))
            random.seed(mix_seed(seed, _PYTHON_STREAM))
            np.random.seed(mix_seed(seed, _NUMPY_STREAM) & 0xFFFFFFFF)
            return fn(value)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def _uint8_tensor(image: Any) -> Any:
    """A PIL image as a uint8 CHW tensor (like PILToTensor); tensors and others unchanged."""
    if isinstance(image, Image.Image):
        pixels = np.asarray(image)
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
        return torch.from_numpy(np.array(pixels.transpose(2, 0, 1), order="C"))
    return image


@dataclass(frozen=True)
class ToUint8Tensor:
    """Stands for PILToTensor / ToImage: the decoded image already is a uint8 CHW tensor."""

    def __call__(self, image: Any) -> Any:
        return _uint8_tensor(image)


@dataclass(frozen=True)
class ToFloat:
    """Stands for ToTensor / ToDtype(float32, scale=True) / ConvertImageDtype(float32):
    uint8 -> float32 in [0, 1]; a float tensor is left as it is (as those transforms do)."""

    def __call__(self, image: Any) -> Any:
        image = _uint8_tensor(image)
        if isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
            return image.float().div_(255)
        return image


@dataclass(frozen=True)
class OnPIL:
    """Calls ``fn`` with a PIL image, as torchvision's ImageFolder would at that point of the
    user's Compose (before its ToTensor): for lambdas and callables fastload cannot inspect."""

    fn: Callable[[Any], Any]

    def __call__(self, image: Any) -> Any:
        if isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.dim() == 3:
            image = Image.fromarray(image.permute(1, 2, 0).numpy())  # lossless: RGB uint8
        return self.fn(image)


@dataclass(frozen=True)
class Rest:
    """What is left of the user's transform: ``steps`` in order (picklable if they are)."""

    steps: tuple[Callable[[Any], Any], ...]

    def __call__(self, image: Any) -> Any:
        for step in self.steps:
            image = step(image)
        return image


@dataclass(frozen=True)
class CompiledTransform:
    """A user transform as fastload runs it: ``pipeline``, then ``rest``, then ``normalize``.

    Attributes:
        pipeline: the compiled geometric prefix, uint8 CHW out; when ``rest`` is None it also
            holds the trailing Normalize (then ``pipeline.run`` is the whole transform).
        rest: the steps left, run in order on the pipeline's uint8 CHW tensor, or None.
        notes: what was compiled and what runs as-is, one line per step.
        normalize: with ``rest``: the trailing "to float + Normalize", run after ``rest`` on
            its uint8 output (the loader moves it to the device); None otherwise.

    Run a sample as ``apply_rest(pipeline.run(data, seed), seed)``.
    """

    pipeline: ImagePipeline
    rest: Callable[[Any], Any] | None
    notes: tuple[str, ...]
    normalize: Normalize | None = None

    @property
    def rest_names(self) -> list[str]:
        """Class names of the user's steps in ``rest`` (for messages)."""
        steps = getattr(self.rest, "steps", (self.rest,) if self.rest is not None else ())
        steps = [getattr(s, "fn", s) for s in steps if not isinstance(s, (ToFloat, ToUint8Tensor))]
        names = [type(s).__name__ for s in steps]
        return names or ["conversions"]

    def apply_rest(self, image: torch.Tensor, seed: int) -> Any:
        """``rest`` then ``normalize`` on ``image``; the random draws are a function of ``seed``.

        NOTE [one lock for the global generators]: ``rest`` runs under a process-wide lock
        with torch's, Python's and numpy's global generators seeded from ``seed`` and
        restored afterwards, so this is safe (and reproducible) from several threads at once,
        one sample at a time. Without ``rest`` the image is returned unchanged. Example:
        ``torch.equal(c.apply_rest(x.clone(), seed=3), c.apply_rest(x.clone(), seed=3))``.
        """
        out: Any = image
        if self.rest is not None:
            out = _uint8_tensor(run_seeded(self.rest, image, seed))  # a PIL image at the end (no ToTensor) comes back as uint8 CHW
        if self.normalize is not None:
            if not (isinstance(out, torch.Tensor) and out.dtype == torch.uint8):
                raise ConfigError(
                    f"transform: fastload runs the trailing Normalize after {self.rest_names} "
                    f"and expects a uint8 image from them, got {type(out).__name__} "
                    f"{getattr(out, 'dtype', '')}. Put the step that converts to float last, "
                    "just before Normalize, or use a plain torchvision ImageFolder"
                )
            out = self.normalize.apply(out, 0)
        return out

    def without_normalize(self) -> tuple[CompiledTransform, Normalize | None]:
        """This transform emitting uint8, and the trailing Normalize it dropped (if any)."""
        if self.normalize is not None:
            return replace(self, normalize=None), self.normalize
        norm = self.pipeline.normalize
        if norm is None:
            return self, None
        return replace(self, pipeline=self.pipeline.without_normalize()), norm


class _Vision:
    """The torchvision classes fastload recognises, v1 and v2 side by side (tuples for isinstance)."""

    def __init__(self) -> None:
        import torchvision.transforms as v1  # only reached when torchvision is already imported
        from torchvision.transforms import v2

        def both(name: str, *more: str) -> tuple[type, ...]:
            return tuple(getattr(m, n) for n in (name, *more) for m in (v1, v2) if hasattr(m, n))

        self.compose, self.rrc = both("Compose"), both("RandomResizedCrop")
        self.resize, self.crop = both("Resize"), both("CenterCrop")
        self.hflip, self.normalize = both("RandomHorizontalFlip"), both("Normalize")
        self.to_tensor, self.to_uint8 = both("ToTensor"), both("PILToTensor", "ToImage")
        self.to_dtype = both("ToDtype", "ConvertImageDtype")
        self.noop = both("ToPureTensor", "Identity")
        self.to_pil, self.lam = both("ToPILImage"), both("Lambda")
        self.containers = both("RandomApply", "RandomChoice", "RandomOrder")


def _vision() -> _Vision | None:
    """torchvision's classes, or None when it is not imported (then no step can be one)."""
    return _Vision() if "torchvision" in sys.modules else None


def _flatten(transform: Any, tv: _Vision | None) -> list[Any]:
    if tv is not None and isinstance(transform, tv.compose):
        return [s for t in transform.transforms for s in _flatten(t, tv)]
    return [transform]


def _bilinear(step: Any, tv: _Vision) -> str | None:
    """Why ``step``'s resampling differs from fastload's (Pillow bilinear, antialiased), or None."""
    mode = getattr(step.interpolation, "value", step.interpolation)  # InterpolationMode, str, int
    if mode not in ("bilinear", Image.BILINEAR):
        return f"interpolation={mode!r}, fastload's decode resizes bilinear"
    if step.antialias not in (True, None):  # None: antialiased on the PIL images torchvision gets
        return f"antialias={step.antialias!r}, fastload's decode always antialiases"
    return None


def _geometric(step: Any, tv: _Vision) -> tuple[Step | None, str]:
    """The fastload step for a torchvision geometric step (or None), and the note saying why."""
    try:
        if isinstance(step, tv.rrc):
            why = _bilinear(step, tv)
            if why is None:
                return RandomResizedCrop(tuple(step.size), tuple(step.scale), tuple(step.ratio)), ""
            return None, why
        if isinstance(step, tv.resize):
            size = [step.size] if isinstance(step.size, int) else list(step.size)
            why = _bilinear(step, tv)
            if len(size) != 1:
                why = f"size={tuple(size)} sets both sides; fastload's Resize keeps the aspect ratio"
            elif step.max_size is not None:
                why = f"max_size={step.max_size} has no fastload equivalent"
            return (Resize(size[0]), "") if why is None else (None, why)
        if isinstance(step, tv.crop):
            return CenterCrop(tuple(step.size)), ""
        if isinstance(step, tv.hflip):
            return HorizontalFlip(float(step.p)), ""
    except ConfigError as exc:  # e.g. scale=(0.5, 1.5): torchvision allows it, fastload does not
        return None, f"fastload refuses its arguments ({exc})"
    return None, ""  # not a geometric step


def _conversion(step: Any, tv: _Vision | None) -> str | None:
    """"float" (to float in [0, 1]), "uint8" (to a uint8 tensor), "noop", or None (not a conversion)."""
    if tv is None:
        return None
    for kind, classes in (("float", tv.to_tensor), ("uint8", tv.to_uint8), ("noop", tv.noop)):
        if isinstance(step, classes):
            return kind
    if isinstance(step, tv.to_dtype) and getattr(step, "dtype", None) == torch.float32:
        # ConvertImageDtype always scales; ToDtype only with scale=True.
        return "float" if getattr(step, "scale", True) else None
    return None


def _normalize(step: Any, tv: _Vision | None) -> Normalize | None:
    if tv is None or not isinstance(step, tv.normalize):
        return None
    mean, std = list(step.mean), list(step.std)
    mean, std = (mean * 3 if len(mean) == 1 else mean), (std * 3 if len(std) == 1 else std)
    try:
        return Normalize(tuple(mean), tuple(std))
    except ConfigError:
        return None  # not 3 channels, or std <= 0: torchvision's own Normalize runs it


def _pil_only(step: Any, tv: _Vision | None) -> bool:
    """Whether ``step`` may need a PIL image: a lambda, a callable fastload does not know, or a
    torchvision container holding one. torchvision's own transforms all take tensors."""
    if tv is None or isinstance(step, tv.lam):
        return True
    if isinstance(step, tv.containers):
        return any(_pil_only(s, tv) for s in step.transforms)
    return not type(step).__module__.startswith("torchvision.")


def _makes_float(step: Any, tv: _Vision | None) -> bool:
    """Whether ``step`` turns the image into floats (any ToDtype/ConvertImageDtype to a float)."""
    dtype = getattr(step, "dtype", None)
    return _conversion(step, tv) == "float" or (
        tv is not None and isinstance(step, tv.to_dtype) and getattr(dtype, "is_floating_point", False)
    )


def _trailing_normalize(tail: list[Any], tv: _Vision | None) -> tuple[int, Normalize | None, str]:
    """Where ``tail``'s trailing "to float (+ Normalize)" starts, as fastload's Normalize, a note.

    Only when the steps before it saw uint8 (or PIL) in the user's order, as they do here:
    conversions holding a "to float", then Normalize or the end; else ``(len(tail), None, "")``.
    """
    end = len(tail)
    while end and _conversion(tail[end - 1], tv) == "noop":
        end -= 1  # a ToPureTensor at the very end changes nothing here
    norm = _normalize(tail[end - 1], tv) if end else None
    stop = end - 1 if norm is not None else end
    start = stop
    while start and _conversion(tail[start - 1], tv) is not None:
        start -= 1
    block = [_conversion(s, tv) for s in tail[start:stop]]
    if "float" not in block or any(_makes_float(s, tv) for s in tail[:start]):
        return len(tail), None, ""
    where = "on the device with DataLoader(device=...), else on the host"
    if norm is None:  # a bare "to float" is Normalize(mean=0, std=1): x / 255
        name = type(tail[start + block.index("float")]).__name__
        unit = Normalize((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
        return start, unit, f"{name} -> Normalize(mean=0, std=1), {where}"
    return start, norm, f"Normalize(mean={norm.mean}, std={norm.std}) -> fastload Normalize, {where}"


def compile_transform(transform: Callable[[Any], Any], *, layout: str = "CHW") -> CompiledTransform:
    """Split a torchvision (v1 or v2) transform into fastload's pipeline and what runs as-is.

    The decoded image is a uint8 CHW tensor. Steps fastload does not compile run unchanged on
    it, in the user's order; where the user's Compose still had a PIL image (before its
    ToTensor/PILToTensor/ToImage), lambdas and unknown callables get a PIL image converted
    from that tensor, and torchvision's own transforms get the tensor. See docs/transforms.md.

    Example::

        >>> import torchvision.transforms as T
        >>> c = compile_transform(T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
        ...                                  T.Normalize(mean, std)]))
        >>> [type(s).__name__ for s in c.pipeline.steps], c.rest
        (['Resize', 'CenterCrop', 'Normalize'], None)
    """
    if not callable(transform):
        raise config_error(
            "ImageFolder", "transform", transform, "a callable such as T.Compose([...])",
            "Pass the transform object itself, e.g. transform=T.Compose([T.Resize(256), T.ToTensor()])",
        )
    tv = _vision()
    flat = _flatten(transform, tv)
    steps: list[Step] = []
    notes: list[str] = []
    pending: list[Any] = []  # conversions met inside the prefix: they run right after it
    why_not: dict[int, str] = {}  # id(step) -> why a geometric step was not compiled
    prefix = 0
    for step in flat if tv is not None else ():
        compiled, why = _geometric(step, tv)
        if compiled is not None:
            steps.append(compiled)
            notes.append(f"{type(step).__name__} -> decode")
        elif _conversion(step, tv) is not None:
            pending.append(step)
        else:
            why_not[id(step)] = why
            break
        prefix += 1
    tail = pending + flat[prefix:]
    start, norm, norm_note = _trailing_normalize(tail, tv)
    runnable: list[Callable[[Any], Any]] = []
    pil = True  # what torchvision's ImageFolder hands the user's Compose: a PIL image
    for step in tail[:start]:
        kind, name = _conversion(step, tv), type(step).__name__
        if kind == "noop":
            continue
        elif kind is not None:
            runnable.append(ToFloat() if kind == "float" else ToUint8Tensor())
            pil = False
            if kind == "float":
                notes.append(f"{name} -> float in [0, 1]")
        elif pil and _pil_only(step, tv):
            runnable.append(OnPIL(step))
            notes.append(f"{name} gets a PIL image (from the uint8 tensor), as before ToTensor")
        else:
            runnable.append(step)
            pil = pil or (tv is not None and isinstance(step, tv.to_pil))
            floats = any(isinstance(r, ToFloat) or _makes_float(r, tv) for r in runnable)
            dtype = "float" if floats else "uint8"
            because = f" ({why_not[id(step)]})" if why_not.get(id(step)) else ""
            if _normalize(step, tv) is not None:  # only a last "to float + Normalize" moves
                because = " on the host: steps run on floats before or after it"
            notes.append(f"{name} runs as-is on the {dtype} tensor{because}")
    if norm_note:
        notes.append(norm_note)
    # Conversions alone change nothing: the decode already gives a uint8 CHW tensor.
    rest = Rest(tuple(runnable)) if any(not isinstance(r, ToUint8Tensor) for r in runnable) else None
    if rest is None and norm is not None:
        steps.append(norm)  # the whole transform is declared: pipeline.run does it all
        norm = None
    if layout != "CHW" and rest is not None:  # torchvision's transforms take CHW tensors
        raise config_error("compile_transform", "layout", layout, "'CHW' with steps that run as-is")
    pipeline = ImagePipeline(tuple(steps), layout)  # type: ignore[arg-type]
    compiled = CompiledTransform(pipeline, rest, tuple(notes), norm)
    logger.info("transform compiled: %s", "; ".join(notes) or "nothing to do")
    return compiled
