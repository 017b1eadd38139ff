"""Pillow's bilinear affine transform of an RGB image: the same bytes, a row at a time.

NOTE [a bilinear affine]
timm's RandAugment geometric ops (Rotate, ShearX/Y, TranslateX/Y and their Rel forms) call
``img.transform(img.size, Image.AFFINE, matrix, resample, fillcolor=fill)`` or
``img.rotate(degrees, resample, fillcolor=fill)``. With ``BILINEAR`` Pillow leaves its
fixed-point nearest-neighbour path (0.09 ms for a 224x224 RGB image) for its generic
transform: per output pixel, the matrix and the filter called through pointers, all in
scalar doubles; 1.18 ms a call for timm's rotate, 1.16 ms for shear_x (best of 30 runs of 50,
on this project's 2-core AMD EPYC VM). The calls are the lesser part: the same loop inlined
in C took about 0.95 ms. :func:`affine` (:func:`fastload.data._pixels.affine_bilinear`, the GIL
released) computes exactly Pillow's arithmetic but a row at a time: output pixel (x, y)
samples the input at ``(a0 X + a1 Y + a2, a3 X + a4 Y + a5)``, ``X = x + 0.5``,
``Y = y + 0.5``, the products added in Pillow's order; outside ``[0, w) x [0, h)`` it is the
fill colour (Pillow's own, from ``Image.new``); inside, Pillow's bilinear filter: -0.5,
floor, neighbours clipped to the edges (a missing row below repeats the row), then
``a + (b - a) * d`` in double along x and y, truncated to uint8. The neighbours of a row are
gathered first, then blended in a loop the compiler vectorises (rows where every dy, or
every dx, is 0, as ShearX/TranslateX and ShearY/TranslateY give, skip the step that leaves
their values as they are). Pixels go in and out as Pillow's 4-byte RGBX, its cheapest
packing. Measured as above: 0.76 ms for rotate, 0.57 ms for shear_x (0.58 shear_y, 0.52
translate_x_rel), bytes in and out included: 1.5x (rotate) to 2x. :func:`rotate_matrix` builds the
matrix as ``Image.rotate`` does (the angle reduced mod 360, cos and sin rounded to 15
digits, about the centre); the angles Pillow copies or transposes instead (0, 180; 90 and
270 on a square image) are left to Pillow.
The bound: bit for bit. tests/test_affine.py checks every geometric op against timm's own
function on images with hard edges (4 sizes, non-square ones among them, about 40
arguments each, both signs); a one-off run of 20,000 random cases (random sizes up to
128x128 and 224x224, arguments to 1.5x timm's ranges, random fills) found no differing
byte among 526 million. That holds where neither Pillow nor this file is built with fused
multiply-adds (x86-64's default, without -march=native): a build that fuses them may round
a pixel differently. Other modes, other filters and builds without the extension get
``None`` here, and the caller runs Pillow.

Example::

    >>> out = affine(pil_image, (1, 0.2, 0, 0, 1, 0), (128, 128, 128))   # timm's ShearX(0.2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from PIL import Image

try:
    from fastload.data import _pixels
except ImportError:  # an optional extension: Pillow's transform then
    _pixels = None

Matrix = tuple[float, float, float, float, float, float]


def affine(img: Image.Image, matrix: Sequence[float], fill: Any) -> Image.Image | None:
    """``img.transform(img.size, Image.AFFINE, matrix, Image.BILINEAR, fillcolor=fill)`` for
    an RGB image (NOTE [a bilinear affine]); None for any other image, a matrix that is not
    6 finite numbers, or without the extension, where the caller should run Pillow."""
    if _pixels is None or not isinstance(img, Image.Image) or img.mode != "RGB":
        return None
    coefficients = tuple(float(v) for v in matrix[:6])
    width, height = img.size
    if len(coefficients) != 6 or not all(map(math.isfinite, coefficients)) or width * height == 0:
        return None
    out = bytearray(width * height * 4)  # Pillow's RGBX, which it packs and unpacks fastest
    src = img.tobytes("raw", "RGBX")
    _pixels.affine_bilinear(src, out, height, width, coefficients, fill_bytes(fill))
    result = Image.frombytes("RGB", (width, height), out, "raw", "RGBX")  # info: as Pillow has it
    result.info = {k: v.copy() if isinstance(v, list) else v for k, v in img.info.items()}
    return result


def rotate(img: Image.Image, degrees: float, fill: Any) -> Image.Image | None:
    """``img.rotate(degrees, Image.BILINEAR, fillcolor=fill)`` about the centre, same size;
    None where :func:`affine` gives None or Pillow would copy or transpose instead."""
    if not isinstance(img, Image.Image):
        return None
    matrix = rotate_matrix(img.size, degrees)
    return None if matrix is None else affine(img, matrix, fill)


def rotate_matrix(size: tuple[int, int], degrees: float) -> Matrix | None:
    """The inverse matrix ``Image.rotate(degrees)`` hands to ``transform`` for an image of
    ``size`` (no expand, centre, translate); None for the angles Pillow does without it."""
    width, height = size
    angle = degrees % 360.0
    if angle in (0, 180) or (angle in (90, 270) and width == height):
        return None  # Pillow: copy() or transpose(), not a filter
    radians = -math.radians(angle)
    cos, sin, minus_sin = (round(math.cos(radians), 15), round(math.sin(radians), 15),
                           round(-math.sin(radians), 15))
    cx, cy = width / 2, height / 2
    # Pillow maps (-cx, -cy) through the rotation, then adds the centre back: the same ops here.
    tx = cos * -cx + sin * -cy + 0.0
    ty = minus_sin * -cx + cos * -cy + 0.0
    return (cos, sin, tx + cx, minus_sin, cos, ty + cy)


def fill_bytes(fill: Any) -> bytes:
    """The 4 bytes (RGBX) Pillow fills an RGB image with for ``fill`` (a tuple, an int, a colour
    name or None, as ``Image.new`` reads it)."""
    try:
        return _fill_bytes(fill)
    except TypeError:  # unhashable (a list): not cached
        return Image.new("RGB", (1, 1), fill).tobytes("raw", "RGBX")


@lru_cache(maxsize=64)
def _fill_bytes(fill: Any) -> bytes:
    return Image.new("RGB", (1, 1), fill).tobytes("raw", "RGBX")
