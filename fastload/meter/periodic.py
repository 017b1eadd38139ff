"""The meter's periodic report: one INFO line, and optional TensorBoard scalars, per window.

``StarvationMeter(log_every=N)`` calls :func:`report_window` every ``N`` batches with the
last ``N`` batches; ``StarvationMeter(tensorboard=...)`` passes its writer along. The line
goes to this module's logger, ``fastload.meter.periodic``.

Example::

    >>> logging.basicConfig(level=logging.INFO)
    >>> loader = fastload.DataLoader(ds, batch_size=64, meter=StarvationMeter(log_every=1000))
    >>> for batch in loader:
    ...     step(batch)
    INFO:fastload.meter.periodic:batches 0-999: wait p50 0.21 ms, max 3.02 ms, 1.3% of step
    time waiting (not input-bound)
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fastload.meter.analysis import Recording, batch_table, gpu_idle
from fastload.meter.report import verdict_for

logger = logging.getLogger(__name__)


def report_window(rec: Recording, lo: int, hi: int, writer: Any | None = None) -> None:
    """Log the wait p50, max, waiting share and band of batches ``lo..hi-1``.

    The window's steady batches count (complete steps, first batch of a pass apart); a
    window without one logs nothing. With a SummaryWriter, also writes
    ``fastload/wait_p50_ms``, ``fastload/wait_share`` and, with CUDA events,
    ``fastload/gpu_idle_share`` at step ``hi``, and flushes it.

    Example::

        >>> report_window(meter.recording(), 0, 1000, writer=SummaryWriter("runs/x"))
    """
    t = batch_table(rec, lo, hi)
    known = np.isfinite(t["step"]) & ~t["first"]
    if not known.any():
        return
    w, s = t["wait"][known], t["step"][known]
    share = float(w.sum() / s.sum()) if s.sum() > 0 else 0.0
    p50 = float(np.median(w))
    logger.info(
        "batches %d-%d: wait p50 %.2f ms, max %.2f ms, %.1f%% of step time waiting (%s)",
        lo, hi - 1, p50 * 1e3, float(w.max()) * 1e3, share * 100, verdict_for(share).value,
    )
    if writer is None:
        return
    writer.add_scalar("fastload/wait_p50_ms", p50 * 1e3, hi)
    writer.add_scalar("fastload/wait_share", share, hi)
    idle = gpu_idle(rec, lo, hi)
    if idle is not None and np.isfinite(idle[known]).any():
        ok = known & np.isfinite(idle)
        idle_share = float(idle[ok].sum() / t["step"][ok].sum())
        writer.add_scalar("fastload/gpu_idle_share", idle_share, hi)
    writer.flush()  # every N batches: a crash loses at most one period
