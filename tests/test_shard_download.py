"""A shard downloaded into a file (fastload.cache.shardfetch, NOTE [streamed ranges]): from
moto's S3 server, directly and behind latency::, its ranges streamed into the file in pieces;
from a local file in threads; the same bytes every way, the requests counted on the server,
an object shorter than its index says refused, naming it; its bytes read while it runs, as
they land (NOTE [reads from a download in progress])."""

from __future__ import annotations

import os
import threading

import fsspec
import fsspec.asyn
import pytest
import s3fs

from fastload.cache.cachedir import CacheDir
from fastload.cache.shardfetch import RESUMES, Landing, download_ranges
from fastload.cache.shardfiles import ShardFiles
from fastload.io.streams import CHUNK_BYTES, StreamCutError, range_chunks
from fastload.io.versions import ObjectChangedError, version_of
from tests.contracts.shard_cache import wait_for
from tests.fixtures.cutting_proxy import CuttingProxy
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


def new_target(tmp_path, size: int = SIZE) -> tuple[ShardFiles, str, int]:
    """A shard store's directory below ``tmp_path`` and a new download file in it."""
    files = ShardFiles(CacheDir(tmp_path / "cache", create=True))
    return (files, *files.new_temp(size))


def download(fs, path: str, size: int, tmp_path) -> tuple[bytes, int]:
    files, name, fd = new_target(tmp_path, size)
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
    files, name, fd = new_target(tmp_path)
    fs.hold()
    try:
        stalled = (r"bytes 0-2621440 of .*shard-000000\.tar: no byte came for 0\.5 s, 4 times: "
                   r"the store is down or stalled")
        with pytest.raises(TimeoutError, match=stalled):
            download_ranges(fs, path, SIZE, fd, part=PART, deadline=0.5)
    finally:
        fs.release()
        os.close(fd)
    assert download(fs, path, SIZE, tmp_path / "again") == (shard[0], 3)


def _reader(landing: Landing, offset: int, length: int) -> tuple[threading.Thread, dict]:
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(data=landing.read(offset, length)))
    thread.start()
    return thread, out


def test_a_landing_answers_a_range_once_its_bytes_landed_and_never_after_close(tmp_path):
    data = os.urandom(10_000)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        landing = Landing(fd, len(data), part=4096, in_flight=1)  # parts 0-4095, 4096-8191, ...
        assert landing.read(5000, 10) is None  # part 1 not requested yet: not waited for
        assert landing.read(9990, 20) is None  # past the end
        within, out = _reader(landing, 100, 50)
        spanning, out2 = _reader(landing, 4000, 200)  # parts 0 and 1
        os.pwrite(fd, data[:1000], 0)
        landing.landed(0, 1000)
        within.join(60)
        assert out["data"] == data[100:150]
        os.pwrite(fd, data[1000:4096], 1000)
        landing.landed(0, 4096)
        assert landing.read(4000, 96) == data[4000:4096]
        landing.begin(1)  # (the spanning read gave up on part 1: it answered None)
        spanning.join(60)
        assert out2["data"] is None
        waiting, out3 = _reader(landing, 4000, 200)
        wait_for(lambda: landing.readers == 1, "the read to wait for part 1")
        assert waiting.is_alive()  # part 1 on its way, 104 of its bytes not landed
        os.pwrite(fd, data[4096:4300], 4096)
        landing.landed(1, 4300)
        waiting.join(60)
        assert out3["data"] == data[4000:4200]
        landing.begin(2)
        last, out4 = _reader(landing, 9000, 100)
        landing.close()
        last.join(60)
        assert out4["data"] is None and landing.closed
        assert landing.read(100, 50) is None  # the file may be closed now: never read after
    finally:
        os.close(fd)


