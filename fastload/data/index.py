"""A dataset's index in a few numpy arrays: paths, labels, sizes and versions of N samples.

NOTE [bounded bytes per sample]
A list of ``(path, label)`` tuples costs several Python objects per sample (a tuple, a str,
an int, a dict entry for the version): ~300 bytes each, 400 MB at ImageNet's 1.28M. Worse,
every worker forked from the main process writes the refcount of each object it touches,
so the pages holding them are copied into every worker (pytorch/pytorch#13246) and the
cost is paid once per process. :class:`DatasetIndex` keeps the whole index in one
``bytes`` blob (its serialized form, :mod:`fastload.data.index_format`) with numpy views
into it: the paths relative to ``prefix`` and the versions as UTF-8 bytes plus offsets,
labels in the smallest unsigned dtype, sizes, and a sort order for path lookups. A few
Python objects in all, ~100 bytes per sample for ImageNet-like names, and nothing a worker
touches by reading a sample writes to the shared pages. Strings are made on demand.

Changing versions (``revalidate``) swaps the whole state for a new one in one attribute
assignment, so a thread reading the index sees the old state or the new, never a mix, and
every copy of the dataset that shares this object sees the new versions.

Example::

    >>> index = DatasetIndex.build("/data/train/", ["cat/1.jpg", "dog/2.jpg"], [0, 1],
    ...                            classes=["cat", "dog"], versions=["10:1:2:3", "12:4:5:6"])
    >>> index.path(1), index.label(1), index.version(1), index.size(1)
    ('/data/train/dog/2.jpg', 1, '12:4:5:6', 12)
    >>> index.find("/data/train/dog/2.jpg")
    1
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from fastload.data.index_format import Columns, IndexFormatError, decode, encode
from fastload.io.versions import version_size

__all__ = ["DatasetIndex", "IndexFormatError"]

_ENCODING = ("utf-8", "surrogateescape")  # os.fsdecode's round trip for any file name


def _encode(text: str) -> bytes:
    return text.encode(*_ENCODING)


def _size(version: str | None) -> int:
    size = None if version is None else version_size(version)
    return -1 if size is None else size


class _State:
    """One immutable state of an index: its blob and the views into it."""

    __slots__ = ("blob", "cols", "meta", "paths", "versions")

    def __init__(self, blob: bytes) -> None:
        self.meta, self.cols = decode(blob)  # raises IndexFormatError
        self.blob = blob
        self.paths = memoryview(self.cols.path_data)
        self.versions = memoryview(self.cols.version_data)


class DatasetIndex:
    """The samples of a dataset: path, label, size and version of each, in numpy arrays.

    Build one with :meth:`build` or :meth:`from_bytes`; ``ImageFolder.index`` is one.

    Attributes:
        prefix: what every path starts with (the root and a slash; "" for explicit lists).
        classes: the class names, label ``i`` is ``classes[i]``.
        listed_at: when the listing the sample set comes from was made (seconds since the
            epoch, ``time.time()``).
        versions_at: when the versions were last read from the origin (the listing, or a
            revalidation since).
        extra: what the builder recorded with the index (JSON values; the stored listing
            keeps the root's URL and the extensions there).
        generation: how many times :meth:`replace_versions` ran on it in this process.
    """

    def __init__(self, blob: bytes) -> None:
        self._state = _State(blob)  # swapped whole (see NOTE [bounded bytes per sample])
        self.generation = 0  # counts replace_versions calls in this process

    def __reduce__(self):  # one blob crosses to worker processes, the views are rebuilt
        return (DatasetIndex, (self._state.blob,))

    @property
    def prefix(self) -> str:
        return self._state.meta["prefix"]

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self._state.meta["classes"])

    @property
    def listed_at(self) -> float:
        return float(self._state.meta["listed_at"])

    @property
    def versions_at(self) -> float:
        return float(self._state.meta["versions_at"])

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self._state.meta.get("extra") or {})

    @classmethod
    def build(
        cls,
        prefix: str,
        paths: Sequence[str],
        labels: Sequence[int],
        *,
        classes: Sequence[str],
        versions: Sequence[str | None] | None = None,
        sizes: Sequence[int | None] | None = None,
        listed_at: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> DatasetIndex:
        """An index of ``paths`` (relative to ``prefix``) with their labels and versions.

        ``versions[i]`` None (or no ``versions``) means unknown: a cached read asks the
        origin. ``sizes`` default to the size each version records (-1 = unknown).
        ``listed_at`` defaults to now. ``extra`` (JSON values) is kept with the index.
        """
        n = len(paths)
        versions = [None] * n if versions is None else versions
        if len(labels) != n or len(versions) != n or (sizes is not None and len(sizes) != n):
            raise ValueError(
                f"DatasetIndex.build: {n} paths, {len(labels)} labels, {len(versions)} versions"
            )
        if n and (min(labels) < 0 or max(labels) >= len(classes)):
            raise ValueError(
                f"DatasetIndex.build: labels must be in 0..{len(classes) - 1} ({len(classes)} classes)"
            )
        rel = [_encode(p) for p in paths]
        ordered = all(a <= b for a, b in itertools.pairwise(rel))
        order = None if ordered else sorted(range(n), key=rel.__getitem__)
        size_list = [_size(v) for v in versions] if sizes is None else [
            -1 if s is None else int(s) for s in sizes
        ]
        cols = Columns.pack(rel, [b"" if v is None else _encode(v) for v in versions],
                            labels, size_list, order)
        at = time.time() if listed_at is None else float(listed_at)
        meta = {"prefix": prefix, "classes": list(classes), "listed_at": at, "versions_at": at,
                "extra": dict(extra or {})}
        return cls(encode(meta, cols))

    @classmethod
    def from_bytes(cls, blob: bytes) -> DatasetIndex:
        """The index :meth:`to_bytes` wrote; raises :class:`IndexFormatError` if it is not one."""
        return cls(bytes(blob))

    def to_bytes(self) -> bytes:
        """The serialized index (what :meth:`from_bytes` reads; validated, checksummed)."""
        return self._state.blob

    # -- one sample ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._state.cols.labels)

    def _check(self, i: int, n: int) -> int:
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} out of range for a dataset of {n} samples")
        return i

    def path(self, i: int) -> str:
        """The full path of sample ``i`` (``prefix`` + its relative path)."""
        st = self._state
        offsets = st.cols.path_offsets
        i = self._check(i, len(offsets) - 1)
        return st.meta["prefix"] + str(st.paths[offsets[i] : offsets[i + 1]], *_ENCODING)

    def label(self, i: int) -> int:
        """The label of sample ``i``, an int."""
        labels = self._state.cols.labels
        return int(labels[self._check(i, len(labels))])

    def version(self, i: int) -> str | None:
        """The version of sample ``i`` as last listed, or None when unknown (or deleted)."""
        st = self._state
        offsets = st.cols.version_offsets
        i = self._check(i, len(offsets) - 1)
        start, end = offsets[i], offsets[i + 1]
        return str(st.versions[start:end], *_ENCODING) if end > start else None

    def size(self, i: int) -> int | None:
        """The size in bytes of sample ``i`` as listed, or None when unknown."""
        sizes = self._state.cols.sizes
        size = int(sizes[self._check(i, len(sizes))])
        return None if size < 0 else size

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label (a read-only array of the smallest unsigned dtype)."""
        return self._state.cols.labels

    @property
    def nbytes(self) -> int:
        """Bytes this index holds: its blob (which its arrays view) and its class names."""
        return len(self._state.blob) + sum(len(c) for c in self._state.meta["classes"])

    # -- lookups ---------------------------------------------------------------------------

    def find(self, path: str) -> int | None:
        """The index of the sample at ``path``, or None (a binary search, no table per path)."""
        st = self._state
        prefix = st.meta["prefix"]
        if not path.startswith(prefix):
            return None
        key = _encode(path[len(prefix) :])
        ordered = _Sorted(st)
        k = bisect.bisect_left(ordered, key)
        if k < len(ordered) and ordered[k] == key:
            return ordered.sample(k)
        return None

    def paths(self, indices: Iterable[int] | None = None) -> Iterator[str]:
        """The paths of ``indices`` (default: every sample, in order), made one at a time."""
        return (self.path(i) for i in (range(len(self)) if indices is None else indices))

    def versions(self) -> list[str | None]:
        """Every sample's version, in order (a list: for comparing, not for keeping)."""
        return [self.version(i) for i in range(len(self))]

    def unversioned(self) -> int:
        """How many samples have no version: deleted since the listing (a revalidation's
        None), or never known (an explicit list without a cache)."""
        return int(np.count_nonzero(np.diff(self._state.cols.version_offsets) == 0))

    def same_versions(self, other: DatasetIndex) -> bool:
        """Whether ``other`` has the same versions for the same samples (arrays compared)."""
        a, b = self._state.cols, other._state.cols
        return (
            np.array_equal(a.path_offsets, b.path_offsets) and np.array_equal(a.path_data, b.path_data)
            and np.array_equal(a.version_offsets, b.version_offsets)
            and np.array_equal(a.version_data, b.version_data)
        )

    def escaping_path(self) -> str | None:
        """The first relative path that does not name a file below :attr:`prefix`, else None.

        A path escapes when it is empty or absolute, or has an empty, ``.`` or ``..``
        component, or a NUL byte: ``../secret.txt`` read as ``prefix + path`` would be a file
        outside the dataset's root. Checked on the raw bytes with numpy (a 1M-sample index
        in well under a second), so a stored listing is checked at every load.

        Example::

            >>> index = DatasetIndex.build("/data/", ["cat/../../etc/passwd"], [0], classes=["cat"])
            >>> index.escaping_path()
            'cat/../../etc/passwd'
        """
        st = self._state
        data = np.asarray(st.cols.path_data, np.uint8)
        offsets = np.asarray(st.cols.path_offsets, np.int64)
        if _plainly_below(data, offsets):
            return None
        bad = _escaping(data, offsets)
        if bad is None:
            return None
        offsets = st.cols.path_offsets
        return str(st.paths[offsets[bad] : offsets[bad + 1]], *_ENCODING)

    # -- changes ---------------------------------------------------------------------------

    def replace_versions(self, versions: Sequence[str | None], *, at: float | None = None) -> None:
        """Take new versions (one per sample; None = deleted or unknown) read at ``at`` (now).

        Sizes follow the versions; the sample set, labels and ``listed_at`` stay. Every
        holder of this object sees the new versions at once (one state swap).
        """
        st = self._state
        cols = st.cols
        if len(versions) != len(cols.labels):
            raise ValueError(
                f"DatasetIndex.replace_versions: {len(versions)} versions for {len(cols.labels)} samples"
            )
        fresh = Columns.pack([], [b"" if v is None else _encode(v) for v in versions], [], [])
        new = Columns.of(cols.path_data, cols.path_offsets, fresh.version_data,
                         fresh.version_offsets, cols.labels, [_size(v) for v in versions],
                         cols.order)
        meta = dict(st.meta, versions_at=time.time() if at is None else float(at))
        self._state = _State(encode(meta, new))
        self.generation += 1

    def __repr__(self) -> str:
        return (
            f"DatasetIndex({len(self)} samples, {len(self.classes)} classes, "
            f"prefix={self.prefix!r}, {self.nbytes} bytes)"
        )


_DOT, _SLASH = ord("."), ord("/")


def _plainly_below(data: np.ndarray, offsets: np.ndarray) -> bool:
    """True when no path can escape: none empty, none starting with "." or "/" or ending
    with "/", and no NUL, "//" or "/." anywhere (searched at memchr speed, so the common
    case costs milliseconds at 1M paths). False: maybe; :func:`_escaping` decides."""
    lengths = np.diff(offsets)
    if len(lengths) == 0:
        return True
    if not lengths.all():
        return False
    heads, tails = data[offsets[:-1]], data[offsets[1:] - 1]
    if (heads == _DOT).any() or (heads == _SLASH).any() or (tails == _SLASH).any():
        return False
    raw = data.tobytes()
    return all(raw.find(pattern) < 0 for pattern in (b"\0", b"//", b"/."))


def _escaping(data: np.ndarray, offsets: np.ndarray) -> int | None:
    """The first sample whose path (``data[offsets[i]:offsets[i + 1]]``) escapes, or None.

    Marks per byte, no loop: a component begins at a path's start or after a slash, and
    ends before a slash or the path's end; a bad byte is a NUL, a slash that begins a
    component (an empty one) or ends a path, or the start of a ``.`` or ``..`` component.
    """
    empty = np.flatnonzero(np.diff(offsets) == 0)
    n = len(data)
    if n == 0:
        return int(empty[0]) if len(empty) else None
    starts = np.zeros(n + 2, bool)
    starts[offsets[:-1]] = True
    ends = np.zeros(n + 2, bool)   # ends[j]: a path ended just before byte j
    ends[offsets[1:]] = True
    slash = np.zeros(n + 2, bool)
    slash[:n] = data == _SLASH
    dot = np.zeros(n + 2, bool)
    dot[:n] = data == _DOT
    begins = starts[:n].copy()
    begins[1:] |= slash[: n - 1]
    closes = slash | ends          # closes[j]: a component ended just before byte j
    bad = (data == 0) | (begins & slash[:n]) | (slash[:n] & ends[1 : n + 1])
    bad |= begins & dot[:n] & closes[1 : n + 1]                                   # "."
    bad |= begins & dot[:n] & dot[1 : n + 1] & ~starts[1 : n + 1] & closes[2 : n + 2]  # ".."
    found = [int(e) for e in empty[:1]]
    first = np.flatnonzero(bad)
    if len(first):
        found.append(int(np.searchsorted(offsets, first[0], side="right")) - 1)
    return min(found) if found else None


class _Sorted:
    """The relative paths (bytes) in sorted order, as a sequence ``bisect`` can search."""

    def __init__(self, st: _State) -> None:
        self._view, self._offsets, self._order = st.paths, st.cols.path_offsets, st.cols.order

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def sample(self, k: int) -> int:
        return int(self._order[k]) if self._order is not None else k

    def __getitem__(self, k: int) -> bytes:
        i = self.sample(k)
        return self._view[self._offsets[i] : self._offsets[i + 1]].tobytes()
