"""``fastload cache``: warm, inspect, verify and clear a cache directory.

Thin over :mod:`fastload.cache`: arguments in, library calls, results to stdout (``--json``
for machines), progress to stderr. Exit status 1 when something failed or is corrupt.

Example::

    fastload cache warm s3://bucket/train --cache /nvme/fastload --jobs 32 --shard 0/4
    fastload cache warm s3://bucket/train --cache /nvme/fastload --transcode 256 --quality 90
    fastload cache stats /nvme/fastload
    fastload cache verify /nvme/fastload
    fastload cache clear /nvme/fastload
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from fastload.cache.config import CacheConfig, transcode_spec
from fastload.cache.disk import DiskTier, read_only
from fastload.cache.warm_report import MAX_FAILURES, WarmReport, parse_shard
from fastload.cli.options import storage_options
from fastload.cli.signals import stop_on_signals
from fastload.errors import CacheError, ConfigError, OriginUnavailableError

if TYPE_CHECKING:
    from typing_extensions import Self


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n} B"


@click.group("cache")
def cache() -> None:
    """Warm, inspect, verify and clear a fastload cache directory."""


@cache.command("warm")
@click.argument("url")
@click.option("--cache", "directory", required=True, type=click.Path(file_okay=False),
              help="The cache directory (the disk tier) to fill.")
@click.option("--jobs", default=None, type=click.IntRange(1, 4096),
              help="Requests in flight on a remote store (each object stored before its slot "
                   "is reused); reader threads on local files (1: read in this thread). "
                   "[default: 64 on an async remote store (s3://, gs://, az://, http(s)://), "
                   "16 on local files and other sync stores]")
@click.option("--shard", default="0/1", show_default=True,
              help="I/N: warm every N-th object starting at I (split a dataset across nodes).")
@click.option("--size", "disk_size", default=None,
              help="Budget of the cache directory, e.g. 500GB (default: half the free space).")
@click.option("--policy", type=click.Choice(["keep", "lru"]), default="keep", show_default=True)
@click.option("--redis", default=None, metavar="URL",
              help="Also fill this shared Redis tier (redis://host:6379/0); N warmers with "
                   "--shard I/N fill it together. Entries are authenticated with "
                   "FASTLOAD_CACHE_HMAC_KEY when it is set (docs/cache.md).")
@click.option("--max-failures", default=MAX_FAILURES, show_default=True, type=click.IntRange(1),
              help="Give up after this many objects in a row failed (the store looks down); "
                   "run the same command again to resume.")
@click.option("--read-timeout", default=None, type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS",
              help="On an async store (s3://, gs://, http(s)://...), fail one object's read "
                   "after this many seconds without its last byte, retries included (it counts "
                   "toward --max-failures); a store that stops answering is found only this "
                   "way. Other stores keep their client's timeouts. [default: 30]")
@click.option("-o", "--storage-option", "options", multiple=True, metavar="KEY=VALUE",
              help="An fsspec storage option (JSON values allowed), e.g. -o endpoint_url=http://...")
@click.option("--transcode", "max_side", default=None, type=int, metavar="MAX_SIDE",
              help="Fill the transcoded tier instead (changes pixels): images re-encoded as "
                   "JPEG with the longer side at most MAX_SIDE pixels, the entries an "
                   "ImageFolder with cache={..., 'transcode': {'max_side': MAX_SIDE}} reads.")
@click.option("--quality", default=None, type=int,
              help="JPEG quality of --transcode, 1..95 [default: 90].")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def warm_command(url: str, directory: str, jobs: int | None, shard: str, disk_size: str | None,
                 policy: str, redis: str | None, max_failures: int, read_timeout: float | None,
                 options: tuple[str, ...], max_side: int | None, quality: int | None,
                 as_json: bool) -> None:
    """Fetch every object below URL into the cache; resumable, exits 1 if any failed.

    URL may also name files as TarShards takes them, a brace pattern or glob
    ('s3://b/train-{0000..1023}.tar') or a wids shard index (shards.json): then only those.

    Ctrl-C or SIGTERM (a scheduler's stop) ends it saying how many files are cached and
    kept; exit 130 or 143, and the same command resumes.
    """
    try:
        shard_of = parse_shard(shard)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--shard") from exc
    transcode = _transcode(max_side, quality)
    why = read_only(directory)
    if why is not None:  # said here in one line, before the tier's warning
        raise CacheError(f"cannot warm: {directory} is read-only ({why}), so nothing could "
                         "be stored; give a cache directory this process can write")
    config = CacheConfig(disk=directory, disk_size=disk_size, policy=policy, redis=redis,
                         prefetch=False, transcode=transcode)
    derive = None
    if transcode is not None:
        # Imported here: Pillow is needed only for --transcode (command start-up time).
        from fastload.data.transcode import Transcode

        derive = Transcode.from_spec(transcode)
    # Imported here: the warm's storage and fetch layers (fsspec, asyncio) only for `warm`.
    from fastload.cache.warm import warm

    deadline = {} if read_timeout is None else {"read_timeout": read_timeout}
    console = Console(stderr=True)
    progress = _RichProgress(console) if console.is_terminal else _PlainProgress()
    with stop_on_signals() as stop:  # NOTE [stop signals]: SIGTERM ends it as Ctrl-C does
        try:
            with progress:
                report = warm(url, config, jobs=jobs, shard=shard_of, max_failures=max_failures,
                              storage_options=storage_options(options), on_start=progress.start,
                              on_file=progress.file, derive=derive, **deadline)
        except OriginUnavailableError as exc:
            if as_json and isinstance(exc.report, WarmReport):
                click.echo(json.dumps(_warm_json(exc.report, gave_up=str(exc)), indent=2))
            click.echo(f"fastload: error: {exc}", err=True)
            raise click.exceptions.Exit(1) from exc
        except KeyboardInterrupt:
            click.echo(f"fastload: {progress.stopped(url, stop.name)}", err=True)
            raise click.exceptions.Exit(stop.exit_code) from None
    if as_json:
        click.echo(json.dumps(_warm_json(report), indent=2))
    else:
        click.echo(
            f"{report.url}: {report.files} files ({_human(report.bytes)}): {report.fetched} fetched, "
            f"{report.skipped} already cached, {report.rejected} not stored (cache full), "
            f"{len(report.failed)} failed"
        )
        for failed_url, error in report.failed[:_FAILED_SHOWN]:
            click.echo(f"FAILED {failed_url}: {error}")
        if len(report.failed) > _FAILED_SHOWN:
            more = len(report.failed) - _FAILED_SHOWN
            click.echo(f"... and {more} more failed (--json lists all)")
        if report.failed:
            click.echo("run the same command again to fetch what failed; cached files are skipped")
    if not report.ok:
        raise click.exceptions.Exit(1)


_FAILED_SHOWN = 5  # failures named in the summary; --json has them all


def _transcode(max_side: int | None, quality: int | None) -> dict[str, int] | None:
    """The transcode spec of ``--transcode``/``--quality``, or None; bad values exit 2."""
    if max_side is None:
        if quality is not None:
            raise click.BadParameter("--quality applies to --transcode; add --transcode MAX_SIDE",
                                     param_hint="--quality")
        return None
    spec = {"max_side": max_side}
    try:
        transcode_spec(spec, name="transcode")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--transcode") from exc
    if quality is not None:
        spec["quality"] = quality
    try:
        return transcode_spec(spec, name="transcode")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--quality") from exc


def _warm_json(report: WarmReport, gave_up: str | None = None) -> dict[str, Any]:
    return {**report.__dict__, "ok": report.ok and gave_up is None, "gave_up": gave_up}


class _Tally:
    """What a warm's progress counts: files to check, done, kept in the cache, bytes."""

    def __init__(self) -> None:
        self.files: int | None = None  # None: still listing
        self.done = self.kept = self.nbytes = 0

    def count(self, nbytes: int, outcome: str) -> None:
        self.done += 1
        self.nbytes += nbytes
        if outcome in ("fetched", "hit"):
            self.kept += 1

    def stopped(self, url: str, signal_name: str) -> str:
        """The one line said when a signal stopped the warm: what it kept, what to do."""
        if self.files is None:
            return (f"aborted by {signal_name} while listing {url}; nothing was fetched. Run "
                    "the same command again to warm it")
        return (
            f"aborted by {signal_name} after {self.done} of {self.files} files: {self.kept} are "
            "in the cache and kept (each entry whole). Run the same command again to resume; "
            "cached files are skipped"
        )


class _RichProgress(_Tally):
    """The warm's progress bar on a terminal (files, bytes, rate, ETA).

    A warm finishes thousands of files a second: :meth:`file` only counts, and the bar is
    updated at most every ``every`` seconds (rich redraws it ten times a second anyway).
    """

    def __init__(self, console: Console, every: float = 0.1) -> None:
        super().__init__()
        self.every = every
        self._shown_bytes = 0
        self._last = 0.0
        self._progress = Progress(
            TextColumn("[bold]warming"),
            BarColumn(),
            TextColumn("{task.fields[done]}/{task.fields[count]} files"),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._progress.add_task("warm", total=None, done=0, count="?")

    def __enter__(self) -> Self:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._show()
        self._progress.__exit__(*exc)

    def start(self, files: int, nbytes: int) -> None:
        self.files = files
        self._progress.update(self._task, total=nbytes, count=files)

    def file(self, _url: str, nbytes: int, outcome: str) -> None:
        self.count(nbytes, outcome)
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self._show()

    def _show(self) -> None:
        advance, self._shown_bytes = self.nbytes - self._shown_bytes, self.nbytes
        self._progress.update(self._task, advance=advance, done=self.done)


class _PlainProgress(_Tally):
    """The warm's progress as a plain stderr line every few seconds, for logs (no terminal).

    Example line: ``warm: 1200/5000 files, 45.1 MB, 230 files/s, ETA 16 s``.
    """

    def __init__(self, every: float = 5.0) -> None:
        super().__init__()
        self.every = every
        self._t0 = self._last = time.monotonic()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.done:
            self._line()

    def start(self, files: int, _nbytes: int) -> None:
        self.files, self._t0 = files, time.monotonic()
        self._last = self._t0
        click.echo(f"warm: {files} files to check", err=True)

    def file(self, _url: str, nbytes: int, outcome: str) -> None:
        self.count(nbytes, outcome)
        if time.monotonic() - self._last >= self.every:
            self._line()

    def _line(self) -> None:
        self._last = now = time.monotonic()
        rate = self.done / max(now - self._t0, 1e-9)
        left = (self.files or 0) - self.done
        eta = f", ETA {left / rate:.0f} s" if rate and left > 0 else ""
        click.echo(f"warm: {self.done}/{self.files} files, {_human(self.nbytes)}, "
                   f"{rate:.0f} files/s{eta}", err=True)


@cache.command("stats")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
def stats_command(directory: str, as_json: bool) -> None:
    """Format, entries, bytes, budget, and the hits/misses recorded by the processes that used
    DIRECTORY."""
    tier = DiskTier(directory, create=False, repair=False)
    if tier.store.problem is not None:
        click.echo(f"fastload: error: {directory}: {tier.store.problem}; {_REPAIR.format(d=directory)}", err=True)
        raise click.exceptions.Exit(1)
    summary = tier.summary()
    tier.close()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    table = Table(title=f"fastload cache {summary['directory']}", show_header=False)
    for name, value in summary.items():
        if name == "directory":
            continue
        if name in ("budget_source", "format_description") or (name == "read_only" and value is None):
            continue
        if name == "format":
            shown = f"{value} ({summary['format_description']})"
        elif name == "budget":
            source = "set by disk_size" if summary["budget_source"] == "disk_size" else "default"
            shown = f"{_human(value)} ({value}, {source})"
        elif name in ("bytes", "bytes_read", "bytes_written", "shard_bytes"):
            shown = f"{_human(value)} ({value})"
        elif name == "hit_rate":
            shown = "-" if value is None else f"{value:.1%}"
        else:
            shown = str(value)
        table.add_row(name, shown)
    Console().print(table)


@cache.command("verify")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--drop", is_flag=True, help="Delete the corrupt entries (they are refetched on use).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify_command(directory: str, drop: bool, as_json: bool) -> None:
    """Check every entry; name the corrupt ones and the names fastload did not make (symlinks
    included, never followed or deleted); exit 1 if any."""
    tier = DiskTier(directory, create=False, repair=False)
    report = tier.verify(drop=drop)
    tier.close()
    ok = not report.corrupt and not report.foreign and not report.damaged
    if as_json:
        click.echo(json.dumps({**report.__dict__, "ok": ok}, indent=2))
    else:
        if report.checked or not report.damaged:  # a damaged store alone: its one line says it
            click.echo(
                f"{report.checked} entries ({_human(report.bytes)}) checked, {len(report.corrupt)} corrupt, "
                f"{len(report.foreign)} not fastload's"
                + (f", {len(report.damaged)} damaged store(s)" if report.damaged else "")
            )
        for path, why in report.damaged:
            copy = not path.endswith("data.mdb")  # a store an earlier process set aside
            if drop:
                done = " (deleted)" if copy else " (set aside and deleted; the store is empty now)"
            else:
                done = f"; {(_DELETE_COPY if copy else _REPAIR).format(d=directory)}"
            click.echo(f"DAMAGED {path}: {why}{done}")
        for name, why in report.corrupt:
            click.echo(f"CORRUPT {name}: {why}" + (" (deleted)" if drop else ""))
        for path, what in report.foreign:
            click.echo(f"FOREIGN {path}: {what}; not fastload's, left alone (remove it yourself)")
    if not ok:
        raise click.exceptions.Exit(1)


_REPAIR = ("`fastload cache verify {d} --drop` or `fastload cache clear {d}` deletes it and starts an "
           "empty store")
_DELETE_COPY = "`fastload cache verify {d} --drop` deletes it"


@cache.command("clear")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print what was freed as JSON.")
def clear_command(directory: str, as_json: bool) -> None:
    """Delete every entry of the cache in DIRECTORY (the directory itself stays); files that
    fastload did not make are left alone and listed."""
    tier = DiskTier(directory, create=False, repair=False)
    report = tier.clear()
    tier.close()
    if as_json:
        click.echo(json.dumps(report.__dict__))
        return
    click.echo(f"cleared {directory}: {report.entries} entries, {_human(report.bytes)} freed")
    for path in report.damaged:
        click.echo(f"DELETED {path}: a damaged packed store")
    for path, what in report.foreign:
        click.echo(f"LEFT {path}: {what}; not fastload's, so not deleted")
