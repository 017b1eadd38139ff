"""Packing an image folder (or a list of files) into WebDataset tar shards.

NOTE [what pack writes]
``pack(src, dst)`` reads the samples of ``ImageFolder(src)`` in its order and writes them to
``dst/<prefix>-000000.tar``, ``-000001.tar``, ... of about ``shard_size`` bytes each. Each
sample is two members that share its key (its path below the root, without the extension,
as webdataset expects): ``<key>.<ext>`` with the file's bytes unchanged, and ``<key>.cls``
with its label as decimal text. With ``transcode`` (a :class:`~fastload.data.transcode.Transcode`,
the transcoded cache tier's re-encoding) an image whose longer side is over ``max_side`` is
written re-encoded instead, as ``<key>.jpg`` (it is a JPEG then); smaller ones keep their
bytes and extension, and one that does not decode keeps its bytes (logged, counted in the
report: it fails in the pipeline as it would unpacked). The tars are plain POSIX (pax) tar files, as webdataset's
own ``TarWriter`` makes them. Beside each shard is its DALI index (``x.idx``, ``wds2idx``'s
v1.2 format, for DALI's reader's ``index_paths``: tests/test_dali_shards.py reads with it;
:class:`~fastload.TarShards` then reads no headers), and in ``dst`` a ``shards.json`` in
wids' shard-index format (``__kind__: wids-shard-index-v1``, ``shardlist`` of
``url``/``nsamples``) with fastload's own fields under ``"fastload"``: the classes, the
source, and each finished shard's sample range.

A shard is written to a temporary name and renamed (locally) or written whole by one
``open(..., "wb")`` (object stores make it visible at close); ``shards.json`` is rewritten
after each shard. A second run with the same arguments continues after the last shard it
recorded (a shard whose file is missing or of another size is written again). So a pack
interrupted at any point resumes, and the shards are the same as an uninterrupted run's.

Example::

    >>> report = pack("s3://bucket/train", "s3://bucket/train-shards", shard_size=256e6)
    >>> report.shards, report.samples
    (147, 1281167)
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import fsspec

from fastload.data.images import ImageFolder
from fastload.data.tarfiles import index_url_of, write_dali_index
from fastload.data.transcode import Transcode
from fastload.errors import ConfigError
from fastload.io.errors import storage_errors
from fastload.io.origin import with_timeouts

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST", "PackReport", "pack"]

MANIFEST = "shards.json"
READ_AHEAD = 64
"""Source files read concurrently ahead of the writer."""
_MTIME = 1_700_000_000  # a fixed member time: packing the same files gives the same bytes


@dataclass
class PackReport:
    """What a :func:`pack` run did: shards and samples in ``dst`` (all, and written now)."""

    dst: str
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    written_shards: int = 0
    resumed_from: int = 0
    urls: list[str] = field(default_factory=list)
    transcoded: int = 0
    """Samples written now re-encoded (``transcode``; the others were within ``max_side``)."""
    not_decodable: list[str] = field(default_factory=list)
    """Files written now as they are because ``transcode`` could not decode them."""


@dataclass(frozen=True)
class _Sample:
    index: int
    data: bytes
    ext: str | None = None
    """The extension its bytes now have (``jpg`` when re-encoded); None: the file's own."""
    failed: str | None = None


