"""``RawFiles``: a dataset whose samples are the raw bytes of files, for non-image data.

What the accelerator emulation feeds when a URL holds no class-per-folder images (NPZ,
TFRecord, Parquet, flat folders): each sample is one file's bytes, read through
:class:`fastload.io.storage.Storage`, so the loader's cost is the storage's cost.

Example::

    >>> ds = RawFiles(Storage("s3://bucket/unet3d"), ["bucket/unet3d/case_000.npz"])
    >>> loader = fastload.DataLoader(ds, batch_size=7, collate_fn=list)
    >>> len(next(iter(loader))[0])      # bytes of the first file
    146600628
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.utils.data import Dataset

from fastload.io.storage import Storage


class RawFiles(Dataset):
    """The bytes of each file in ``paths`` (filesystem paths of ``storage``), in order."""

    fastload_worker_safe = True  # reads only; see NOTE [auto never changes the batches]

    def __init__(self, storage: Storage, paths: Sequence[str]) -> None:
        self.storage = storage
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> bytes:
        return self.storage.read(self.paths[index])
