"""Training workloads to emulate: MLPerf Storage's per-step compute times on A100 and H100.

MLPerf Storage (mlcommons/storage, DLIO) emulates an accelerator by sleeping for the time
one training step takes on it, per batch; its workload files state that time as
``train.computation_time`` (seconds per step) with ``reader.batch_size`` (samples per step)
and the accelerator-utilization bar a run must keep (``metric.au``). Those published values
are copied below, each with the file it comes from.

Example::

    >>> w = workload("resnet50", "h100")
    >>> round(w.samples_per_s)          # samples one emulated H100 consumes per second
    1786
    >>> workload("custom", samples_per_sec=1000).sample_s
    0.001
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastload.errors import ConfigError

MLPERF_SOURCE = "github.com/mlcommons/storage configs/dlio/workload/"


@dataclass(frozen=True)
class Workload:
    """One model on one accelerator: seconds per step, samples per step, the AU bar to keep."""

    model: str
    accelerator: str
    step_s: float
    batch_size: int
    au_target: float
    source: str

    @property
    def sample_s(self) -> float:
        """Compute seconds per sample on one accelerator."""
        return self.step_s / self.batch_size

    @property
    def samples_per_s(self) -> float:
        """Samples one accelerator consumes per second when it never waits."""
        return self.batch_size / self.step_s

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "accelerator": self.accelerator,
            "step_s": self.step_s,
            "batch_size": self.batch_size,
            "sample_s": self.sample_s,
            "samples_per_s_per_accelerator": self.samples_per_s,
            "au_target": self.au_target,
            "source": self.source,
        }


def _mlperf(model: str, accelerator: str, step_s: float, batch: int, au: float) -> Workload:
    return Workload(model, accelerator, step_s, batch, au, f"{MLPERF_SOURCE}{model}_{accelerator}.yaml")


WORKLOADS: dict[tuple[str, str], Workload] = {
    (w.model, w.accelerator): w
    for w in (
        _mlperf("resnet50", "h100", 0.224, 400, 0.90),
        _mlperf("resnet50", "a100", 0.435, 400, 0.90),
        _mlperf("unet3d", "h100", 0.323, 7, 0.90),
        _mlperf("unet3d", "a100", 0.636, 7, 0.90),
        _mlperf("cosmoflow", "h100", 0.00350, 1, 0.70),
        _mlperf("cosmoflow", "a100", 0.00551, 1, 0.70),
    )
}

MODELS = sorted({m for m, _ in WORKLOADS})
ACCELERATORS = sorted({a for _, a in WORKLOADS})


def workload(
    model: str = "resnet50",
    accelerator: str = "h100",
    *,
    samples_per_sec: float | None = None,
    au_target: float | None = None,
) -> Workload:
    """The workload to emulate: MLPerf's ``model`` on ``accelerator``, or a custom rate.

    ``samples_per_sec`` (samples one accelerator consumes per second) replaces the published
    step time; the model name is then only a label. ``au_target`` overrides MLPerf's bar.
    """
    if au_target is not None and not 0 < au_target <= 1:
        raise ConfigError(f"au_target must be in (0, 1], got {au_target}; e.g. 0.9 for 90%")
    if samples_per_sec is not None:
        if samples_per_sec <= 0:
            raise ConfigError(
                f"samples_per_sec must be > 0, got {samples_per_sec}: the samples one "
                "accelerator consumes per second"
            )
        return Workload(
            model, accelerator, 1.0 / samples_per_sec, 1,
            0.90 if au_target is None else au_target, "--samples-per-sec",
        )
    found = WORKLOADS.get((model, accelerator))
    if found is None:
        raise ConfigError(
            f"no published step time for model {model!r} on accelerator {accelerator!r}; "
            f"choose a model from {', '.join(MODELS)} and an accelerator from "
            f"{', '.join(ACCELERATORS)}, or give the rate with samples_per_sec "
            "(--samples-per-sec)"
        )
    if au_target is None:
        return found
    return Workload(found.model, found.accelerator, found.step_s, found.batch_size, au_target, found.source)
