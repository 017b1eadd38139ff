"""Decode less: image decoders that return only the pixels a crop needs (issue 13).

The threaded engine plans each sample on its header (crop box, output size, flip), then asks
a decoder for just the region it resizes: a JPEG decodes at 1/2, 1/4 or 1/8 scale in the DCT
domain when the crop is large enough (:func:`dct_scale`: ImagePipeline's Pillow draft rule),
and the ``"roi"`` decoder (:mod:`fastload.data._jpeg`) skips the rows above the region and
the columns beside it, and never reads the rows below.

Example::

    >>> h = read_header(data)                                  # Header(500, 375, 'JPEG', 'RGB')
    >>> box, (out_h, out_w) = (100.0, 50.0, 400.0, 350.0), (112, 112)
    >>> denom = dct_scale(box[2] - box[0], box[3] - box[1], out_w, out_h,
    ...                   width=h.width, height=h.height)      # 2: 300x300 -> 150x150 >= 112
    >>> region, sub_box = region_for(box, h.width, h.height, denom)
    >>> choice = decoder_choice.choose(first_samples)           # measured on these files
    >>> try:
    ...     pixels = choice.decoder.decode(data, h, denom, region)   # (h, w, 3) uint8
    ... except Unsupported:                                          # PNG, CMYK, ...
    ...     pixels = DECODERS["pillow"].decode(data, h, denom, region)

Decoders raise :class:`Unsupported` for input they cannot handle (fall back to ``"pillow"``,
which decodes all Pillow opens) and ValueError or OSError for corrupt input, never pixels of
a half-decoded image.

NOTE [which files are corrupt]
Pillow decides, on every engine. The torch engine decodes with Pillow; the ``"roi"`` decoder
returns pixels only for a JPEG that libjpeg reads from SOI to EOI without an error or a
warning, below the region too (NOTE [a clean decode or Pillow's verdict] in ``_jpeg.c``),
and :class:`fastload.data.render.Renderer` hands every file it refuses to Pillow, whose
pixels or error stand. Pillow ignores libjpeg's warnings (extraneous bytes before a marker,
corrupt entropy-coded data: it decodes those files) and refuses a file cut short or with a
scan where EOI belongs; so does the threaded engine, whatever the crop. :func:`read_header`
lets libjpeg's warnings pass and asks Pillow where libjpeg errs.
tests/test_jpeg_corpus.py checks the agreement on a mutated corpus.

NOTE [torchvision's decoder when imported]
``import torchvision`` takes seconds (2-2.7 s here: its models and ops import torch._dynamo).
A script that builds ``ImageFolder(..., size=224, train=True)`` without torchvision's
transforms has not paid it, and the decoder race (:mod:`.decoder_choice`) paid it on the
first batch of the first loader: that batch came at 2.1 s where the next loader's came at
0.06 s (10 local shards, threads engine). torchvision's ``decode_jpeg`` decodes full scale
only, so it loses the race to ``roi`` (a region, at reduced scale) wherever ``roi`` or
``simplejpeg`` loads. So it joins the race only when the process imported torchvision
already (then it costs nothing to load) or when neither of those loads; ``decoder=
"torchvision"`` asked for by name loads it regardless (:func:`by_name`).
"""

from __future__ import annotations

import io
import logging
import math
import sys
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from PIL import Image

from fastload.data.pipeline import _to_rgb

try:
    from fastload.data import _jpeg
except ImportError as exc:  # an optional extension: no compiler or no jpeglib.h at install
    _jpeg, _jpeg_error = None, exc

logger = logging.getLogger(__name__)

Region = tuple[int, int, int, int]  # (x0, y0, x1, y1) in pixels of the image scaled by 1/denom
Box = tuple[float, float, float, float]  # (left, top, right, bottom), fractional pixels

DENOMS = (1, 2, 4, 8)
# images.DECODE_ERRORS (UnidentifiedImageError is an OSError): images imports the cache layer.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
_JPEG_MODES = {1: "L", 2: "RGB", 3: "RGB", 4: "CMYK", 5: "CMYK"}  # libjpeg's J_COLOR_SPACE


class Unsupported(Exception):
    """This decoder cannot decode this input (not a JPEG, CMYK, ...): use Pillow's."""


@dataclass(frozen=True)
class Header:
    """What a header says: size in pixels, Pillow's format name and mode ("RGB", "L", ...)."""

    width: int
    height: int
    format: str
    mode: str = "RGB"


