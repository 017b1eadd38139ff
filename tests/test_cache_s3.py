"""The read-through cache against a real S3 server (moto): origin reads counted on the server,
promotion, versions, missing objects, corrupt entries refetched, processes sharing one cache,
ImageFolder(cache=...), the fastload:: protocol and the latency:: wrapper."""

import multiprocessing as mp

import fsspec
import pytest
import s3fs
import torch

from fastload import DataLoader, ImageFolder
from fastload.cache import DiskTier, open_cache
from tests.cache_damage import damage
from fastload.cache.filesystem import CachedReads
from fastload.errors import ObjectNotFoundError
from fastload.io.storage import Storage


@pytest.fixture
def s3(s3_options):
    return s3fs.S3FileSystem(**s3_options)


@pytest.fixture
def objects(s3, s3_jpegs):
    paths = sorted(p for p in s3.find(s3_jpegs.removeprefix("s3://")) if p.endswith(".jpg"))
    return paths[:8]


def test_reads_go_to_the_origin_once_then_come_from_the_tiers(s3, s3_server, objects, tmp_path):
    cache = open_cache({"memory": "10MB", "disk": tmp_path / "c"})
    path = objects[0]
    s3_server.reset_counts()
    first = cache.read(s3, path)
    assert first == s3.cat_file(path)
    assert s3_server.count("GET", path) == 2  # ours plus the comparison above
    for _ in range(3):
        assert cache.read(s3, path) == first
    assert s3_server.count("GET", path) == 2
    assert cache.tiers[0].stats.hits == 3 and cache.origin_reads == 1

    # a new process's cache (empty memory) finds it on disk and promotes it to memory
    fresh = open_cache({"memory": "10MB", "disk": tmp_path / "c"})
    assert fresh.read(s3, path) == first
    assert fresh.tiers[1].stats.hits == 1 and fresh.tiers[0].contains(fresh.key(s3, path))
    assert s3_server.count("GET", path) == 2


@pytest.mark.parametrize("cached", [False, True], ids=["no cache", "cache"])
def test_an_origin_read_is_one_get_and_no_head(s3, s3_server, s3_options, s3_jpegs, cached, tmp_path):
    reads = CachedReads(open_cache(tmp_path / "c")) if cached else None
    storage = Storage(s3_jpegs, s3_options, read_through=reads)
    path = [p for p in storage.find() if p.endswith(".jpg")][0]
    s3.invalidate_cache()  # no size known from a listing: s3fs would ask with a HEAD
    s3_server.reset_counts()
    data = storage.read(path)
    assert s3_server.count("HEAD", path) == 0  # NOTE [one GET per object]
    assert s3_server.count("GET", path) == 1
    assert data == s3.cat_file(path)


def test_a_changed_object_is_never_served_stale(s3, s3_jpegs, tmp_path):
    path = s3_jpegs.removeprefix("s3://").rsplit("/", 1)[0] + "/changing.bin"
    s3.pipe_file(path, b"old")
    cache = open_cache(tmp_path / "c")
    assert cache.read(s3, path) == b"old"
    s3.pipe_file(path, b"new!")
    assert cache.read(s3, path) == b"new!"


def test_a_missing_object_raises_file_not_found_naming_the_url(s3, s3_jpegs, tmp_path):
    cache = open_cache(tmp_path / "c")
    missing = s3_jpegs.removeprefix("s3://") + "/nope.jpg"
    with pytest.raises(FileNotFoundError, match=r"s3://fastload-jpegs/train/nope.jpg") as info:
        cache.read(s3, missing)
    assert isinstance(info.value, ObjectNotFoundError)


def test_a_corrupt_entry_is_refetched_from_the_origin(s3, s3_server, objects, tmp_path):
    cache = open_cache(tmp_path / "c")
    path = objects[1]
    good = cache.read(s3, path)
    damage(cache.tiers[0], cache.key(s3, path), lambda b: b[:-10])
    s3_server.reset_counts()
    assert cache.read(s3, path) == good
    assert s3_server.count("GET", path) == 1
    assert DiskTier(tmp_path / "c").verify().corrupt == []


def _read_all(directory, options, paths, seed, out):
    fs = s3fs.S3FileSystem(**options)
    cache = open_cache(directory)
    order = paths[seed:] + paths[:seed]
    out.put({p: len(cache.read(fs, p)) for p in order})


def test_processes_sharing_one_directory_download_each_object_once(s3, s3_server, s3_options, objects, tmp_path):
    s3_server.reset_counts()
    ctx = mp.get_context("fork")  # spawn would re-import torch in each child
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_read_all, args=(str(tmp_path / "c"), s3_options, objects, i, out))
        for i in range(8)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    sizes = {p: s3.size(p) for p in objects}
    assert all(r == sizes for r in results)
    assert {p: s3_server.count("GET", p) for p in objects} == {p: 1 for p in objects}
    tier = DiskTier(tmp_path / "c")
    assert tier.verify().corrupt == [] and tier.rescan()[0] == len(objects)


def test_image_folder_with_a_cache_gives_the_same_batches_and_skips_the_origin(
    s3_server, s3_options, s3_jpegs, tmp_path
):
    def epoch(ds, workers):
        loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers)
        return [(x.clone(), y.clone()) for x, y in loader]

    plain = ImageFolder(s3_jpegs, size=32, seed=1, storage_options=s3_options)
    cached = ImageFolder(s3_jpegs, size=32, seed=1, storage_options=s3_options,
                         cache={"disk": tmp_path / "c", "memory": "4MB"})
    expected = epoch(plain, 0)
    s3_server.reset_counts()
    first = epoch(cached, 2)
    assert sum(s3_server.gets("fastload-jpegs/train/").values()) == len(cached)
    s3_server.reset_counts()
    second = epoch(cached, 2)
    assert s3_server.gets("fastload-jpegs/train/") == {}
    for got in (first, second):
        assert len(got) == len(expected)
        for (x, y), (ex, ey) in zip(got, expected):
            assert torch.equal(x, ex) and torch.equal(y, ey)


def test_the_fastload_protocol_reads_through_the_cache(s3_server, s3_options, objects, tmp_path):
    url = f"fastload::s3://{objects[2]}"
    opts = {"fastload": {"cache": str(tmp_path / "c")}, "s3": s3_options}
    s3_server.reset_counts()
    with fsspec.open(url, **opts) as f:
        first = f.read()
    with fsspec.open(url, **opts) as f:
        assert f.read() == first
    assert s3_server.count("GET", objects[2]) == 1
    assert s3_server.count("HEAD", objects[2]) >= 1  # the version check of each open
    fs, path = fsspec.core.url_to_fs(url, **opts)
    assert fs.cat_file(path, start=0, end=2) == first[:2] == b"\xff\xd8"
    with pytest.raises(ValueError, match="read-only"):
        fs.open(path, "wb")
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        fs.cat_file(path.rsplit("/", 1)[0] + "/nope.jpg")


def test_the_latency_wrapper_delays_counts_and_keeps_the_origin_url(s3_options, objects):
    fs, path = fsspec.core.url_to_fs(
        f"latency::s3://{objects[3]}", latency={"latency": 0.01}, s3=s3_options
    )
    assert fs.cat_file(path)[:2] == b"\xff\xd8"
    assert fs.info(path)["size"] > 0
    assert fs.requests == {"cat_file": 1, "info": 1} and fs.total_requests == 2
    assert fs.unstrip_protocol(path) == f"s3://{objects[3]}"
    fs.reset_counts()
    assert fs.total_requests == 0
