"""What every compiled augmentation is: parameters fastload draws, torchvision's kernels.

An :class:`Augment` stands for one torchvision (v1 or v2) or timm augmentation step. It draws
its parameters from the per-sample :class:`torch.Generator` it is handed, with the same calls
in the same order as torchvision's ``make_params``/``forward`` make on torch's global
generator (so a generator seeded like ``torch.manual_seed(s)`` draws what torchvision would
after ``torch.manual_seed(s)``), and calls ``torchvision.transforms.v2.functional``'s kernels
with them. It never touches a global generator, so it can run on the threaded engine's pixel
threads next to a training loop (NOTE [augmentations draw from the sample's generator]).

Example::

    >>> g = torch.Generator().manual_seed(7)
    >>> out = ColorJitter("ColorJitter", (0.6, 1.4), None, None, None).apply(image, g)
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Augment(abc.ABC):
    """A compiled augmentation; ``name`` is the user's step's class, for notes and messages."""

    name: str

    @abc.abstractmethod
    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """``image`` (a CHW tensor, uint8 or float) augmented with parameters drawn from ``g``."""


def chance(g: torch.Generator, p: float) -> bool:
    """True with probability ``p``: torchvision's ``torch.rand(1) < p`` (its random-apply)."""
    return bool(torch.rand(1, generator=g) < p)


def uniform(g: torch.Generator, low: float, high: float) -> float:
    """One float uniform in [low, high), as torchvision's ``torch.empty(1).uniform_(low, high)``."""
    return float(torch.empty(1).uniform_(low, high, generator=g).item())


def randint(g: torch.Generator, n: int) -> int:
    """An int in [0, n), as torchvision's ``torch.randint(n, ())``."""
    return int(torch.randint(n, (), generator=g))


def pair(value: Any) -> tuple[float, float] | None:
    """A (low, high) range as floats, or None."""
    return None if value is None else (float(value[0]), float(value[1]))


@dataclass(frozen=True)
class RandomApply(Augment):
    """torchvision's RandomApply of compiled steps: all of them with probability ``p`` (one
    ``torch.rand(1)`` draw first), else none."""

    p: float
    steps: tuple[Augment, ...]

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if not chance(g, self.p):
            return image
        for step in self.steps:
            image = step.apply(image, g)
        return image


@dataclass(frozen=True)
class RandomChoice(Augment):
    """torchvision's RandomChoice of compiled steps: one, picked with weights ``p`` by
    ``torch.multinomial`` (v2's draw; v1's ``random.choices`` has the same distribution)."""

    p: tuple[float, ...]
    steps: tuple[Augment, ...]

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        k = int(torch.multinomial(torch.tensor(self.p), 1, generator=g))
        return self.steps[k].apply(image, g)


@dataclass(frozen=True)
class RandomOrder(Augment):
    """torchvision's RandomOrder of compiled steps: all, in a ``randperm`` order (v2's draw;
    v1's ``random.shuffle`` has the same distribution)."""

    steps: tuple[Augment, ...]

    def apply(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        for k in torch.randperm(len(self.steps), generator=g).tolist():
            image = self.steps[k].apply(image, g)
        return image