def test_a_read_whose_bytes_landed_reads_them_though_the_download_closes_first(tmp_path):
    """The download's last part lands and the download closes at once, before the waiting
    read wakes: the read still gets its bytes, and close returns only after it left."""
    data = os.urandom(5000)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        landing = Landing(fd, len(data), part=4096, in_flight=2)
        reads = [_reader(landing, 4000, 1000) for _ in range(3)]
        wait_for(lambda: landing.readers == 3, "three reads to wait for their bytes")
        os.pwrite(fd, data, 0)
        landing.landed(0, 4096)
        landing.landed(1, 5000)
        landing.close()  # (the reads may not have run since they were woken)
        assert landing.readers == 0
        for thread, out in reads:
            thread.join(60)
            assert out["data"] == data[4000:5000]
    finally:
        os.close(fd)


def test_reads_during_a_download_from_s3_wait_for_their_bytes_and_get_them(
        remote, s3_options, shard, tmp_path):
    fs, path = fsspec.core.url_to_fs(f"latency::{remote}", s3=s3_options,
                                     latency={"latency": 0.001})
    files, name, fd = new_target(tmp_path)
    landing = Landing(fd, SIZE, part=PART, in_flight=2)
    ranges = [(10, 1000), (PART - 500, 1000), (2 * PART + 7, 5000)]  # parts 0, 0-1, 2
    fs.hold()  # every request waits: nothing lands until the store answers
    done: dict = {}
    downloading = threading.Thread(
        target=lambda: done.update(n=download_ranges(fs, path, SIZE, fd, part=PART,
                                                     in_flight=2, landing=landing)))
    try:
        downloading.start()
        readers = [_reader(landing, o, n) for o, n in ranges[:2]]
        assert landing.read(*ranges[2]) is None  # part 2 waits for a place among the two
        wait_for(lambda: landing.readers == 2, "two reads to wait for the store")
        assert all(t.is_alive() for t, _ in readers)  # waiting for the store, not given up
        fs.release()
        for thread, _ in readers:
            thread.join(60)
        downloading.join(60)
        assert [out["data"] for _, out in readers] == [shard[0][o:o + n] for o, n in ranges[:2]]
        assert done["n"] == 3
        assert landing.read(*ranges[2]) == shard[0][ranges[2][0]:sum(ranges[2])]
    finally:
        fs.release()
        downloading.join(60)
        os.close(fd)


@pytest.mark.parametrize("chain", ["s3", "latency::s3"])
def test_each_range_asks_s3_for_the_indexed_version(chain, remote, s3_options, shard, tmp_path):
    """NOTE [the version asked with each range]: If-Match with the version's ETag."""
    url = remote if chain == "s3" else f"latency::{remote}"
    options = {"s3": s3_options, "latency": {"latency": 0}} if chain != "s3" else s3_options
    fs, path = fsspec.core.url_to_fs(url, **options)
    version = version_of(s3fs.S3FileSystem(**s3_options).info(remote))
    files, name, fd = new_target(tmp_path)
    try:
        assert download_ranges(fs, path, SIZE, fd, part=PART, version=version) == 3
        assert (files.path / name).read_bytes() == shard[0]
        other = f'{SIZE}:"0123456789abcdef0123456789abcdef"'
        with pytest.raises(ObjectChangedError, match=r"no longer the version .* indexed"):
            download_ranges(fs, path, SIZE, fd, part=PART, version=other)
    finally:
        os.close(fd)


@pytest.fixture
def proxy(s3_server):
    with CuttingProxy(("127.0.0.1", s3_server.port)) as proxy:
        yield proxy


def _through(proxy, s3_options, remote: str, chain: str):
    """The shard's filesystem and path, its connections through ``proxy``."""
    proxied = {**s3_options, "endpoint_url": proxy.url}
    url = remote if chain == "s3" else f"latency::{remote}"
    options = {"s3": proxied, "latency": {"latency": 0}} if chain != "s3" else proxied
    return fsspec.core.url_to_fs(url, **options)


