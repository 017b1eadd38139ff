"""The JPEG decoder a loader uses, measured on its first samples (:func:`choose`), and that
verdict kept for the process for JPEGs of the same sizes (:func:`choose_once`).

NOTE [one decoder measurement per process]
:func:`choose` spends up to 0.3 s timing every decoder on a loader's
first samples, before its first batch. A script builds more than one loader over the same
images: a validation loader beside the training one, Lightning's loaders rebuilt each epoch
(``reload_dataloaders_every_n_epochs``), a benchmark's fresh loaders; each would pay it
again for the same verdict, and on a first epoch of a thousand images that is a quarter of
it. So the verdict is kept for the process, keyed on what decides it: the output size and
the samples' (width, height, format, mode); a loader over JPEGs of other sizes measures
afresh. The reason says the figures are from an earlier loader of this process.

Example::

    >>> first = choose_once(samples, out_size=(224, 224))      # measures
    >>> again = choose_once(samples, out_size=(224, 224))      # the same verdict, no timing
    >>> again.reason.endswith("(measured by an earlier loader in this process)")
    True
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastload.data import decoders
from fastload.data.sample_errors import DECODE_ERRORS

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class DecoderChoice:
    """The decoder :func:`choose` measured fastest, why, and every measured median."""

    decoder: decoders.Decoder
    reason: str
    ms_per_image: dict[str, float]


def choose(
    samples: Sequence[bytes], *, out_size: tuple[int, int] = (224, 224), budget_s: float = 0.3
) -> DecoderChoice:
    """Time every available decoder on these real samples; the fastest median wins.

    Each decoder decodes the same region of each JPEG sample: a centre box of 70% of the
    width and height (about RandomResizedCrop's mean area), at the scale :func:`dct_scale`
    gives for ``out_size`` (height, width, as in ImagePipeline). Decoders take turns, one
    sample each, until ``budget_s`` is spent (every decoder times at least one sample). A
    decoder that raises on a sample is left out, and the reason says so.

        >>> choose(samples).reason
        'roi: 1.05 ms/image vs simplejpeg 1.48, pillow 1.62 (8 JPEGs, median of 24 ...)'
    """
    out_h, out_w = out_size
    jobs = []
    for data in samples:
        try:
            header = decoders.read_header(data)
        except DECODE_ERRORS:
            continue
        if header.format != "JPEG" or header.mode not in ("RGB", "L"):
            continue
        w, h = header.width, header.height
        box = (0.15 * w, 0.15 * h, 0.85 * w, 0.85 * h)
        denom = decoders.dct_scale(0.7 * w, 0.7 * h, out_w, out_h, width=w, height=h)
        region, _ = decoders.region_for(box, w, h, denom)
        x0, y0, x1, y1 = region
        jobs.append((data, header, denom, region, np.empty((y1 - y0, x1 - x0, 3), np.uint8)))
    pillow = decoders.DECODERS["pillow"]
    if not jobs:
        return DecoderChoice(pillow, f"pillow: no RGB or grayscale JPEG among the "
                                     f"{len(samples)} samples", {})
    timings: dict[str, list[float]] = {d.name: [] for d in decoders.available()}
    running, left_out = decoders.available(), {}
    deadline = time.perf_counter() + budget_s
    turn = 0
    while running and (turn < 1 or time.perf_counter() < deadline):
        data, header, denom, region, out = jobs[turn % len(jobs)]
        order = running[turn % len(running):] + running[: turn % len(running)]  # no fixed first
        for decoder in order:
            start = time.perf_counter()
            try:
                decoder.decode(data, header, denom, region, out)
            except (decoders.Unsupported, *DECODE_ERRORS) as exc:
                left_out[decoder.name] = f"{type(exc).__name__}: {exc}"
                running.remove(decoder)
                del timings[decoder.name]
                continue
            timings[decoder.name].append(time.perf_counter() - start)
        turn += 1
    ms = {name: 1000 * statistics.median(t) for name, t in timings.items()}
    ranked = sorted(ms, key=ms.__getitem__)
    best = decoders.DECODERS[ranked[0]] if ranked else pillow  # all failed: Pillow still is the fallback
    others = ", ".join(f"{n} {ms[n]:.2f}" for n in ranked[1:])
    denoms = "/".join(str(d) for d in sorted({job[2] for job in jobs}))
    reason = (f"{best.name}: {ms[best.name]:.2f} ms/image" + (f" vs {others}" if others else "")
              if ranked else "pillow: every decoder failed")
    reason += (f" ({len(jobs)} JPEGs, median of {turn} decodes each, centre 70% crop at "
               f"1/{denoms} for {out_w}x{out_h})")
    if left_out:
        reason += "; left out: " + "; ".join(f"{n} ({why})" for n, why in left_out.items())
    if decoders.raced_without_torchvision():
        reason += "; " + decoders.NOT_RACED
    logger.debug("decoder choice: %s", reason)
    return DecoderChoice(best, reason, ms)


_REMEMBERED = " (measured by an earlier loader in this process)"
_choices: dict[tuple[object, ...], DecoderChoice] = {}
_lock = threading.Lock()


def _key(samples: Sequence[bytes], out_size: tuple[int, int]) -> tuple[object, ...] | None:
    shapes = set()
    for data in samples:
        try:
            header = decoders.read_header(data)
        except (*DECODE_ERRORS, decoders.Unsupported):
            continue
        shapes.add((header.width, header.height, header.format, header.mode))
    return (tuple(out_size), tuple(sorted(shapes))) if shapes else None


def choose_once(
    samples: Sequence[bytes], *, out_size: tuple[int, int] = (224, 224)
) -> DecoderChoice:
    """:func:`choose` on these samples, or its earlier verdict in this process for
    samples of the same sizes (NOTE [one decoder measurement per process])."""
    key = _key(samples, out_size)
    with _lock:
        known = _choices.get(key) if key is not None else None
    if known is not None:
        return known
    choice = choose(samples, out_size=out_size)
    if key is not None and choice.ms_per_image:  # a verdict with figures, not a fallback
        with _lock:
            _choices.setdefault(key, dataclasses.replace(choice, reason=choice.reason + _REMEMBERED))
    return choice


def forget() -> None:
    """Drop the kept verdicts: the next loader measures again."""
    with _lock:
        _choices.clear()
