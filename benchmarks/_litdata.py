"""LitData's StreamingDataLoader over the same JPEGs, for benchmarks/shards.py (issue 23).

LitData (Lightning's ``litdata``) packs samples into chunk files with ``optimize`` and streams
them with ``StreamingDataset`` + ``StreamingDataLoader``. This is its documented image recipe:
each item holds the JPEG's bytes and its label; ``__getitem__`` decodes with torchvision's
``decode_jpeg`` and runs the same RandomResizedCrop + flip as the other rows, on uint8
tensors; workers persistent, as fastload's and torch's rows.

Only local chunks here: LitData 0.2.76 downloads S3 chunks with obstore, whose client refuses
moto's ``http://127.0.0.1`` endpoint ("builder error": LitData builds the store without
``allow_http``), so it cannot be pointed at the loopback S3 server the other remote rows use.

Example::

    >>> chunks = litdata_chunks(jpeg_root, tmp / "litdata")
    >>> loader = litdata_loader(chunks, size=224, batch=64, workers=2)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def _item(path: str) -> dict[str, Any]:
    """One optimize() item: a JPEG's bytes and its class folder's name."""
    return {"image": Path(path).read_bytes(), "label": Path(path).parent.name}


def litdata_chunks(root: Path, out: Path, chunk_bytes: str = "64MB") -> Path:
    """``root``'s JPEGs packed into LitData chunks under ``out`` (once; reused if there)."""
    from litdata import optimize

    if (out / "index.json").exists() and any(out.glob("*.bin")):
        return out
    files = sorted(str(p) for p in Path(root).rglob("*.jpg"))
    optimize(fn=_item, inputs=files, output_dir=os.fspath(out), chunk_bytes=chunk_bytes,
             num_workers=1, mode="overwrite")
    return out


try:
    from litdata import StreamingDataLoader, StreamingDataset
except ImportError:  # the row is then n/a
    StreamingDataset = object  # type: ignore[assignment,misc]


class LitImages(StreamingDataset):  # type: ignore[misc,valid-type]
    """LitData's dataset of (JPEG bytes, label) items, decoded and cropped as the other rows."""

    def __init__(self, chunks: str, size: int) -> None:
        from torchvision.transforms import v2

        super().__init__(chunks, shuffle=True)
        # not self.transform: StreamingDataset applies an attribute of that name to the raw item
        self.augment = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, str]:
        from torchvision.io import decode_jpeg

        item = super().__getitem__(index)
        image = decode_jpeg(torch.frombuffer(bytearray(item["image"]), dtype=torch.uint8))
        return self.augment(image), item["label"]


def litdata_loader(chunks: Path, *, size: int, batch: int, workers: int) -> Any:
    """LitData's StreamingDataLoader over ``chunks``, shuffled, decoding as torchvision does."""
    extra = {"persistent_workers": True} if workers else {}
    return StreamingDataLoader(LitImages(os.fspath(chunks), size), batch_size=batch, num_workers=workers, **extra)
