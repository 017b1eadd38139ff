"""``fastload pack SRC DST``: an image folder or a file list into WebDataset tar shards.

Thin over :func:`fastload.data.pack.pack` (NOTE [what pack writes]): progress to stderr, the
result to stdout (``--json`` for machines). Exit status 0 when every sample was packed, 1
when a read or a write failed (a rerun continues after the last finished shard), 2 for bad
input (no such folder, a bad ``--shard-size``, a list file that does not parse).

Example::

    fastload pack s3://bucket/train s3://bucket/train-shards --shard-size 256MB
    fastload pack files.txt /data/shards        # lines of "PATH LABEL"
    fastload pack /data/train /data/shards-256 --transcode 256   # longer sides <= 256 px
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from fastload.cli.options import storage_options
from fastload.errors import ConfigError, SampleError, StorageError

_LIST_SUFFIXES = (".txt", ".csv", ".tsv", ".lst")


def _source(src: str) -> str | list[tuple[str, int]]:
    """SRC as pack takes it: a folder URL, or the (path, label) pairs of a list file."""
    if not (os.path.isfile(src) and src.endswith(_LIST_SUFFIXES)):
        return src
    pairs = []
    with open(src, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.replace(",", " ").replace("\t", " ").split()
            if not fields or line.lstrip().startswith("#"):
                continue
            if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
                raise click.BadParameter(f"{src}:{number}: {line.strip()!r} is not 'PATH LABEL'",
                                         param_hint="SRC")
            pairs.append((fields[0], int(fields[1])))
    return pairs


@click.command("pack")
@click.argument("src")
@click.argument("dst")
@click.option("--shard-size", default="256MB", show_default=True,
              help="Target bytes of a shard (a sample larger than that gets a shard of its own).")
@click.option("--prefix", default="shard", show_default=True,
              help="Shard file names: PREFIX-000000.tar, PREFIX-000001.tar, ...")
@click.option("--storage-option", "src_options", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for SRC (repeatable; JSON values are parsed).")
@click.option("--dst-option", "dst_options", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for DST (repeatable).")
@click.option("--transcode", "max_side", type=int, default=None, metavar="MAX_SIDE",
              help="Re-encode each image whose longer side is over MAX_SIDE pixels as a JPEG "
                   "with that longer side (the transcoded cache tier's re-encoding).")
@click.option("--quality", type=int, default=None,
              help="JPEG quality of --transcode's re-encoding (1..95; default 90).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def pack(src: str, dst: str, shard_size: str, prefix: str, src_options: tuple[str, ...],
         dst_options: tuple[str, ...], max_side: int | None, quality: int | None,
         as_json: bool) -> None:
    """Pack the images of SRC (a class-per-folder root, any fsspec URL, or a file of 'PATH
    LABEL' lines) into WebDataset tar shards in DST, readable by webdataset unchanged.

    Each shard gets an index in DALI's wds2idx format (.idx) and DST a shards.json in wids'
    shard-index format. Interrupted, the same command continues after the last finished shard.
    """
    from fastload.cache.config import parse_size
    from fastload.data.pack import PackReport
    from fastload.data.pack import pack as pack_images

    try:
        size = parse_size(shard_size, name="--shard-size")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--shard-size") from exc
    transcode = _transcode(max_side, quality)

    def progress(report: PackReport, total: int) -> None:
        click.echo(f"shard {report.shards}: {report.samples}/{total} samples "
                   f"({100 * report.samples / max(1, total):.0f}%)", err=True)

    from fastload.data.images import ImageFolder

    # Listing errors are bad input (exit 2; an unavailable store 1, by main); reads and writes 1.
    source = ImageFolder(_source(src), storage_options=storage_options(src_options))
    try:
        report = pack_images(source, dst, shard_size=size, prefix=prefix,
                             dst_options=storage_options(dst_options, "--dst-option"),
                             progress=progress, transcode=transcode)
    except (SampleError, StorageError) as exc:
        click.echo(f"fastload: error: {exc}", err=True)
        click.echo("run the same command again to continue after the last finished shard", err=True)
        raise click.exceptions.Exit(1) from exc
    if as_json:
        click.echo(json.dumps(report.__dict__, indent=2))
    else:
        resumed = f" ({report.resumed_from} from an earlier run)" if report.resumed_from else ""
        click.echo(f"{dst}: {report.shards} shards{resumed}, {report.samples} samples, "
                   f"{report.bytes / 1e6:.1f} MB")
        if transcode is not None:
            click.echo(f"transcoded {report.transcoded} samples written now to a longer side "
                       f"<= {transcode.max_side} px (the others were within it); "
                       f"{len(report.not_decodable)} not decodable, packed as they are")


def _transcode(max_side: int | None, quality: int | None) -> Any:
    """--transcode/--quality as a Transcode (None without --transcode); bad values exit 2."""
    if max_side is None:
        if quality is not None:
            raise click.BadParameter("--quality applies only with --transcode MAX_SIDE",
                                     param_hint="--quality")
        return None
    from fastload.data.transcode import Transcode

    try:
        return Transcode(max_side, quality) if quality is not None else Transcode(max_side)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--transcode/--quality") from exc
