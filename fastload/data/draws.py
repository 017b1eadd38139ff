"""Which steps of a transform draw from torch's, Python's or numpy's global generator: seen, not guessed.

:func:`global_draws` runs the steps once on a test image and compares the three global
generators' states around each step (NOTE [which steps draw] in :mod:`fastload.data.transforms`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def generator_states() -> tuple[Any, ...]:
    numpy_state = np.random.get_state()
    return torch.get_rng_state(), random.getstate(), (numpy_state[1].copy(), *numpy_state[2:])


def moved_generators(before: tuple[Any, ...], after: tuple[Any, ...]) -> list[str]:
    """The global generators whose state changed between ``before`` and ``after``."""
    moved = ["torch's"] if not torch.equal(before[0], after[0]) else []
    moved += ["Python's"] if before[1] != after[1] else []
    numpy_same = np.array_equal(before[2][0], after[2][0]) and before[2][1:] == after[2][1:]
    return moved + ([] if numpy_same else ["numpy's"])


def global_draws(
    steps: Sequence[Callable[[Any], Any]], size: tuple[int, int], lock: Any, name_of: Callable[[Any], str]
) -> tuple[str, ...]:
    """NOTE [which steps draw] in :mod:`fastload.data.transforms`: run ``steps`` once on a
    test image, under ``lock`` (the one around the global generators), watching the
    generators; each step named by ``name_of``. Example::

        >>> global_draws([v2.ColorJitter(0.4)], (64, 64), threading.Lock(), lambda s: type(s).__name__)
        ("ColorJitter draws from torch's global random generator",)
    """
    pixels = np.random.default_rng(0).integers(0, 256, (3, *size), dtype=np.uint8)  # its own generator
    image: Any = torch.from_numpy(pixels)
    found: list[str] = []
    with lock, torch.random.fork_rng(devices=[]):
        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            for step in steps:
                name = name_of(step)
                before = generator_states()
                try:
                    image = step(image)
                except Exception as exc:  # noqa: BLE001 - a user's step, on an image it may not expect
                    found.append(
                        f"{name} may draw from a global random generator (it raised "
                        f"{type(exc).__name__} on a {size[0]}x{size[1]} test image, so fastload "
                        "could not watch it or the steps after it)"
                    )
                    break
                moved = moved_generators(before, generator_states())
                if moved:
                    plural = "s" if len(moved) > 1 else ""
                    found.append(f"{name} draws from {' and '.join(moved)} global random generator{plural}")
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
    return tuple(found)
