"""Synthetic ImageNet-like JPEG folders, for the demo, the benchmarks and the tests.

Images are smooth colour gradients with noise, so JPEG sizes and decode costs resemble
photographs (about 500x375, quality 90, 40-80 KB) rather than flat colour.

``size_range=(320, 1280)`` makes a set of larger photos of mixed sizes instead: each
image's width and height are drawn (seeded) from that range, and the sizes are listed in
the manifest.

Example::

    >>> root = make_jpeg_folder("/tmp/synth", images=2000, classes=10)
    >>> sorted(os.listdir(root))[:2]
    ['class_00', 'class_01']
    >>> photos = make_jpeg_folder("/tmp/photos", images=600, size_range=(320, 1280))
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
from PIL import Image

logger = logging.getLogger(__name__)

_MANIFEST = ".fastload-synthetic.json"


def make_jpeg_folder(
    root: str | os.PathLike[str],
    *,
    images: int = 2000,
    classes: int = 10,
    size: tuple[int, int] = (500, 375),
    quality: int = 90,
    seed: int = 0,
    size_range: tuple[int, int] | None = None,
) -> Path:
    """Write ``images`` JPEGs in ``classes`` folders below ``root``; reuse them if present.

    ``size`` is (width, height) in pixels. With ``size_range=(lo, hi)`` it is ignored: each
    image's width and height are drawn uniformly from ``lo..hi`` (inclusive, from ``seed``)
    and the manifest lists them under ``"sizes"``. The folder is rebuilt only when its
    manifest differs from the arguments, so benchmarks can call this every run.
    """
    root = Path(root)
    spec: dict = {
        "images": images, "classes": classes, "size": list(size), "quality": quality, "seed": seed
    }
    sizes = [tuple(size)] * images
    if size_range is not None:  # a key only then, so existing folders' manifests still match
        lo, hi = size_range
        spec.pop("size")
        spec["size_range"] = [lo, hi]
        drawn = np.random.default_rng([seed, 1]).integers(lo, hi, size=(images, 2), endpoint=True)
        sizes = [(int(w), int(h)) for w, h in drawn]
    manifest = root / _MANIFEST
    if manifest.exists():
        found = json.loads(manifest.read_text())
        found.pop("sizes", None)
        if found == spec:
            return root
    logger.info("writing %d synthetic JPEGs to %s", images, root)
    rng = np.random.default_rng(seed)
    grids: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for c in range(classes):
        (root / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(images):
        c = i % classes
        width, height = sizes[i]
        if (width, height) not in grids:
            grids = {(width, height): tuple(np.mgrid[0:height, 0:width].astype(np.float32))}
        yy, xx = grids[(width, height)]
        fx, fy, phase = rng.uniform(0.005, 0.03, 3)
        base = np.stack(
            [
                128 + 100 * np.sin(xx * fx + phase + c),
                128 + 100 * np.cos(yy * fy + 2 * phase),
                128 + 100 * np.sin((xx + yy) * (fx + fy) / 2 + c),
            ],
            axis=-1,
        )
        noisy = base + rng.normal(0, 12, base.shape)
        pixels = np.clip(noisy, 0, 255).astype(np.uint8)
        Image.fromarray(pixels, "RGB").save(
            root / f"class_{c:02d}" / f"img_{i:06d}.jpg", quality=quality
        )
    if size_range is not None:
        spec["sizes"] = [list(wh) for wh in sizes]
    manifest.write_text(json.dumps(spec))
    return root
