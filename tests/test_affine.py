"""NOTE [a bilinear affine]: fastload's kernel against timm's own geometric op functions (which
run Pillow's transform), bit for bit; and the fallbacks to them (other modes, other filters)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

auto_augment = pytest.importorskip("timm.data.auto_augment")
pytest.importorskip("fastload.data._pixels", reason="the optional C extension was not built")

from fastload.data.augment import affine
from fastload.data.augment import timm_rand
from fastload.data.augment.timm_rand import Op, bilinear_affine

BILINEAR, BICUBIC = Image.Resampling.BILINEAR, Image.Resampling.BICUBIC
FILL = (124, 116, 104)
SIZES = [(224, 224), (53, 37), (16, 61), (3, 2)]  # (width, height)


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    """Noise on a gradient with hard-edged blocks and a bright border: edges everywhere."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    ramps = [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x * y) % 256]
    base = np.stack(ramps, -1)
    base = base + rng.integers(-30, 30, (height, width, 3))
    base[(x // 5 + y // 7) % 2 == 0] //= 3  # a checkerboard of sharp steps
    base[0, :], base[:, -1] = 255, 0
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


def arguments(name: str, size: tuple[int, int], rng: random.Random) -> list[float]:
    """Random arguments over timm's ranges and beyond, both signs, and exact edge values."""
    spread = {"rotate": 180.0, "shear_x": 1.0, "shear_y": 1.0, "translate_x_rel": 0.6,
              "translate_y_rel": 0.6, "translate_x_abs": 1.2 * size[0],
              "translate_y_abs": 1.2 * size[1]}[name]
    values = [rng.uniform(-spread, spread) for _ in range(24)]
    values += [rng.uniform(-spread, spread) * 0.05 for _ in range(8)]  # small, as M1..M3 give
    if name == "rotate":
        return values + [30.0, -30.0, 45.0, 0.0, 90.0, -90.0, 180.0, 270.0, 360.0, 1e-9]
    if name.startswith("translate") and name.endswith("abs"):
        return values + [0.0, 1.0, -1.0, 0.5, -0.5, 2.25, float(size[0]), -float(size[1])]
    return values + [0.0, 0.3, -0.3, 0.5, 1e-12]


OPS = ["rotate", "shear_x", "shear_y", "translate_x_rel", "translate_y_rel", "translate_x_abs",
       "translate_y_abs"]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", OPS)
def test_geometric_ops_are_timms_bit_for_bit(name, size):
    fn, rng = getattr(auto_augment, name), random.Random(f"{name}{size}")
    img, fast_runs = picture(*size), 0
    for arg in arguments(name, size, rng):
        fill = FILL if rng.random() < 0.8 else tuple(rng.randrange(256) for _ in range(3))
        theirs = np.asarray(fn(img, arg, fillcolor=fill, resample=BILINEAR))
        mine = bilinear_affine(fn, img, arg, fill)
        if mine is None:  # only where Pillow's rotate copies or transposes
            assert name == "rotate" and affine.rotate_matrix(size, arg) is None, arg
            continue
        fast_runs += 1
        assert mine.mode == "RGB" and mine.size == img.size
        assert np.array_equal(np.asarray(mine), theirs), (name, size, arg)
    assert fast_runs >= 30


@pytest.mark.parametrize("fill", [None, 7, "red", "#102030", (255, 0, 10)])
def test_fill_is_what_pillow_fills_with(fill):
    img, matrix = picture(40, 30), (1, 0.4, -5.5, 0.1, 1, 3.25)
    theirs = img.transform(img.size, Image.Transform.AFFINE, matrix, BILINEAR, fillcolor=fill)
    assert np.array_equal(np.asarray(affine.affine(img, matrix, fill)), np.asarray(theirs))


def test_a_fill_pillow_refuses_is_refused_alike():
    img, matrix = picture(8, 6), (1, 0.4, 0, 0, 1, 0)
    with pytest.raises(TypeError, match="color must be int or tuple"):
        img.transform(img.size, Image.Transform.AFFINE, matrix, BILINEAR, fillcolor=[3, 4, 5])
    with pytest.raises(TypeError, match="color must be int or tuple"):
        affine.affine(img, matrix, [3, 4, 5])


def test_other_modes_and_matrices_are_left_to_pillow():
    img = picture(20, 10)
    for mode in ("L", "RGBA", "P", "LA", "I", "F", "CMYK"):
        assert affine.affine(img.convert(mode), (1, 0.2, 0, 0, 1, 0), FILL) is None, mode
    assert affine.affine(img, (1, float("nan"), 0, 0, 1, 0), FILL) is None
    assert affine.affine(img, (1, 0, 0, 0, 1), FILL) is None  # not 6 numbers
    assert bilinear_affine(auto_augment.posterize, img, 4, FILL) is None  # not a geometric op
    assert affine.rotate(img, 180, FILL) is None and affine.rotate(picture(9, 9), -90, FILL) is None
    assert affine.rotate(img, 90, FILL) is not None  # not square: Pillow transforms it too


def test_the_kernel_checks_its_sizes():
    from fastload.data import _pixels

    src, out = bytes(2 * 3 * 4), bytearray(2 * 3 * 4)
    _pixels.affine_bilinear(src, out, 2, 3, (1, 0, 0, 0, 1, 0), bytes(4))
    for args in [(src[:-1], out, 2, 3), (src, bytearray(5), 2, 3), (src, out, 0, 3)]:
        with pytest.raises(ValueError):
            _pixels.affine_bilinear(*args, (1, 0, 0, 0, 1, 0), bytes(4))
    with pytest.raises(ValueError):
        _pixels.affine_bilinear(src, out, 2, 3, (1, 0, 0, 0, 1, 0), bytes(3))
    with pytest.raises(ValueError):
        _pixels.affine_bilinear(src, out, 2, 3, (1, 0, float("inf"), 0, 1, 0), bytes(4))


def op(name: str, fn_name: str, resample, fill=FILL) -> Op:
    return Op(name, 1.0, 7.0, 0.5, None, (("translate_const", 100), ("translate_pct", 0.45)), fill,
              resample, getattr(auto_augment, fn_name))


NAMES = {"Rotate": "rotate", "ShearX": "shear_x", "ShearY": "shear_y",
         "TranslateX": "translate_x_abs", "TranslateY": "translate_y_abs",
         "TranslateXRel": "translate_x_rel", "TranslateYRel": "translate_y_rel"}


@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("resample", [BILINEAR, BICUBIC, (BILINEAR, BICUBIC)])
def test_op_run_draws_as_before_and_renders_as_timm(name, resample, monkeypatch):
    """Op.run makes the same draws with the kernel as with timm's function for every call,
    gives the same image, and runs the kernel exactly when the filter drawn is BILINEAR."""
    step, kernel_runs = op(name, NAMES[name], resample), []
    images = [picture(48, 40, s) for s in range(3)]
    real = affine.affine
    monkeypatch.setattr(affine, "affine", lambda *a: kernel_runs.append(a) or real(*a))
    for seed in range(40):
        mine_rng, their_rng = random.Random(seed), random.Random(seed)
        mine = step.run(images[seed % 3], mine_rng)
        with monkeypatch.context() as m:
            m.setattr(timm_rand, "bilinear_affine", lambda *a: None)
            theirs = step.run(images[seed % 3], their_rng)
        assert mine_rng.getstate() == their_rng.getstate(), (name, seed)
        assert np.array_equal(np.asarray(mine), np.asarray(theirs)), (name, seed)
    if resample == BICUBIC:
        assert not kernel_runs
    else:
        assert 5 < len(kernel_runs) <= 40


@pytest.mark.parametrize(("mode", "fill"), [("L", 128), ("RGBA", (*FILL, 255)), ("P", FILL)])
def test_non_rgb_images_run_timms_function(mode, fill, monkeypatch):
    monkeypatch.setattr(affine, "affine", lambda *a: pytest.fail("the kernel ran on " + mode))
    step, img = op("ShearX", "shear_x", BILINEAR, fill), picture(30, 20).convert(mode)
    for seed in range(10):
        mine = step.run(img, random.Random(seed))
        factor = _shear_x_factor(random.Random(seed), step)
        theirs = auto_augment.shear_x(img, factor, fillcolor=fill, resample=BILINEAR)
        assert mine.mode == mode, (mode, seed)
        assert np.array_equal(np.asarray(mine), np.asarray(theirs)), (mode, seed)


def _shear_x_factor(rng: random.Random, step: Op) -> float:
    """ShearX's argument as Op.run draws it from ``rng``: magnitude noise, then the sign."""
    level = max(0.0, min(rng.gauss(step.magnitude, step.magnitude_std), 10.0))
    return -level / 10.0 * 0.3 if rng.random() > 0.5 else level / 10.0 * 0.3
