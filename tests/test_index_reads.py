"""Indexing remote shards in few requests (NOTE [reading through small gaps]): byte ranges of
one file merged across small gaps on a remote store and read exactly on a local disk, the
tar header walk reading through small samples but not large ones, and TarShards indexing
shards written by ``fastload pack`` on moto's S3 server from their labels files (NOTE [the
labels file]), or with one merged label read a shard without them, and never trusting a
labels file or an index file that does not match its shard (NOTE [an index file that is not
the shard's])."""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path

import fsspec
import numpy as np
import pytest

from fastload import TarShards
from fastload.data.pack import pack
from fastload.data.tarfiles import WALK_BLOCK, walk_members, write_dali_index
from fastload.io.ranges import READ_THROUGH, read_ranges

pytestmark = pytest.mark.timeout(300)

BUCKET = "fastload-indexreads"


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    data = random.Random(7).randbytes(3 * READ_THROUGH)
    path = tmp_path_factory.mktemp("ranges") / "blob.bin"
    path.write_bytes(data)
    return path, data


RANGES = [(1_500_000, 7), (10, 5), (600_000, 0), (10, 5), (12, 40), (2_400_000, 145_000)]
"""Out of order, a repeat, an empty range, an overlapping one; gaps under 1 MiB."""


def test_local_ranges_are_read_exactly_in_the_callers_order(blob):
    path, data = blob
    got = read_ranges(fsspec.filesystem("file"), str(path), RANGES)
    assert got == [data[o:o + n] for o, n in RANGES]
    assert read_ranges(fsspec.filesystem("file"), str(path), []) == []


def test_a_range_past_the_end_of_the_file_raises_naming_it(blob):
    path, data = blob
    with pytest.raises(OSError, match="blob.bin came back as 3 bytes: the file is shorter"):
        read_ranges(fsspec.filesystem("file"), str(path), [(0, 4), (len(data) - 3, 5)])


def test_remote_ranges_with_small_gaps_are_one_request(blob, s3_options, s3_server):
    path, data = blob
    fs = fsspec.filesystem("s3", **s3_options)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    fs.put_file(str(path), f"{BUCKET}/blob.bin")
    s3_server.reset_counts()
    assert read_ranges(fs, f"{BUCKET}/blob.bin", RANGES) == [data[o:o + n] for o, n in RANGES]
    assert s3_server.count("GET", f"{BUCKET}/blob.bin") == 1
    far = [(0, 4), (len(data) - 4, 4)]  # 3 MiB apart: two requests, not the bytes between
    s3_server.reset_counts()
    assert read_ranges(fs, f"{BUCKET}/blob.bin", far) == [data[:4], data[-4:]]
    assert s3_server.count("GET", f"{BUCKET}/blob.bin") == 2


