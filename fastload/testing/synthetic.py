"""Synthetic ImageNet-like JPEG folders, for the demo, the benchmarks and the tests.

Images are smooth colour gradients with noise, so JPEG sizes and decode costs resemble
photographs (about 500x375, quality 90, 40-80 KB) rather than flat colour.

Example::

    >>> root = make_jpeg_folder("/tmp/synth", images=2000, classes=10)
    >>> sorted(os.listdir(root))[:2]
    ['class_00', 'class_01']
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
) -> Path:
    """Write ``images`` JPEGs in ``classes`` folders below ``root``; reuse them if present.

    ``size`` is (width, height) in pixels. The folder is rebuilt only when its manifest
    differs from the arguments, so benchmarks can call this every run.
    """
    root = Path(root)
    spec = {"images": images, "classes": classes, "size": list(size), "quality": quality, "seed": seed}
    manifest = root / _MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()) == spec:
        return root
    logger.info("writing %d synthetic JPEGs to %s", images, root)
    rng = np.random.default_rng(seed)
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for c in range(classes):
        (root / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(images):
        c = i % classes
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
    manifest.write_text(json.dumps(spec))
    return root
