"""`cache warm`'s pipeline (fastload.cache.warm_pipeline): the async path against the real
moto S3 server and against latency::, batched stores, resume without requests, failures named,
the breaker on the async path, --jobs 1, derivations that reject bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import s3fs

import fastload.testing.latency  # noqa: F401  (registers latency::)
from fastload.cache import DiskTier, open_cache
from fastload.cache.tiered import TieredCache
from fastload.cache.warm import warm
from fastload.cache.warm_pipeline import BATCH
from fastload.errors import OriginUnavailableError
from fastload.io.storage import Storage
from tests.fixtures.s3 import S3Server, upload_folder


def _folder(root: Path, files: int, size: int = 700) -> dict[str, bytes]:
    """``files`` objects in two folders below ``root``; name -> bytes."""
    made = {}
    for i in range(files):
        path = root / f"d{i % 2}" / f"{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size) + i.to_bytes(4, "little")
        path.write_bytes(data)
        made[path.relative_to(root).as_posix()] = data
    return made


def _cached(directory: Path, fs, paths: list[str]) -> dict[str, bytes | None]:
    """What the disk tier in ``directory`` holds for each path (None: nothing)."""
    cache = open_cache(directory)
    try:
        return {p: cache.tiers[0].get(cache.key(fs, p)) for p in paths}
    finally:
        cache.close()


class CountingDisk(DiskTier):
    """A real disk tier that records the size of each put_many and contains_many call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.put_batches: list[int] = []
        self.contains_batches: list[int] = []

    def put_many(self, items):
        items = list(items)
        self.put_batches.append(len(items))
        return super().put_many(items)

    def contains_many(self, keys):
        self.contains_batches.append(len(keys))
        return super().contains_many(keys)


def test_warm_over_s3_is_one_get_per_object_and_a_rerun_none(s3_server, s3_options, tmp_path):
    made = _folder(tmp_path / "local", 40)
    url = upload_folder(s3_options, tmp_path / "local", "s3://warm-async/train")
    s3_server.reset_counts()
    report = warm(url, tmp_path / "c", jobs=8, storage_options=s3_options)
    assert (report.files, report.fetched, report.skipped, report.failed) == (40, 40, 0, [])
    gets = s3_server.gets("warm-async/train/")
    assert len(gets) == 40 and set(gets.values()) == {1}  # one GET each, and no HEAD
    assert not [k for k in s3_server.counter.counts if k[0] == "HEAD"]

    fs = s3fs.S3FileSystem(**s3_options)
    paths = [f"warm-async/train/{name}" for name in made]
    assert _cached(tmp_path / "c", fs, paths) == {f"warm-async/train/{n}": d for n, d in made.items()}

    s3_server.reset_counts()
    again = warm(url, tmp_path / "c", jobs=8, storage_options=s3_options)
    assert (again.fetched, again.skipped) == (0, 40)
    assert s3_server.gets("warm-async/train/") == {}  # resumed from contains_many alone


@pytest.mark.parametrize("jobs", [1, 16])
def test_latency_warm_fetches_each_object_once_and_a_resume_only_the_missing(tmp_path, jobs):
    made = _folder(tmp_path / "data", 30)
    url = f"latency::file://{tmp_path / 'data'}"
    options = {"latency": {"latency": 0.002}}
    fs = Storage(url, options).fs  # the instance warm uses (fsspec caches it by its options)
    fs.reset_counts()
    first = warm(url, tmp_path / "c", jobs=jobs, shard=(0, 3), storage_options=options)
    assert (first.files, first.fetched) == (10, 10)
    assert fs.requests["cat_file"] == 10

    fs.reset_counts()
    outcomes = []
    second = warm(url, tmp_path / "c", jobs=jobs, storage_options=options,
                  on_file=lambda u, n, outcome: outcomes.append((u, n, outcome)))
    assert (second.files, second.fetched, second.skipped, second.failed) == (30, 20, 10, [])
    assert fs.requests["cat_file"] == 20  # the 10 cached ones were not requested
    assert sorted(o for _, _, o in outcomes) == ["fetched"] * 20 + ["hit"] * 10
    assert {n for _, n, _ in outcomes} == {704}
    target = [str(tmp_path / "data" / name) for name in made]
    cached = _cached(tmp_path / "c", fs, target)
    assert cached == {str(tmp_path / "data" / n): d for n, d in made.items()}


def test_downloads_are_stored_in_batches_and_resume_asks_per_batch(tmp_path):
    files = BATCH + 44
    _folder(tmp_path / "data", files, size=100)
    tier = CountingDisk(tmp_path / "c")
    report = warm(str(tmp_path / "data"), TieredCache([tier]), jobs=1)
    assert report.fetched == files and report.ok
    # jobs=1 on local files reads in this thread, a batch at a time (NOTE [warm pipeline])
    assert tier.put_batches == [BATCH, 44] and tier.contains_batches == [BATCH, 44]
    assert DiskTier(tmp_path / "c").verify().checked == files

    again = CountingDisk(tmp_path / "c")
    resumed = warm(str(tmp_path / "data"), TieredCache([again]), jobs=8)
    assert (resumed.skipped, resumed.fetched) == (files, 0)
    assert again.put_batches == [] and again.contains_batches == [BATCH, 44]


