"""Read-only views of a :class:`~fastload.data.index.DatasetIndex` that look like torchvision's.

``ImageFolder.samples`` and ``.targets`` are lists in torchvision; here they are views of the
index (NOTE [bounded bytes per sample] in :mod:`fastload.data.index`): each item is made when
it is asked for, so a list of a million tuples never exists. They index, slice (a slice is a
list), iterate, compare equal to lists with the same items and work with ``len``, ``in`` and
``json.dumps(list(view))``; they cannot be changed. :class:`IndexVersions` is the
``path -> version`` mapping a :class:`~fastload.io.storage.Storage` keys cached reads by,
looked up in the index instead of a dict per path.

Example::

    >>> ds.samples[0]
    ('/data/train/cat/1.jpg', 0)
    >>> ds.targets[:3], len(ds.targets)
    ([0, 0, 1], 1281167)
    >>> ds.storage.versions["/data/train/cat/1.jpg"]
    '48213:1764403200000000000:5308443:1764403200123456789'
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any, overload

from fastload.data.index import DatasetIndex


class _View(Sequence):
    """A read-only sequence over an index; subclasses say what one item is."""

    __hash__ = None  # type: ignore[assignment]  # like a list: compares by value

    def __init__(self, index: DatasetIndex) -> None:
        self.index = index

    @abc.abstractmethod
    def _item(self, i: int) -> Any:
        """Item ``i`` of the view (a subclass says what one is)."""

    def __len__(self) -> int:
        return len(self.index)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item(k) for k in range(*i.indices(len(self)))]
        return self._item(i)

    def __iter__(self) -> Iterator[Any]:
        return (self._item(k) for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, tuple, _View)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __add__(self, other: object) -> list[Any]:
        """``ds.samples + [...]``: a new list, as torchvision's list would give."""
        if not isinstance(other, (list, tuple, _View)):
            return NotImplemented
        return [*self, *other]

    def __radd__(self, other: object) -> list[Any]:
        if not isinstance(other, (list, tuple)):
            return NotImplemented
        return [*other, *self]

    def __repr__(self) -> str:
        n = len(self)
        shown = ", ".join(repr(self._item(k)) for k in range(min(n, 3)))
        return f"{type(self).__name__}([{shown}{', ...' if n > 3 else ''}], {n} items)"


class SamplesView(_View):
    """``(path, label)`` of each sample, like torchvision's ``ImageFolder.samples``."""

    def _item(self, i: int) -> tuple[str, int]:
        return self.index.path(i), self.index.label(i)


class TargetsView(_View):
    """The label (an int) of each sample, like torchvision's ``ImageFolder.targets``."""

    def _item(self, i: int) -> int:
        return self.index.label(i)


class IndexVersions(MutableMapping):
    """``path -> version`` of an index's samples, for :class:`~fastload.io.storage.Storage`.

    A lookup is a binary search in the index (:meth:`DatasetIndex.find`). A sample with no
    version (unknown, or deleted at the last revalidation) is missing here, so a cached read
    asks the origin; what the reader then learns (``versions[path] = v``) and any path not
    in the index is kept in a small dict of its own, in this process. The index itself
    changes only through :meth:`DatasetIndex.replace_versions`, which drops what was learned.

    ``index`` is set once the dataset has one (the Storage exists before its listing).
    """

    def __init__(self, index: DatasetIndex | None = None) -> None:
        self.index = index
        self._learned: dict[str, str] = {}
        self._generation: tuple[int, int] | None = None  # what the learned versions belong to

    def _fresh(self) -> dict[str, str]:
        index = self.index
        now = None if index is None else (id(index), index.generation)
        if now != self._generation:  # the index took new versions: forget what was learned
            self._learned, self._generation = {}, now
        return self._learned

    def __getitem__(self, path: str) -> str:
        learned = self._fresh()
        if path in learned:
            return learned[path]
        i = None if self.index is None else self.index.find(path)
        version = None if i is None else self.index.version(i)  # type: ignore[union-attr]
        if version is None:
            raise KeyError(path)
        return version

    def __setitem__(self, path: str, version: str) -> None:
        self._fresh()[path] = version

    def __delitem__(self, path: str) -> None:
        self._fresh().pop(path, None)

    def __iter__(self) -> Iterator[str]:
        learned = self._fresh()
        if self.index is not None:
            for i in range(len(self.index)):
                path = self.index.path(i)
                if path not in learned and self.index.version(i) is not None:
                    yield path
        yield from learned

    def __len__(self) -> int:
        return sum(1 for _ in self)  # a walk of the index: for tests and repr, not a hot path

    def __bool__(self) -> bool:  # cheap, unlike len(): `versions or {}` must not walk the index
        return bool(self._fresh()) or (self.index is not None and len(self.index) > 0)

    def __repr__(self) -> str:
        return f"IndexVersions({self.index!r}, {len(self._learned)} learned)"
