"""``ParquetImages``: Parquet files of images and labels as a declared, map-style dataset.

Each row holds an encoded image (Hugging Face's ``Image`` feature: a struct with ``bytes``
and ``path``; or a plain binary column) and a label. The rows are found once from the files'
footers and label columns (NOTE [the Parquet index] in :mod:`.parquet_index`); a sample's
bytes are a value of its row group's image column, read as one byte range per row group
and kept in a small per-process LRU (NOTE [one range per row group] in :mod:`.parquet_read`):
with a disk cache, from the local copy of the whole file, downloaded ahead in the epoch's
order (NOTE [a dataset on the shard store] in :mod:`.shard_cache_use`), else through the
cache's entries or from the origin. Then it is decoded by whichever engine runs the
loader (threads with ROI decode, torch workers, DALI), exactly as
:class:`~fastload.ImageFolder`'s files are (NOTE [a declared dataset] in :mod:`.declared`). ``fastload.DataLoader`` reads it in a row-group
aware order (NOTE [shard-aware order] with row groups as the shards). docs/shards.md has
the whole story.

Example::

    >>> from fastload import DataLoader, ParquetImages
    >>> ds = ParquetImages("s3://bucket/imagenet/train-*.parquet", size=224, train=True,
    ...                    cache="~/.cache/fastload")
    >>> ds.classes[:2], len(ds)
    >>> loader = DataLoader(ds, batch_size=256, shuffle=True)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fastload.data import batchinfo
from fastload.data.declared import OnError
from fastload.data.parquet_build import column_name, parquet_index
from fastload.data.parquet_index import ParquetIndex
from fastload.data.parquet_read import GroupLRU, decode_column, pyarrow_parquet, read_metadata
from fastload.data.pipeline import ImagePipeline, Normalize
from fastload.data.shard_cache_use import CachedShards, cached_range, shard_refs, store_range
from fastload.data.shard_order import ShardOrder
from fastload.data.sharded import ShardedImages
from fastload.data.stored_listing import DEFAULT_MAX_AGE_S
from fastload.errors import CorruptSampleError, EmptyDatasetError, SampleError
from fastload.io.errors import storage_error

logger = logging.getLogger(__name__)

__all__ = ["ParquetImages"]

GROUP_READS = 8
"""Row groups a remote batch reads at once (``read_batch``)."""

HELD_WARNING_BYTES = 2**30
"""Decoded row groups a process keeps (``2 x shuffle_window`` of the largest) above which
building the dataset warns."""


class ParquetImages(ShardedImages):
    """Parquet files whose rows hold an encoded image and a label, as a map-style dataset.

    Takes :class:`~fastload.ImageFolder`'s and :class:`~fastload.TarShards`' arguments where
    they mean the same.

    Args:
        files: a glob (``"s3://b/train-*.parquet"``), a brace pattern, one URL or local path,
            or a list of them; any fsspec URL (``hf://datasets/<org>/<name>/...`` through
            huggingface_hub's filesystem where it is installed). All on one filesystem.
        transform: a torchvision transform, compiled into the decode as ImageFolder's.
        target_transform: called on each label, on every engine.
        image_column: the column of encoded images: a Hugging Face ``Image`` struct
            (``bytes``, ``path``) or a binary column; "auto" takes ``image`` or ``img``.
        label_column: the label column (ints, or names: their position among the sorted
            names); "auto" takes ``label`` or ``labels``; None: no labels (-1).
        size, train, normalize, pipeline: the declared steps, as ImageFolder's.
        cache: a directory, dict or CacheConfig (docs/cache.md) where the index is kept, and
            remote files whole (a disk tier: its shard store, NOTE [the shard store]) or row
            groups' image chunks (memory or Redis only); None reads the origin. Local files
            are read directly (the index is still kept).
        on_error: "raise" (default) or "skip", as ImageFolder's.
        seed: seed of the random augmentations and of the epoch order; None follows torch.
        storage_options: passed to fsspec.
        listing_max_age: seconds an index stored in the cache is reused.
        shuffle_window: row groups whose samples an epoch shuffles together (NOTE
            [shard-aware order]); each process keeps at least twice that many decoded
            (more up to 256 MiB).

    Attributes:
        index: the :class:`~fastload.data.parquet_index.ParquetIndex` (numpy arrays).
        classes, class_to_idx, targets: as ImageFolder's (``targets`` a numpy array);
            classes are a ``ClassLabel``'s names where the files' Hugging Face metadata has
            them.
        urls: the file URLs, expanded.
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        image_column: str = "auto",
        label_column: str | None = "auto",
        size: int | tuple[int, int] = 224,
        train: bool = False,
        normalize: bool | Normalize = False,
        pipeline: ImagePipeline | None = None,
        cache: Any = None,
        on_error: OnError = "raise",
        seed: int | None = None,
        storage_options: dict[str, Any] | None = None,
        listing_max_age: float = DEFAULT_MAX_AGE_S,
        shuffle_window: int = 4,
    ) -> None:
        where = "ParquetImages"
        pyarrow_parquet()  # says what to install before anything is read
        max_age = self._take_arguments(
            where, transform, target_transform, size=size, train=train, normalize=normalize,
            pipeline=pipeline, cache=cache, on_error=on_error, seed=seed,
            storage_options=storage_options, listing_max_age=listing_max_age,
            shuffle_window=shuffle_window)
        columns = (column_name(where, "image_column", image_column, False),
                   column_name(where, "label_column", label_column, True))
        self._open_files(where, files, kind="Parquet file", suffix=".parquet")
        self.index: ParquetIndex = parquet_index(
            self._fs, self.urls, self.paths, columns=columns,  # type: ignore[arg-type]
            cache=self._cache, storage_options=self.storage_options, max_age=max_age)
        if len(self.index) == 0:
            raise EmptyDatasetError(f"no rows in {len(self.urls)} Parquet file(s) starting "
                                    f"{self.urls[0]}")
        self.classes = self.index.classes
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        label_column = self.index.columns["label"]  # None: no labels asked for
        self._say_unlabelled(f"a null in label column {label_column!r}",
                             if_all=None if label_column is None else logging.WARNING)
        self._order = ShardOrder(self.index.group_sizes(), self.shuffle_window,  # NOTE [row
                                 files=self.index.group_file)  # groups of files]
        self._shards = CachedShards.open(
            self._cache, shard_refs(self._store_urls, self.paths, self.index.versions,
                                    self.index.sizes),
            shuffle_window=self.shuffle_window, owner="ParquetImages",
            reads="row groups (from as many files)", local=self.local)
        self._process_state()
        held = 2 * self.shuffle_window * int(self.index.group_length.max(initial=0))
        if held > HELD_WARNING_BYTES:
            logger.warning(
                "%s: row groups of up to %.0f MB; each process reading it keeps 2 x "
                "shuffle_window=%d of them decoded (%.1f GB). Lower shuffle_window, or write "
                "smaller row groups (datasets: to_parquet(batch_size=...); pyarrow: "
                "write_table(row_group_size=...))", self.urls[0],
                self.index.group_length.max() / 1e6, self.shuffle_window, held / 1e9)

    # Per process: the filesystem, the footers, the decoded row groups ----------------------

    def _process_state(self) -> None:
        self._pid = os.getpid()
        self._metadata: dict[int, Any] = {}
        self._groups = GroupLRU(2 * self.shuffle_window)

    def _here(self) -> None:
        if self._pid != os.getpid():  # a new process (fork or unpickled): nothing shared
            self._fs = None
            self._process_state()

    @property
    def fs(self) -> Any:
        """The files' filesystem (opened again in a new process)."""
        self._here()
        if self._fs is None:
            self._fs = self._url_to_fs(self.urls[0])[0]
        return self._fs

    @property
    def groups_loaded(self) -> int:
        """Row groups this process has read and decoded (each read of one counts)."""
        self._here()
        return self._groups.loads

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fs=None, _pid=-1, _metadata={}, _groups=None)
        return state

    # The contract ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        more = " ..." if len(self.urls) > 1 else ""
        return (f"ParquetImages({self.urls[0]!r}{more}, {len(self.urls)} files, "
                f"{len(self.index.group_file)} row groups, {len(self)} images, "
                f"{len(self.classes)} classes, on_error={self.on_error!r})")

    def _place(self, index: int) -> tuple[str, int, int]:
        i = int(index)
        return (self.urls[self.index.file_of(i)], self.index.group_number_of(i),
                int(self.index.rows[i]))

    def sample_name(self, index: int) -> str:
        url, group, row = self._place(index)
        return f"{os.path.basename(url)}:{group}:{row}"

    def sample_url(self, index: int) -> str:
        url, group, row = self._place(index)
        return f"{url} (row group {group}, row {row})"

    def corrupt(self, index: int, exc: BaseException) -> CorruptSampleError:
        """The error for sample ``index`` whose bytes are not an image it can decode."""
        why = str(exc) or type(exc).__name__
        return CorruptSampleError(
            f"cannot decode the image of {self.sample_url(index)} (index {int(index)}, column "
            f"{self.index.columns['image']!r}): {why}. Replace or drop that row and write the "
            "file again, or pass on_error='skip' to skip and count it.",
            index=int(index), path=self.sample_name(index))

    # Reading --------------------------------------------------------------------------------

    def group_bytes(self, group: int) -> bytes:
        """The bytes of row group ``group``'s image column chunk (groups counted over all
        files): the one read of remote data (NOTE [one range per row group]). Remote files with
        a disk cache: from the local copy of the whole file (NOTE [a dataset on the shard
        store]); other caches: under the key of ``<file URL>#<start>+<length>`` at the file's
        indexed version; local files are read directly. Storage errors propagate as raised."""
        file = int(self.index.group_file[group])
        start, length = int(self.index.group_start[group]), int(self.index.group_length[group])
        if self._shards is not None or self._cache is None or self.local:
            return self._range(file, start, length)
        key = self._cache.key_of(f"{self.urls[file]}#{start}+{length}", self.index.versions[file])
        data = cached_range(self._cache, key)
        if data is None:
            data = self._origin(file, start, length)
            store_range(self._cache, key, data)
        return data

    def _range(self, file: int, start: int, length: int) -> bytes:
        """Bytes of file ``file``: from its local copy when the shard store has it, else the origin."""
        if self._shards is not None:
            return self._shards.read(self.fs, file, start, length, self._origin)
        return self._origin(file, start, length)

    def _origin(self, file: int, start: int, length: int) -> bytes:
        data = self.fs.cat_file(self.paths[file], start=start, end=start + length)
        if len(data) != length:
            raise OSError(f"read {len(data)} of {length} bytes at byte {start} (the file changed "
                          "since it was indexed? build the ParquetImages again)")
        return data

    def _files_of(self, samples: np.ndarray) -> np.ndarray:
        return self.index.group_file[self.index.groups[samples]]

    def _load_group(self, group: int) -> Any:
        file = int(self.index.group_file[group])
        metadata = self._metadata.get(file)
        if metadata is None:
            metadata = self._metadata[file] = read_metadata(self.index.footer(file))

        def outside(offset: int, length: int) -> bytes:
            return self._range(file, offset, length)

        data = self.group_bytes(group)
        try:
            return decode_column(metadata, self.index.sizes[file],
                                 {int(self.index.group_start[group]): data},
                                 int(self.index.group_number[group]),
                                 self.index.columns["leaf"], outside)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise OSError(f"cannot decode the column chunk of row group "
                          f"{int(self.index.group_number[group])}: {exc}") from exc

    def _column_of(self, group: int) -> Any:
        self._here()
        return self._groups.get(group, self._load_group)

    def _value(self, index: int, column: Any) -> bytes:
        value = column[int(self.index.rows[int(index)])].as_py()
        if value is None:
            raise CorruptSampleError(
                f"the image of {self.sample_url(index)} (index {int(index)}) is null: the row "
                f"has no image bytes in column {self.index.columns['image']!r} (a Hugging Face "
                "Image that names a file by path instead is not read). Write the images' bytes "
                "into the file (datasets embeds them when it writes Parquet from Image() "
                "features), drop the row, or pass on_error='skip' to skip and count it.",
                index=int(index), path=self.sample_name(index))
        return value

    def read_bytes(self, index: int) -> bytes:
        """The encoded bytes of sample ``index``, from its row group's image column (read once
        per process while it is among the last few used). A failed read raises
        :class:`~fastload.errors.UnreadableSampleError` naming the file, the row group and
        the row; a null image a :class:`~fastload.errors.CorruptSampleError`."""
        try:
            column = self._column_of(self.index.group_of(int(index)))
        except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
            error = storage_error(exc, "read", self.sample_url(index))
            raise self.unreadable(index, error) from exc
        return self._value(index, column)

    def read_batch(self, indices: Sequence[int]) -> list[bytes | Exception | None]:
        """A batch's bytes: the row groups it needs and this process does not keep are read
        at once (remote files: :data:`GROUP_READS` at a time), then each sample's value."""
        start = time.perf_counter()
        self._here()
        wanted = sorted({self.index.group_of(int(i)) for i in indices})
        missing = [g for g in wanted if g not in self._groups]
        if len(missing) > 1 and not self.local:
            with ThreadPoolExecutor(min(GROUP_READS, len(missing)),
                                    thread_name_prefix="fastload-parquet") as pool:
                list(pool.map(self._try_group, missing))
        out: list[bytes | Exception | None] = []
        for i in indices:
            try:
                out.append(self.read_bytes(i))
            except SampleError:  # load() reads it again and raises the error with its name
                out.append(None)
        batchinfo.record(time.perf_counter() - start, 0.0, 0)
        return out

    def _try_group(self, group: int) -> None:
        try:
            self._column_of(group)
        except Exception:  # noqa: BLE001 - each sample's read_bytes raises it with its name
            return
