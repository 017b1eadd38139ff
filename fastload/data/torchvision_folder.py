"""``ImageFolder``'s torchvision surface: ``samples``/``targets``/``imgs``, ``find_classes``,
``make_dataset``, ``loader`` and ``target_transform``, and the build's way through a
subclass's own ``find_classes`` / ``make_dataset``.

:class:`TorchvisionFolder` is the part of :class:`~fastload.ImageFolder` that torchvision's
``DatasetFolder`` has: a subclass overrides ``find_classes`` or ``make_dataset`` as it would
torchvision's, and :func:`list_root` (called by the build) honours what it overrides. With
neither overridden, the classes come with the root's one listing, or with the listing
stored in the cache, and no request is sent for them (NOTE [the stored listing]). A
``loader`` other than the default, or a subclass's own ``__getitem__``, is user code in the
read path: :meth:`~TorchvisionFolder.torch_only_reason` says so, and the loader keeps such a
dataset on torch workers, which call it.

Example::

    >>> class Pets(ImageFolder):
    ...     def find_classes(self, directory):
    ...         return ["cat", "dog"], {"cat": 0, "dog": 1}     # the other folders are left out
    >>> Pets("/data/train").class_to_idx
    {'cat': 0, 'dog': 1}
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fastload.cache import TieredCache
from fastload.data import batchinfo, listing
from fastload.data.folder_rules import (
    FolderRules,
    check_class_to_idx,
    folder_rules,
    is_default_loader,
    name_of,
    overridden,
)
from fastload.data.folder_rules import find_classes as classes_below
from fastload.data.index import DatasetIndex
from fastload.data.index_views import SamplesView, TargetsView
from fastload.data.sample_errors import NOT_READ_ERRORS
from fastload.data.stored_listing import StoredListing, index_of_root
from fastload.data.transforms import run_seeded
from fastload.errors import ConfigError
from fastload.io.storage import Storage


class TorchvisionFolder:
    """What ``ImageFolder`` shares with torchvision's ``DatasetFolder`` (see the module doc).

    The class that derives from it directly (``ImageFolder``, also a
    :class:`~fastload.data.declared.DeclaredImages`, which gives ``corrupt``, ``unreadable``,
    ``sample_seed``, ``target`` and ``batch_targets``) sets the attributes below; its methods
    named in :data:`~fastload.data.folder_rules.READ_PATH` are the declared read path.
    """

    index: DatasetIndex
    storage: Storage
    loader: Callable[[str], Any]
    transform: Callable[[Any], Any] | None
    target_transform: Callable[[Any], Any] | None

    @property
    def samples(self) -> SamplesView:
        """``(path, label)`` of each sample: a read-only view of :attr:`index` (see the class doc)."""
        return SamplesView(self.index)

    @samples.setter
    def samples(self, value: Any) -> None:
        raise ConfigError(
            "ImageFolder.samples is a read-only view of the dataset's index; to read other "
            "files, pass them as a list: ImageFolder([(path, label), ...]), override "
            "make_dataset, or wrap the dataset in torch.utils.data.Subset(ds, indices)"
        )

    imgs = samples  # torchvision's other name for them

    @property
    def targets(self) -> TargetsView:
        """The label of each sample: a read-only view of :attr:`index` (``index.labels`` is
        the numpy array)."""
        return TargetsView(self.index)

    @targets.setter
    def targets(self, value: Any) -> None:
        raise ConfigError(
            "ImageFolder.targets is a read-only view of the dataset's labels; pass other "
            "labels with the paths: ImageFolder([(path, label), ...])"
        )

    def torch_only_reason(self) -> str | None:
        """Why only torch workers can run this dataset's samples, or None: the declared read
        path, which every engine runs. ``fastload.DataLoader`` shows it in ``backend_reason``.

        Example::

            >>> ImageFolder("/data/train", loader=my_loader).torch_only_reason()
            'ImageFolder(loader=my_loader) reads and decodes each file itself; ...'
        """
        if not is_default_loader(self.loader):
            return (
                f"ImageFolder(loader={name_of(self.loader)}) reads and decodes each file itself; "
                "only torch workers call it (threads and DALI run fastload's own decode)"
            )
        # A subclass's own read path: DeclaredImages's check, next in ImageFolder's MRO.
        return super().torch_only_reason()  # type: ignore[misc]

    def load_with_loader(self, index: int) -> tuple[Any, Any]:
        """Sample ``index`` as the user's ``loader`` returns it for its path (a remote file's
        URL), then ``transform`` on it, seeded per sample like the declared path; errors
        name the file and the index, as the declared path's do."""
        path = self.index.path(index)
        start = time.perf_counter()
        try:
            sample = self.loader(path if self.storage.is_local else self.storage.to_url(path))
        except NOT_READ_ERRORS as exc:  # read, but not an image it can decode
            raise self.corrupt(index, exc) from exc  # type: ignore[attr-defined]
        except OSError as exc:
            raise self.unreadable(index, exc) from exc  # type: ignore[attr-defined]
        loaded = time.perf_counter()
        if self.transform is not None:
            sample = run_seeded(self.transform, sample, self.sample_seed(index))  # type: ignore[attr-defined]
        batchinfo.record(loaded - start, time.perf_counter() - loaded, 1)
        return sample, self.target(self.index.label(index))

    def find_classes(self, directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
        """torchvision's ``find_classes``: the folders directly below ``directory``, sorted, and
        each one's label (its position). Raises :class:`~fastload.errors.EmptyClassError`
        without any.

        Override it to choose the classes (a subset, other labels, another layout); the
        build then takes its ``class_to_idx`` as it is and keys a stored listing by it.

        Example::

            >>> ds.find_classes(ds.root)
            (['cat', 'dog'], {'cat': 0, 'dog': 1})
        """
        same = os.fspath(directory) == self.storage.url
        return classes_below(self.storage if same else Storage(directory, self.storage.storage_options))

    @staticmethod
    def make_dataset(
        directory: str | os.PathLike[str],
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """torchvision's ``make_dataset``: ``(path, label)`` of each valid file below each class
        folder of ``directory``, in torchvision's order; exactly one of ``extensions`` and
        ``is_valid_file`` (a ConfigError, which is a ValueError, otherwise).

        Override it to read another layout: the build indexes what it returns (local paths
        or the store's paths, anywhere) and reads those files.

        Example::

            >>> ImageFolder.make_dataset("/data/train", {"cat": 0}, extensions=(".jpg",))[:1]
            [('/data/train/cat/1.jpg', 0)]
        """
        if class_to_idx is None:
            raise ConfigError("ImageFolder.make_dataset: the class_to_idx parameter cannot be None")
        rules = folder_rules(extensions, is_valid_file, allow_empty, class_to_idx=class_to_idx,
                             default=None, where="ImageFolder.make_dataset")
        return list(SamplesView(listing.scan(Storage(directory), rules, "raise", details=False).index))


@dataclass
class Listed:
    """What :func:`list_root` found: the index and where it is stored, the classes, whether
    the samples are the root's listing (else a ``make_dataset``'s, revalidated one by one),
    and the rules a revalidation counts new files by."""

    index: DatasetIndex
    stored: StoredListing | None
    classes: list[str]
    class_to_idx: dict[str, int]
    listed_root: bool
    rules: FolderRules


def list_root(
    dataset: Any, rules: FolderRules, cache: TieredCache | None, storage_options: dict[str, Any]
) -> Listed:
    """The index of ``dataset``'s root (an ImageFolder being built) by torchvision's rules, or
    by its class's own ``find_classes`` / ``make_dataset`` where it overrides them."""
    own = overridden(type(dataset), TorchvisionFolder, ("find_classes", "make_dataset"))
    stored = dict(on_error=dataset.on_error, max_age=dataset.listing_max_age, storage_options=storage_options)
    if not own:  # the classes come with the listing: no request beyond it
        index, where = index_of_root(dataset.storage, cache, rules=rules, **stored)
        classes = list(index.classes)
        return Listed(index, where, classes, {c: i for i, c in enumerate(classes)}, True, rules)
    classes, class_to_idx = dataset.find_classes(dataset.root)
    if "make_dataset" not in own:
        rules = replace(rules, class_to_idx=check_class_to_idx(class_to_idx, "find_classes"))
        index, where = index_of_root(dataset.storage, cache, rules=rules, **stored)
        return Listed(index, where, classes, class_to_idx, True, rules)
    samples = dataset.make_dataset(
        dataset.root, class_to_idx, extensions=rules.extensions,
        is_valid_file=rules.is_valid_file, allow_empty=rules.allow_empty,
    )
    index = listing.index_of_pairs(
        dataset.storage, samples, snapshot=cache is not None, class_to_idx=class_to_idx,
    )
    return Listed(index, None, classes, class_to_idx, False, rules)


def list_pairs(storage: Storage, pairs: Any, *, snapshot: bool) -> Listed:
    """The index of an explicit ``(path, label)`` list: label ``i`` is class ``str(i)``."""
    index = listing.index_of_pairs(storage, pairs, snapshot=snapshot)
    classes = list(index.classes)
    return Listed(index, None, classes, {c: i for i, c in enumerate(classes)}, False, FolderRules())
