"""fastload's own pixel kernels against torchvision's: NOTE [a float table] (bit for bit) and
NOTE [a separable blur] (within one level, on very few pixels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

torchvision = pytest.importorskip("torchvision")
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torchvision.transforms.v2 import functional as F

from fastload.data import float_table
from fastload.data.augment.blur import gaussian_blur
from fastload.data.transforms import compile_transform

pytest.importorskip("fastload.data._pixels", reason="the optional C extension was not built")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
RNG = np.random.default_rng(5)


def photo(h: int, w: int) -> np.ndarray:
    """A smooth-ish RGB image (noise on gradients), HWC uint8."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], axis=-1)
    return np.clip(base + RNG.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)


BLOCKS = {  # the tail of a recipe from the first conversion on; RandomErasing(p=0) keeps it mid-recipe
    "v2 PILToTensor+ToDtype+Normalize": [T2.PILToTensor(), T2.ToDtype(torch.float32, scale=True),
                                         T2.Normalize(MEAN, STD), T2.RandomErasing(0.0)],
    "v2 ToImage+ToDtype+Normalize": [T2.ToImage(), T2.ToDtype(torch.float32, scale=True),
                                     T2.Normalize(MEAN, STD), T2.RandomErasing(0.0)],
    "v2 ToDtype alone": [T2.PILToTensor(), T2.ToDtype(torch.float32, scale=True), T2.RandomErasing(0.0)],
    "v1 ToTensor+Normalize": [T1.ToTensor(), T1.Normalize(MEAN, STD), T1.RandomErasing(0.0)],
}


@pytest.mark.parametrize("name", list(BLOCKS))
@pytest.mark.parametrize("shape", [(224, 224), (37, 53)])
def test_a_float_table_gives_the_users_floats_bit_for_bit(name, shape):
    steps = BLOCKS[name]
    compiled = compile_transform(T2.Compose([T2.CenterCrop(shape), *steps]))
    blocks = [s for s in compiled.rest.steps if isinstance(s, float_table.FloatTable)]
    assert len(blocks) == 1, compiled.rest
    pil = Image.fromarray(photo(*shape))
    theirs = T2.Compose(steps)(pil).as_subclass(torch.Tensor)
    tensor = torch.from_numpy(np.asarray(pil).transpose(2, 0, 1).copy())
    for image in (pil, tensor):
        if name.startswith("v1") and isinstance(image, torch.Tensor):
            continue  # v1's ToTensor takes no tensor: the user's Compose had a PIL image there
        mine = blocks[0](image)
        assert mine.dtype == torch.float32 and torch.equal(mine, theirs), (name, type(image))
    assert blocks[0].table(True) is not None  # the table ran, not the steps


def test_a_subclassed_normalize_is_not_folded_into_a_table():
    class MyNormalize(T2.Normalize):
        def forward(self, x):
            return super().forward(x) * 2

    compiled = compile_transform(T2.Compose([T2.CenterCrop(32), T2.PILToTensor(),
                                             T2.ToDtype(torch.float32, scale=True), MyNormalize(MEAN, STD),
                                             T2.RandomErasing(0.0)]))
    blocks = [s for s in compiled.rest.steps if isinstance(s, float_table.FloatTable)]
    assert blocks and all(not any(isinstance(t, MyNormalize) for t in b.steps) for b in blocks)
    assert any(isinstance(s, MyNormalize) for s in compiled.rest.steps)


def test_a_grayscale_or_float_image_runs_the_steps():
    block = float_table.FloatTable((T2.ToDtype(torch.float32, scale=True), T2.Normalize([0.5], [0.2])))
    grey = torch.from_numpy(RNG.integers(0, 256, (1, 8, 8), dtype=np.uint8))
    assert torch.equal(block(grey), T2.Normalize([0.5], [0.2])(T2.ToDtype(torch.float32, scale=True)(grey)))


@pytest.mark.parametrize("kernel,sigma", [((23, 23), (1.7, 1.7)), ((5, 9), (0.4, 2.0)), ((3, 3), (0.1, 0.1))])
@pytest.mark.parametrize("shape", [(224, 224), (41, 66)])
def test_the_separable_blur_is_torchvisions_within_one_level(kernel, sigma, shape):
    pixels = photo(*shape)
    for image in (Image.fromarray(pixels), torch.from_numpy(pixels.transpose(2, 0, 1).copy()),
                  Image.fromarray(pixels[:, :, 0])):
        mine, theirs = gaussian_blur(image, kernel, sigma), F.gaussian_blur(image, list(kernel), list(sigma))
        assert type(mine) is type(theirs)
        a, b = (np.asarray(x).astype(int) for x in (mine, theirs))
        diff = np.abs(a - b)
        assert a.shape == b.shape and diff.max() <= 1 and diff.mean() < 1e-3, (kernel, sigma, shape)


def test_a_blur_wider_than_the_image_is_torchvisions_own():
    tiny = torch.from_numpy(RNG.integers(0, 256, (3, 8, 30), dtype=np.uint8))
    # a radius of 11 does not fit 8 rows: torchvision's reflect padding refuses it, and so do we
    with pytest.raises(RuntimeError):
        F.gaussian_blur(tiny, [23, 23], [1.0, 1.0])
    with pytest.raises(RuntimeError):
        gaussian_blur(tiny, (23, 23), (1.0, 1.0))
    fits = torch.from_numpy(RNG.integers(0, 256, (3, 12, 30), dtype=np.uint8))  # radius 11 < 12 rows
    diff = (gaussian_blur(fits, (3, 23), (1.0, 1.0)).int() - F.gaussian_blur(fits, [3, 23], [1.0, 1.0]).int()).abs()
    assert int(diff.max()) <= 1
