"""``fastload bench``: can this storage and this input pipeline keep my accelerators busy?

Measures, at any fsspec URL and within a time budget: an inventory of the files, raw read
throughput against concurrency with per-object latency and random range reads, the decode +
augment rate per core, and an MLPerf-Storage-style emulation of N accelerators fed by a real
fastload loader; then says in one sentence how many accelerators the data keeps at the AU bar
and what limits it. See docs/bench.md. The command line prints the report
(:mod:`fastload.cli.render`); this package itself writes nothing to the console.

Example::

    >>> from fastload.bench import run_bench
    >>> report = run_bench("s3://bucket/train", gpus=8, model="resnet50", duration_s=60)
    >>> print(report.verdict)
"""

from fastload.bench.workloads import WORKLOADS, Workload, workload
from fastload.lazy import attach as _attach

# The report and the runner import torch (through the loader): imported on first use.
__getattr__, __dir__ = _attach(__name__, {
    "BenchReport": "fastload.bench.report",
    "Measurements": "fastload.bench.report",
    "run_bench": "fastload.bench.runner",
}, globals())

__all__ = ["WORKLOADS", "BenchReport", "Measurements", "Workload", "run_bench", "workload"]
