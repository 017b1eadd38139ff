"""torchvision's folder rules: which folders are classes, which files their samples, in which order.

NOTE [torchvision's folder rules]
``fastload.ImageFolder`` gives the ``classes``, ``class_to_idx``, ``samples`` and ``targets``
that ``torchvision.datasets.ImageFolder`` gives for the same tree (tests/test_folder_torchvision.py
compares them on random trees):

* the classes are the folders directly below the root (hidden ones too; symlinks to folders
  count), sorted by name; a class's label is its position. A subclass's ``find_classes``
  decides instead, and its ``class_to_idx`` is used as it is.
* a class's samples are the files anywhere below its folder that ``is_valid_file(path)``
  accepts, or whose path ends with one of ``extensions`` (case-insensitive), never both;
  in torchvision's walk order: folder by folder, the folders sorted by path, the files
  sorted by name in each (:func:`walk_order`). Classes follow in sorted name order.
* a class with no valid file raises :class:`~fastload.errors.EmptyClassError` (a
  ``FileNotFoundError``, "Found no valid file for the classes ..."), unless ``allow_empty``:
  then it stays a class, with its label and no samples; no later class is renumbered. So
  does a root without any class folder ("Couldn't find any class folder in ...").

Where fastload differs, on purpose: it lists regular files only (a FIFO, a socket or a
dangling symlink is left out with a warning, torchvision would list it and fail reading
it), leaves out a symlinked folder that loops back above itself (torchvision would walk it
until the path is too long), and lower-cases ``extensions`` (torchvision compares the lower-
cased path with them as given). Folders of a remote store exist only through the objects
below them, so a remote class folder is never empty; one whose objects are not images is.

Example::

    >>> rules = folder_rules(None, None, allow_empty=True)     # ImageFolder's defaults
    >>> rules.accepts("/data/train/cat/1.JPG"), rules.extensions[:2]
    (True, ('.jpg', '.jpeg'))
    >>> walk_order(["/d/c/sub/a.jpg", "/d/c/z.jpg"], start=len("/d/c/"))
    ['/d/c/z.jpg', '/d/c/sub/a.jpg']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
from PIL import Image

from fastload.arguments import check_bool, check_strings, config_error
from fastload.errors import ConfigError, EmptyClassError
from fastload.io.errors import storage_errors
from fastload.io.storage import Storage

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""What counts as an image without ``is_valid_file``: torchvision's ``IMG_EXTENSIONS``."""

READ_PATH = ("__getitem__", "__getitems__", "load", "finish")
"""ImageFolder's methods that the in-process engines (threads, DALI) do not call: a subclass
that overrides one runs only where torch's fetcher calls them, on torch workers."""


@dataclass(frozen=True)
class FolderRules:
    """Which files below a root are samples, and of which class (NOTE [torchvision's folder rules]).

    Attributes:
        extensions: lower-case endings of the files kept, or None with ``is_valid_file``.
        is_valid_file: the user's ``path -> bool``, or None with ``extensions``.
        allow_empty: keep a class folder without a valid file as a class without samples.
        class_to_idx: a subclass's ``find_classes`` mapping, or None: the folders below the
            root, sorted, labelled by position.
    """

    extensions: tuple[str, ...] | None = IMAGE_EXTENSIONS
    is_valid_file: Callable[[str], bool] | None = None
    allow_empty: bool = False
    class_to_idx: Mapping[str, int] | None = None

    def accepts(self, path: str) -> bool:
        """Whether the file at ``path`` (as ``samples`` shows it) is a sample."""
        if self.is_valid_file is not None:
            return bool(self.is_valid_file(path))
        return path.lower().endswith(self.extensions)  # type: ignore[arg-type]

    def select(self, paths: Sequence[str]) -> list[str]:
        """The samples among ``paths``, in their order."""
        if self.is_valid_file is not None:
            check = self.is_valid_file
            return [p for p in paths if check(p)]
        ends = self.extensions
        return [p for p in paths if p.lower().endswith(ends)]  # type: ignore[arg-type]

    @property
    def storable(self) -> bool:
        """Whether a listing made by these rules can be stored and found again by them: not
        with ``is_valid_file``, a function whose answers no key can capture."""
        return self.is_valid_file is None

    def describe(self) -> dict[str, Any]:
        """The rules as JSON values (what a stored listing is keyed and checked by)."""
        return {
            "extensions": sorted(set(self.extensions or ())),
            "allow_empty": self.allow_empty,
            "class_to_idx": None if self.class_to_idx is None else sorted(self.class_to_idx.items()),
        }


def folder_rules(
    extensions: Sequence[str] | None,
    is_valid_file: Callable[[str], bool] | None,
    allow_empty: bool,
    *,
    class_to_idx: Mapping[str, int] | None = None,
    default: tuple[str, ...] | None = IMAGE_EXTENSIONS,
    where: str = "ImageFolder",
) -> FolderRules:
    """The rules of ``where``'s arguments, checked as torchvision checks them.

    ``extensions`` and ``is_valid_file`` are exclusive (a ConfigError, a ``ValueError``, when
    both are given); with neither, ``default`` extensions apply (ImageFolder's images;
    ``None``: an error, as torchvision's ``make_dataset`` raises).
    """
    allow_empty = check_bool(where, "allow_empty", allow_empty)
    if extensions is None and is_valid_file is None:
        if default is None:
            raise ConfigError(
                f"{where}(extensions=None, is_valid_file=None): both extensions and is_valid_file "
                "cannot be None or not None at the same time; pass one of them"
            )
        extensions = default
    elif extensions is not None and is_valid_file is not None:
        raise ConfigError(
            f"{where}(extensions=..., is_valid_file=...): both extensions and is_valid_file "
            "cannot be None or not None at the same time (torchvision's rule); pass extensions "
            "to keep files by their ending, or is_valid_file to decide per path"
        )
    if is_valid_file is not None and not callable(is_valid_file):
        raise config_error(where, "is_valid_file", is_valid_file, "a function path -> bool, or None")
    if extensions is not None:
        extensions = tuple(e.lower() for e in check_strings(
            where, "extensions", extensions, example="('.jpg', '.png')"))
    if class_to_idx is not None:
        class_to_idx = check_class_to_idx(class_to_idx, where)
    return FolderRules(extensions, is_valid_file, allow_empty, class_to_idx)


