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

from fastload.meter.recorder import MeteredIterator, StarvationMeter, batch_length
from fastload.meter.report import Diagnosis, Summary, Verdict, WorkerWork, diagnose, verdict_for
from fastload.meter.wrap import Metered, measure

__all__ = [
    "Diagnosis",
    "Metered",
    "MeteredIterator",
    "StarvationMeter",
    "Summary",
    "Verdict",
    "WorkerWork",
    "batch_length",
    "diagnose",
    "measure",
    "verdict_for",
]
