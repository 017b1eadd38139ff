"""``ImageFolder``: a declared image dataset over any fsspec URL.

The dataset is *declared*: its files, labels and :class:`~fastload.data.pipeline.ImagePipeline`
are data, so fastload can run it on torch workers (Pillow) or compile it to DALI, and can
use worker processes for it safely (see NOTE [auto never changes the batches]).

Example::

    >>> from fastload import DataLoader, ImageFolder
    >>> ds = ImageFolder("s3://bucket/imagenet/train", size=224, train=True)
    >>> ds.classes[:2], len(ds)
    (['n01440764', 'n01443537'], 1281167)
    >>> image, label = ds[0]          # uint8 (3, 224, 224), int
    >>> loader = DataLoader(ds, batch_size=256, shuffle=True)

Layout: ``root/<class name>/<file>``, any depth below the class folder, like torchvision's
``ImageFolder``, whose arguments it takes and whose classes, labels and sample order it gives
(NOTE [torchvision's folder rules] in :mod:`fastload.data.folder_rules`). An explicit list of
``(path, label)`` pairs works too: ``ImageFolder([("a.jpg", 0), ("b.jpg", 1)])``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastload.arguments import (
    check_bool,
    check_choice,
    check_mapping,
    check_number,
    check_optional_int,
    check_size,
)
from fastload.cache import TieredCache, open_cache
from fastload.cache.filesystem import CachedReads
from fastload.data import batchinfo, listing
from fastload.data.declared import DeclaredImages, OnError
from fastload.data.fetch_advice import cache_dir, folder_fix
from fastload.data.folder_args import check_callables, check_root, check_steps, decode_steps
from fastload.data.folder_rules import (
    IMAGE_EXTENSIONS,
    FolderRules,
    default_loader,
    folder_rules,
    is_default_loader,
    name_of,
)
from fastload.data.index_views import IndexVersions
from fastload.data.pipeline import ImagePipeline, Normalize
from fastload.data.sample_errors import DECODE_ERRORS
from fastload.data.stored_listing import DEFAULT_MAX_AGE_S, store_versions
from fastload.data.torchvision_folder import TorchvisionFolder, list_pairs, list_root
from fastload.data.transcode import transcoding
from fastload.data.transforms import CompiledTransform
from fastload.errors import StorageError
from fastload.io.storage import Storage

logger = logging.getLogger(__name__)

__all__ = ["DECODE_ERRORS", "IMAGE_EXTENSIONS", "ImageFolder"]


class ImageFolder(TorchvisionFolder, DeclaredImages):
    """Images below ``root`` (class-per-folder), or an explicit list of ``(path, label)``.

    Takes torchvision's ``ImageFolder`` arguments in its order, with their meaning
    (``ImageFolder(root, transform, target_transform, loader, is_valid_file, allow_empty)``)
    and fastload's own by keyword. A subclass may override ``find_classes`` and
    ``make_dataset`` as in torchvision; both are honoured.

    Args:
        root: an fsspec URL or local path of the class folders, or a list of (path, label).
        transform: the user's own torchvision (v1 or v2) transform, instead of ``pipeline``
            and ``size/train/normalize``: ``ImageFolder(root, T.Compose([T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)]))``. Its leading
            geometric steps compile into the decode, the rest runs unchanged on the uint8
            tensor, seeded per sample; a trailing "to float + Normalize" moves to the device
            with ``DataLoader(device=...)``. ``ds.compiled.notes`` say what went where
            (docs/transforms.md).
        target_transform: called on each label; on every engine (threads and DALI collate
            its results as torch's ``default_collate`` does).
        loader: ``path -> sample``, as torchvision's. The default (fastload's or torchvision's
            PIL loader) is the declared decode. Another reads each file itself (a local path,
            or a remote file's URL) and ``transform`` gets its output as it is, seeded per
            sample: only torch workers run it, ``loader.backend_reason`` says so.
        is_valid_file: ``path -> bool`` choosing the samples, instead of ``extensions``.
        allow_empty: keep a class folder without a valid file as a class without samples;
            by default it raises :class:`~fastload.errors.EmptyClassError` (a
            ``FileNotFoundError``), as torchvision does.
        size: output (h, w) in pixels, or one int for square images.
        train: True = random-resized-crop + horizontal flip; False = resize + center crop.
        normalize: True for ImageNet mean/std, a :class:`Normalize`, or False for uint8.
            On a loader with ``device=`` set it runs on that device, batched.
        pipeline: a full :class:`ImagePipeline`, instead of ``size/train/normalize``.
        cache: where bytes are cached: a directory (``"~/.cache/fastload"``), a dict or
            :class:`~fastload.cache.CacheConfig` (memory and disk sizes, policy), or
            ``None`` to read the origin every time. See docs/cache.md.
        on_error: what a sample that cannot be read or decoded does (missing, permission
            denied, a looping symlink, a storage failure, corrupt or truncated bytes, a
            decompression bomb). "raise" (default): a :class:`~fastload.errors.SampleError`
            with ``.index`` and ``.path``, the same from worker processes; "skip": it is left
            out of its batch, listed in ``loader.skipped`` and reported at the epoch end.
        seed: seed of the random augmentations; None follows ``torch.manual_seed``.
        extensions: file endings that count as samples (case-insensitive); torchvision's
            image endings unless ``is_valid_file`` is given (not both, as in torchvision).
        storage_options: passed to fsspec (credentials, endpoint, ...).
        listing_max_age: seconds a listing stored in the cache (disk or Redis tier) is
            reused instead of listing the root again (NOTE [the stored listing]); 0 = always
            list. The default, an hour, lets every rank, node and restart of a run list
            nothing, and bounds how old a reused sample set can be: files added to the root
            are in a new ImageFolder within the hour. Versions are still checked.

    Attributes:
        samples: ``(path, label)`` of each sample (``imgs`` too), ``targets`` their labels,
            ``classes``, ``class_to_idx``, ``loader``, ``transform``, ``target_transform``,
            ``extensions``: torchvision's. ``samples`` and ``targets`` are read-only views of
            :attr:`index` (a list of a million tuples costs ~300 bytes a sample in every
            worker): index, slice, iterate and compare them like lists; to choose samples, pass
            ``(path, label)`` pairs as ``root``, override ``make_dataset``, or use ``Subset``.
        index: the :class:`~fastload.data.index.DatasetIndex` of paths, labels, sizes and
            versions (numpy arrays, ~100 bytes a sample).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Sequence[tuple[str, int]],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        loader: Callable[[str], Any] = default_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        size: int | tuple[int, int] = 224,
        train: bool = False,
        normalize: bool | Normalize = False,
        pipeline: ImagePipeline | None = None,
        cache: Any = None,
        on_error: OnError = "raise",
        seed: int | None = None,
        extensions: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        listing_max_age: float = DEFAULT_MAX_AGE_S,
    ) -> None:
        where = "ImageFolder"
        on_error = check_choice(where, "on_error", on_error, ("raise", "skip"))  # type: ignore[assignment]
        size = check_size(where, "size", size)
        train = check_bool(where, "train", train)
        check_steps(normalize, pipeline)
        seed = check_optional_int(where, "seed", seed)
        storage_options = check_mapping(where, "storage_options", storage_options)
        self.listing_max_age = check_number(where, "listing_max_age", listing_max_age, low=0)
        check_root(root, is_valid_file)
        check_callables(target_transform=target_transform, loader=loader)
        rules = folder_rules(extensions, is_valid_file, allow_empty)
        self.transform, self.target_transform, self.loader = transform, target_transform, loader
        self.extensions = rules.extensions  # None with is_valid_file, as torchvision's
        self.compiled: CompiledTransform | None
        self.pipeline, self.compiled = decode_steps(loader, transform, pipeline, size, train, normalize, cache)
        self.on_error: OnError = on_error
        self.seed = seed
        self._cache = open_cache(cache)
        # cache={..., "transcode": {...}}: reads (and the prefetcher, which fills
        # self.cache) keep re-encoded images under their own keys (docs/cache.md).
        self._cache = transcoding(self._cache)
        # One filesystem for reads: with a cache, the fastload:: one over the origin's, keyed
        # by the index's versions (passed with each read; NOTE [cache keys]).
        reads = None if self._cache is None else CachedReads(self._cache)
        versions = IndexVersions()
        listed_root = isinstance(root, (str, os.PathLike))  # else an explicit file list
        url = os.fspath(root) if listed_root else "/"  # type: ignore[arg-type]
        self.storage = Storage(url, storage_options, read_through=reads, versions=versions)
        found = list_root(self, rules, self._cache, storage_options) if listed_root else list_pairs(
            self.storage, root, snapshot=self._cache is not None)  # type: ignore[arg-type]
        self.index, self._stored, self._listed_root = found.index, found.stored, found.listed_root
        self.classes, self.class_to_idx = found.classes, found.class_to_idx
        versions.index = self.index
        # What revalidate counts new files by; is_valid_file stays out: a lambda would stop
        # the dataset from pickling into spawned workers, which never revalidate.
        self._rules: FolderRules | None = found.rules if rules.is_valid_file is None else None

    @property
    def root(self) -> str:
        return self.storage.url

    @property
    def cache(self) -> TieredCache | None:
        """The cache reads go through, or None. ``storage.fs`` is the origin's filesystem and
        ``storage.versions`` the listing's versions by path (a view of :attr:`index`)."""
        return self._cache

    def revalidate(self) -> int:
        """Re-read the versions of this dataset's files, so cached reads see changed files.

        One listing of the root (an explicit file list: a stat per local file, a listing per
        remote folder). The sample set stays as built, like torchvision's: a file deleted
        since raises ObjectNotFoundError naming it when read (or is skipped), new files are
        ignored. ``fastload.DataLoader`` calls this before every epoch after the first of a
        cached remote dataset (a local one stats each file at each read, so this only logs
        and updates the index; docs/reliability.md). Returns the number of samples whose
        version changed (deleted ones included). Example::

            >>> ds = ImageFolder("/data/train", cache="/nvme/fastload")
            >>> ds.revalidate()          # after files were rewritten
            3
        """
        if self._cache is None:
            return 0
        changed, replaced = listing.revalidate(
            self.storage, self.index, listed_root=self._listed_root, on_error=self.on_error,
            rules=self._rules,
        )
        if replaced and self._stored is not None:
            store_versions(self._stored, self.index)
        return changed

    def fetch_fix(self) -> str:
        """The fix the meter prints when reading these images holds the loop up (NOTE [the
        source's own fix])."""
        return folder_fix(type(self).__name__, self.root if self._listed_root else None,
                          local=self.storage.is_local, cache_dir=cache_dir(self._cache),
                          cached=self._cache is not None)

    @property
    def reads_current_versions(self) -> bool:
        """Whether each read stats its file (cached, local: NOTE [a stat per local read])."""
        return self._cache is not None and self.storage.is_local

    @property
    def listing_note(self) -> str | None:
        """What the sample set may leave out, when it is a stored listing reused without a
        full check (a remote root: NOTE [listing freshness]); None otherwise. A warning says
        it at the build, and ``loader.settings`` shows it."""
        return None if self._stored is None else self._stored.note

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        own = "" if is_default_loader(self.loader) else f", loader={name_of(self.loader)}"
        return (
            f"{type(self).__name__}({self.root!r}, {len(self)} images, {len(self.classes)} classes, "
            f"steps={[type(s).__name__ for s in self.pipeline.steps]}, on_error={self.on_error!r}{own}"
            + (f", transform: {'; '.join(self.compiled.notes)})" if self.compiled else ")")
        )

    def load(self, index: int, data: bytes | Exception | None = None) -> tuple[Any, Any]:
        """Read and transform one sample (NOTE [a declared dataset]); a custom ``loader``
        reads and decodes the file itself."""
        if not is_default_loader(self.loader):
            return self.load_with_loader(index)
        return super().load(index, data)

    def label(self, index: int) -> int:
        return self.index.label(index)

    def sample_name(self, index: int) -> str:
        return self.index.path(index)

    def sample_url(self, index: int) -> str:
        return self.storage.to_url(self.index.path(index))

    @property
    def reads_local_files(self) -> bool:
        return self.storage.is_local

    def read_bytes(self, index: int) -> bytes:
        """The encoded bytes of sample ``index``.

        Every engine reads through here or :meth:`read_batch`, so the storage (and its cache)
        sees each read. A failed read raises :class:`~fastload.errors.UnreadableSampleError`
        (:class:`~fastload.errors.MissingSampleError` for a file gone since the listing) naming
        the file and the index, with the storage's error as ``__cause__``.
        """
        path, version = self.index.path(index), self.index.version(index)
        try:
            return self.storage.read(path, version)
        except (StorageError, OSError) as exc:  # a cache tier may raise a bare OSError
            raise self.unreadable(index, exc) from exc

    def read_batch(self, indices: Sequence[int]) -> list[bytes | Exception | None]:
        """The bytes of a batch's samples, or each read's error, read at once through the cache
        (NOTE [batched reads] in :mod:`fastload.cache.tiered`); without one, Nones: each
        :meth:`load` reads its own."""
        if self._cache is None:
            return [None] * len(indices)
        start, index = time.perf_counter(), self.index
        out = self.storage.read_many([index.path(i) for i in indices], [index.version(i) for i in indices])
        batchinfo.record(time.perf_counter() - start, 0.0, 0)
        return out  # type: ignore[return-value]
