"""A shard downloaded into a file (fastload.cache.shardfetch, NOTE [streamed ranges]): from
moto's S3 server, directly and behind latency::, its ranges streamed into the file in pieces;
from a local file in threads; the same bytes every way, the requests counted on the server,
an object shorter than its index says refused, naming it."""

from __future__ import annotations

import os

import fsspec
import fsspec.asyn
import pytest
import s3fs

from fastload.cache.cachedir import CacheDir
from fastload.cache.shardfetch import download_ranges
from fastload.cache.shardfiles import ShardFiles
from fastload.io.streams import CHUNK_BYTES, range_chunks
from tests.fixtures.s3 import upload_folder

pytestmark = pytest.mark.timeout(120)

BUCKET = "fastload-download"
SIZE = 5 * CHUNK_BYTES + 12_345  # parts of 2.5 pieces: pieces end inside and at a part's end
PART = 5 * CHUNK_BYTES // 2


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> tuple[bytes, os.PathLike]:
    root = tmp_path_factory.mktemp("download")
    data = os.urandom(SIZE)
    (root / "shard-000000.tar").write_bytes(data)
    return data, root


@pytest.fixture(scope="module")
def remote(s3_options, shard) -> str:
    return upload_folder(s3_options, shard[1], f"s3://{BUCKET}") + "/shard-000000.tar"


def download(fs, path: str, size: int, tmp_path) -> tuple[bytes, int]:
    files = ShardFiles(CacheDir(tmp_path / "cache", create=True))
    name, fd = files.new_temp(size)
    try:
        requests = download_ranges(fs, path, size, fd, part=PART)
        return (files.path / name).read_bytes(), requests
    finally:
        os.close(fd)


@pytest.mark.parametrize("chain", ["s3", "latency::s3"])
def test_a_shard_from_s3_is_streamed_into_the_file_whole(chain, remote, s3_options, s3_server,
                                                          shard, tmp_path):
    url = remote if chain == "s3" else f"latency::{remote}"
    options = {"s3": s3_options, "latency": {"latency": 0.005}} if chain != "s3" else s3_options
    fs, path = fsspec.core.url_to_fs(url, **options)
    s3_server.reset_counts()
    got, requests = download(fs, path, SIZE, tmp_path)
    assert got == shard[0]
    assert requests == 3 == s3_server.count("GET", remote.removeprefix("s3://"))


def test_s3_ranges_arrive_in_pieces_of_at_most_a_chunk(remote, s3_options, shard):
    fs = s3fs.S3FileSystem(**s3_options)

    async def pieces():
        return [p async for p in range_chunks(fs, remote, 100, 100 + 3 * CHUNK_BYTES)]

    got = fsspec.asyn.sync(fs.loop, pieces)
    assert len(got) >= 3 and all(len(p) <= CHUNK_BYTES for p in got)
    assert b"".join(got) == shard[0][100:100 + 3 * CHUNK_BYTES]


def test_a_local_shard_is_copied_by_threads_and_a_sync_target_in_one_piece(shard, tmp_path):
    data, root = shard
    local = str(root / "shard-000000.tar")
    assert download(fsspec.filesystem("file"), local, SIZE, tmp_path / "a")[0] == data
    fs, path = fsspec.core.url_to_fs(f"latency::file://{local}", latency={"latency": 0})
    fs.reset_counts()
    assert download(fs, path, SIZE, tmp_path / "b") == (data, 3)
    assert fs.requests["cat_file"] == 3


@pytest.mark.parametrize("chain", ["s3", "latency::s3"])
def test_an_object_shorter_than_its_index_says_is_refused_by_name(chain, remote, s3_options,
                                                                  tmp_path):
    url = remote if chain == "s3" else f"latency::{remote}"
    options = {"s3": s3_options, "latency": {"latency": 0}} if chain != "s3" else s3_options
    fs, path = fsspec.core.url_to_fs(url, **options)
    shorter = r"shard-000000\.tar came back as .* shorter than its indexed size"
    with pytest.raises(OSError, match=shorter):
        download(fs, path, SIZE + 1000, tmp_path)


def test_a_stalled_store_ends_the_download_at_its_deadline_naming_the_bytes(
        remote, s3_options, shard, tmp_path):
    fs, path = fsspec.core.url_to_fs(f"latency::{remote}", s3=s3_options,
                                     latency={"latency": 0.001})
    files = ShardFiles(CacheDir(tmp_path / "cache", create=True))
    name, fd = files.new_temp(SIZE)
    fs.hold()
    try:
        stalled = r"bytes 0-2621440 of .*shard-000000\.tar took over 0\.5 s"
        with pytest.raises(TimeoutError, match=stalled):
            download_ranges(fs, path, SIZE, fd, part=PART, deadline=0.5)
    finally:
        fs.release()
        os.close(fd)
    assert download(fs, path, SIZE, tmp_path / "again") == (shard[0], 3)