def read_header(data: bytes) -> Header:
    """The header of an encoded image, without decoding pixels (~10 us for a JPEG).

    Raises ``PIL.Image.DecompressionBombError`` above ``2 * PIL.Image.MAX_IMAGE_PIXELS``
    (and warns above it) like ``Image.open``; ``ValueError`` or ``OSError``
    (``UnidentifiedImageError``) for bytes that are no image. A JPEG header libjpeg refuses
    is read by Pillow, whose verdict stands (NOTE [which files are corrupt]).
    """
    if _jpeg is not None and bytes(data[:3]) == b"\xff\xd8\xff":
        try:
            width, height, _, colorspace = _jpeg.header(data)
        except ValueError:
            pass  # Pillow's header, or its error, below
        else:
            _check_pixels(width, height)
            return Header(width, height, "JPEG", _JPEG_MODES.get(colorspace, "unknown"))
    return pillow_header(data)


def pillow_header(data: bytes) -> Header:
    """The header as Pillow reads it (``Image.open``: the header only, its size checks too).

    The header the Pillow decoder and the torch engine go by; where a damaged file makes
    libjpeg and Pillow read different headers, Pillow's decides (NOTE [which files are
    corrupt]).

        >>> pillow_header(png_bytes)
        Header(width=64, height=48, format='PNG', mode='RGB')
    """
    with Image.open(io.BytesIO(data)) as img:
        return Header(img.width, img.height, img.format or "unknown", img.mode)


def _check_pixels(width: int, height: int) -> None:
    """Image.open's decompression-bomb rule, reading MAX_IMAGE_PIXELS at call time too."""
    limit, pixels = Image.MAX_IMAGE_PIXELS, width * height
    if limit is None or pixels <= limit:
        return
    why = "Image size ({} pixels) exceeds limit of {} pixels, could be decompression bomb DOS attack."
    if pixels > 2 * limit:
        raise Image.DecompressionBombError(why.format(pixels, 2 * limit))
    warnings.warn(why.format(pixels, limit), Image.DecompressionBombWarning, stacklevel=3)


