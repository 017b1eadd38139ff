"""One intra-op thread for each of the threaded engine's pixel threads.

NOTE [one intra-op thread per pixel thread]
A pixel thread calls torch kernels on one 224x224 image at a time (the antialiased resize,
a recipe's tensor steps, the copy into the batch). Left alone, each call splits its tens of
microseconds of work over an OpenMP team of torch's intra-op threads (one per core), so N
pixel threads start N teams on the same cores. On a machine that is busy (and a training
machine is: the pixel threads themselves keep the cores busy), a team waits at its barrier
for a member the kernel has not scheduled: here ``x.float().div_(255)`` on a 224x224 image
took 0.91 ms with a team of 2 on a loaded 2-core machine against 0.06 ms on one thread. The
pixel threads already are the parallelism, so each runs its kernels on one thread.

torch's ``set_num_threads`` cannot do this: it also sets the process-wide count that every
thread not yet started takes (the training loop's own, if it has not run a parallel op
yet). OpenMP's own ``omp_set_num_threads`` sets only the calling thread's count. So a pixel
thread first lets ATen give it its count (``torch.get_num_threads``: ATen sets each thread's
count once, on its first parallel op), then sets its own to 1 through the OpenMP runtime
torch loaded. The training loop's threads keep theirs (tests/test_threads_engine.py checks).
Where torch has no OpenMP runtime in its lib folder (another threading backend), nothing
changes.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
from typing import Any

import torch

logger = logging.getLogger(__name__)

_RUNTIMES = ("libgomp*.so*", "libiomp5*.so*", "libomp*.so*", "libgomp*.dylib", "libomp*.dylib")


@functools.lru_cache(maxsize=1)
def _openmp() -> Any:
    """torch's OpenMP runtime (already loaded, so this is the same library), or None."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    for pattern in _RUNTIMES:
        for path in sorted(glob.glob(os.path.join(lib, pattern))):
            try:
                runtime = ctypes.CDLL(path)
                runtime.omp_set_num_threads  # noqa: B018 - the symbol must be there
                return runtime
            except (OSError, AttributeError):
                continue
    logger.debug("no OpenMP runtime in %s: pixel threads keep torch's intra-op threads", lib)
    return None


def one_intraop_thread() -> None:
    """Run this thread's torch kernels on this thread alone (NOTE [one intra-op thread per
    pixel thread]); other threads keep their count. Example::

        >>> pool = DaemonPool(2, "fastload-pixels", initializer=one_intraop_thread)
    """
    runtime = _openmp()
    if runtime is None:
        return
    torch.get_num_threads()  # ATen's once-per-thread set-up first, or it would undo ours
    runtime.omp_set_num_threads(1)
