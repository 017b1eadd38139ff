"""Checks of user arguments at the public API, with errors that say how to fix them.

Each check takes the call (``"ImageFolder"``), the parameter name and the value, returns the
value in its canonical form, and raises :class:`~fastload.errors.ConfigError` (a
``ValueError``) whose message names the call, the parameter, the value received and what is
expected::

    >>> check_size("ImageFolder", "size", "big")
    Traceback (most recent call last):
    fastload.errors.ConfigError: ImageFolder(size='big'): expected an int or an (height, width)
    pair of positive ints (pixels), got 'big' (str). Pass e.g. size=224 or size=(224, 160)

Checks run once, when an object is built, never per sample.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from fastload.errors import ConfigError


def config_error(where: str, name: str, value: Any, expected: str, fix: str = "") -> ConfigError:
    """The error for ``where(name=value)``: what was expected, and how to fix it."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    message = f"{where}({name}={shown}): expected {expected}, got {shown} ({type(value).__name__})"
    return ConfigError(f"{message}. {fix}" if fix else message)


def check_bool(where: str, name: str, value: Any) -> bool:
    """``True`` or ``False`` (numpy bools too); 1, "yes" or None are refused."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise config_error(where, name, value, "True or False")


def check_int(where: str, name: str, value: Any, *, minimum: int | None = None) -> int:
    """An integer (not a bool), at least ``minimum`` when given."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise config_error(where, name, value, f"an int{bound}")
    return int(value)


def check_number(
    where: str, name: str, value: Any, *, low: float | None = None, high: float | None = None,
    low_open: bool = False,
) -> float:
    """A real number (not a bool) in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
        hi = "" if high is None else f"<= {high}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        raise config_error(where, name, value, f"a number{' ' + bounds if bounds else ''}")
    return float(value)


def check_choice(where: str, name: str, value: Any, choices: Collection[str]) -> str:
    """One of ``choices`` (strings)."""
    if not isinstance(value, str) or value not in choices:
        raise config_error(where, name, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def check_size(where: str, name: str, value: Any) -> tuple[int, int]:
    """``224`` or ``(h, w)``: an ``(h, w)`` tuple of positive ints (pixels)."""
    expected = "an int or an (height, width) pair of positive ints (pixels)"
    fix = f"Pass e.g. {name}=224 or {name}=(224, 160)"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        pair: Sequence[Any] = (value, value)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        pair = value
    else:
        raise config_error(where, name, value, expected, fix)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in pair):
        raise config_error(where, name, value, expected, fix)
    return int(pair[0]), int(pair[1])


def check_pair(
    where: str, name: str, value: Any, *, low: float, high: float | None = None,
    low_open: bool = False,
) -> tuple[float, float]:
    """A ``(lo, hi)`` pair of numbers with ``lo <= hi``, both within the bounds."""
    if not (isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2):
        raise config_error(where, name, value, "a (low, high) pair of numbers")
    lo, hi = (check_number(where, name, v, low=low, high=high, low_open=low_open) for v in value)
    if lo > hi:
        raise config_error(where, name, value, "a (low, high) pair with low <= high")
    return lo, hi


def check_strings(where: str, name: str, value: Any, *, example: str = "") -> tuple[str, ...]:
    """A non-empty list or tuple of strings (a bare string is refused: it is not a list)."""
    ok = (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) > 0
        and all(isinstance(v, str) and v for v in value)
    )
    if not ok:
        fix = f"Pass e.g. {name}={example}" if example else ""
        raise config_error(where, name, value, "a non-empty list or tuple of non-empty strings", fix)
    return tuple(value)


def check_optional_int(where: str, name: str, value: Any, *, minimum: int | None = None) -> int | None:
    """None, or an int as :func:`check_int` accepts."""
    return None if value is None else check_int(where, name, value, minimum=minimum)


def check_mapping(where: str, name: str, value: Any) -> dict[str, Any]:
    """None (meaning empty) or a mapping with string keys, returned as a new dict."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise config_error(
            where, name, value, "a dict of option names to values, or None",
            f"Pass e.g. {name}={{'anon': True}}",
        )
    return dict(value)
