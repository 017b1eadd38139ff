"""A mutated-JPEG corpus through both engines' decode paths, and through the C decoder under ASan.

The verdict on a file is Pillow's on every engine (NOTE [which files are corrupt] in
fastload/data/decoders.py): the threaded engine with the region decoder must refuse exactly
the files the torch engine (Pillow) refuses, whatever the crop, and nothing may crash. The
decode paths run in-process here (thousands of decodes in a second or two); one small
folder of the same mutations goes through both real engines end to end.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from fastload import DataLoader, ImageFolder
from fastload.data import decoders
from fastload.data.pipeline import (
    CenterCrop,
    HorizontalFlip,
    ImagePipeline,
    RandomResizedCrop,
    Resize,
)
from fastload.data.render import Renderer
from fastload.data.sample_errors import DECODE_ERRORS
from fastload.testing.jpeg_mutations import MUTATORS, base_jpegs, corpus, segments

PIPELINES = {
    "train": ImagePipeline((RandomResizedCrop(24), HorizontalFlip(0.5))),
    "eval": ImagePipeline((Resize(32), CenterCrop(24))),
}
SEEDS = {"train": (1, 2), "eval": (1,)}  # the train crop differs by seed; eval's does not
MAX_PIXELS = 1_000_000
"""PIL.Image.MAX_IMAGE_PIXELS while the corpus runs: a mutated SOF may claim any size, and
both engines refuse what exceeds twice this before allocating (and decode up to it)."""

BASES = base_jpegs()


@pytest.fixture(autouse=True)
def small_bomb_limit(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", MAX_PIXELS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def roi(name: str = "roi") -> decoders.Decoder:
    try:
        return decoders.by_name(name)
    except KeyError:
        pytest.skip(f"the {name!r} decoder does not load here")


def verdict(decode) -> str:
    """'ok' or the decode error's type; any other exception fails the test (a crash)."""
    try:
        decode()
    except DECODE_ERRORS as exc:
        return type(exc).__name__
    return "ok"


def torch_verdict(data: bytes, pipeline: ImagePipeline, seed: int) -> str:
    return verdict(lambda: pipeline.run(data, seed))  # ImageFolder.load's decode, in a worker


def threads_verdict(renderer: Renderer, data: bytes, seed: int) -> str:
    out = torch.empty((3, 24, 24), dtype=torch.uint8)
    return verdict(lambda: renderer.render(data, seed, out))  # ThreadEngine's pixel threads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("decoder", ["roi", "simplejpeg", "torchvision"])
def test_the_engines_agree_on_which_mutated_files_are_corrupt(decoder):
    """Each JPEG decoder the threaded engine may measure fastest, against Pillow."""
    items = corpus(BASES, 300, seed=0)
    renderers = {name: Renderer(p, roi(decoder)) for name, p in PIPELINES.items()}
    disagree, corrupt = [], 0
    for item in items:
        for name, pipeline in PIPELINES.items():
            for seed in SEEDS[name]:
                want = torch_verdict(item.data, pipeline, seed)
                got = threads_verdict(renderers[name], item.data, seed)
                corrupt += want != "ok"
                if (want == "ok") != (got == "ok"):
                    disagree.append(f"{item.name} ({item.detail}), {name} seed {seed}: "
                                    f"torch {want}, threads {got}")
    assert not disagree, f"{len(disagree)} disagreements:\n" + "\n".join(disagree[:30])
    runs = len(items) * sum(len(s) for s in SEEDS.values())
    assert runs // 5 < corrupt < runs * 4 // 5, "the corpus should hold both verdicts"


