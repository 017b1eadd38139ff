"""Decode + transform rate per core: how many images one CPU core turns into training tensors.

A sample of image files is read first (not timed); then one thread decodes and transforms
them in a loop with the ImageNet training recipe (random-resized-crop to 224 + flip) until
its time is up. The rate is images per CPU-second of that thread (``time.thread_time``), so
other load on the machine does not lower it. Multiplied by the cores the loader's workers
get, it says whether decoding or storage is the limit.

Example::

    >>> samples = read_samples(storage, inventory.entries, limit=32)
    >>> pillow_rate(samples, seconds=2).images_per_s_per_core
    412.7
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from fastload.bench.inventory import FileEntry
from fastload.bench.stats import per_second
from fastload.errors import CorruptSampleError
from fastload.data.images import IMAGE_EXTENSIONS
from fastload.data.pipeline import ImagePipeline
from fastload.io.storage import Storage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeRate:
    """One engine's decode+transform rate on one core, or why it was not measured."""

    engine: str
    images: int
    cpu_seconds: float
    skipped_reason: str | None = None

    @property
    def images_per_s_per_core(self) -> float:
        return per_second(self.images, self.cpu_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "images": self.images,
            "cpu_s": self.cpu_seconds,
            "images_per_s_per_core": self.images_per_s_per_core,
            "skipped_reason": self.skipped_reason,
        }


def image_entries(entries: Sequence[FileEntry]) -> list[FileEntry]:
    """The entries whose names end in an image extension fastload decodes."""
    return [e for e in entries if e.path.lower().endswith(IMAGE_EXTENSIONS)]


def read_samples(
    storage: Storage, entries: Sequence[FileEntry], *, limit: int = 32
) -> list[tuple[str, bytes]]:
    """``(url, bytes)`` of up to ``limit`` image files, spread evenly over the listing."""
    images = image_entries(entries)
    step = max(1, len(images) // limit)
    return [(storage.to_url(e.path), storage.read(e.path)) for e in images[::step][:limit]]


def training_pipeline(size: int = 224) -> ImagePipeline:
    """The recipe the rate is measured with: ImageNet training augmentation, uint8 output."""
    return ImagePipeline.standard(size, train=True)


def pillow_rate(
    samples: Sequence[tuple[str, bytes]], *, seconds: float = 2.0, pipeline: ImagePipeline | None = None
) -> DecodeRate:
    """Images per CPU-second with fastload's Pillow pipeline (what torch workers run)."""
    if not samples:
        return DecodeRate("pillow", 0, 0.0, "no image files (by extension) in the dataset")
    pipeline = pipeline or training_pipeline()
    images = 0
    cpu_start = time.thread_time()
    deadline = time.perf_counter() + seconds
    while images < len(samples) or time.perf_counter() < deadline:
        url, data = samples[images % len(samples)]
        try:
            pipeline.run(data, seed=images)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise CorruptSampleError(
                f"cannot decode {url}: {exc}. Replace or remove the file before benchmarking",
                path=url,
            ) from exc
        images += 1
    return DecodeRate("pillow", images, time.thread_time() - cpu_start)
