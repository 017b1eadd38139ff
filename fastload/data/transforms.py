"""A user's torchvision transform, compiled: the leading geometry into the decode, the rest as-is.

``ImageFolder(root, transform=t)`` takes what a script hands ``torchvision.datasets.ImageFolder``.
:func:`compile_transform` splits it: the leading geometric steps become fastload's declared
:class:`~fastload.data.pipeline.ImagePipeline` (planned on the JPEG header, so the decode can
run at reduced scale); a trailing "to float (+ Normalize)" becomes fastload's ``Normalize``,
which ``DataLoader(device=...)`` moves to the device; the common augmentations (ColorJitter,
RandAugment, RandomErasing, ...) become :mod:`fastload.data.augment`'s, drawing from the
sample's own generator; the rest (lambdas, ...) runs unchanged, all in the user's order.

Example::

    >>> c = compile_transform(T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
    ...     T.ColorJitter(0.4, 0.4, 0.4), T.ToImage(), T.ToDtype(torch.float32, scale=True),
    ...     T.Normalize(mean, std)]))                       # T: torchvision.transforms.v2
    >>> [type(s).__name__ for s in c.pipeline.steps], c.rest_names, c.normalize is not None
    (['RandomResizedCrop', 'HorizontalFlip'], ['ColorJitter'], True)
    >>> sample = c.apply_rest(c.pipeline.run(jpeg_bytes, seed=5), seed=5)   # float32 (3, 224, 224)

torchvision is never imported here: only looked up in ``sys.modules`` (a script that built a
torchvision transform has imported it). See docs/transforms.md.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from fastload.arguments import config_error
from fastload.data import draws, float_table, known_steps
from fastload.data.pipeline import ImagePipeline, Normalize, Step
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
_AUGMENT_STREAM = 4  # the compiled augmentations' own generator (NOTE [augmentations draw ...])


def run_seeded(fn: Callable[[Any], Any], value: Any, seed: int) -> Any:
    """``fn(value)`` with torch's, Python's and numpy's global generators seeded from ``seed``
    and restored afterwards, under the process-wide lock (NOTE [one lock for the global
    generators]): the same draws for the same seed, from any thread."""
    with _RNG_LOCK, torch.random.fork_rng(devices=[]):
        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            # The CPU generator only, the one fork_rng(devices=[]) restores: torch.manual_seed
            # would also reseed CUDA's (and costs 0.26 ms a sample, 200x this).
            torch.default_generator.manual_seed(mix_seed(seed, _TORCH_STREAM))
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
    """Stands for PILToTensor / ToImage: the decoded image already is a uint8 CHW tensor.
    ``user_step``: the user's own (NOTE [a float table] runs it)."""

    user_step: Any = field(default=None, compare=False, repr=False)

    def __call__(self, image: Any) -> Any:
        return _uint8_tensor(image)


@dataclass(frozen=True)
class ToFloat:
    """Stands for ToTensor / ToDtype(float32, scale=True) / ConvertImageDtype(float32):
    uint8 -> float32 in [0, 1]; a float tensor is left as it is (as those transforms do).
    ``user_step``: the user's own (NOTE [a float table] runs it)."""

    user_step: Any = field(default=None, compare=False, repr=False)

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
        return self.fn(_pil(image))


def _pil(image: Any) -> Any:
    """A uint8 CHW tensor as a PIL image (lossless: RGB uint8); anything else unchanged."""
    if isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.dim() == 3:
        if image.shape[0] == 3 and image.is_contiguous():  # 3 planes merged by Pillow: 8x fromarray's speed
            height, width = image.shape[1:]
            planes = image.numpy()
            return Image.merge("RGB", [Image.frombuffer("L", (width, height), planes[c], "raw", "L", 0, 1)
                                       for c in range(3)])
        return Image.fromarray(image.permute(1, 2, 0).numpy())
    return image


def augment_generator(seed: int) -> torch.Generator:
    """The generator a sample's compiled augmentations draw from, in order, seeded from ``seed``
    (NOTE [augmentations draw from the sample's generator] in :mod:`fastload.data.augment`)."""
    return torch.Generator().manual_seed(mix_seed(seed, _AUGMENT_STREAM))


@dataclass(frozen=True)
class Augmented:
    """A user's augmentation compiled by :mod:`fastload.data.augment`: fastload draws its
    parameters from the sample's generator and runs torchvision's kernels; ``pil``: on a PIL
    image (PIL's kernels), where the user's Compose had one, as torchvision's ImageFolder runs
    it, else on the tensor."""

    augment: Any  # a fastload.data.augment.Augment
    pil: bool = False

    def run(self, image: Any, generator: torch.Generator) -> Any:
        if self.pil:
            return self.augment.apply(_pil(image), generator)
        return self.augment.apply(_uint8_tensor(image), generator)

    def __call__(self, image: Any) -> Any:
        """With the generator of seed 0 (what watching it for global draws needs)."""
        return self.run(image, augment_generator(0))


