"""``fastload bench URL``: can this storage feed my GPUs?

A thin layer over :func:`fastload.bench.run_bench`: progress on stderr, the report (rich
tables and a one-sentence verdict, :mod:`fastload.cli.render`, or one JSON document
with ``--json``) on stdout.

Example::

    fastload bench s3://bucket/imagenet/train --gpus 8 --model resnet50 --duration 60
    fastload bench /data/train --cache /nvme/fastload --json > bench.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fastload.bench.workloads import ACCELERATORS, MODELS
from fastload.cli.options import storage_options


@click.command("bench")
@click.argument("url")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="Accelerators you plan to feed; the report gives their AU.")
@click.option("--model", default="resnet50", show_default=True,
              help=f"Workload whose MLPerf Storage step time is emulated: {', '.join(MODELS)}.")
@click.option("--accelerator", type=click.Choice(ACCELERATORS), default="h100", show_default=True,
              help="Accelerator whose published step time is used.")
@click.option("--samples-per-sec", type=float, default=None,
              help="Samples one accelerator consumes per second (instead of a model's time).")
@click.option("--au-target", type=float, default=None,
              help="AU bar to keep, 0..1 (default: MLPerf's for the model, 0.9 for resnet50).")
@click.option("--cache", "cache", default=None, metavar="DIR",
              help="Measure through fastload's cache in DIR, cold and warm (a scratch subdir).")
@click.option("--duration", type=click.FloatRange(min=1.0), default=60.0, show_default=True,
              help="Seconds to spend measuring (listing not included).")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=32, show_default=True,
              help="Most reader threads in the raw read sweep (1, 2, 4, ... up to it).")
@click.option("--workers", default="auto", show_default=True,
              help="num_workers of the emulation's loader ('auto' or a number).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Batch size of the emulation (default: the model's, at most 64).")
@click.option("-o", "--storage-option", "options", multiple=True, metavar="KEY=VALUE",
              help="An fsspec storage option (JSON values allowed), e.g. -o endpoint_url=http://...")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def bench(
    url: str,
    gpus: int | None,
    model: str,
    accelerator: str,
    samples_per_sec: float | None,
    au_target: float | None,
    cache: str | None,
    duration: float,
    max_concurrency: int,
    workers: str,
    batch_size: int | None,
    options: tuple[str, ...],
    as_json: bool,
) -> None:
    """Measure whether the data at URL can keep GPUs busy (any fsspec URL; reads only).

    Exits 1 when the store cannot be reached, 2 when URL does not exist or holds no data.
    """
    num_workers: int | str = workers
    if workers != "auto":
        try:
            num_workers = int(workers)
        except ValueError:
            raise click.BadParameter(f"expected 'auto' or a number, got {workers!r}",
                                     param_hint="--workers") from None
    # The bench runs a real loader (torch): imported here, so `fastload --help` starts at once.
    from fastload.bench import run_bench
    from fastload.cli.render import render

    stderr = Console(stderr=True)
    columns = (TextColumn("{task.description:<28}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True, disable=not stderr.is_terminal) as bar:
        tasks: dict[str, Any] = {}

        def progress(phase: str, fraction: float) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=1.0)
            bar.update(tasks[phase], completed=fraction)

        report = run_bench(
            url,
            gpus=gpus,
            model=model,
            accelerator=accelerator,
            samples_per_sec=samples_per_sec,
            au_target=au_target,
            cache=cache,
            duration_s=duration,
            max_concurrency=max_concurrency,
            num_workers=num_workers,
            batch_size=batch_size,
            storage_options=storage_options(options),
            progress=progress,
        )
    if as_json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(report, Console(soft_wrap=True))