def check_class_to_idx(class_to_idx: Any, where: str = "ImageFolder") -> dict[str, int]:
    """A ``find_classes`` mapping as a dict of class names to labels (ints >= 0)."""
    ok = isinstance(class_to_idx, Mapping) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in class_to_idx.items()
    )
    if not ok:
        raise config_error(
            where, "class_to_idx", class_to_idx, "a dict of class names to labels (ints >= 0)",
            "find_classes must return (classes, {name: label}); fastload keeps labels as ints",
        )
    if not class_to_idx:
        raise ConfigError(
            f"{where}: 'class_to_idx' must have at least one entry to collect any samples "
            "(find_classes returned none)"
        )
    return dict(class_to_idx)


def names_by_label(class_to_idx: Mapping[str, int], labels: Iterable[int] = ()) -> list[str]:
    """Label ``i``'s class name at position ``i`` (the first name by sorted order where several
    share a label; ``str(i)`` where none has it), up to the largest of both ``labels`` and
    the mapping's."""
    top = max([*class_to_idx.values(), *labels], default=-1)
    names = [str(i) for i in range(top + 1)]
    for name in sorted(class_to_idx, reverse=True):
        names[class_to_idx[name]] = name
    return names


def find_classes(storage: Storage) -> tuple[list[str], dict[str, int]]:
    """torchvision's ``find_classes`` of ``storage``'s root: its folders, sorted, by position.

    A local root is read with one ``os.scandir`` (symlinks to folders count, as in
    torchvision); a remote one with one listing of its top level. Raises
    :class:`~fastload.errors.EmptyClassError` when there is none.
    """
    root = storage.root
    if storage.is_local:
        with storage_errors("list", storage.url), os.scandir(root) as entries:
            names = [e.name for e in entries if e.is_dir()]
    else:
        fs = storage.fs
        with storage_errors("list", storage.url):
            found = fs.ls(root, detail=True)
        names = [os.path.basename(i["name"].rstrip("/")) for i in found if i.get("type") == "directory"]
    if not names:
        raise no_class_folder(storage.url)
    classes = sorted(names)
    return classes, {name: i for i, name in enumerate(classes)}


def walk_order(paths: list[str], start: int) -> list[str]:
    """A class's files in torchvision's order (``sorted(os.walk(...))``, then sorted names).

    ``paths`` are sorted (a listing's order) and below one class folder that ends at
    ``start``. Without subfolders that order is torchvision's already; with them a folder's
    own files come before its subfolders' (``c/z.jpg`` before ``c/sub/a.jpg``).
    """
    if all(p.find("/", start) < 0 for p in paths):
        return paths
    return sorted(paths, key=_folder_then_name)


def _folder_then_name(path: str) -> tuple[str, str]:
    folder, _, name = path.rpartition("/")
    return folder, name


def no_class_folder(url: str) -> EmptyClassError:
    """torchvision's error for a root without class folders."""
    return EmptyClassError(
        f"Couldn't find any class folder in {url}. Expected <root>/<class>/<image>; put each "
        "class's images in a folder of its own below the root"
    )


def empty_classes(url: str, names: Sequence[str], rules: FolderRules) -> EmptyClassError:
    """torchvision's error for class folders without a valid file, with the fix."""
    what = (
        f"Supported extensions are: {', '.join(rules.extensions)}" if rules.extensions is not None
        else "is_valid_file accepted none of their files"
    )
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return EmptyClassError(
        f"Found no valid file for the classes {shown}. {what} (below {url}). Put images in "
        "them, remove them, or pass allow_empty=True to keep them as classes without samples"
    )


def default_loader(path: str) -> Image.Image:
    """torchvision's default loader: the image at ``path`` (a path or fsspec URL) as RGB.

    ``ImageFolder.loader`` is this unless another is passed; fastload itself never calls
    it: with it, samples take the declared decode (threads, DALI, Pillow in workers).
    """
    with fsspec.open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


def is_default_loader(loader: Any) -> bool:
    """Whether ``loader`` is fastload's or torchvision's default (PIL) loader: the declared
    decode gives what it gives, so passing it changes nothing."""
    if loader is default_loader:
        return True
    return getattr(loader, "__module__", None) == "torchvision.datasets.folder" and getattr(
        loader, "__name__", None) in ("default_loader", "pil_loader")


def overridden(cls: type, base: type, names: Sequence[str]) -> list[str]:
    """Those of ``base``'s methods ``names`` that ``cls`` (a subclass) defines anew."""
    return [n for n in names if getattr(cls, n, None) is not getattr(base, n, None)]


def name_of(fn: Any) -> str:
    """A function's name for a message (its class's for a callable object)."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__
