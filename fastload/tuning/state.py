"""What a dataset holds, read without calling it: a bounded walk of its attributes.

For the probe (NOTE [the dataset probe] in :mod:`fastload.tuning.probe`): a fingerprint of
the state (to see a fetch mutate it), the plain class attributes a copy shares with the
user's object (to put back what a fetch rebinds), attributes forked workers would share
unsafely, a ``__getitem__`` that reads its worker's identity, and the bytes of its arrays.
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
import socket
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import torch

_DEPTH = 4
_ITEMS = 64
_NODES = 4096
IDENTITY_CALLS = frozenset({"get_worker_info", "initial_seed"})
_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
         types.MethodWrapperType, types.WrapperDescriptorType)
_LIBRARY_ROOTS = frozenset({"builtins", "torch", "numpy", "typing", "abc", "collections"})

logger = logging.getLogger(__name__)


# -- state: a bounded walk, its fingerprint, class attributes -----------------------------

def _is_library(t: type) -> bool:
    return (t.__module__ or "builtins").split(".")[0] in _LIBRARY_ROOTS


def _atomic(o: Any) -> bool:
    return o is None or isinstance(o, (bool, int, float, complex, str, bytes, bytearray))


def _opaque(o: Any) -> bool:
    np = sys.modules.get("numpy")
    return (
        _atomic(o) or isinstance(o, (torch.Tensor, torch.Generator, type, random.Random, *_CODE))
        or (np is not None and isinstance(o, (np.ndarray, np.generic, np.random.Generator, np.random.RandomState)))
    )


def _children(o: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(o, dict):
        for n, (k, v) in enumerate(o.items()):
            if n >= _ITEMS:
                return
            yield f"[{short(repr(k), 24)}]", v
    elif isinstance(o, (list, tuple)):
        for n, v in enumerate(o[:_ITEMS]):
            yield f"[{n}]", v
    elif not isinstance(o, (set, frozenset)):
        attrs = getattr(o, "__dict__", None)
        if isinstance(attrs, dict):
            yield from ((f".{k}", v) for k, v in list(attrs.items())[:_ITEMS])
        for cls in type(o).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if isinstance(slot, str) and slot not in ("__dict__", "__weakref__") and hasattr(o, slot):
                    yield f".{slot}", getattr(o, slot)


def walk(root: Any) -> Iterator[tuple[str, Any]]:
    """(path, object) for everything reachable from ``root``, bounded; deterministic order."""
    seen: set[int] = set()
    stack = [("", root, 0)]
    nodes = 0
    while stack and nodes < _NODES:
        path, o, depth = stack.pop()
        if not _atomic(o):
            if id(o) in seen:
                continue
            seen.add(id(o))
        nodes += 1
        yield path, o
        if depth < _DEPTH and not _opaque(o):
            try:
                kids = list(_children(o))
            except Exception:  # noqa: BLE001, S112 - an object whose attributes cannot be read
                continue
            stack.extend((path + name, kid, depth + 1) for name, kid in reversed(kids))


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _token(o: Any) -> Any:
    np = sys.modules.get("numpy")
    try:
        if o is None or isinstance(o, (bool, int, float, complex)):
            return o
        if isinstance(o, (str, bytes, bytearray)):
            raw = o.encode("utf-8", "surrogatepass") if isinstance(o, str) else bytes(o)
            return o if len(o) <= 64 else (len(o), _digest(raw))
        if isinstance(o, torch.Tensor):
            return ("tensor", str(o.dtype), tuple(o.shape), o.device.type, o._version, o.data_ptr())
        if isinstance(o, torch.Generator):
            return ("generator", _digest(o.get_state().numpy().tobytes()))
        if isinstance(o, random.Random):
            return ("random", hash(o.getstate()))
        if np is not None and isinstance(o, np.ndarray):
            raw = o.tobytes() if o.nbytes <= 1 << 20 else o.ravel()[:: max(1, o.size // 4096)].tobytes()
            return ("ndarray", o.dtype.str, o.shape, _digest(raw))
        if np is not None and isinstance(o, np.random.RandomState):
            return ("RandomState", _digest(o.get_state()[1].tobytes()), o.get_state()[2])
        if np is not None and isinstance(o, np.random.Generator):
            return ("Generator", repr(o.bit_generator.state))
        if isinstance(o, (dict, list, tuple, set, frozenset)):
            return (type(o).__name__, len(o))
    except Exception:  # noqa: BLE001, S110 - an object whose accessors raise: its type stands for it
        pass
    return type(o).__qualname__


def fingerprint(o: Any) -> list[tuple[str, Any]]:
    return [(path, _token(x)) for path, x in walk(o)]


def difference(before: list[tuple[str, Any]], after: list[tuple[str, Any]]) -> str | None:
    for (p, a), (q, b) in zip(before, after):
        if p != q:
            return f"{p or q or 'its state'} changed"
        if a != b:
            return f"{p or 'its state'}: {short(repr(a), 40)} -> {short(repr(b), 40)}"
    if len(before) != len(after):
        longer = after if len(after) > len(before) else before
        return f"{longer[min(len(before), len(after))][0] or 'its state'} added or removed"
    return None


def class_state(o: Any) -> dict[type, dict[str, Any]]:
    """Plain class attributes of the user's classes reachable from ``o`` (shared with the user)."""
    classes = []
    for _, x in walk(o):
        for cls in type(x).__mro__:
            if not _is_library(cls) and cls not in classes:
                classes.append(cls)
    state = {}
    for cls in classes[:16]:
        state[cls] = {k: v for k, v in vars(cls).items() if not k.startswith("__") and not hasattr(v, "__get__")}
    return state


