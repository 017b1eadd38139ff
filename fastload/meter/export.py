"""The meter's exports: JSON records, a PNG plot, TensorBoard scalars.

They read only what :class:`MeterData` names, the meter's public ``summary()`` and
``records()``, so this module does not import the recorder (no import cycle). matplotlib
(``pip install 'fastload[plot]'``) and tensorboard (``pip install 'fastload[tensorboard]'``)
are optional and imported only when used.

Example::

    >>> loader.meter.to_json("meter.json")     # {"summary": {...}, "batches": [{...}, ...]}
    >>> loader.meter.plot("meter.png")
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Protocol

from fastload.errors import MissingDependencyError

if TYPE_CHECKING:
    from fastload.meter.report import Summary


class MeterData(Protocol):
    """What the exports read from a meter (a :class:`~fastload.meter.StarvationMeter` is one)."""

    def summary(self) -> Summary: ...

    def records(self) -> list[dict[str, Any]]: ...


def write_json(meter: MeterData, path: str | os.PathLike[str]) -> None:
    """One record per batch plus the summary, as one JSON document."""
    summary = meter.summary()
    doc = {"summary": summary.as_dict(), "report": str(summary), "batches": meter.records()}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def write_plot(meter: MeterData, path: str | os.PathLike[str]) -> None:
    """A PNG with the wait (and GPU idle) per batch over time and the wait histogram."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            f"meter.plot({os.fspath(path)!r}) needs matplotlib, which is not installed: "
            "pip install 'fastload[plot]'"
        ) from exc
    records = meter.records()
    summary = meter.summary()
    t = [r["start_s"] for r in records]
    wait_ms = [r["wait_s"] * 1e3 for r in records]
    fig, (over_time, histogram) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        over_time.plot(t, wait_ms, ".", markersize=3, label="host wait")
        idle = [
            (r["start_s"], r["gpu_idle_s"] * 1e3) for r in records if r["gpu_idle_s"] is not None
        ]
        if idle:
            over_time.plot(*zip(*idle), ".", markersize=3, label="GPU idle")
        over_time.set_xlabel("time since the first batch (s)")
        over_time.set_ylabel("ms per batch")
        over_time.set_title("wait per batch")
        over_time.legend()
        histogram.hist(wait_ms, bins=min(50, max(5, len(wait_ms) // 5)))
        histogram.set_xlabel("host wait (ms)")
        histogram.set_ylabel("batches")
        histogram.set_title(
            f"{summary.verdict.value}: {summary.wait_share:.1%} of step time waiting"
        )
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def open_summary_writer(log_dir: str | os.PathLike[str]) -> Any:
    """A TensorBoard SummaryWriter on ``log_dir``; a clear error when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise MissingDependencyError(
            f"TensorBoard output to {os.fspath(log_dir)!r} needs the tensorboard package: "
            "pip install 'fastload[tensorboard]', or pass a writer you already have"
        ) from exc
    return SummaryWriter(log_dir=os.fspath(log_dir))


def as_summary_writer(target: Any) -> Any:
    """``target`` itself when it is a SummaryWriter (has ``add_scalar``), else one opened on it.

    Example::

        >>> writer = as_summary_writer("runs/x")     # or as_summary_writer(my_writer)
    """
    if hasattr(target, "add_scalar"):
        return target
    return open_summary_writer(target)


def write_tensorboard(meter: MeterData, writer: Any) -> None:
    """Per-batch scalars: ``fastload/wait_ms``, ``fastload/step_ms``, ``fastload/gpu_idle_ms``."""
    for r in meter.records():
        writer.add_scalar("fastload/wait_ms", r["wait_s"] * 1e3, r["batch"])
        if r["step_s"] is not None:
            writer.add_scalar("fastload/step_ms", r["step_s"] * 1e3, r["batch"])
        if r["gpu_idle_s"] is not None:
            writer.add_scalar("fastload/gpu_idle_ms", r["gpu_idle_s"] * 1e3, r["batch"])
    writer.flush()
