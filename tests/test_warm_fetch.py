"""fastload.io.fetch (the reads of `cache warm`) and the async side of latency::."""

from __future__ import annotations

import fsspec
import fsspec.asyn
import pytest
import s3fs

import fastload.testing.latency  # noqa: F401  (registers latency::)
from fastload.errors import ObjectNotFoundError, StorageError
from fastload.io.fetch import AsyncFetcher, InlineFetcher, ThreadFetcher, is_async, open_fetcher


def _files(tmp_path, n=12):
    made = {}
    for i in range(n):
        path = tmp_path / f"{i:03d}.bin"
        path.write_bytes(bytes([i]) * (100 + i))
        made[str(path)] = path.read_bytes()
    return made


def _collect(fetcher, expected: int):
    got = {}
    while len(got) < expected:
        for item in fetcher.results(timeout=5):
            got[item.path] = item
    return got


def _latency(latency: float = 0.001, **target):
    return fsspec.filesystem("latency", target_protocol="file", latency=latency,
                             skip_instance_cache=True, **target)


def test_each_filesystem_gets_its_fetcher(s3_options):
    local = fsspec.filesystem("file")
    assert isinstance(open_fetcher(local, 1), InlineFetcher)
    assert isinstance(open_fetcher(local, 8), ThreadFetcher)
    assert isinstance(open_fetcher(fsspec.filesystem("memory"), 1), ThreadFetcher)
    assert isinstance(open_fetcher(_latency(), 4), AsyncFetcher)
    assert isinstance(open_fetcher(s3fs.S3FileSystem(**s3_options), 4), AsyncFetcher)
    assert is_async(_latency()) and not is_async(local)
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        open_fetcher(local, 0)


@pytest.mark.parametrize("kind", ["inline", "threads", "async"])
def test_a_fetcher_reads_every_path_and_names_what_fails(tmp_path, kind):
    made = _files(tmp_path)
    fs = _latency() if kind == "async" else fsspec.filesystem("file")
    missing = str(tmp_path / "missing.bin")
    with open_fetcher(fs, 1 if kind == "inline" else 4) as fetcher:
        fetcher.submit([*made, missing])
        got = _collect(fetcher, len(made) + 1)
    assert {p: g.data for p, g in got.items() if p != missing} == made
    error = got[missing].error
    assert isinstance(error, ObjectNotFoundError) and "missing.bin" in str(error)
    if kind != "async":  # local reads know the version of the bytes they read
        assert all(g.version for p, g in got.items() if p != missing)


def test_an_async_fetcher_keeps_jobs_requests_in_flight_and_drops_the_queued(tmp_path):
    made = _files(tmp_path, 10)
    fs = _latency(0.5)
    with open_fetcher(fs, 2) as fetcher:
        fetcher.submit(list(made))
        dropped = fetcher.cancel_queued()
        got = _collect(fetcher, 2)
    assert len(dropped) == 8 and set(dropped) | set(got) == set(made)
    assert fs.requests["cat_file"] == 2  # the dropped ones were never requested


def test_closing_an_async_fetcher_cancels_its_requests(tmp_path):
    made = _files(tmp_path, 4)
    fs = _latency(60.0)
    fetcher = open_fetcher(fs, 4)
    fetcher.submit(list(made))
    fetcher.close()  # returns well before the 60 s sleeps would end
    assert fetcher.results(timeout=0) == []


def test_a_thread_fetcher_stops_its_readers(tmp_path):
    import threading

    made = _files(tmp_path, 40)
    with open_fetcher(fsspec.filesystem("file"), 4) as fetcher:
        assert fetcher.window == 32  # local reads go in chunks (NOTE [fetch paths])
        fetcher.submit(list(made))
        got = _collect(fetcher, 40)
    assert len(got) == 40
    assert not [t for t in threading.enumerate() if t.name.startswith("fastload-fetch")]


def test_latency_async_reads_count_like_sync_ones(tmp_path):
    made = _files(tmp_path, 3)
    fs = _latency(0.01)
    path = next(iter(made))
    assert fs.cat_file(path) == made[path]  # the sync call is as it was
    assert fsspec.asyn.sync(fs.loop, fs._cat_file, path) == made[path]
    assert fsspec.asyn.sync(fs.loop, fs._cat_file, path, start=10, end=20) == made[path][10:20]
    assert fs.requests["cat_file"] == 3 and fs.total_requests == 3
    assert fs.loop is fsspec.asyn.get_loop()


def test_latency_over_s3_awaits_the_target_on_its_loop(s3_options, s3_server):
    s3 = s3fs.S3FileSystem(**s3_options)
    s3.mkdir("latency-async")
    s3.pipe_file("latency-async/a.bin", b"abc" * 100)
    fs = fsspec.filesystem("latency", fs=s3, latency=0.001, skip_instance_cache=True)
    assert fs.loop is s3.loop
    s3_server.reset_counts()
    assert fsspec.asyn.sync(fs.loop, fs._cat_file, "latency-async/a.bin", start=0) == b"abc" * 100
    assert s3_server.count("GET", "latency-async/a.bin") == 1
    assert s3_server.count("HEAD", "latency-async/a.bin") == 0
    with pytest.raises(FileNotFoundError):
        fsspec.asyn.sync(fs.loop, fs._cat_file, "latency-async/missing.bin")


def test_an_async_read_of_a_dead_endpoint_is_a_storage_error(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    with open_fetcher(fs, 2, deadline=10) as fetcher:
        fetcher.submit([f"http://127.0.0.1:{port}/a.bin"])
        (item,) = _collect(fetcher, 1).values()
    assert isinstance(item.error, StorageError) and f"127.0.0.1:{port}/a.bin" in str(item.error)
