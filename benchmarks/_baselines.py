"""The loaders and decoders that benchmarks/engine_throughput.py measures fastload against.

* :func:`torchvision_pil`: torchvision ImageFolder + transforms.v2 on PIL images.
* :func:`torchvision_tensor`: file bytes -> torchvision.io.decode_jpeg -> v2 on uint8 tensors.
* :func:`ffcv_loader`: FFCV's full-size JPEG mode, when ``import ffcv`` works.
* :func:`limit_candidates`: one-image decode + crop + resize functions, one per decoder that
  imports here, for the physical limit (the best one-core rate x cores).

All of them do the training recipe, random-resized-crop to 224 + horizontal flip, uint8 CHW.

Example::

    >>> loader = torchvision_pil(root, batch_size=64, workers=2)
    >>> candidates, skipped = limit_candidates(224)
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.data
import torchvision
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2

Box = tuple[float, float, float, float]  # left, top, right, bottom, in the original's pixels
Candidate = Callable[[bytes, Box, bool], torch.Tensor]


def _dataloader(dataset, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    extra = {"persistent_workers": True} if workers else {}
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=False, **extra
    )


def torchvision_pil(root, *, batch_size: int, workers: int, size: int = 224):
    """torchvision's ImageFolder (PIL) + v2 RandomResizedCrop/flip/PILToTensor on a torch DataLoader."""
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(os.fspath(root), transform=transform)
    return _dataloader(dataset, batch_size, workers)


def _jpeg_tensor(path: str) -> torch.Tensor:
    return decode_jpeg(torchvision.io.read_file(path), mode=ImageReadMode.RGB)


def torchvision_tensor(root, *, batch_size: int, workers: int, size: int = 224):
    """read_file + torchvision.io.decode_jpeg, then v2 RandomResizedCrop/flip on the uint8 tensor."""
    transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    dataset = torchvision.datasets.ImageFolder(
        os.fspath(root), loader=_jpeg_tensor, transform=transform
    )
    return _dataloader(dataset, batch_size, workers)


def ffcv_loader(root, beton: str, *, batch_size: int, workers: int, size: int = 224):
    """FFCV's full-size JPEG mode (RGBImageField write_mode="jpg", no max_resolution).

    Written against FFCV's documented API; ffcv is not installed where this was written,
    so the row is skipped there. Writing the .beton file is not timed.
    """
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter

    if not os.path.exists(beton):
        fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
        DatasetWriter(beton, fields, num_workers=workers).from_indexed_dataset(
            torchvision.datasets.ImageFolder(os.fspath(root))
        )
    pipelines = {
        "image": [
            RandomResizedCropRGBImageDecoder((size, size)),
            RandomHorizontalFlip(),
            ToTensor(),
            ToTorchImage(),
        ],
        "label": [IntDecoder(), ToTensor()],
    }
    return Loader(
        beton,
        batch_size=batch_size,
        num_workers=workers,
        order=OrderOption.RANDOM,
        pipelines=pipelines,
        os_cache=True,
    )


# --- the physical limit: one image, one thread, decode + crop + resize -------------------------


def _want(width: int, height: int, box: Box, out: int) -> tuple[int, int]:
    """The smallest decoded size that keeps the crop at least ``out`` pixels on each side."""
    bw, bh = box[2] - box[0], box[3] - box[1]
    return min(width, math.ceil(width * out / bw)), min(height, math.ceil(height * out / bh))


def _scaled(box: Box, fx: float, fy: float) -> Box:
    return (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)


def _resize_hwc(pixels: np.ndarray, box: Box, out: int, flip: bool) -> torch.Tensor:
    """Crop ``box`` (rounded to whole pixels) of an HWC uint8 array, resize (antialiased bilinear)."""
    left, top, right, bottom = (round(v) for v in box)
    crop = torch.from_numpy(pixels[top:bottom, left:right]).permute(2, 0, 1)[None]
    image = F.interpolate(crop, size=(out, out), mode="bilinear", antialias=True)[0]
    return image.flip(-1) if flip else image


