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
report: it fails in the pipeline as it would unpacked). The tars are plain POSIX (pax) tar
files, byte for byte what ``tarfile`` (and so webdataset's own ``TarWriter``) makes of them.
Beside each shard is its DALI index (``x.idx``, ``wds2idx``'s v1.2 format, for DALI's
reader's ``index_paths``: tests/test_dali_shards.py reads with it; :class:`~fastload.TarShards`
then reads no headers) and its labels file (``x.labels``, NOTE [the labels file]: indexing then
reads no label members either), and in ``dst`` a ``shards.json`` in wids' shard-index format
(``__kind__: wids-shard-index-v1``, ``shardlist`` of ``url``/``nsamples``) with fastload's
own fields under ``"fastload"``: the classes, the source, and each finished shard's sample
range.

A shard is streamed to a file as its samples come (NOTE [pack's tar bytes] in
:mod:`fastload.data.pack_tar`): a local ``dst`` gets it under a temporary name beside its
final one, fsynced and renamed when it is whole; a remote one gets a local spool file in the
temporary directory, uploaded whole (object stores make it visible at close) and removed.
The data of a local source file is copied by the kernel (``copy_file_range``) without
entering Python; other sources are read ahead by a thread pool within a memory budget
(:mod:`fastload.data.pack_read`). Finishing a shard (fsync and rename, or upload; its ``.idx``
and ``.labels``; ``shards.json`` rewritten) runs in a helper thread while the next shard is
written. A second run with the same arguments continues after the last shard ``shards.json``
recorded (a shard whose file is missing or of another size is written again). So a pack interrupted
at any point resumes, and the shards are the same as an uninterrupted run's.

Example::

    >>> report = pack("s3://bucket/train", "s3://bucket/train-shards", shard_size=256e6)
    >>> report.shards, report.samples
    (147, 1281167)
"""

from __future__ import annotations

import json
import logging
import os
import re
import tarfile
import tempfile
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import fsspec

from fastload.data.images import ImageFolder
from fastload.data.pack_read import Sample, open_files, read_ahead
from fastload.data.pack_tar import ShardFile
from fastload.data.shard_labels import labels_url_of, write_labels
from fastload.data.tarfiles import index_url_of, write_dali_index
from fastload.data.transcode import Transcode
from fastload.errors import ConfigError
from fastload.io.errors import storage_errors
from fastload.io.origin import with_timeouts

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST", "PackReport", "pack"]

MANIFEST = "shards.json"


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


def _fits(offset: int, size: int, shard_size: float) -> bool:
    """Whether a sample of ``size`` image bytes (and its label) still fits a shard now at
    ``offset``: two headers (and a pax header's two blocks for a long name), the padded data,
    the end-of-archive blocks, rounded up to tar's record of 10,240 bytes."""
    block = tarfile.BLOCKSIZE
    end = offset + 4 * block + (size + block - 1) // block * block + block + 2 * block
    return -(-end // tarfile.RECORDSIZE) * tarfile.RECORDSIZE <= shard_size


def _keys(source: ImageFolder) -> Callable[[str], tuple[str, str]]:
    """``key_of(path)``: the member key and image extension of the sample at ``path``, its
    path below the root (without the extension, dots made ``_``: webdataset's key ends at
    the first dot)."""
    root = source.storage.root if source.index.prefix else ""

    def key_of(path: str) -> tuple[str, str]:
        inside = root and path.startswith(root)
        relative = (path[len(root):] if inside else path).lstrip("/")
        stem, dot, ext = relative.rpartition(".")
        return (stem or relative).replace(".", "_"), (ext.lower() if dot else "jpg")

    return key_of


def _samples(source: ImageFolder, indices: range,
             transcode: Transcode | None) -> Generator[Sample, None, None]:
    """The source's samples for the writer: open local files to copy where the bytes go
    through unchanged (NOTE [what pack writes]), else their bytes read ahead."""
    plain = type(source).read_bytes is ImageFolder.read_bytes  # a subclass may alter bytes
    if transcode is None and plain and source.cache is None and source.storage.is_local:
        return open_files(source, indices)
    return read_ahead(source, indices, transcode)


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
    the shards (images' longer side at most 256 pixels). Raises a
    :class:`~fastload.errors.StorageError` (or a sample error naming the file) when a read or
    a write fails; what was finished stays and a rerun continues from it.
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
    key_of = _keys(source)
    _check_keys([key_of(path)[0] for path in map(source.index.path, range(len(source)))],
                plan["source"])
    done = _done_shards(fs, root, _load_manifest(fs, f"{root}/{MANIFEST}"), plan)
    report = PackReport(dst, resumed_from=len(done))
    out = _Destination(fs, root, _manifest_writer(source.classes, plan), done, source.index.label)
    publisher = _Publisher(out)

    def finished(entry: dict[str, Any] | None) -> None:
        if entry is not None:
            report.written_shards += 1
            report.shards, report.samples = len(done) + report.written_shards, entry["stop"]
            if progress is not None:
                progress(report, len(source))

    samples = _samples(source, range(done[-1]["stop"] if done else 0, len(source)), transcode)
    try:
        pending = next(samples, None)
        while pending is not None:
            name = f"{prefix}-{len(done) + out.started:06d}.tar"
            shard, rows, first = out.start(name), [], pending.index
            try:
                while pending is not None and (
                        not rows or _fits(shard.offset, pending.nbytes, shard_size)):
                    rows.append(_add(shard, source, key_of, pending, report))
                    pending = next(samples, None)
            except BaseException:
                shard.discard()
                raise
            finished(publisher.publish(shard, name, rows, first))
        finished(publisher.wait())
    finally:
        samples.close()
        publisher.close()  # a shard written whole before an error is still finished
    report.shards, report.samples = len(out.shards), sum(s["nsamples"] for s in out.shards)
    report.bytes = sum(s["bytes"] for s in out.shards)
    report.urls = [fs.unstrip_protocol(f"{root}/{s['url']}") for s in out.shards]
    if not out.shards:
        out.write_manifest()
    return report


def _add(shard: ShardFile, source: ImageFolder, key_of: Callable[[str], tuple[str, str]],
         sample: Sample, report: PackReport) -> list[tuple[str, int, int, str]]:
    """Write ``sample`` (its image and its label) into ``shard``; its DALI index row."""
    i = sample.index
    key, ext = key_of(sample.path)
    ext = sample.ext or ext
    report.transcoded += sample.ext is not None
    if sample.failed is not None:
        report.not_decodable.append(sample.failed)
        logger.warning("packed %s as it is: --transcode cannot decode it", sample.failed)
    if sample.data is not None:
        offset = shard.add(f"{key}.{ext}", sample.data)
    else:
        try:
            offset = shard.add_file(f"{key}.{ext}", sample.fd, sample.size, sample.path)
        except EOFError as exc:
            raise source.unreadable(i, OSError(str(exc))) from exc
    label = str(source.index.label(i)).encode()
    return [(ext, offset, sample.nbytes, f"{key}.{ext}"),
            ("cls", shard.add(f"{key}.cls", label), len(label), f"{key}.cls")]


class _Destination:
    """Where shards go: each is written to a local file (beside its final name, or in the
    temporary directory for a remote ``dst``), then, in a helper thread while the next one
    is written, made durable and visible (fsync + rename, or an upload), with its ``.idx``
    and ``.labels``, and recorded in ``shards.json``."""

    def __init__(self, fs: Any, root: str, manifest: Callable[[list[dict[str, Any]]], str],
                 done: list[dict[str, Any]], label_of: Callable[[int], int]):
        self.fs, self.root, self.manifest, self.label_of = fs, root, manifest, label_of
        self.local = isinstance(fs, fsspec.implementations.local.LocalFileSystem)
        if self.local:
            _remove_stale_temps(root)
        self.shards = list(done)
        """The finished shards' manifest entries, in order."""
        self.started = 0
        """Shards started by this run."""

    def start(self, name: str) -> ShardFile:
        """The file shard ``name`` is written to."""
        self.started += 1
        if self.local:
            where = f"{self.root}/{name}.tmp-{os.getpid()}"
        else:  # a name of its own: two packs in one process may write the same shard name
            with storage_errors("create a spool file for", tempfile.gettempdir()):
                fd, where = tempfile.mkstemp(prefix=f"fastload-pack-{os.getpid()}-",
                                             suffix=f"-{name}")
            os.close(fd)
        return ShardFile(where, shown_as=self.fs.unstrip_protocol(f"{self.root}/{name}"))

    def finish(self, shard: ShardFile, name: str, rows: list[Any], first: int) -> dict[str, Any]:
        """Make ``shard`` durable and visible as ``name``, then record it; its entry."""
        path = f"{self.root}/{name}"
        try:
            size = shard.finish(sync=self.local)
            with storage_errors("write", self.fs.unstrip_protocol(path)):
                if self.local:
                    os.replace(shard.path, path)
                else:
                    self.fs.put_file(shard.path, path)
        finally:
            shard.discard()  # removes the spooled copy (a renamed file is not there any more)
        index_text = write_dali_index(rows)
        _write(self.fs, index_url_of(path), index_text.encode())
        labels = [self.label_of(i) for i in range(first, first + len(rows))]
        _write(self.fs, labels_url_of(path), write_labels(size, labels, index_text).encode())
        entry = {"url": name, "nsamples": len(rows), "bytes": size,
                 "start": first, "stop": first + len(rows)}
        self.shards.append(entry)
        self.write_manifest()
        return entry

    def write_manifest(self) -> None:
        _write(self.fs, f"{self.root}/{MANIFEST}", self.manifest(self.shards).encode())


class _Publisher:
    """Finishes written shards (:meth:`_Destination.finish`) in a helper thread, one at a
    time and in order, while the caller writes the next one."""

    def __init__(self, out: _Destination):
        self.out = out
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fastload-pack-publish")
        self.finishing: Future[dict[str, Any]] | None = None

    def publish(self, shard: ShardFile, name: str, rows: list[Any],
                first: int) -> dict[str, Any] | None:
        """Hand ``shard`` over once the previous one is finished; returns that one's entry
        (None at the first), or raises its error."""
        try:
            previous = self.wait()
        except BaseException:
            shard.discard()
            raise
        self.finishing = self.pool.submit(self.out.finish, shard, name, rows, first)
        return previous

    def wait(self) -> dict[str, Any] | None:
        """The entry of the shard being finished once it is (None if there is none)."""
        finishing, self.finishing = self.finishing, None
        return None if finishing is None else finishing.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _manifest_writer(classes: Sequence[str],
                     plan: dict[str, Any]) -> Callable[[list[dict[str, Any]]], str]:
    def manifest(shards: list[dict[str, Any]]) -> str:
        return json.dumps({
            "__kind__": "wids-shard-index-v1",
            "wids_version": 1,
            "shardlist": [{"url": s["url"], "nsamples": s["nsamples"]} for s in shards],
            "fastload": {"plan": plan, "classes": list(classes), "shards": shards},
        }, indent=1)

    return manifest


def _remove_stale_temps(root: str) -> None:
    """Delete what an earlier pack killed mid-shard left in ``root``: its own temp files
    (``<shard, .idx, .labels or shards.json>.tmp-<pid>``, the names this module writes)
    whose process is gone. Anything else, and a live process's temps, are left alone."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        match = _TEMP.fullmatch(name)
        if match is None or _alive(int(match.group(2))):
            continue
        try:
            os.unlink(os.path.join(root, name))
            logger.info("removed %s, left by a pack that did not finish (process %s)", name, match.group(2))
        except OSError as exc:  # gone meanwhile, or not ours to remove: left as it is
            logger.debug("could not remove %s: %s", name, exc)


_TEMP = re.compile(r"(.+\.(?:tar|idx|labels)|" + re.escape(MANIFEST) + r")\.tmp-(\d+)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _write(fs: Any, path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all where the filesystem can rename (and
    fsynced before the rename: a recorded shard's files survive a crash)."""
    with storage_errors("write", fs.unstrip_protocol(path)):
        if isinstance(fs, fsspec.implementations.local.LocalFileSystem):
            tmp = f"{path}.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
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
