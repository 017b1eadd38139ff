"""fastload.data.decoders: every decoder gives Pillow's pixels, for a region and at DCT scale.

Bounds: the libjpeg-turbo decoders (roi, simplejpeg, torchvision) and Pillow all run
libjpeg-turbo's default islow IDCT and fancy upsampling, so their pixels agree exactly here;
the tests allow max 2 levels and mean 0.25 (other builds may pick other SIMD paths).
"""

from __future__ import annotations

import io
import math
import random
import shutil
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastload.data import decoders
from fastload.data.decoder_choice import choose
from fastload.data.decoders import (
    Header,
    Unsupported,
    available,
    dct_scale,
    read_header,
    region_for,
    scaled_size,
)

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")

NAMES = ["roi", "simplejpeg", "torchvision", "pillow"]
MAX_DIFF, MEAN_DIFF = 2, 0.25


def photo(width: int = 500, height: int = 375, seed: int = 0) -> np.ndarray:
    """Smooth gradients and noise, like fastload.testing.synthetic: photo-like JPEG costs."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(xx * 0.021), 128 + 100 * np.cos(yy * 0.017),
                     128 + 100 * np.sin((xx + yy) * 0.011)], axis=-1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, mode: str = "RGB", fmt: str = "JPEG", **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").convert(mode).save(buf, fmt, **options)
    return buf.getvalue()


PIXELS = photo()
JPEGS = {  # name -> bytes: Pillow's default 4:2:0, the other subsamplings, progressive, odd size
    "420": encode(PIXELS, quality=90),
    "444": encode(PIXELS, quality=90, subsampling=0),
    "422": encode(PIXELS, quality=90, subsampling=1),
    "progressive": encode(PIXELS, quality=90, progressive=True),
    "odd": encode(photo(333, 251, seed=1), quality=85),
}
GRAY = encode(PIXELS, "L", quality=90)
CMYK = encode(PIXELS, "CMYK", quality=90)
PNG = encode(PIXELS, fmt="PNG")


@pytest.fixture(params=NAMES)
def decoder(request):
    try:
        return decoders.by_name(request.param)  # torchvision's too, if the process had not
    except KeyError:
        pytest.skip(f"{request.param} is not available here: {_why_missing(request.param)}")


def _why_missing(name: str) -> str:
    return str(decoders._jpeg_error) if name == "roi" else "it does not import"


def pillow(data: bytes, denom: int = 1) -> np.ndarray:
    """Pillow's own decode, at 1/denom by draft as ImagePipeline does it."""
    with Image.open(io.BytesIO(data)) as img:
        if denom > 1:
            img.draft("RGB", (img.width // denom, img.height // denom))
        return np.asarray(img.convert("RGB"))


def assert_close(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape and got.dtype == np.uint8, (what, got.shape, want.shape)
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= MAX_DIFF and diff.mean() <= MEAN_DIFF, (what, diff.max(), diff.mean())


def whole(header: Header, denom: int = 1):
    return (0, 0, *scaled_size(header.width, header.height, denom))


def regions(width: int, height: int, count: int = 12, seed: int = 0):
    """Random regions, plus ones on 8/16-pixel (iMCU) boundaries and at the edges."""
    r = random.Random(seed)
    out = [(16, 16, 48, 32), (0, 0, 17, 9), (width - 1, height - 1, width, height),
           (1, 1, width - 1, height - 1), (width // 3, 0, width // 3 + 1, height)]
    for _ in range(count):
        x0, y0 = r.randrange(width), r.randrange(height)
        out.append((x0, y0, r.randrange(x0 + 1, width + 1), r.randrange(y0 + 1, height + 1)))
    return out


# -- pixels ------------------------------------------------------------------------------


# Each test loops over its cases: one test item per decoder keeps the suite's per-test
# checks (conftest's no_leftovers) from dominating the run time.


def test_full_decode_matches_pillow(decoder):
    for kind, data in JPEGS.items():
        header = read_header(data)
        assert_close(decoder.decode(data, header, 1, whole(header)), pillow(data), kind)


def test_region_equals_the_full_decode_sliced(decoder):
    for kind in ["420", "422", "progressive", "odd"]:
        data = JPEGS[kind]
        header = read_header(data)
        for denom in (1, 2) if decoder.name != "torchvision" else (1,):
            full = decoder.decode(data, header, denom, whole(header, denom))
            for x0, y0, x1, y1 in regions(*scaled_size(header.width, header.height, denom)):
                got = decoder.decode(data, header, denom, (x0, y0, x1, y1))
                np.testing.assert_array_equal(got, full[y0:y1, x0:x1],
                                              err_msg=f"{kind} 1/{denom} {x0, y0, x1, y1}")


def test_dct_scale_matches_pillow_draft(decoder):
    for kind, denom in [(k, d) for k in ("420", "444", "odd") for d in (2, 4, 8)]:
        data = JPEGS[kind]
        header = read_header(data)
        if decoder.name == "torchvision":
            with pytest.raises(Unsupported):
                decoder.decode(data, header, denom, whole(header, denom))
            continue
        want = pillow(data, denom)
        assert want.shape[:2] == scaled_size(header.width, header.height, denom)[::-1]
        got = decoder.decode(data, header, denom, whole(header, denom))
        assert_close(got, want, f"{kind} 1/{denom}")
        x0, y0, x1, y1 = 3, 5, want.shape[1] - 2, want.shape[0] - 4
        got = decoder.decode(data, header, denom, (x0, y0, x1, y1))
        assert_close(got, want[y0:y1, x0:x1], f"{kind} 1/{denom} region")


def test_grayscale_jpeg_gives_three_equal_channels(decoder):
    header = read_header(GRAY)
    assert (header.format, header.mode) == ("JPEG", "L")
    got = decoder.decode(GRAY, header, 1, (10, 20, 300, 200))
    assert got.shape == (180, 290, 3)
    assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()
    assert_close(got, pillow(GRAY)[20:200, 10:300])


def test_writes_into_out_and_returns_it(decoder):
    data = JPEGS["420"]
    header = read_header(data)
    for region in [(0, 0, 500, 375), (100, 50, 200, 100)]:
        out = np.zeros((region[3] - region[1], region[2] - region[0], 3), np.uint8)
        assert decoder.decode(data, header, 1, region, out) is out
        assert_close(out, pillow(data)[region[1]:region[3], region[0]:region[2]])


# -- formats the JPEG decoders leave to Pillow ------------------------------------------


def test_png_decodes_through_pillow_and_is_unsupported_elsewhere(decoder):
    header = read_header(PNG)
    assert header == Header(500, 375, "PNG", "RGB")
    if decoder.name == "pillow":
        np.testing.assert_array_equal(decoder.decode(PNG, header, 1, (5, 6, 70, 80)),
                                      PIXELS[6:80, 5:70])
        with pytest.raises(Unsupported):  # no reduced-scale decode outside JPEG
            decoder.decode(PNG, header, 2, (0, 0, 10, 10))
    else:
        with pytest.raises(Unsupported):
            decoder.decode(PNG, header, 1, (0, 0, 10, 10))


def test_cmyk_jpeg_is_unsupported_except_by_pillow(decoder):
    header = read_header(CMYK)
    assert (header.format, header.mode) == ("JPEG", "CMYK")
    if decoder.name == "pillow":
        want = np.asarray(Image.open(io.BytesIO(CMYK)).convert("RGB"))
        np.testing.assert_array_equal(decoder.decode(CMYK, header, 1, whole(header)), want)
    else:
        with pytest.raises(Unsupported):
            decoder.decode(CMYK, header, 1, whole(header))


def test_roi_reports_cmyk_even_when_the_header_says_rgb():
    """The C side checks the colour space itself and raises its own UnsupportedError."""
    roi = decoders.DECODERS.get("roi") or pytest.skip(_why_missing("roi"))
    with pytest.raises(Unsupported, match="CMYK"):
        roi.decode(CMYK, Header(500, 375, "JPEG", "RGB"), 1, (0, 0, 500, 375))


# -- corrupt input: an error, never pixels -----------------------------------------------


def _corrupt(data: bytes) -> bytes:
    rng = np.random.default_rng(3)
    bad = bytearray(data)
    bad[len(data) // 2: len(data) // 2 + 200] = rng.integers(0, 256, 200, np.uint8).tobytes()
    return bytes(bad)


BROKEN = {
    "truncated": JPEGS["420"][: len(JPEGS["420"]) // 2],
    "truncated_progressive": JPEGS["progressive"][: len(JPEGS["progressive"]) * 2 // 3],
    "random_bytes_inside": _corrupt(JPEGS["420"]),
}


def test_corrupt_jpeg_raises_a_decode_error(decoder):
    for kind, data in BROKEN.items():
        header = read_header(data)  # the header is intact
        with pytest.raises((ValueError, OSError)):
            decoder.decode(data, header, 1, whole(header))
            pytest.fail(f"{kind}: pixels returned")
        if decoder.name != "torchvision":
            with pytest.raises((ValueError, OSError)):
                decoder.decode(data, header, 2, (0, 100, 250, 188))  # a region below the damage
                pytest.fail(f"{kind}: pixels returned at 1/2")


def test_roi_refuses_a_file_damaged_below_the_region():
    """The rest of the file is read to EOI (NOTE [a clean decode or Pillow's verdict]):
    damage the crop misses still makes the decode an error, for Pillow to judge."""
    roi = decoders.DECODERS.get("roi") or pytest.skip(_why_missing("roi"))
    for data in (BROKEN["truncated"], JPEGS["420"][:-2]):
        with pytest.raises(ValueError, match="Premature end"):
            roi.decode(data, read_header(data), 1, (0, 0, 500, 16))
    got = roi.decode(JPEGS["420"], read_header(JPEGS["420"]), 1, (0, 0, 500, 16))
    np.testing.assert_array_equal(got, pillow(JPEGS["420"])[:16])


def test_garbage_raises_from_read_header_and_decode(decoder):
    for data in [b"", b"garbage" * 10, b"\xff\xd8\xff", b"\xff\xd8\xffgarbage", JPEGS["420"][:100]]:
        with pytest.raises((ValueError, OSError)):
            read_header(data)
        with pytest.raises((ValueError, OSError)):
            decoder.decode(data, Header(500, 375, "JPEG"), 1, (0, 0, 500, 375))
            pytest.fail(f"pixels returned for {data[:20]!r}")


def test_read_header_guards_decompression_bombs(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500 * 375 // 2 - 1)
    for data in (JPEGS["420"], PNG):  # the C header path and Pillow's
        with pytest.raises(Image.DecompressionBombError):
            read_header(data)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500 * 375 - 1)
    with pytest.warns(Image.DecompressionBombWarning):
        assert read_header(JPEGS["420"]).width == 500
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_header(JPEGS["420"]) == Header(500, 375, "JPEG", "RGB")


# -- argument errors ---------------------------------------------------------------------


ARGUMENT_ERRORS = [  # denom, region, out, message
    (1, (0, 0, 501, 375), None, "not inside"),
    (2, (0, 0, 251, 188), None, "not inside"),
    (1, (10, 10, 10, 20), None, "not inside"),
    (1, (-1, 0, 10, 10), None, "not inside"),
    (3, (0, 0, 10, 10), None, "denom"),
    (1, (0, 0, 10, 10), np.empty((10, 9, 3), np.uint8), "shape"),
    (1, (0, 0, 10, 10), np.empty((10, 10, 3), np.float32), "uint8"),
    (1, (0, 0, 10, 10), np.empty((10, 20, 3), np.uint8)[:, ::2], "C-contiguous"),
]


def test_argument_errors(decoder):
    header = read_header(JPEGS["420"])
    for denom, region, out, match in ARGUMENT_ERRORS:
        with pytest.raises(ValueError, match=match):
            decoder.decode(JPEGS["420"], header, denom, region, out)


def test_the_extension_validates_its_own_arguments():
    jpeg = decoders._jpeg or pytest.skip(_why_missing("roi"))
    data, buf = JPEGS["420"], np.empty((10, 10, 3), np.uint8)
    for denom, region, match in [(1, (0, 0, 10, 9), "exactly 270"), (16, (0, 0, 10, 10), "denom"),
                                 (2, (245, 0, 255, 10), "outside"), (1, (5, 0, 5, 10), "x0 < x1")]:
        with pytest.raises(ValueError, match=match):
            jpeg.decode(data, buf, denom, region)
    with pytest.raises(BufferError):
        jpeg.decode(data, bytes(300), 1, (0, 0, 10, 10))
    assert jpeg.header(JPEGS["odd"]) == (333, 251, 3, 3)  # width, height, components, YCbCr


@pytest.mark.skipif(not (Path("/usr/include/jpeglib.h").exists() and shutil.which("cc")),
                    reason="no jpeglib.h or no C compiler here: the extension cannot build")
def test_the_roi_extension_built_where_it_can():
    """`make system-deps` installs jpeglib.h, so a silently failed optional build shows here."""
    assert decoders._jpeg is not None, decoders._jpeg_error
    assert "roi" in decoders.DECODERS


# -- threads -----------------------------------------------------------------------------


def test_concurrent_decodes_give_identical_results(decoder):
    data = JPEGS["420"]
    header = read_header(data)
    jobs = [(denom, region) for denom in ((1, 2) if decoder.name != "torchvision" else (1,))
            for region in regions(*scaled_size(500, 375, denom), count=6, seed=denom)]
    want = [decoder.decode(data, header, d, r).copy() for d, r in jobs]
    results: list[list[np.ndarray]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def work(i: int) -> None:
        start.wait()
        results[i] = [decoder.decode(data, header, d, r).copy() for d, r in jobs]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for got in results:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


# -- geometry ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(500, 375), (1024, 768), (333, 251), (4000, 3000)])
def test_dct_scale_is_the_scale_pillow_draft_picks_in_the_pipeline(size):
    """ImagePipeline._decode's draft request, replayed on a real JPEG header, many crops."""
    width, height = size
    data = encode(np.zeros((height, width, 3), np.uint8), quality=50)
    r = random.Random(width)
    for _ in range(500):
        bw, bh = r.uniform(8, width), r.uniform(8, height)
        out_w, out_h = r.choice([(224, 224), (112, 112), (64, 48), (r.randint(1, 600),) * 2])
        if r.random() < 0.2:  # exactly on the "more than twice" edge
            bw, bh = 2.0 * out_w, max(bh, 2.0 * out_h + 1)
        bw, bh = min(bw, width), min(bh, height)
        want = 1
        if bw > 2 * out_w and bh > 2 * out_h:
            with Image.open(io.BytesIO(data)) as img:
                want_size = (math.ceil(width * out_w / bw), math.ceil(height * out_h / bh))
                _, scaled = img.draft("RGB", want_size)  # box (0, 0, width/scale, height/scale)
                want = round(width / scaled[2])
        assert dct_scale(bw, bh, out_w, out_h, width=width, height=height) == want, (bw, bh)


def test_dct_scale_without_the_image_size_and_scaled_size():
    assert dct_scale(448, 448, 224, 224) == 1  # not *more* than twice: Pillow's gate
    assert dct_scale(449, 449, 224, 224) == 2
    assert dct_scale(2000, 1000, 224, 224) == 4
    assert dct_scale(4000, 4000, 224, 224) == 8
    assert dct_scale(4000, 400, 224, 224) == 1
    assert scaled_size(500, 375, 8) == (63, 47) and scaled_size(500, 375, 1) == (500, 375)


def test_region_for_covers_the_box_in_scaled_pixels():
    for denom in (1, 2, 4, 8):
        box = (100.5, 50.25, 400.0, 300.75)
        (x0, y0, x1, y1), sub = region_for(box, 500, 375, denom)
        sw, sh = scaled_size(500, 375, denom)
        fx, fy = sw / 500, sh / 375
        assert x0 <= box[0] * fx and x1 >= box[2] * fx and y0 <= box[1] * fy and y1 >= box[3] * fy
        assert sub == pytest.approx((box[0] * fx - x0, box[1] * fy - y0, box[2] * fx - x0,
                                     box[3] * fy - y0))
    assert region_for((0, 0, 500, 375), 500, 375, 2, margin=3)[0] == (0, 0, 250, 188)
    assert region_for((100, 100, 200, 200), 500, 375, 1, margin=3)[0] == (97, 97, 203, 203)
    assert region_for((499.9, 374.9, 500, 375), 500, 375, 1)[0] == (499, 374, 500, 375)


# -- which decoder -----------------------------------------------------------------------


def test_available_lists_the_decoders_that_load_pillow_always():
    names = [d.name for d in available()]
    assert names[-1] == "pillow" and set(names) == set(decoders.DECODERS)
    assert names == [n for n in NAMES if n in names]  # preference order
    assert "simplejpeg" in names  # a dependency of fastload


def test_choose_measures_every_available_decoder():
    samples = [encode(photo(seed=i), quality=90) for i in range(4)]
    choice = choose(samples, budget_s=0.05)
    names = [d.name for d in available()]
    assert choice.decoder in available()
    assert set(choice.ms_per_image) == set(names)  # 500x375 crops stay at 1/1: all can
    for name, ms in choice.ms_per_image.items():
        assert ms > 0 and f"{name}{':' if name == choice.decoder.name else ''} {ms:.2f}" in choice.reason
    assert choice.ms_per_image[choice.decoder.name] == min(choice.ms_per_image.values())
    assert "4 JPEGs" in choice.reason


def test_choose_leaves_out_a_decoder_that_cannot_and_says_why():
    samples = [encode(photo(1024, 768, seed=i), quality=90) for i in range(2)]
    choice = choose(samples, out_size=(224, 224), budget_s=0.02)  # 717x538 crop: 1/2
    assert "1/2" in choice.reason
    if "torchvision" in decoders.DECODERS:
        assert "torchvision" not in choice.ms_per_image
        assert "left out: torchvision (Unsupported: torchvision decodes JPEGs at full scale" \
            in choice.reason


RACE_WITHOUT_TORCHVISION = """
import sys
from fastload import DataLoader, ImageFolder
from fastload.data import decoders
loader = DataLoader(ImageFolder(sys.argv[1], size=32), batch_size=16, backend="threads")
for _ in loader:
    pass
print("torchvision" in sys.modules)
print(loader.backend_reason)
print(decoders.by_name("torchvision").name, "torchvision" in sys.modules)
"""


def test_the_race_does_not_import_torchvision_for_a_script_that_did_not(jpeg_root, tmp_path):
    """NOTE [torchvision's decoder when imported]: its import took seconds on the first batch."""
    import subprocess
    import sys

    script = tmp_path / "race.py"
    script.write_text(RACE_WITHOUT_TORCHVISION)
    run = subprocess.run([sys.executable, str(script), str(jpeg_root)], capture_output=True,
                         text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr
    imported, reason, asked = run.stdout.strip().splitlines()
    assert imported == "False"
    assert reason.endswith("; " + decoders.NOT_RACED)
    assert asked == "torchvision True"  # asked for by name, it still loads


def test_choose_without_jpegs_takes_pillow():
    choice = choose([PNG, b"garbage"], budget_s=0.01)
    assert choice.decoder.name == "pillow" and "no RGB or grayscale JPEG" in choice.reason
    assert choice.ms_per_image == {}