def _fits(offset: int, size: int, shard_size: float) -> bool:
    """Whether a sample of ``size`` image bytes (and its label) still fits a shard now at
    ``offset``: two headers (and a pax header's two blocks for a long name), the padded data,
    the end-of-archive blocks, rounded up to tar's record of 10,240 bytes."""
    block = tarfile.BLOCKSIZE
    end = offset + 4 * block + (size + block - 1) // block * block + block + 2 * block
    return -(-end // tarfile.RECORDSIZE) * tarfile.RECORDSIZE <= shard_size


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> int:
    """Add ``name`` with ``data``; returns the offset of its data in the tar."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), _MTIME, 0o444
    tar.addfile(info, io.BytesIO(data))
    return tar.offset - (len(data) + tarfile.BLOCKSIZE - 1) // tarfile.BLOCKSIZE * tarfile.BLOCKSIZE


def _key_of(source: ImageFolder, i: int) -> tuple[str, str]:
    """The member key and image extension of sample ``i``: its path below the root."""
    path = source.index.path(i)
    root = source.storage.root if source.index.prefix else ""
    relative = path[len(root):].lstrip("/") if root and path.startswith(root) else path.lstrip("/")
    stem, dot, ext = relative.rpartition(".")
    key = (stem or relative).replace(".", "_")  # webdataset's key ends at the first dot
    return key, (ext.lower() if dot else "jpg")


def _read_ahead(source: ImageFolder, indices: range, transcode: Transcode | None) -> Iterator[_Sample]:
    def read(i: int) -> _Sample:
        data = source.read_bytes(i)
        if transcode is None:
            return _Sample(i, data)
        try:
            small = transcode(data)
        except ValueError as exc:  # not a decodable image: packed as it is
            return _Sample(i, data, failed=f"{source.index.path(i)}: {exc}")
        return _Sample(i, data) if small is data else _Sample(i, small, "jpg")

    # The pool reads (and re-encodes: Pillow releases the GIL while it decodes, resizes and
    # encodes) ahead of the writer, in the source's order.
    with ThreadPoolExecutor(16, thread_name_prefix="fastload-pack") as pool:
        for start in range(indices.start, indices.stop, READ_AHEAD):
            yield from pool.map(read, range(start, min(start + READ_AHEAD, indices.stop)))


def _load_manifest(fs: Any, path: str) -> dict[str, Any] | None:
    if not fs.exists(path):
        return None
    with storage_errors("read", path):
        manifest = json.loads(fs.cat_file(path))
    return manifest if isinstance(manifest, dict) and "fastload" in manifest else None


def _done_shards(
    fs: Any, root: str, manifest: dict[str, Any] | None, plan: dict[str, Any],
) -> list[dict[str, Any]]:
    """The shards a previous run of the same plan finished and that are still there, whole."""
    if manifest is None or manifest["fastload"].get("plan") != plan:
        return []
    done = []
    for shard in manifest["fastload"].get("shards", []):
        path = f"{root}/{shard['url']}"
        if not fs.exists(path) or fs.size(path) != shard["bytes"]:
            break
        done.append(shard)
    return done


def pack(
    src: str | Sequence[tuple[str, int]] | ImageFolder,
    dst: str,
    *,
    shard_size: float = 256e6,
    prefix: str = "shard",
    storage_options: dict[str, Any] | None = None,
    dst_options: dict[str, Any] | None = None,
    progress: Callable[[PackReport, int], None] | None = None,
    transcode: Transcode | None = None,
) -> PackReport:
    """Pack ``src`` (an ImageFolder, its root URL or a ``(path, label)`` list) into ``dst``.

    See NOTE [what pack writes]. ``progress(report, total_samples)`` is called after each
    shard. ``transcode=Transcode(max_side=256)`` bakes the transcoded tier's re-encoding into
    the shards (images' longer side at most 256 pixels). Raises a :class:`~fastload.errors.StorageError` (or a sample error naming the file)
    when a read or a write fails; what was finished stays and a rerun continues from it.
    """
    if shard_size < 4096:
        raise ConfigError(
            f"shard_size={shard_size!r}: a shard must hold at least 4096 bytes (try 256MB)")
    if not prefix or "/" in prefix:
        raise ConfigError(f"prefix={prefix!r}: a file name prefix without '/' is needed")
    source = src if isinstance(src, ImageFolder) else ImageFolder(
        src, storage_options=storage_options)  # type: ignore[arg-type]
    fs, root = fsspec.core.url_to_fs(dst, **with_timeouts(dst, dst_options or {}))
    root = root.rstrip("/")
    with storage_errors("create", dst):
        fs.makedirs(root, exist_ok=True)
    plan = {"source": source.root if source.index.prefix else f"a list of {len(source)} files",
            "samples": len(source), "shard_size": int(shard_size), "prefix": prefix}
    if transcode is not None:  # a key only then: earlier plans (and their resume) still match
        plan["transcode"] = transcode.tag
    _check_keys([_key_of(source, i)[0] for i in range(len(source))], plan["source"])
    done = _done_shards(fs, root, _load_manifest(fs, f"{root}/{MANIFEST}"), plan)
    report = PackReport(dst, resumed_from=len(done))
    start = done[-1]["stop"] if done else 0
    shards = list(done)
    samples = _read_ahead(source, range(start, len(source)), transcode)
    pending = next(samples, None)
    while pending is not None:
        name = f"{prefix}-{len(shards):06d}.tar"
        buffer, rows = io.BytesIO(), []
        first = pending.index
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            while pending is not None and (
                    not rows or _fits(tar.offset, len(pending.data), shard_size)):
                i, data = pending.index, pending.data
                key, ext = _key_of(source, i)
                ext = pending.ext or ext
                report.transcoded += pending.ext is not None
                if pending.failed is not None:
                    report.not_decodable.append(pending.failed)
                    logger.warning("packed %s as it is: --transcode cannot decode it",
                                   pending.failed)
                label = str(source.index.label(i)).encode()
                members = [(ext, _member(tar, f"{key}.{ext}", data), len(data), f"{key}.{ext}")]
                members.append(("cls", _member(tar, f"{key}.cls", label), len(label), f"{key}.cls"))
                rows.append(members)
                pending = next(samples, None)
        blob = buffer.getvalue()
        _write(fs, f"{root}/{name}", blob)
        _write(fs, index_url_of(f"{root}/{name}"), write_dali_index(rows).encode())
        shards.append({"url": name, "nsamples": len(rows), "bytes": len(blob),
                       "start": first, "stop": first + len(rows)})
        _write(fs, f"{root}/{MANIFEST}", _manifest(shards, source.classes, plan).encode())
        report.written_shards += 1
        if progress is not None:
            report.shards, report.samples = len(shards), shards[-1]["stop"]
            progress(report, len(source))
    report.shards, report.samples = len(shards), sum(s["nsamples"] for s in shards)
    report.bytes = sum(s["bytes"] for s in shards)
    report.urls = [fs.unstrip_protocol(f"{root}/{s['url']}") for s in shards]
    if not shards:
        _write(fs, f"{root}/{MANIFEST}", _manifest(shards, source.classes, plan).encode())
    return report


def _manifest(shards: list[dict[str, Any]], classes: Sequence[str], plan: dict[str, Any]) -> str:
    return json.dumps({
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "shardlist": [{"url": s["url"], "nsamples": s["nsamples"]} for s in shards],
        "fastload": {"plan": plan, "classes": list(classes), "shards": shards},
    }, indent=1)


def _write(fs: Any, path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all where the filesystem can rename."""
    with storage_errors("write", fs.unstrip_protocol(path)):
        if isinstance(fs, fsspec.implementations.local.LocalFileSystem):
            tmp = f"{path}.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            fs.pipe_file(path, data)


def _check_keys(keys: Sequence[str], where: str) -> None:
    """Raise ConfigError if two samples would share a key (a reader would merge them)."""
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise ConfigError(f"two files of {where} map to the sample key {key!r}; rename one")
        seen.add(key)
