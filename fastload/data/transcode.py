"""The transcoded cache tier's re-encoding: images capped at ``max_side`` pixels, as JPEG.

Opt-in, and it changes pixels. With ``cache={"disk": "/nvme/fastload", "transcode":
{"max_side": 256, "quality": 90}}`` an ``ImageFolder`` caches each image re-encoded by
:class:`Transcode` instead of its original bytes (FFCV's max-resolution trick): decoding a
256-pixel JPEG in later epochs costs a fraction of decoding a multi-megapixel original. The
cache knows only a named derivation (NOTE [derived entries] in :mod:`fastload.cache.fills`):
entries are keyed by the object's key plus :attr:`Transcode.tag`, so they never collide with
original entries and other parameters never find them. ``fastload cache warm URL --cache DIR
--transcode 256`` fills the same entries.

This module imports Pillow, not torch, so the command line can use it cheaply.

Example::

    >>> t = Transcode(max_side=256)
    >>> t.tag
    'transcode:max_side=256:quality=90:v1'
    >>> small = t(open("big.jpg", "rb").read())            # JPEG bytes, longer side <= 256
    >>> cache = transcoding(open_cache({"disk": "/nvme/c", "transcode": {"max_side": 256}}))
    >>> cache.derive.tag
    'transcode:max_side=256:quality=90:v1'
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image, UnidentifiedImageError

from fastload.cache.config import TRANSCODE_QUALITY, transcode_spec
from fastload.cache.tiered import TieredCache

logger = logging.getLogger(__name__)

_VERSION = 1
"""Bumped whenever the re-encoding changes its output, so old entries are never served."""

# Pillow's errors for bytes that are no (complete) image; anything else propagates.
_DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)


@dataclass(frozen=True)
class Transcode:
    """Re-encode an image as an RGB JPEG whose longer side is at most ``max_side`` pixels.

    Larger images are decoded (JPEG at reduced scale where it can: draft mode), converted to
    RGB as the pipeline converts them, resized with a Lanczos filter keeping the aspect ratio
    and encoded at ``quality``. EXIF orientation is ignored, as the pipeline ignores it (the
    pixels keep their stored orientation). Images already within ``max_side`` are never
    upscaled or re-encoded: their original bytes are returned, so their pixels stay exactly
    as they are (and a small corrupt image fails in the pipeline as it would uncached).

    Args:
        max_side: the longest side, in pixels, of a stored image (>= 1; pick at least the
            size the pipeline resizes to, e.g. 256 for 224-pixel crops).
        quality: JPEG quality, 1..95.

    Raises:
        ConfigError: a parameter out of range (the message says the range).

    Example::

        >>> Transcode(max_side=256, quality=85).tag
        'transcode:max_side=256:quality=85:v1'
    """

    max_side: int
    quality: int = TRANSCODE_QUALITY

    def __post_init__(self) -> None:
        transcode_spec({"max_side": self.max_side, "quality": self.quality})

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Transcode:
        """The Transcode of a spec such as ``{"max_side": 256, "quality": 90}`` (checked)."""
        return cls(**transcode_spec(spec))

    @property
    def tag(self) -> str:
        """The name in the cache key: the derivation, its parameters and its version."""
        return f"transcode:max_side={self.max_side}:quality={self.quality}:v{_VERSION}"

    def __call__(self, data: bytes) -> bytes:
        """The re-encoded image; raises ``ValueError`` when ``data`` is not a decodable image.

        The ``ValueError`` tells the cache to store nothing and serve ``data`` as it is, so a
        corrupt image fails in the pipeline exactly as without transcoding.
        """
        try:
            with warnings.catch_warnings():
                # A DecompressionBombWarning is the pipeline's to raise, on its own decode.
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                return self._transcode(data)
        except _DECODE_ERRORS as exc:
            # Pillow's text for an unknown format names a BytesIO by its address: say it plainly.
            why = "Pillow cannot identify it" if isinstance(exc, UnidentifiedImageError) else exc
            raise ValueError(f"not a decodable image ({why})") from exc

    def _transcode(self, data: bytes) -> bytes:
        with Image.open(io.BytesIO(data)) as img:
            if max(img.size) <= self.max_side:
                return data
            target = _fit(img.size, self.max_side)
            if img.format == "JPEG":
                # Decode at 1/2, 1/4 or 1/8 scale, never below twice the target: several
                # times fewer pixels decoded, and enough left for an antialiased resize.
                img.draft("RGB", (target[0] * 2, target[1] * 2))
            img.load()  # a truncated or corrupt image raises here
            rgb = _to_rgb(img)
            small = rgb.resize(_fit(rgb.size, self.max_side), Image.Resampling.LANCZOS)
            out = io.BytesIO()
            small.save(out, format="JPEG", quality=self.quality)
            return out.getvalue()


def _fit(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """``size`` scaled so its longer side is ``max_side`` (never 0 pixels)."""
    width, height = size
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _to_rgb(img: Image.Image) -> Image.Image:
    # The pipeline's conversion (fastload.data.pipeline): palettes with transparency go
    # through RGBA, so both see the same colors.
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img if img.mode == "RGB" else img.convert("RGB")


def transcoding(cache: TieredCache | None) -> TieredCache | None:
    """The cache to read through: ``cache``, or a transcoding view when its config asks.

    A cache whose config has ``transcode`` and no derivation yet gets one built from the
    spec (:meth:`TieredCache.deriving`); anything else is returned unchanged.

    Example::

        >>> transcoding(open_cache({"disk": "/nvme/c", "transcode": {"max_side": 256}})).derive
        Transcode(max_side=256, quality=90)
    """
    if cache is None or cache.derive is not None or cache.config.transcode is None:
        return cache
    return cache.deriving(Transcode.from_spec(cache.config.transcode))