@pytest.mark.timeout(60)
def test_what_the_region_decoder_serves_pillow_decodes():
    """A clean libjpeg read to EOI is the only way to the region decoder's pixels."""
    decoder, served = roi(), 0
    for item in corpus(BASES, 300, seed=1):
        try:
            header = decoders.read_header(item.data)
            region = (0, 0, max(1, header.width // 4), max(1, header.height // 4))
            decoder.decode(item.data, header, 1, region)
        except (decoders.Unsupported, *DECODE_ERRORS):
            continue
        served += 1
        with Image.open(io.BytesIO(item.data)) as img:
            img.load()  # raises if Pillow refuses what the region decoder served
    assert served > 50


@pytest.mark.timeout(60)
def test_the_cases_of_issue_21():
    """Junk before DHT decodes on both; a duplicated scan and a cut at 97% fail on both,
    whatever the crop (they used to depend on it)."""
    data = BASES["420"]
    dht = next(s for s in segments(data) if s.marker == 0xC4)
    sos = next(s for s in segments(data) if s.marker == 0xDA)
    junk = data[: dht.start] + b"\x00\x00" + data[dht.start:]
    duplicated = data[: sos.end] + data[sos.start: sos.end] + data[sos.end:]
    cut = data[: len(data) * 97 // 100]
    pipeline = PIPELINES["train"]
    renderer = Renderer(pipeline, roi())
    for seed in range(20):
        assert threads_verdict(renderer, junk, seed) == torch_verdict(junk, pipeline, seed) == "ok"
        for bad in (duplicated, cut):
            assert torch_verdict(bad, pipeline, seed) != "ok"
            assert threads_verdict(renderer, bad, seed) != "ok", seed
    out = torch.empty((3, 24, 24), dtype=torch.uint8)
    renderer.render(junk, 3, out)
    diff = (out.float() - pipeline.run(junk, 3).float()).abs().mean().item()
    assert diff < 4.0  # Pillow's pixels, as the torch engine's (tests/test_threads_engine.py)


@pytest.mark.timeout(120)
def test_both_engines_skip_the_same_files_of_a_folder(tmp_path):
    """End to end: the same mutated files skipped by the threaded engine (whichever decoder
    it measures fastest) and by torch's worker processes."""
    roi()
    items = corpus(BASES, 2 * len(MUTATORS), seed=2)
    for i, item in enumerate(items):
        folder = tmp_path / f"class_{i % 2}"
        folder.mkdir(exist_ok=True)
        (folder / f"m{i:03d}.jpg").write_bytes(item.data)
    skipped = {}
    for backend, workers in (("threads", "auto"), ("torch", 2)):
        ds = ImageFolder(tmp_path, size=24, train=True, seed=0, on_error="skip")
        loader = DataLoader(ds, batch_size=8, backend=backend, num_workers=workers)
        served = sum(len(labels) for _, labels in loader)
        skipped[backend] = sorted(Path(s.path).name for s in loader.skipped)
        loader.engine.close()
        assert served + len(skipped[backend]) == len(items)
    assert skipped["threads"] == skipped["torch"]
    assert 0 < len(skipped["torch"]) < len(items)


# -- the C decoder under AddressSanitizer ------------------------------------------------

_ASAN_RUN = textwrap.dedent("""
    import importlib.util, pathlib, sys
    import numpy as np
    spec = importlib.util.spec_from_file_location("_jpeg", sys.argv[1])
    jpeg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jpeg)
    decoded = refused = 0
    for path in sorted(pathlib.Path(sys.argv[2]).iterdir()):
        data = path.read_bytes()
        try:
            width, height, _, _ = jpeg.header(data)
        except ValueError:
            refused += 1
            continue
        if width * height > 4_000_000:
            continue  # a mutated SOF's claim: read_header refuses these before a decode
        for denom in (1, 2, 8):
            w, h = -(-width // denom), -(-height // denom)
            for x0, y0, x1, y1 in ((0, 0, w, h), (w // 3, h // 4, w // 3 + 1, h // 2 + 1),
                                   (w // 2, h // 2, w, h)):
                if not (x0 < x1 <= w and y0 < y1 <= h):
                    continue
                out = np.empty((y1 - y0, x1 - x0, 3), np.uint8)
                try:
                    jpeg.decode(data, out, denom, (x0, y0, x1, y1))
                    decoded += 1
                except ValueError:
                    refused += 1
    print(decoded, refused)
""")


def _asan_runtime() -> str:
    """The path of gcc's libasan.so, or skip where the compiler cannot build with ASan."""
    try:
        found = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no gcc here: {exc}")
    if not os.path.isabs(found) or not os.path.exists(found):
        pytest.skip("gcc has no AddressSanitizer runtime (libasan.so) here")
    return found


@pytest.mark.timeout(180)
def test_the_corpus_under_address_sanitizer(tmp_path):
    runtime = _asan_runtime()
    source = Path(decoders.__file__).with_name("_jpeg.c")
    built = tmp_path / "_jpeg_asan.so"
    compile_ = subprocess.run(
        ["gcc", "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-shared",
         "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(source), "-ljpeg", "-o", str(built)],
        capture_output=True, text=True, timeout=120,
    )
    if compile_.returncode != 0:
        pytest.skip(f"the extension does not build with -fsanitize=address here: "
                    f"{compile_.stderr[-500:]}")
    files = tmp_path / "corpus"
    files.mkdir()
    for i, item in enumerate(corpus(BASES, 400, seed=3) + corpus(BASES, 200, seed=4)):
        (files / f"{i:04d}.jpg").write_bytes(item.data)
    for name, data in BASES.items():
        (files / f"base-{name}.jpg").write_bytes(data)
    env = dict(os.environ, LD_PRELOAD=runtime,
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86")
    run = subprocess.run([sys.executable, "-c", _ASAN_RUN, str(built), str(files)],
                         capture_output=True, text=True, timeout=150, env=env)
    assert run.returncode == 0 and "AddressSanitizer" not in run.stderr, run.stderr[-4000:]
    decoded, refused = map(int, run.stdout.split())
    assert decoded > 100 and refused > 100