def _tar(samples: int, image_bytes: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for ext, payload in (("cls", str(i % 7).encode()), ("jpg", os.urandom(image_bytes))):
                info = tarfile.TarInfo(f"s/{i:05d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def _walk(data: bytes, through: int) -> tuple[list[tuple[str, int, int, bytes | None]], int, int]:
    """The members, the reads and the bytes read of one walk."""
    reads = [0, 0]

    def read_at(offset: int, length: int) -> bytes:
        reads[0] += 1
        reads[1] += min(length, len(data) - offset)
        return data[offset:offset + length]

    members = [(m.name, m.offset, m.size, m.data)
               for m in walk_members(read_at, len(data), keep=lambda n: n.endswith(".cls"),
                                     through=through)]
    return members, reads[0], reads[1]


def test_the_header_walk_reads_through_small_samples():
    data = _tar(40, 100_000)
    exact, exact_reads, _ = _walk(data, WALK_BLOCK)
    through, through_reads, _ = _walk(data, READ_THROUGH)
    assert through == exact and len(exact) == 80
    assert [d for _, _, _, d in exact if d is not None] == [str(i % 7).encode() for i in range(40)]
    assert exact_reads >= 40  # a read a sample, each 64 KB
    assert through_reads <= 40 // 8 + 2  # 1 MiB holds ten 100 KB samples


def test_the_header_walk_does_not_read_through_large_samples():
    data = _tar(6, 3 * READ_THROUGH)
    exact, _, _ = _walk(data, WALK_BLOCK)
    through, reads, read_bytes = _walk(data, READ_THROUGH)
    assert through == exact
    assert reads == 7 and read_bytes <= 7 * WALK_BLOCK  # 64 KB a sample and the end, not 1 MiB


def _packed_on_s3(jpeg_root, s3_options, tmp_path, name: str):
    local = pack(str(jpeg_root), str(tmp_path / "packed"), shard_size=150_000)
    fs = fsspec.filesystem("s3", **s3_options)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    remote = pack(str(jpeg_root), f"s3://{BUCKET}/{name}", shard_size=150_000,
                  dst_options=s3_options)
    assert len(remote.urls) >= 3
    return local, remote, fs


def _same_index(ds: TarShards, here: TarShards) -> None:
    assert len(ds) == len(here) == 48
    for name in ("offsets", "lengths", "labels", "shards"):
        assert np.array_equal(getattr(ds.index, name), getattr(here.index, name)), name


def test_packed_shards_on_s3_index_from_their_labels_files(jpeg_root, s3_options, s3_server,
                                                           tmp_path):
    local, remote, _ = _packed_on_s3(jpeg_root, s3_options, tmp_path, "labelled")
    text = (tmp_path / "packed" / Path(local.urls[0]).name).with_suffix(".labels").read_text()
    for written in (tmp_path / "packed").glob("*.labels"):
        written.unlink()  # the local reference reads the label members themselves
    s3_server.reset_counts()
    _same_index(TarShards(remote.urls, size=32, storage_options=s3_options),
                TarShards(local.urls, size=32))
    for url in remote.urls:
        path = url.removeprefix("s3://")
        # one read of the shard: its first and last members' headers, merged (NOTE [an index
        # file that is not the shard's]); not its labels, not its images
        assert s3_server.count("GET", path) == 1
        assert s3_server.count("GET", path.removesuffix(".tar") + ".idx") == 1
        assert s3_server.count("GET", path.removesuffix(".tar") + ".labels") == 1
    head, *labels = text.splitlines()
    assert head.startswith("fastload-labels v2 ")
    assert [int(x) for x in labels] == TarShards(local.urls[:1], size=32).targets.tolist()


def test_without_labels_files_the_labels_are_one_merged_read_a_shard(jpeg_root, s3_options,
                                                                     s3_server, tmp_path):
    local, remote, fs = _packed_on_s3(jpeg_root, s3_options, tmp_path, "unlabelled")
    for url in remote.urls:
        fs.rm_file(url.removesuffix(".tar") + ".labels")
    s3_server.reset_counts()
    _same_index(TarShards(remote.urls, size=32, storage_options=s3_options),
                TarShards(local.urls, size=32))
    for url in remote.urls:
        path = url.removeprefix("s3://")
        # its labels and the two headers checked: one merged read, not one each
        assert s3_server.count("GET", path) == 1


@pytest.mark.parametrize("damage", ["other shard", "cut short", "not labels"])
def test_a_labels_file_that_does_not_match_its_shard_is_named_and_not_used(
        damage, jpeg_root, tmp_path, caplog):
    paths = [u.removeprefix("file://") for u in
             pack(str(jpeg_root), str(tmp_path / "packed"), shard_size=150_000).urls]
    labels = Path(paths[0]).with_suffix(".labels")
    head, *rows = labels.read_text().splitlines()
    _, _, size, count, _ = head.split()
    if damage == "other shard":  # labels of a shard since rewritten by another tool
        shifted = "".join(f"{(int(r) + 1) % 9}\n" for r in rows)
        text = f"fastload-labels v1 {int(size) + 512} {count}\n" + shifted
    elif damage == "cut short":
        text = "\n".join([head, *rows[:-2]]) + "\n"
    else:
        text = "3\n1\n"
    labels.write_text(text)
    with caplog.at_level("WARNING", logger="fastload.data.shard_build"):
        ds = TarShards(paths, size=32)
    assert f"{labels}" in caplog.text and "read from the shard instead" in caplog.text
    assert ds.targets[:len(rows)].tolist() == [int(r) for r in rows]  # the members' labels
    for path in paths:
        Path(path).with_suffix(".labels").unlink()
    assert np.array_equal(ds.targets, TarShards(paths, size=32).targets)


def _reversed(path: Path) -> list[list[tuple[str, int, int, str]]]:
    """Write the shard at ``path`` again with its samples in reverse order (as another tool
    might: the same size); the rows of its new index."""
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    keys = list(dict.fromkeys(m.name.split(".")[0] for m, _ in members))
    again = io.BytesIO()
    with tarfile.open(fileobj=again, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key in reversed(keys):
            for m, data in members:
                if m.name.split(".")[0] == key:
                    tar.addfile(m, io.BytesIO(data))
    assert len(again.getvalue()) == path.stat().st_size  # the same size, the same count
    path.write_bytes(again.getvalue())
    with tarfile.open(path) as tar:
        return [[(m.name.split(".", 1)[1], m.offset_data, m.size, m.name)
                 for m in tar.getmembers() if m.name.split(".")[0] == key]
                for key in reversed(keys)]


def test_a_shard_written_again_in_another_order_does_not_get_its_old_labels(
        jpeg_root, tmp_path, caplog):
    """NOTE [the labels file]: the same samples in another order keep the shard's size and
    count; the stale labels file must not be served (every label would be wrong)."""
    [url] = pack(str(jpeg_root), str(tmp_path / "packed"), shard_size=1e9).urls
    path = Path(url.removeprefix("file://"))
    labels_before = path.with_suffix(".labels").read_text()
    rows = _reversed(path)  # another tool writes it again, samples reversed, and its index
    path.with_suffix(".idx").write_text(write_dali_index(rows))
    assert path.with_suffix(".labels").read_text() == labels_before  # left as it was
    with caplog.at_level("WARNING", logger="fastload.data.shard_build"):
        ds = TarShards([str(path)], size=32)
    assert "written for another index file" in caplog.text and str(path.with_suffix(".labels")) in caplog.text
    old = [int(x) for x in labels_before.splitlines()[1:]]
    assert ds.targets.tolist() == old[::-1]  # the members' labels, in the new order
    path.with_suffix(".labels").unlink()
    assert np.array_equal(ds.targets, TarShards([str(path)], size=32).targets)


def _members_by_key(path: Path) -> dict[str, tuple[bytes, int]]:
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    return {name.split(".")[0]: (data, int(files[name.split(".")[0] + ".cls"]))
            for name, data in files.items() if name.endswith(".jpg")}


@pytest.mark.parametrize("change", ["reordered", "fewer samples", "v1.1 index, reordered"])
def test_an_index_file_left_beside_a_shard_written_again_is_named_and_not_used(
        change, jpeg_root, tmp_path, caplog):
    """NOTE [an index file that is not the shard's]: every sample must still be its own bytes
    with its own label."""
    [url] = pack(str(jpeg_root), str(tmp_path / "packed"), shard_size=1e9).urls
    path = Path(url.removeprefix("file://"))
    path.with_suffix(".labels").unlink()
    index = path.with_suffix(".idx")
    if change == "fewer samples":
        with tarfile.open(path) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()][:-10]
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for m, data in members:
                tar.addfile(m, io.BytesIO(data))
    else:
        _reversed(path)
    if change.startswith("v1.1"):  # no names: only the headers' sizes can differ
        head, *lines = index.read_text().splitlines()
        v11 = [" ".join(f for i, f in enumerate(line.split()) if i % 4 != 3) for line in lines]
        index.write_text("\n".join([head.replace("v1.2", "v1.1"), *v11]) + "\n")
    with caplog.at_level("WARNING", logger="fastload.data.shard_build"):
        ds = TarShards([str(path)], size=32)
    assert f"{index} does not describe {path}" in caplog.text
    truth = _members_by_key(path)
    assert len(ds) == len(truth)
    for i in range(len(ds)):
        data, label = truth[ds.index.key(i)]
        assert ds.read_bytes(i) == data and ds.targets[i] == label
    index.unlink()
    assert np.array_equal(ds.targets, TarShards([str(path)], size=32).targets)


def test_a_labels_file_of_the_first_version_is_still_read(jpeg_root, tmp_path, caplog):
    paths = [u.removeprefix("file://") for u in
             pack(str(jpeg_root), str(tmp_path / "packed"), shard_size=150_000).urls]
    written = []
    for path in paths:  # as fastload pack wrote them before v2: no digest of the index file
        labels = Path(path).with_suffix(".labels")
        head, *rows = labels.read_text().splitlines()
        _, _, size, count, _ = head.split()
        rows = [str(int(r) + 100) for r in rows]  # labels the members do not hold: seen if used
        labels.write_text("\n".join([f"fastload-labels v1 {size} {count}", *rows]) + "\n")
        written += [int(r) for r in rows]
    with caplog.at_level("WARNING", logger="fastload.data.shard_build"):
        ds = TarShards(paths, size=32)
    assert "labels" not in caplog.text
    assert ds.targets.tolist() == written  # read from the v1 files, not from the members
