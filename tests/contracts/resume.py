"""The shared resume check: an epoch cut after k batches and resumed equals the uninterrupted one.

Every stateful loader (each engine, each resume mode) runs :func:`interrupted`, so they are all
held to the same promise: ``state_dict()`` after k batches, pickled as if saved to disk, then
``load_state_dict()`` on a new loader in a process whose random state is anything, hands out
exactly the batches the uninterrupted epoch had after its k-th.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch


def interrupted(make: Callable[[], Any], k: int, *, user_seed: int = 123) -> tuple[list, list, dict]:
    """An uninterrupted epoch, and the same epoch cut after ``k`` batches and resumed."""
    torch.manual_seed(5)
    full = list(make())
    torch.manual_seed(5)
    loader = make()
    it = iter(loader)
    before = [next(it) for _ in range(k)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))  # as if saved to disk
    del it
    torch.manual_seed(user_seed)  # the new process's random state is anything
    again = make()
    again.load_state_dict(state)
    return full, before + list(again), state


def same_batches(a: list, b: list) -> bool:
    """Batch for batch equal: tensors, or sequences of tensors (images, labels)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        xs, ys = (x, y) if isinstance(x, (list, tuple)) else ([x], [y])
        if len(xs) != len(ys) or not all(torch.equal(p, q) for p, q in zip(xs, ys)):
            return False
    return True
