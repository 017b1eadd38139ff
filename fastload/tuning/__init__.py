"""Measured loader settings for datasets that do not declare themselves worker-safe.

:mod:`fastload.tuning.probe` fetches a few samples from a copy of the dataset and records
what worker processes would change (RNG draws, mutation, pickling, CUDA, fork hazards) and
what a sample costs; :mod:`fastload.tuning.workers` turns those numbers into a worker count
(and re-tunes it between epochs); :mod:`fastload.tuning.safety` says which datasets need no
probe (declared worker-safe, or known not to gain). :mod:`fastload.settings` calls them.
"""

from fastload.tuning.probe import DatasetProbe, probe_dataset, start_method
from fastload.tuning.workers import WorkerChoice, choose_workers, retune_workers

__all__ = [
    "DatasetProbe",
    "WorkerChoice",
    "choose_workers",
    "probe_dataset",
    "retune_workers",
    "start_method",
]
