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
    """A PNG of :func:`plot_figure`: step make-up, running wait share, worker busy share."""
    plt = _pyplot(path)
    fig = plot_figure(meter, plt)
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def _pyplot(path: Any) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            f"meter.plot({os.fspath(path)!r}) needs matplotlib, which is not installed: "
            "pip install 'fastload[plot]'"
        ) from exc
    return plt


def plot_figure(meter: MeterData, plt: Any = None) -> Any:
    """The meter's picture as a matplotlib Figure with three panels, top to bottom:

    * the step of each batch over time, stacked: the loop's own compute, then the wait
      (and GPU idle, dotted, where CUDA events measured it);
    * the waiting share's running value (over a window of batches) against the 5% and 20%
      bands of the verdict;
    * the worker processes' busy share over time, from their own begin/end times
      (:mod:`.workers`), or why it was not measured.

    Example::

        >>> fig = plot_figure(loader.meter)
        >>> len(fig.axes)
        3
    """
    import numpy as np

    from fastload.meter.report import HIGHLY_INPUT_BOUND, MODERATELY_INPUT_BOUND

    if plt is None:
        plt = _pyplot("<figure>")
    records = meter.records()
    summary = meter.summary()
    t = np.array([r["start_s"] for r in records], dtype=np.float64)
    wait = np.array([r["wait_s"] for r in records], dtype=np.float64)
    step = np.array(
        [r["step_s"] if r["step_s"] is not None else r["wait_s"] for r in records], dtype=np.float64
    )
    fig, (steps, share, busy) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    if len(records):
        compute = np.clip(step - wait, 0.0, None)
        steps.stackplot(t, compute * 1e3, wait * 1e3, labels=["loop (compute)", "waiting for data"],
                        step="post", alpha=0.8)
        idle = [(r["start_s"], r["gpu_idle_s"] * 1e3) for r in records if r["gpu_idle_s"] is not None]
        if idle:
            steps.plot(*zip(*idle), ":", color="k", label="GPU idle")
        window = max(5, min(200, len(records) // 20))
        kernel = np.ones(window)
        w_sum = np.convolve(wait, kernel, mode="full")[: len(wait)]
        s_sum = np.convolve(step, kernel, mode="full")[: len(step)]
        running = np.divide(w_sum, s_sum, out=np.zeros_like(w_sum), where=s_sum > 0)
        share.plot(t, running * 100, color="C1", label=f"waiting share, last {window} batches")
    steps.set_ylabel("ms per batch")
    steps.set_title(f"step = compute + wait per batch ({summary.verdict.value}, "
                    f"{summary.wait_share:.1%} waiting)")
    steps.legend(loc="upper right")
    share.axhspan(0, MODERATELY_INPUT_BOUND * 100, color="tab:green", alpha=0.12)
    share.axhspan(MODERATELY_INPUT_BOUND * 100, HIGHLY_INPUT_BOUND * 100, color="tab:orange", alpha=0.12)
    share.axhspan(HIGHLY_INPUT_BOUND * 100, 100, color="tab:red", alpha=0.08)
    for band in (MODERATELY_INPUT_BOUND, HIGHLY_INPUT_BOUND):
        share.axhline(band * 100, color="grey", linestyle="--", linewidth=0.8)
    share.set_ylim(0, 100)
    share.set_ylabel("% of step time waiting")
    share.set_title("waiting share (running), against the 5% and 20% bands")
    share.legend(loc="upper right")
    _busy_panel(busy, records, summary, np)
    busy.set_xlabel("time since the first batch (s)")
    fig.tight_layout()
    return fig


def _busy_panel(ax: Any, records: list[dict[str, Any]], summary: Any, np: Any) -> None:
    stats = summary.worker_stats
    began = np.array([r.get("worker_began_s") for r in records], dtype=np.float64)
    done = np.array([r.get("worker_done_s") for r in records], dtype=np.float64)
    ok = np.isfinite(began) & np.isfinite(done)
    ax.set_ylabel("% of worker time busy")
    ax.set_ylim(0, 105)
    if stats is None or stats.busy_share is None or not ok.any():
        why = stats.note if stats is not None and stats.note else "worker busy share not measured"
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, wrap=True)
        ax.set_title("worker busy share")
        return
    began, done = began[ok], done[ok]
    edges = np.linspace(began.min(), done.max(), 41)
    lo, hi = edges[:-1], edges[1:]
    overlap = np.clip(
        np.minimum(done[:, None], hi[None, :]) - np.maximum(began[:, None], lo[None, :]), 0.0, None
    ).sum(axis=0)
    share = overlap / ((hi - lo) * stats.workers)
    ax.step(lo, np.minimum(share, 1.0) * 100, where="post", color="C2",
            label=f"{stats.workers} workers")
    ax.axhline(stats.busy_share * 100, color="C2", linestyle="--", linewidth=0.8,
               label=f"steady state {stats.busy_share:.0%}")
    ax.set_title("worker busy share (time inside dataset access and collate)")
    ax.legend(loc="lower right")


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
