"""One declared sample, from encoded bytes straight into its slot of a uint8 batch.

The threaded engine (:mod:`fastload.engines.threads`) calls :meth:`Renderer.render` from
several threads at once. For each sample it

1. reads the header only (:func:`fastload.data.decoders.read_header`),
2. plans the geometry with the sample's seed (:meth:`ImagePipeline.plan`: the same crop
   box, output size and flip as the torch and DALI engines, NOTE [one plan, two engines]),
3. picks the DCT scale (1/2, 1/4, 1/8) when the crop is at least twice the output, by the
   rule Pillow's draft mode follows on the torch engine (:func:`~fastload.data.decoders.dct_scale`),
4. decodes only the crop's region at that scale, into a buffer the thread keeps,
5. resizes it with torch's uint8 antialiased bilinear (or bicubic, as the plan says) kernel
   into a second buffer the thread keeps, then copies it into the batch's slot in the batch's layout, mirrored by a
   negative stride when the plan flips.

Nothing is allocated per sample but array headers: the decoded region and the resized
pixels live in per-thread buffers, the result goes into the batch. Every step releases the
GIL (libjpeg-turbo, torch's kernels, numpy's copy), so threads scale with cores.

NOTE [pixels differ from the torch engine]
The geometry is identical; the pixels are not bit-identical. The torch engine resamples a
fractional box with Pillow; this path decodes the integer region around the box and resizes
it with torch's antialiased bilinear or bicubic kernel (the same filters, Pillow's bicubic
included, rounded differently, and the box rounded to whole pixels of the decoded scale). tests/test_threads_engine.py bounds the
difference and docs/engines.md gives the measured figures.

Example::

    >>> renderer = Renderer(dataset.pipeline, choose(samples).decoder)
    >>> batch = torch.empty((64, 3, 224, 224), dtype=torch.uint8)
    >>> renderer.render(data, seed=7, out=batch[0])
"""

from __future__ import annotations

import random
import threading

import numpy as np
import torch

from fastload.data import decoders
from fastload.data.pipeline import ImagePipeline, Plan

_RESIZE_OUT = {  # torch's antialiased kernels with an out= overload, where this torch has them
    mode: getattr(getattr(torch.ops.aten, f"_upsample_{mode}2d_aa", None), "out", None)
    for mode in ("bilinear", "bicubic")
}


class Renderer:
    """Decodes and resizes samples of one pipeline into caller-provided uint8 slots.

    Args:
        pipeline: the dataset's pipeline; its geometry only (Normalize runs on the batch).
        decoder: the decoder for JPEGs (chosen by measurement, :func:`fastload.data.decoder_choice.choose`);
            anything it cannot decode goes to Pillow.
    """

    def __init__(self, pipeline: ImagePipeline, decoder: decoders.Decoder) -> None:
        self.pipeline = pipeline
        self.decoder = decoder
        self.fallback = decoders.DECODERS["pillow"]
        self.layout = pipeline.layout
        self._local = threading.local()

    def render(self, data: bytes, seed: int, out: torch.Tensor) -> None:
        """Write one sample into ``out``, a (3, H, W) or (H, W, 3) uint8 view of a batch.

        Raises what the decoders raise for bytes that do not decode (ValueError, OSError,
        PIL's errors: fastload.data.images.DECODE_ERRORS), never writing garbage pixels.
        """
        header = decoders.read_header(data)
        if header.format == "JPEG" and self.decoder is not self.fallback:
            try:
                self._render(data, header, seed, self.decoder, out)
                return
            except (decoders.Unsupported, ValueError, OSError):
                # CMYK, or a JPEG libjpeg does not read cleanly to its end (an error or a
                # warning, anywhere in the file): Pillow decides, with its own reading of
                # the header, as on the torch engine (NOTE [which files are corrupt]).
                header = decoders.pillow_header(data)
        self._render(data, header, seed, self.fallback, out)

    def _render(self, data: bytes, header: decoders.Header, seed: int, decoder: decoders.Decoder,
                out: torch.Tensor) -> None:
        plan = self.pipeline.plan(header.width, header.height, random.Random(seed))
        left, top, right, bottom = plan.box
        denom = 1
        if header.format == "JPEG":
            denom = decoders.dct_scale(right - left, bottom - top, plan.out_w, plan.out_h,
                                       width=header.width, height=header.height)
        width, height = decoders.scaled_size(header.width, header.height, denom)
        fx, fy = width / header.width, height / header.height
        x0, x1 = _span(left * fx, right * fx, width)
        y0, y1 = _span(top * fy, bottom * fy, height)
        buffer = self._buffer((y1 - y0, x1 - x0, 3))
        region = decoder.decode(data, header, denom, (x0, y0, x1, y1), buffer)
        self._resize(region, plan, out)

    def _buffer(self, shape: tuple[int, int, int]) -> np.ndarray:
        """A (h, w, 3) uint8 view of this thread's decode buffer, grown once where needed."""
        need = shape[0] * shape[1] * shape[2]
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.size < need:
            scratch = np.empty(max(need, 1 << 20), np.uint8)
            self._local.scratch = scratch
        return scratch[:need].reshape(shape)

    def _resize(self, region: np.ndarray, plan: Plan, out: torch.Tensor) -> None:
        # HWC pixels seen as one NCHW image in channels_last order: no copy, and the layout
        # torch's uint8 antialias kernel is fastest on (0.20 ms for 224 px here, against 0.29
        # into a CHW tensor). The resized pixels land in a per-thread HWC buffer; one numpy
        # copy then moves them into the batch in its layout, mirrored by a negative stride
        # when the plan flips (0.06 ms; torch's own CHW copy of it takes 0.19 ms).
        # Bicubic's antialiased kernel is Pillow's (a = -0.5), as torchvision's tensor resize is.
        out_w, out_h, mode = plan.out_w, plan.out_h, plan.interpolation
        src = torch.from_numpy(region).permute(2, 0, 1).unsqueeze(0)
        scratch = self._scratch(out_h, out_w)
        target = scratch.permute(2, 0, 1).unsqueeze(0)
        resize_out = _RESIZE_OUT[mode]
        if src.shape[2:] == (out_h, out_w):
            target.copy_(src)
        elif resize_out is not None:
            resize_out(src, [out_h, out_w], False, None, None, out=target)
        else:  # a torch without the out= overload: one allocation more
            target.copy_(torch.nn.functional.interpolate(
                src, size=(out_h, out_w), mode=mode, antialias=True, align_corners=False,
            ))
        pixels = scratch.numpy()  # (h, w, 3)
        if plan.flip:
            pixels = pixels[:, ::-1]
        np.copyto(out.numpy(), pixels.transpose(2, 0, 1) if self.layout == "CHW" else pixels)

    def _scratch(self, out_h: int, out_w: int) -> torch.Tensor:
        scratch = getattr(self._local, "resized", None)
        if scratch is None or scratch.shape[:2] != (out_h, out_w):
            scratch = torch.empty((out_h, out_w, 3), dtype=torch.uint8)
            self._local.resized = scratch
        return scratch


def _span(low: float, high: float, limit: int) -> tuple[int, int]:
    """The whole pixels ``[a, b)`` nearest to ``[low, high)``, inside ``[0, limit)``, never empty."""
    a = min(max(0, round(low)), limit - 1)
    b = max(a + 1, min(limit, round(high)))
    return a, b