def dct_scale(
    box_w: float, box_h: float, out_w: int, out_h: int, *, width: int | None = None,
    height: int | None = None) -> int:
    """The JPEG scale denominator (1, 2, 4 or 8) to decode a ``box_w`` x ``box_h`` crop at.

    Scaling starts only when the crop is more than twice the output both ways, and the crop
    stays at least the output size. With the image's ``width`` and ``height`` this is
    exactly the scale Pillow's draft picks in ``ImagePipeline._decode`` (which rounds its
    request to whole pixels of the image), so both engines decode at the same scale: pass
    them. Without them the image is taken to be the box.

        >>> dct_scale(400, 300, 112, 112, width=500, height=375)
        2
    """
    if not (box_w > 2 * out_w and box_h > 2 * out_h):
        return 1
    width = int(box_w) if width is None else width
    height = int(box_h) if height is None else height
    want_w, want_h = math.ceil(width * out_w / box_w), math.ceil(height * out_h / box_h)
    fits = min(width // want_w, height // want_h)
    return next(d for d in (8, 4, 2, 1) if fits >= d)


def scaled_size(width: int, height: int, denom: int) -> tuple[int, int]:
    """Size of the image decoded at 1/``denom``: libjpeg's ceil(width / denom)."""
    return -(-width // denom), -(-height // denom)


def region_for(box: Box, width: int, height: int, denom: int, margin: int = 0) -> tuple[Region, Box]:
    """The pixel region covering ``box`` (of the original) at 1/``denom``, and ``box`` in it.

    The second value is what to resize from inside the decoded region. ``margin`` widens
    the region (clamped to the image) for a resize filter that reads beyond the box.
    Boxes map as in ``ImagePipeline._decode``: by scaled size / original size.
    """
    sw, sh = scaled_size(width, height, denom)
    fx, fy = sw / width, sh / height
    left, top, right, bottom = box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy
    x0 = min(sw - 1, max(0, math.floor(left) - margin))
    y0 = min(sh - 1, max(0, math.floor(top) - margin))
    x1 = max(x0 + 1, min(sw, math.ceil(right) + margin))
    y1 = max(y0 + 1, min(sh, math.ceil(bottom) + margin))
    return (x0, y0, x1, y1), (left - x0, top - y0, right - x0, bottom - y0)


class Decoder(ABC):
    """Decodes the ``region`` of an image scaled by 1/``denom`` to (h, w, 3) uint8 RGB.

    ``out``, if given, is a C-contiguous (y1-y0, x1-x0, 3) uint8 array to write into and
    is returned; otherwise the result may be a view into a larger decoded image.
    """

    name: str

    @abstractmethod
    def decode(
        self, data: bytes, header: Header, denom: int, region: Region,
        out: np.ndarray | None = None,
    ) -> np.ndarray: ...

    def __repr__(self) -> str:
        return f"<{self.name} decoder>"


def _check(header: Header, denom: int, region: Region, out: np.ndarray | None) -> None:
    """The argument errors every decoder reports the same way (ValueError)."""
    if denom not in DENOMS:
        raise ValueError(f"denom must be one of {DENOMS}, not {denom!r}")
    sw, sh = scaled_size(header.width, header.height, denom)
    x0, y0, x1, y1 = region
    if not (0 <= x0 < x1 <= sw and 0 <= y0 < y1 <= sh):
        raise ValueError(f"region {tuple(region)} is not inside the {sw}x{sh} image "
                         f"({header.width}x{header.height} at 1/{denom})")
    shape = (y1 - y0, x1 - x0, 3)
    if out is not None and (out.shape != shape or out.dtype != np.uint8
                            or not (out.flags.c_contiguous and out.flags.writeable)):
        raise ValueError(f"out must be a writable C-contiguous uint8 array of shape {shape}, "
                         f"not {out.dtype} {out.shape}")


def _jpeg_only(header: Header) -> None:
    if header.format != "JPEG" or header.mode not in ("RGB", "L"):
        raise Unsupported(f"a {header.mode} {header.format} (this decoder: RGB/grayscale JPEG)")


def _deliver(pixels: np.ndarray, region: Region, out: np.ndarray | None) -> np.ndarray:
    x0, y0, x1, y1 = region
    crop = pixels[y0:y1, x0:x1]
    if out is None:
        return crop
    np.copyto(out, crop)
    return out


class RoiDecoder(Decoder):
    """libjpeg-turbo via :mod:`fastload.data._jpeg`: decodes only the region's rows/columns."""

    name = "roi"

    def __init__(self) -> None:
        if _jpeg is None:
            raise ImportError(f"fastload.data._jpeg did not build or load: {_jpeg_error}")

    def decode(self, data, header, denom, region, out=None):
        _jpeg_only(header)
        _check(header, denom, region, out)
        x0, y0, x1, y1 = region
        if out is None:
            out = np.empty((y1 - y0, x1 - x0, 3), np.uint8)
        try:
            _jpeg.decode(data, out, denom, (x0, y0, x1, y1))
        except _jpeg.UnsupportedError as exc:
            raise Unsupported(str(exc)) from exc
        return out


class SimpleJpegDecoder(Decoder):
    """simplejpeg (TurboJPEG): the whole image at 1/denom, then the region sliced out."""

    name = "simplejpeg"

    def __init__(self) -> None:
        import simplejpeg
        self._decode = simplejpeg.decode_jpeg

    def decode(self, data, header, denom, region, out=None):
        _jpeg_only(header)
        _check(header, denom, region, out)
        sw, sh = scaled_size(header.width, header.height, denom)
        whole = tuple(region) == (0, 0, sw, sh)
        # min_factor=denom with the scaled size as minimum makes TurboJPEG pick exactly
        # 1/denom among its scaling factors; strict turns its warnings into ValueError.
        pixels = self._decode(
            data, "RGB", fastdct=False, fastupsample=False, min_width=sw, min_height=sh,
            min_factor=denom, strict=True, buffer=out if whole else None,
        )
        if pixels.shape[:2] != (sh, sw):
            raise ValueError(f"simplejpeg decoded {pixels.shape[:2]}, not 1/{denom}'s {(sh, sw)}")
        if whole and out is not None:
            return out  # decoded straight into it
        return _deliver(pixels, region, out)


class TorchvisionDecoder(Decoder):
    """torchvision.io.decode_jpeg (its bundled libjpeg-turbo); full scale only."""

    name = "torchvision"

    def __init__(self) -> None:
        import torch
        import torchvision.io
        self._torch, self._io = torch, torchvision.io

    def decode(self, data, header, denom, region, out=None):
        _jpeg_only(header)
        _check(header, denom, region, out)
        if denom != 1:
            raise Unsupported("torchvision decodes JPEGs at full scale only")
        # bytearray: torch.frombuffer warns on read-only buffers such as bytes.
        encoded = self._torch.frombuffer(bytearray(data), dtype=self._torch.uint8)
        try:
            chw = self._io.decode_jpeg(encoded, mode=self._io.ImageReadMode.RGB)
        except RuntimeError as exc:  # its libjpeg errors; corrupt data is a ValueError here
            raise ValueError(f"torchvision could not decode the JPEG: {exc}") from exc
        return _deliver(chw.permute(1, 2, 0).numpy(), region, out)


class PillowDecoder(Decoder):
    """Pillow, for every format it opens; JPEG scale by draft. The fallback of the others."""

    name = "pillow"

    def decode(self, data, header, denom, region, out=None):
        _check(header, denom, region, out)
        with Image.open(io.BytesIO(data)) as img:
            if img.size != (header.width, header.height):
                raise ValueError(f"image {img.size}, header {(header.width, header.height)}")
            if denom > 1:
                if img.format != "JPEG":
                    raise Unsupported(f"only JPEGs decode at reduced scale, not {img.format}")
                # Draft picks the largest scale whose image is >= the size asked: asking the
                # floor of 1/denom gets exactly denom (ceil could round it down).
                img.draft("RGB", (max(1, img.width // denom), max(1, img.height // denom)))
                if img.size != scaled_size(header.width, header.height, denom):
                    # No draft for this file (damaged markers): Pillow decodes it in full,
                    # as on the torch engine, and its verdict stands; then a box reduction.
                    img = img.reduce(denom)
            crop = img.crop(tuple(region))  # loads: truncated or corrupt data raises OSError
        if crop.mode != "RGB":  # after the crop: converting converts only the region
            crop = _to_rgb(crop)
        return _deliver(np.asarray(crop), (0, 0, crop.width, crop.height), out)


_CLASSES = (RoiDecoder, SimpleJpegDecoder, TorchvisionDecoder, PillowDecoder)  # preference
_OWN_TURBO = frozenset({"roi", "simplejpeg"})
_found: dict[str, Decoder] = {}
_tried: set[str] = set()
_found_lock = threading.Lock()

NOT_RACED = ("torchvision not raced (this process has not imported it, and its import takes "
             "seconds; import torchvision before the loader to race it)")
"""What :func:`~fastload.data.decoder_choice.choose` says of a torchvision it left out."""


def _decoders(*, torchvision: bool = False) -> Mapping[str, Decoder]:
    """Each decoder that loads here, loaded once (NOTE [torchvision's decoder when imported]);
    ``torchvision=True``: its too, whatever the process imported."""
    with _found_lock:
        for cls in _CLASSES:
            if cls.name in _tried:
                continue
            if cls is TorchvisionDecoder and not (
                torchvision or "torchvision" in sys.modules or not _OWN_TURBO & _found.keys()
            ):
                continue
            _tried.add(cls.name)
            try:
                _found[cls.name] = cls()
            except Exception as exc:  # noqa: BLE001 (ImportError; a broken install: any)
                logger.debug("decoder %r is not available: %s: %s", cls.name,
                             type(exc).__name__, exc)
        return MappingProxyType({c.name: _found[c.name] for c in _CLASSES if c.name in _found})


def available() -> list[Decoder]:
    """The decoders that load here, fastest-first by default preference; Pillow always.
    torchvision's only where this process imported torchvision (NOTE [torchvision's decoder
    when imported]); :func:`by_name` loads it regardless."""
    return list(_decoders().values())


def by_name(name: str) -> Decoder:
    """The decoder called ``name`` (torchvision's too, imported if need be); KeyError when it
    does not load here."""
    return _decoders(torchvision=name == "torchvision")[name]


def raced_without_torchvision() -> bool:
    """Whether :func:`available` left torchvision's decoder out for its import's cost."""
    with _found_lock:
        return "torchvision" not in _tried


def __getattr__(name: str) -> Any:
    # DECODERS (name -> decoder) is built on first use: see _decoders.
    if name == "DECODERS":
        return _decoders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