def test_batches_on_the_async_path_store_every_object_once(tmp_path):
    _folder(tmp_path / "data", 120, size=50)
    tier = CountingDisk(tmp_path / "c")
    report = warm(f"latency::file://{tmp_path / 'data'}", TieredCache([tier]), jobs=32,
                  storage_options={"latency": {"latency": 0.001}})
    assert report.fetched == 120 and sum(tier.put_batches) == 120
    assert max(tier.put_batches) <= 32  # never more than jobs objects between request and store
    assert DiskTier(tmp_path / "c").verify().checked == 120


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux /proc")
@pytest.mark.parametrize("prefix", ["", "latency::file://"], ids=["local", "async"])
def test_failed_objects_are_named_with_their_error(tmp_path, prefix):
    _folder(tmp_path / "data", 6)
    for i in range(3):  # listed as regular files; reading them at offset 0 fails with EIO
        (tmp_path / "data" / f"bad{i}.bin").symlink_to("/proc/self/mem")
    seen = []
    report = warm(f"{prefix}{tmp_path / 'data'}", tmp_path / "c", jobs=4,
                  storage_options={"latency": {"latency": 0.001}} if prefix else None,
                  on_file=lambda u, n, outcome: seen.append(outcome))
    assert (report.fetched, len(report.failed), report.ok) == (6, 3, False)
    names = [url.rsplit("/", 1)[1] for url, _ in report.failed]
    assert names == ["bad0.bin", "bad1.bin", "bad2.bin"]
    for url, error in report.failed:
        assert error.startswith("cannot read ") and url.rsplit("/", 1)[1] in error
    assert seen.count("failed") == 3 and seen.count("fetched") == 6


def test_a_full_cache_counts_rejected(tmp_path):
    _folder(tmp_path / "data", 20, size=2000)
    report = warm(str(tmp_path / "data"), {"disk": tmp_path / "c", "disk_size": "10KB"}, jobs=4)
    assert report.fetched + report.rejected == 20 and report.rejected > 0 and report.ok
    assert DiskTier(tmp_path / "c").verify().checked == report.fetched


@pytest.mark.timeout(120)
@pytest.mark.parametrize("jobs", [1, 4])
def test_the_breaker_trips_on_the_async_path_and_a_rerun_resumes(s3_server, tmp_path, jobs):
    server = S3Server().start()  # its own server: this test stops it
    opts = server.storage_options()
    _folder(tmp_path / "local", 40, size=300)
    url = upload_folder(opts, tmp_path / "local", f"s3://breaker-async-{jobs}/train")
    seen = []

    def on_file(_url, _nbytes, outcome):
        seen.append(outcome)
        if len(seen) == 5:
            server.stop()  # the origin goes down mid-warm

    try:
        with pytest.raises(OriginUnavailableError) as caught:
            warm(url, tmp_path / "c", jobs=jobs, storage_options=opts, max_failures=3,
                 on_file=on_file)
        exc = caught.value
        assert exc.files == 40 and exc.failed >= 3 and exc.cached >= 5
        assert exc.done == exc.cached + exc.failed < 40  # it stopped starting new reads
        assert "objects in a row failed" in str(exc) and f"{url}/" in exc.last_error
        if jobs == 1:  # one object at a time: stored before the next is requested
            assert (exc.done, exc.cached, exc.failed) == (8, 5, 3)
        assert DiskTier(tmp_path / "c").verify().checked == exc.cached

        server = S3Server(port=server.port).start()  # the same buckets come back
        again = warm(url, tmp_path / "c", jobs=jobs, storage_options=opts)
        assert (again.skipped, again.fetched, again.failed) == (exc.cached, 40 - exc.cached, [])
    finally:
        server.stop()


def test_a_derivation_that_rejects_bytes_fails_those_objects_without_tripping(tmp_path, jpeg_root):
    from fastload.data.transcode import Transcode

    data = tmp_path / "data"
    data.mkdir()
    images = sorted(jpeg_root.rglob("*.jpg"))[:6]
    for i, image in enumerate(images):
        (data / f"{i}.jpg").write_bytes(image.read_bytes())
    for i in range(3):
        (data / f"broken{i}.jpg").write_bytes(b"not a jpeg")
    derive = Transcode(max_side=32)
    report = warm(str(data), tmp_path / "c", jobs=4, derive=derive, max_failures=1)
    assert report.fetched == 6 and len(report.failed) == 3  # the breaker did not trip
    assert all(f"as {derive.tag}" in error for _, error in report.failed)
    small = open_cache(tmp_path / "c").deriving(derive)
    fs = Storage(str(data)).fs
    for i in range(6):
        value = small.tiers[0].get(small.key(fs, str(data / f"{i}.jpg")))
        assert value is not None and value == derive((data / f"{i}.jpg").read_bytes())


def test_batched_fills_keep_the_fetch_time_version_check(tmp_path):
    from fastload.io.versions import version_of

    cache = open_cache(tmp_path / "c")
    listed = version_of({"size": 3, "ETag": '"v1"'})
    url = "s3://bucket/a.bin"
    assert cache.missing([cache.key_of(url, listed)], shared_only=True) == [True]

    same = cache.prepare(url, listed, b"abc")
    assert same.key == cache.key_of(url, listed)
    grown = cache.prepare(url, listed, b"abcd")  # not the listed size: served, never stored
    assert grown.key is None
    newer = cache.prepare("/data/b.bin", "1:2:3", b"x", read_version="9:9:9")  # local: its own
    assert newer.key == cache.key_of("/data/b.bin", "9:9:9")
    assert cache.store_many([same, grown, newer], shared_only=True) == ["fetched"] * 3
    assert cache.missing([same.key, cache.key_of("/data/b.bin", "1:2:3"), newer.key]) == [
        False, True, False]
    assert cache.tiers[0].get(same.key) == b"abc" and cache.origin_reads == 3
    cache.close()