@dataclass(frozen=True)
class Rest:
    """What is left of the user's transform: ``steps`` in order (picklable if they are)."""

    steps: tuple[Callable[[Any], Any], ...]

    def __call__(self, image: Any) -> Any:
        return self.run(image, 0)

    def run(self, image: Any, seed: int) -> Any:
        """The steps on ``image``; compiled augmentations draw from ``seed``'s generator, one
        generator shared in step order."""
        generator: torch.Generator | None = None
        for step in self.steps:
            if isinstance(step, Augmented):
                generator = generator if generator is not None else augment_generator(seed)
                image = step.run(image, generator)
            else:
                image = step(image)
        return image


def _run_rest(rest: Callable[[Any], Any], image: Any, seed: int) -> Any:
    return rest.run(image, seed) if isinstance(rest, Rest) else rest(image)


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
        steps = [n for s in steps for n in (s.names if isinstance(s, float_table.FloatTable) else [s])]
        names = [s if isinstance(s, str) else _name(s) for s in steps if not isinstance(s, (ToFloat, ToUint8Tensor))]
        return names or ["conversions"]

    @property
    def takes_pil(self) -> bool:
        """Whether ``rest`` starts with a step given a PIL image: then an engine may hand it
        ``pipeline.decode``'s PIL image instead of ``pipeline.run``'s tensor (no round trip)."""
        steps = self.rest.steps if isinstance(self.rest, Rest) else ()
        return bool(steps) and (isinstance(steps[0], OnPIL) or getattr(steps[0], "pil", False))

    @functools.cached_property
    def global_draws(self) -> tuple[str, ...]:
        """The steps of ``rest`` that draw from torch's, Python's or numpy's global random
        generator, each as a phrase naming it and them; empty when none does.

        NOTE [which steps draw]: seen, not guessed. The first time it is asked (when a loader
        chooses its engine), ``rest`` runs once on a uint8 test image of the pipeline's output
        size, step by step, with the three generators' states compared around each step and
        restored afterwards, as the dataset probe sees a draw (NOTE [the dataset probe]). A
        Normalize with tensor mean/std, a ``Lambda`` that draws nothing, a conversion: no draw.
        torchvision's random steps draw on every call (their ``p`` is itself a draw), timm's
        RandAugment and RandomErasing too. A step that raises on the test image cannot be seen:
        it and the steps after it are counted as drawing. A step that draws only on some images
        is the one case this misses. Example: ``c.global_draws == ("ColorJitter draws from
        torch's global random generator",)``.
        """
        steps = getattr(self.rest, "steps", (self.rest,) if self.rest is not None else ())
        return draws.global_draws(steps, self.pipeline.output_size or (64, 64), _RNG_LOCK, _name)

    def apply_rest(self, image: torch.Tensor | Image.Image, seed: int, *, seeded: bool = True) -> Any:
        """``rest`` then ``normalize`` on ``image``; the random draws are a function of ``seed``.

        NOTE [one lock for the global generators]: ``rest`` runs under a process-wide lock
        with torch's, Python's and numpy's global generators seeded from ``seed`` and
        restored afterwards, so this is safe (and reproducible) from several threads at once,
        one sample at a time. Without ``rest`` the image is returned unchanged. Example:
        ``torch.equal(c.apply_rest(x.clone(), seed=3), c.apply_rest(x.clone(), seed=3))``.
        ``seeded=False`` runs ``rest`` as it is, outside the lock, touching no generator: for
        a rest that draws nothing (``global_draws`` empty) in threads of the training process.
        """
        out: Any = image
        if self.rest is not None and not seeded:
            out = _uint8_tensor(_run_rest(self.rest, image, seed))
        elif self.rest is not None:
            run = functools.partial(_run_rest, self.rest, seed=seed)
            out = _uint8_tensor(run_seeded(run, image, seed))  # a PIL image at the end (no ToTensor) comes back as uint8 CHW
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


def _name(step: Any) -> str:
    """A step's name for messages: its class, or a plain function's own name."""
    step = step.fn if isinstance(step, OnPIL) else step
    if isinstance(step, Augmented):
        return str(step.augment.name)
    return getattr(step, "__name__", None) or type(step).__name__


