"""GaussianBlur on uint8 pixels as two 1-D passes: torchvision's result, a tenth of its work.

NOTE [a separable blur]
torchvision blurs by a 2-D convolution with the outer product of two 1-D Gaussian kernels on
float32 pixels, then rounds (half to even) back to uint8. For SimCLR's ``GaussianBlur(23)``
that is 529 multiply-adds a pixel: about 27 ms for a 224x224 image, more than everything
else in the recipe together. The same sums come from a row pass with the x kernel, then a
column pass with the y kernel: 46 multiply-adds a pixel (:func:`fastload.data._pixels.blur`,
with the GIL released). The 1-D kernels here are torchvision's (the same float32 ops), the
padding is its reflect padding, the rounding its; only the order in which the float products
are added differs, so a pixel can differ by one level where a sum falls within a rounding
error of .5 (tests/test_augment.py bounds it: at most 1, on a small fraction of pixels).
Float images, images smaller than the kernel's radius and builds without the extension get
torchvision's own kernel.

Example::

    >>> out = gaussian_blur(pil_image, (23, 23), (1.3, 1.3))     # a PIL image, blurred
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

try:
    from fastload.data import _pixels
except ImportError:  # an optional extension: torchvision's kernel then
    _pixels = None


def kernel1d(size: int, sigma: float) -> np.ndarray:
    """torchvision's 1-D Gaussian kernel of ``size`` taps, float32 (the same ops)."""
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    x = torch.linspace(-lim, lim, steps=size, dtype=torch.float32)
    return torch.softmax(x.div(sigma).pow(2).neg(), dim=0).numpy()


def gaussian_blur(image: Any, kernel_size: tuple[int, int], sigma: tuple[float, float]) -> Any:
    """``F.gaussian_blur(image, kernel_size, sigma)`` (x then y, as torchvision orders them);
    uint8 images (PIL RGB or L, CHW tensors) by two 1-D passes (NOTE [a separable blur])."""
    pixels, channels, hwc = _uint8(image)
    if pixels is None or _pixels is None:
        return F.gaussian_blur(image, list(kernel_size), list(sigma))
    height, width = (pixels.shape[:2] if hwc else pixels.shape[1:])
    if kernel_size[0] // 2 >= width or kernel_size[1] // 2 >= height:
        return F.gaussian_blur(image, list(kernel_size), list(sigma))
    out = np.empty_like(pixels)
    _pixels.blur(pixels, out, kernel1d(kernel_size[0], sigma[0]), kernel1d(kernel_size[1], sigma[1]),
                 height, width, channels, hwc)
    if isinstance(image, Image.Image):
        return Image.fromarray(out, mode=image.mode)
    return torch.from_numpy(out)


def _uint8(image: Any) -> tuple[np.ndarray | None, int, bool]:
    """(C-contiguous uint8 pixels, channels, whether HWC), or None where torchvision blurs."""
    if isinstance(image, Image.Image):
        if image.mode not in ("RGB", "L"):
            return None, 0, True
        pixels = np.asarray(image)
        return (pixels, 3, True) if image.mode == "RGB" else (pixels, 1, True)
    plain = isinstance(image, torch.Tensor) and type(image) is torch.Tensor
    if plain and image.dtype == torch.uint8 and image.dim() == 3 and 1 <= image.shape[0] <= 4:
        return image.contiguous().numpy(), int(image.shape[0]), False
    return None, 0, False