@pytest.mark.parametrize("chain", ["s3", "latency::s3"])
def test_a_part_whose_connection_breaks_midway_is_asked_for_its_rest(
        chain, proxy, remote, s3_options, s3_server, shard, tmp_path, caplog):
    """NOTE [a range that broke off]: a connection reset 1 MB into a part's body (a real TCP
    reset, by a proxy in front of moto): the download asks for the rest of that part only,
    with the version, and the file is whole."""
    fs, path = _through(proxy, s3_options, remote, chain)
    version = version_of(s3fs.S3FileSystem(**s3_options).info(remote))
    files, name, fd = new_target(tmp_path)
    s3_server.reset_counts()
    proxy.cut(after=1 << 20)
    try:
        requests = download_ranges(fs, path, SIZE, fd, part=PART, in_flight=1, version=version)
    finally:
        os.close(fd)
    assert proxy.cuts == 1
    assert (files.path / name).read_bytes() == shard[0]
    ranges = s3_server.get_ranges(remote.removeprefix("s3://"))
    assert requests == 4 == len(ranges)  # three parts, one of them asked twice
    assert ranges[0] == f"bytes=0-{PART - 1}"
    resumed = int(ranges[1].removeprefix("bytes=").split("-")[0])
    assert 0 < resumed <= 1 << 20 and ranges[1] == f"bytes={resumed}-{PART - 1}"
    assert "the connection broke off" in caplog.text and f"asking for bytes {resumed}-" in caplog.text


def test_a_part_that_keeps_breaking_fails_the_download_naming_it(
        proxy, remote, s3_options, shard, tmp_path):
    fs, path = _through(proxy, s3_options, remote, "s3")
    files, name, fd = new_target(tmp_path)
    proxy.cut(after=100_000, times=RESUMES + 1)
    try:
        with pytest.raises(StreamCutError, match=rf"shard-000000\.tar: the connection broke off "
                                                 rf".* {RESUMES + 1} times"):
            download_ranges(fs, path, SIZE, fd, part=PART, in_flight=1)
    finally:
        os.close(fd)
    assert proxy.cuts == RESUMES + 1
    proxy.cut(after=0, times=0)
    assert download(fs, path, SIZE, tmp_path / "again") == (shard[0], 3)


def test_a_slow_link_that_keeps_sending_is_not_a_stall(proxy, remote, s3_options, shard,
                                                       tmp_path):
    """A part that takes longer than the deadline while its bytes keep coming (a slow or
    shared link: here 500 KB/s a connection, 5.2 s a part, against a deadline of 3 s, where
    the proxy's pieces of 64 KiB come every 0.13 s) is downloaded: the deadline bounds a wait
    for the next bytes, not a whole part."""
    fs, path = _through(proxy, s3_options, remote, "s3")
    files, name, fd = new_target(tmp_path)
    proxy.limit(500_000)
    try:
        assert download_ranges(fs, path, SIZE, fd, part=PART, deadline=3.0) == 3
    finally:
        os.close(fd)
    assert (files.path / name).read_bytes() == shard[0]


def test_a_connection_that_stalls_midway_is_asked_again_for_the_rest(
        proxy, remote, s3_options, s3_server, shard, tmp_path):
    """A connection that stops sending 1 MB into a part (open, silent): after the deadline
    (3 s) with no byte, the rest of the part is asked for on a new connection."""
    fs, path = _through(proxy, s3_options, remote, "s3")
    files, name, fd = new_target(tmp_path)
    s3_server.reset_counts()
    proxy.cut(after=1 << 20, how="stall")
    try:
        assert download_ranges(fs, path, SIZE, fd, part=PART, in_flight=1, deadline=3.0) == 4
    finally:
        os.close(fd)
    assert proxy.cuts == 1 and (files.path / name).read_bytes() == shard[0]
    resumed = s3_server.get_ranges(remote.removeprefix("s3://"))[1]
    assert resumed.endswith(f"-{PART - 1}") and not resumed.startswith("bytes=0-")