def _pillow(out: int) -> Candidate:
    def run(data: bytes, box: Box, flip: bool) -> torch.Tensor:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        img.draft("RGB", _want(width, height, box, out))  # DCT-domain downscale: 1/2, 1/4, 1/8
        box = _scaled(box, img.size[0] / width, img.size[1] / height)
        img = img.convert("RGB").resize((out, out), Image.BILINEAR, box=box)
        if flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img)).permute(2, 0, 1)

    return run


def _simplejpeg(out: int) -> Candidate:
    import simplejpeg

    def run(data: bytes, box: Box, flip: bool) -> torch.Tensor:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        min_w, min_h = _want(width, height, box, out)
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=min_w, min_height=min_h)
        box = _scaled(box, pixels.shape[1] / width, pixels.shape[0] / height)
        return _resize_hwc(pixels, box, out, flip)

    return run


def _torchvision(out: int) -> Candidate:
    def run(data: bytes, box: Box, flip: bool) -> torch.Tensor:
        image = decode_jpeg(
            torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB
        )
        left, top, right, bottom = (round(v) for v in box)
        image = v2.functional.resized_crop(
            image, top, left, bottom - top, right - left, [out, out], antialias=True
        )
        return v2.functional.horizontal_flip(image) if flip else image

    return run


def _fastload_decoders(out: int) -> tuple[dict[str, Candidate], str | None]:
    """fastload.data.decoders.DECODERS as candidates, or why there are none.

    Each is driven the way fastload.data.render does: ``read_header``, ``dct_scale`` and
    ``scaled_size`` pick the 1/denom scale, then ``decode(data, header, denom, region,
    buffer)`` fills an HWC uint8 buffer of the region (x0, y0, x1, y1) of the scaled image.
    A decoder that returns something else fails its warm-up and is left out, with the reason.
    """
    try:
        from fastload.data import decoders
    except ImportError as exc:
        return {}, f"fastload.data.decoders does not import ({exc})"
    candidates: dict[str, Candidate] = {}
    for name, decoder in decoders.DECODERS.items():

        def run(data: bytes, box: Box, flip: bool, decoder=decoder) -> torch.Tensor:
            header = decoders.read_header(data)
            left, top, right, bottom = box
            denom = 1
            if header.format == "JPEG":
                denom = decoders.dct_scale(right - left, bottom - top, out, out)
            width, height = decoders.scaled_size(header.width, header.height, denom)
            fx, fy = width / header.width, height / header.height
            x0, x1 = max(0, round(left * fx)), min(width, round(right * fx))
            y0, y1 = max(0, round(top * fy)), min(height, round(bottom * fy))
            buffer = np.empty((y1 - y0, x1 - x0, 3), np.uint8)
            pixels = np.asarray(decoder.decode(data, header, denom, (x0, y0, x1, y1), buffer))
            if pixels.shape != buffer.shape:
                raise ValueError(
                    f"decoded {pixels.shape} for region {(x0, y0, x1, y1)} at 1/{denom}"
                )
            return _resize_hwc(pixels, (0, 0, x1 - x0, y1 - y0), out, flip)

        candidates[f"fastload.data.decoders:{name}"] = run
    return candidates, None


def limit_candidates(out: int = 224) -> tuple[dict[str, Candidate], dict[str, str]]:
    """``({name: decode+crop+resize function}, {name: why it is not a candidate})``."""
    candidates: dict[str, Candidate] = {"pillow (draft + resize box)": _pillow(out)}
    skipped: dict[str, str] = {}
    try:
        candidates["simplejpeg + F.interpolate"] = _simplejpeg(out)
    except ImportError as exc:
        skipped["simplejpeg"] = f"does not import ({exc})"
    candidates["torchvision decode_jpeg + v2 resized_crop"] = _torchvision(out)
    ours, why = _fastload_decoders(out)
    candidates.update(ours)
    if why:
        skipped["fastload.data.decoders"] = why
    return candidates, skipped