def restore_classes(state: dict[type, dict[str, Any]]) -> str | None:
    """Put back class attributes a fetch rebound, added or deleted; say which (the first)."""
    changed = None
    for cls, attrs in state.items():
        now = {k: v for k, v in vars(cls).items() if not k.startswith("__") and not hasattr(v, "__get__")}
        for name in set(attrs) | set(now):
            if attrs.get(name, _MISSING) is now.get(name, _MISSING):
                continue
            try:
                if name in attrs:
                    setattr(cls, name, attrs[name])
                else:
                    delattr(cls, name)
                outcome = "restored"
            except (AttributeError, TypeError) as exc:  # a metaclass that refuses: say so
                outcome = f"could not be restored: {exc}"
                logger.warning("dataset probe: class attribute %s.%s changed by a fetch and %s",
                               cls.__name__, name, outcome)
            changed = changed or f"class attribute {cls.__name__}.{name} changed ({outcome})"
    return changed


_MISSING = object()


# -- fork hazards, worker identity, array bytes -------------------------------------------

def fork_hazard(nodes: list[tuple[str, Any]]) -> str | None:
    for path, o in nodes:
        t = type(o)
        where = f" at dataset{path}" if path else ""
        root = (t.__module__ or "").split(".")[0]
        try:
            if root == "sqlite3" and t.__name__ == "Connection":
                return f"it holds an open sqlite3 connection{where}"
            if isinstance(o, socket.socket) and o.fileno() != -1:
                return f"it holds an open socket{where}"
            if isinstance(o, threading.Thread) and o.is_alive():
                return f"it holds a running thread{where}"
            if root in ("h5py", "lmdb"):
                return f"it holds a {root} handle ({t.__name__}){where}"
            if isinstance(o, io.IOBase) and not o.closed:
                return f"it holds an open file{where} (forked workers share its offset)"
        except Exception:  # noqa: BLE001, S112 - the dataset's own code may raise anything
            continue
    return None


def reads_identity(nodes: list[tuple[str, Any]]) -> str | None:
    for _, o in nodes:
        t = type(o)
        if _is_library(t):
            continue
        code = getattr(getattr(t, "__getitem__", None), "__code__", None)
        if code is not None and IDENTITY_CALLS & set(code.co_names):
            return f"{t.__name__}.__getitem__"
    return None


def memory_of(nodes: list[tuple[str, Any]]) -> tuple[set[int], list[tuple[int, int]]]:
    """The objects (ids) and array memory (address ranges) a walk of a dataset reached."""
    ids = {id(o) for _, o in nodes if not _atomic(o)}
    spans = [span for _, o in nodes if (span := _span(o)) is not None]
    return ids, spans


def shares_memory(nodes: list[tuple[str, Any]], owner: tuple[set[int], list[tuple[int, int]]]) -> str | None:
    """How a sample (its walk, ``nodes``) shares objects or memory with ``memory_of(dataset)``.

    For the probe's kept samples (NOTE [probe samples reused]): a sample that is an object of
    the dataset, or a view of its arrays, is what the dataset holds, not a copy of it.
    """
    ids, spans = owner
    for path, o in nodes:
        where = f" (at sample{path})" if path else ""
        if not _atomic(o) and id(o) in ids:
            return f"is an object the dataset holds{where}"
        span = _span(o)
        if span is not None and span[1] > span[0] and any(lo <= span[0] < hi for lo, hi in spans):
            return f"is a view of the dataset's memory{where}"
    return None


def _span(o: Any) -> tuple[int, int] | None:
    """The address range of a tensor's storage or an array's memory, or None."""
    np = sys.modules.get("numpy")
    try:
        if isinstance(o, torch.Tensor):
            if o.device.type != "cpu" or o.is_nested or o.layout != torch.strided:
                return None
            if o.numel() == 0:
                return None
            lo = o.data_ptr()
            storage = o.untyped_storage()
            return min(lo, storage.data_ptr()), max(lo, storage.data_ptr()) + storage.nbytes()
        if np is not None and isinstance(o, np.ndarray):
            if o.size == 0:
                return None
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            lo = int(o.__array_interface__["data"][0])
            start = int(base.__array_interface__["data"][0])
            return min(lo, start), max(lo, start) + int(base.nbytes)
    except Exception:  # noqa: BLE001 - an object whose accessors raise: no memory known
        return None
    return None


def array_bytes(o: Any) -> int:
    np = sys.modules.get("numpy")
    if isinstance(o, torch.Tensor):
        try:
            return o.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001 - the dataset's own code may raise anything
            return 0
    if np is not None and isinstance(o, np.ndarray):
        return int(o.nbytes)
    return 0


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def short(o: Any, n: int = 80) -> str:
    s = str(o).replace("\n", " ")
    return s if len(s) <= n else s[: n - 3] + "..."
