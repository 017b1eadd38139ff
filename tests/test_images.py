"""ImageFolder: listing, labels, the declared pipeline, image modes, errors that name the file."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import ImageFolder, ImagePipeline


def write(path: Path, mode: str = "RGB", size=(200, 150), fmt: str = "JPEG") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(path)))
    rgb = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    img = rgb.convert(mode) if mode != "P" else rgb.quantize(16)
    img.save(path, format=fmt)
    return path


def test_classes_are_sorted_folder_names(jpeg_root):
    ds = ImageFolder(jpeg_root, size=64)
    assert ds.classes == ["class_00", "class_01", "class_02", "class_03"]
    assert len(ds) == 48
    for path, label in ds.samples:
        assert Path(path).parent.name == ds.classes[label]
    assert ds.targets == [label for _, label in ds.samples]


def test_eval_output_is_uint8_chw_of_the_requested_size(jpeg_root):
    image, label = ImageFolder(jpeg_root, size=(64, 80))[5]
    assert image.dtype == torch.uint8 and image.shape == (3, 64, 80)
    assert isinstance(label, int)


def test_hwc_layout_and_normalize(jpeg_root):
    pipe = ImagePipeline.standard(32, train=False, normalize=True, layout="HWC")
    image, _ = ImageFolder(jpeg_root, pipeline=pipe)[0]
    assert image.shape == (32, 32, 3) and image.dtype == torch.float32
    raw, _ = ImageFolder(jpeg_root, size=32, pipeline=pipe.without_normalize())[0]
    mean = torch.tensor([0.485, 0.456, 0.406])
    std = torch.tensor([0.229, 0.224, 0.225])
    assert torch.allclose(image, (raw.float() / 255 - mean) / std, atol=1e-5)


def test_train_augmentation_is_seeded(jpeg_root):
    a = ImageFolder(jpeg_root, size=48, train=True, seed=7)
    b = ImageFolder(jpeg_root, size=48, train=True, seed=7)
    c = ImageFolder(jpeg_root, size=48, train=True, seed=8)
    assert torch.equal(a[3][0], b[3][0])
    assert not all(torch.equal(a[i][0], c[i][0]) for i in range(4))
    assert a[3][0].shape == (3, 48, 48)


@pytest.mark.parametrize("mode", ["L", "P", "CMYK", "RGBA", "I;16"])
def test_every_mode_comes_out_rgb(tmp_path, mode):
    fmt = "PNG" if mode in ("P", "RGBA", "I;16") else "JPEG"
    ext = ".png" if fmt == "PNG" else ".jpg"
    write(tmp_path / "a" / f"x{ext}", mode=mode, fmt=fmt)
    image, _ = ImageFolder(tmp_path, size=40)[0]
    assert image.shape == (3, 40, 40)


def test_draft_decoding_stays_close_to_a_full_decode(tmp_path):
    path = write(tmp_path / "a" / "big.jpg", size=(1600, 1200))
    small, _ = ImageFolder(tmp_path, size=100)[0]  # decoded with draft (1/8 scale)
    with Image.open(path) as img:
        full = img.convert("RGB").resize((133, 100), Image.BILINEAR)
    left = (133 - 100) // 2
    ref = torch.from_numpy(np.array(full)[:, left : left + 100]).permute(2, 0, 1)
    assert (small.float() - ref.float()).abs().mean() < 40  # random noise image: coarse check


def test_explicit_sample_list(jpeg_root):
    files = sorted(str(p) for p in Path(jpeg_root).rglob("*.jpg"))[:3]
    ds = ImageFolder([(files[0], 2), (files[1], 0), (files[2], 2)], size=32)
    assert len(ds) == 3 and ds.targets == [2, 0, 2]
    assert ds[1][1] == 0


def test_missing_root_names_the_url(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(fastload.ObjectNotFoundError, match=str(missing)):
        ImageFolder(missing)


def test_empty_root_names_the_url(tmp_path):
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "readme.txt").write_text("no images")
    with pytest.raises(fastload.EmptyDatasetError, match=str(tmp_path)):
        ImageFolder(tmp_path)


def test_unknown_protocol_says_what_to_install():
    with pytest.raises(fastload.StorageError, match="nosuchproto"):
        ImageFolder("nosuchproto://bucket/train")


@pytest.mark.parametrize("content", [b"not an image at all", "truncated"])
def test_corrupt_image_error_names_file_and_index(tmp_path, content):
    good = write(tmp_path / "a" / "0.jpg")
    bad = tmp_path / "a" / "1.jpg"
    bad.write_bytes(good.read_bytes()[:300] if content == "truncated" else content)
    ds = ImageFolder(tmp_path, size=32)
    with pytest.raises(fastload.CorruptSampleError) as info:
        ds[1]
    assert str(bad) in str(info.value) and "index 1" in str(info.value)
    assert info.value.index == 1 and info.value.path == str(bad)


def test_file_deleted_after_listing_is_a_not_found_error(tmp_path):
    write(tmp_path / "a" / "0.jpg")
    gone = write(tmp_path / "a" / "1.jpg")
    ds = ImageFolder(tmp_path, size=32)
    gone.unlink()
    with pytest.raises(FileNotFoundError, match="index 1"):
        ds[1]


def test_bad_on_error_value():
    with pytest.raises(fastload.ConfigError, match="on_error"):
        ImageFolder("/", on_error="ignore")


def test_pipeline_decodes_bytes_directly():
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (255, 0, 0)).save(buf, format="PNG")
    image = ImagePipeline.standard(16).run(buf.getvalue())
    assert image.shape == (3, 16, 16)
    assert image[0].min() == 255 and image[1].max() == 0


def test_unreachable_s3_endpoint_is_a_storage_error_naming_the_url():
    import socket

    pytest.importorskip("s3fs")
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {
        "key": "k", "secret": "s", "skip_instance_cache": True,
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
    }
    with pytest.raises(fastload.StorageError, match="s3://nobucket/train") as info:
        ImageFolder("s3://nobucket/train", storage_options=options)
    assert not isinstance(info.value, FileNotFoundError)  # unreachable is not "missing"
    assert info.value.__cause__ is not None


def test_a_known_protocol_whose_package_is_missing_names_the_pip_command():
    """gcs:// is a known fsspec protocol; without gcsfs it is a MissingDependencyError (an
    ImportError) saying what to install."""
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    with pytest.raises(fastload.MissingDependencyError, match="pip install gcsfs") as info:
        ImageFolder("gcs://bucket/train")
    assert isinstance(info.value, ImportError)
