"""Public names that import their module on first use, so ``import fastload`` stays cheap.

A package's ``__init__`` maps each public name to the module that defines it and lets
:func:`attach` give it PEP 562's ``__getattr__`` and ``__dir__``: ``fastload.DataLoader``
imports torch the first time it is read, while ``fastload --version``, ``fastload cache
stats`` and ``import fastload.errors`` never do.

Example::

    __getattr__, __dir__ = attach(__name__, {"DataLoader": "fastload.loader"}, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def attach(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, serving ``names`` (name -> module).

    A name, once imported, is stored in ``namespace`` (the package's globals), so later
    reads are plain attribute lookups.
    """

    def __getattr__(name: str) -> Any:
        try:
            module = names[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
