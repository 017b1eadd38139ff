"""The starvation meter: did the training loop wait for its data, why, and what to change.

Every :class:`fastload.DataLoader` carries one as ``loader.meter`` (``meter=False`` turns it
off); :func:`measure` wraps any other iterable of batches with the same meter.

Example::

    >>> from fastload.meter import measure
    >>> batches = measure(torch.utils.data.DataLoader(dataset, batch_size=64))
    >>> for x, y in batches:
    ...     step(x, y)
    >>> print(batches.meter.summary())
"""

from fastload.meter.diagnosis import diagnose
from fastload.meter.hotpath import MeteredIterator, batch_length
from fastload.meter.recorder import StarvationMeter
from fastload.meter.report import Diagnosis, Summary, Verdict, WorkerStats, WorkerWork, verdict_for
from fastload.meter.workers import MeasuredWorkerInit, WorkerCounters, measured_worker_init
from fastload.meter.wrap import Metered, measure

__all__ = [
    "Diagnosis",
    "MeasuredWorkerInit",
    "Metered",
    "MeteredIterator",
    "StarvationMeter",
    "Summary",
    "Verdict",
    "WorkerCounters",
    "WorkerStats",
    "WorkerWork",
    "batch_length",
    "diagnose",
    "measure",
    "measured_worker_init",
    "verdict_for",
]
