"""Thread state that a forked child must not inherit.

NOTE [locks across fork]
torch starts worker processes by fork. A thread lock that a thread of the parent held at that
moment (the prefetcher filling the cache, a stats flush) stays held forever in the child, and
an in-flight marker of the parent's fetch is never cleared there: a worker would wait up to
the lock timeout for a fetch that no thread of its own is making. Objects that keep such
state register a reset here; it runs in every forked child before anything else.

Example::

    after_fork(self, TieredCache._reset_after_fork)
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

_resets: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def after_fork(obj: Any, reset: Callable[[Any], None]) -> None:
    """Call ``reset(obj)`` in each forked child while ``obj`` is alive."""
    _resets[obj] = reset


def _reset_all() -> None:
    for obj, reset in list(_resets.items()):
        reset(obj)


os.register_at_fork(after_in_child=_reset_all)
