"""The bench report as text on a console: the tables and the verdict ``fastload bench`` prints.

Console output belongs to the command line; the library's :class:`~fastload.bench.BenchReport`
only holds the numbers (and ``to_json``).

Example::

    >>> from rich.console import Console
    >>> render(run_bench("/data/train", gpus=4), Console())
    /data/train: 2,000 files, 144.3 MB, size p50 72.2 KB p95 73.8 KB, listed in 0.05 s
    ...
    verdict: this storage feeds 3 H100s training resnet50 at >= 90% AU ...
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fastload.bench import BenchReport


def render(report: BenchReport, console: Console) -> None:
    """Print the report's tables and verdict with rich."""
    inv = report.inventory
    console.print(
        f"[bold]{report.url}[/]: {inv.files:,} files, {_mb(inv.total_bytes)}, size p50 "
        f"{_mb(inv.size_bytes_p50)} p95 {_mb(inv.size_bytes_p95)}, listed in "
        f"{inv.listing_s:.2f} s"
    )
    reads = Table(title="Raw reads (whole objects)", title_justify="left")
    for col in ("condition", "threads", "objects", "MB/s", "files/s", "p50 ms", "p95 ms", "p99 ms"):
        reads.add_column(col, justify="right")
    for m in report.measurements:
        for p in m.reads:
            j = p.to_json()
            reads.add_row(
                m.label, str(p.concurrency), f"{p.objects:,}", f"{p.read_bytes_per_s / 1e6:,.1f}",
                f"{p.objects_per_s:,.0f}", f"{j['latency_ms_p50']:.2f}",
                f"{j['latency_ms_p95']:.2f}", f"{j['latency_ms_p99']:.2f}",
            )
    console.print(reads)
    for m in report.measurements:
        r = m.range_reads
        if r.skipped_reason:
            console.print(f"{m.label} range reads: skipped: {r.skipped_reason}")
        else:
            j = r.to_json()
            console.print(
                f"{m.label} range reads of 4 KiB: {r.reads_per_s:,.0f}/s at {r.concurrency} "
                f"threads, p50 {j['latency_ms_p50']:.2f} ms, p99 {j['latency_ms_p99']:.2f} ms"
            )
    for d in report.decode:
        if d.skipped_reason:
            console.print(f"decode ({d.engine}): skipped: {d.skipped_reason}")
        else:
            console.print(
                f"decode+augment ({d.engine}): {d.images_per_s_per_core:,.0f} images/s per core "
                f"x {report.decode_cores} loader cores of {report.cores}"
            )
    w = report.workload
    emu = Table(
        title=f"Emulated {w.accelerator.upper()}s training {w.model} "
        f"({w.sample_s * 1000:.3f} ms/sample, bar {w.au_target:.0%} AU)",
        title_justify="left",
    )
    for col in ("condition", "accelerators", "samples/s", "AU", "min AU", "batches"):
        emu.add_column(col, justify="right")
    for m in report.measurements:
        emu.add_row(m.label, "feed probe", f"{m.feed_samples_per_s:,.0f}", "-", "-",
                    str(sum(u.batches for u in m.probe.usage)))
        for r in m.runs:
            emu.add_row(
                m.label, str(r.accelerators), f"{r.samples_per_s:,.0f}", f"{r.au:.1%}",
                f"{min(u.au for u in r.usage):.1%}", str(sum(u.batches for u in r.usage)),
            )
    console.print(emu)
    console.print(f"[bold]verdict:[/] {report.verdict}")


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} KB"
