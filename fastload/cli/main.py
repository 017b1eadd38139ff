"""The ``fastload`` command: a thin layer over library calls.

Results go to stdout, progress and logs to stderr; ``--json`` where a command has results.
``python -m fastload`` is the same command.
"""

from __future__ import annotations

import logging
import sys

import click

from fastload.version import __version__
from fastload.cli.bench import bench as bench_command
from fastload.cli.cache import cache as cache_command
from fastload.cli.pack import pack as pack_command
from fastload.errors import FastloadError, OriginUnavailableError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fastload")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """fastload: keep GPUs fed. Measure storage, warm caches, find input bottlenecks."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


cli.add_command(bench_command)
cli.add_command(cache_command)
cli.add_command(pack_command)


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    Exit codes: 0 success; 1 something failed (objects not fetched, corrupt entries, the
    origin unavailable); 2 bad usage or bad input (an unknown option, a missing directory);
    130 interrupted (Ctrl-C), 143 stopped by SIGTERM (``cache warm`` says what it kept: NOTE
    [stop signals] in :mod:`fastload.cli.signals`). The console script and ``python -m
    fastload`` exit with it::

        sys.exit(main(["cache", "verify", "/nvme/fastload"]))
    """
    try:
        # standalone_mode=False: click returns the code of `ctx.exit(n)` / `Exit(n)` (or the
        # command's return value) instead of calling sys.exit, so it must be passed on.
        code = cli.main(args=argv, prog_name="fastload", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.UsageError) else exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except OriginUnavailableError as exc:
        click.echo(f"fastload: error: {exc}", err=True)
        return 1
    except FastloadError as exc:
        click.echo(f"fastload: error: {exc}", err=True)
        return 2
    return code if isinstance(code, int) else 0
