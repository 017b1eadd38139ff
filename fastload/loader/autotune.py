"""Between epochs: the worker count re-tuned from what the meter measured (tf.data's AUTOTUNE).

At the start of every epoch after the first, :func:`retune` reads the last epoch from the
loader's meter: the share of its steps the loop spent waiting for input (its last pass) and
how busy the worker processes were (their own counters, :mod:`fastload.meter.workers`). The
rule itself is :func:`fastload.settings.retune` (NOTE [workers from measurements] in
:mod:`fastload.tuning.workers`): more workers when the loop waited on input with the workers
busy and the machine has headroom, fewer when the workers idled and the loop never waited.

It never touches a value the user set (argument or ``FASTLOAD_NUM_WORKERS``), a loader that
runs in-process or on another engine than torch's workers, or a dataset that draws from the
global random generator (its batches depend on the worker count). A declared dataset's
batches do not depend on the worker count (NOTE [per-sample seeds]), nor do an index-only
dataset's, so a new count changes only the speed. Persistent workers of the old count are
shut down first; the next epoch starts the new ones.

Example::

    >>> for epoch in range(3):
    ...     for batch in loader: ...
    >>> loader.settings.num_workers.reason
    '3 workers (was 2): the last epoch waited on input with workers 94% busy and headroom below 4'
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fastload.meter import StarvationMeter
from fastload.meter.analysis import batch_table
from fastload.meter.report import MODERATELY_INPUT_BOUND
from fastload.settings import Chosen
from fastload.settings import retune as retune_setting

if TYPE_CHECKING:
    from fastload.loader.dataloader import DataLoader

logger = logging.getLogger(__name__)


def last_pass_wait_share(loader: DataLoader) -> float | None:
    """The share of the last pass's steps (its first batch left out) spent waiting, or None."""
    meter = loader.meter
    if meter is None:
        return None
    rec = meter.recording()
    if not rec.pass_first:
        return None
    table = batch_table(rec, rec.pass_first[-1], len(rec.end))
    steady = np.isfinite(table["step"]) & ~table["first"]
    if not steady.any():
        return None
    step = float(table["step"][steady].sum())
    return float(table["wait"][steady].sum()) / step if step > 0 else None


def retune(loader: DataLoader) -> bool:
    """Re-tune ``loader.num_workers`` for the next epoch; whether it changed."""
    meter = loader.meter
    if meter is None or loader.backend != "torch" or loader.num_workers == 0:
        return False
    if loader.settings.num_workers.source != "auto":
        return False
    share = last_pass_wait_share(loader)
    stats = meter.worker_stats()
    if share is None or stats is None or stats.busy_share is None:
        return False
    chosen = retune_setting(
        loader.settings, input_bound=share >= MODERATELY_INPUT_BOUND,
        workers_busy=stats.busy_share, cores=loader.settings.machine.cores_per_rank,
    )
    if chosen is None or chosen.value == loader.num_workers:
        return False
    loader.engine.restart()  # persistent workers of the old count
    loader.num_workers = Chosen(chosen.value)  # NOTE [a rebuilt loader stays auto]
    loader.settings = replace(loader.settings, num_workers=chosen)
    # The workers' counters are sized per worker: the new count gets new ones, around the
    # init the old ones wrapped: the user's own worker_init_fn, or fastload's around it (a
    # webdataset pipeline's gopen handlers, NOTE [registering with webdataset] in
    # fastload.io.wds). NOTE [what a rebuild copies]: fastload's parts, not the loader's
    # public attribute.
    parts = loader.worker_parts
    inner = getattr(parts.worker_init_fn, "user_fn", loader.worker_init_fn)
    parts.worker_init_fn = StarvationMeter.worker_init(
        inner, chosen.value, meter, in_order=loader.in_order
    )
    meter.watch_workers(parts.worker_init_fn)
    meter.num_workers = chosen.value
    logger.info("num_workers: %s", chosen.reason)
    return True