def _trailing_normalize(
    tail: list[Any], known: known_steps.Known | None
) -> tuple[int, Normalize | None, str]:
    """Where ``tail``'s trailing "to float (+ Normalize)" starts, as fastload's Normalize, a note.

    Only when the steps before it saw uint8 (or PIL) in the user's order, as they do here:
    conversions holding a "to float", then Normalize or the end; else ``(len(tail), None, "")``.
    """
    end = len(tail)
    while end and known_steps.conversion(tail[end - 1], known) == "noop":
        end -= 1  # a ToPureTensor at the very end changes nothing here
    norm = known_steps.normalize(tail[end - 1], known) if end else None
    stop = end - 1 if norm is not None else end
    start = stop
    while start and known_steps.conversion(tail[start - 1], known) is not None:
        start -= 1
    block = [known_steps.conversion(s, known) for s in tail[start:stop]]
    if "float" not in block or any(known_steps.makes_float(s, known) for s in tail[:start]):
        return len(tail), None, ""
    where = "on the device with DataLoader(device=...), else on the host"
    if norm is None:  # a bare "to float" is Normalize(mean=0, std=1): x / 255
        name = type(tail[start + block.index("float")]).__name__
        unit = Normalize((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
        return start, unit, f"{name} -> Normalize(mean=0, std=1), {where}"
    return start, norm, f"Normalize(mean={norm.mean}, std={norm.std}) -> fastload Normalize, {where}"


def _augment(step: Any, known: known_steps.Known | None) -> tuple[Any, str]:
    """``step`` compiled by :mod:`fastload.data.augment` (imported only with torchvision), or
    None and why not ("" for a step it does not know)."""
    if known is None:
        return None, ""
    from fastload.data.augment import compile_augment

    return compile_augment(step)


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
    known = known_steps.Known.find()
    flat = known_steps.flatten(transform, known)
    steps: list[Step] = []
    notes: list[str] = []
    pending: list[Any] = []  # conversions met inside the prefix: they run right after it
    why_not: dict[int, str] = {}  # id(step) -> why a geometric step was not compiled
    prefix = 0
    for step in flat if known is not None else ():
        compiled, why = known_steps.geometric(step, known)
        if compiled is not None:
            steps.append(compiled)
            mode = getattr(compiled, "interpolation", "bilinear")
            drawn = " (bilinear or bicubic, drawn per sample)" if mode == "random" else ""
            how = "" if mode == "bilinear" else f", {mode}{drawn}"
            notes.append(f"{type(step).__name__} -> decode{how}")
        elif known_steps.conversion(step, known) is not None:
            pending.append(step)
        else:
            why_not[id(step)] = why
            break
        prefix += 1
    tail = pending + flat[prefix:]
    start, norm, norm_note = _trailing_normalize(tail, known)
    runnable: list[Callable[[Any], Any]] = []
    pil = True  # what torchvision's ImageFolder hands the user's Compose: a PIL image
    for step in tail[:start]:
        kind, name = known_steps.conversion(step, known), type(step).__name__
        augment, why = _augment(step, known)
        if kind == "noop":
            continue
        elif augment is not None:
            runnable.append(Augmented(augment, pil))
            shape = "the PIL image, as before ToTensor" if pil else "the tensor"
            notes.append(f"{name} -> fastload's draws from the sample's generator, torchvision's "
                         f"kernels on {shape}")
        elif kind is not None:
            runnable.append(ToFloat(step) if kind == "float" else ToUint8Tensor(step))
            pil = False
            if kind == "float":
                notes.append(f"{name} -> float in [0, 1]")
        elif pil:  # what torchvision's ImageFolder gives it; PIL's kernels are also the faster
            runnable.append(OnPIL(step))
            because = why_not.get(id(step)) or why
            because = f" ({because})" if because else ""
            notes.append(f"{name} runs as-is on a PIL image, as before ToTensor{because}")
        else:
            runnable.append(step)
            pil = pil or known_steps.is_to_pil(step, known)
            floats = any(isinstance(r, ToFloat) or known_steps.makes_float(r, known) for r in runnable)
            dtype = "float" if floats else "uint8"
            because = why_not.get(id(step)) or why
            because = f" ({because})" if because else ""
            if known_steps.normalize(step, known) is not None:  # only a last "to float + Normalize" moves
                because = " on the host: steps run on floats before or after it"
            notes.append(f"{name} runs as-is on the {dtype} tensor{because}")
    if norm_note:
        notes.append(norm_note)
    # Conversions alone change nothing: the decode already gives a uint8 CHW tensor.
    runnable = float_table.fuse(runnable, lambda s: isinstance(s, (ToUint8Tensor, ToFloat)),
                                lambda s: isinstance(s, ToFloat), lambda s: known_steps.is_exact_normalize(s, known))
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
