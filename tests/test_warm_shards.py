"""`fastload cache warm` over remote tar shards and Parquet files fills the shard store the
shard datasets read (NOTE [warming shard files]): the installed console script against the
real S3 server, then TarShards and ParquetImages over the same cache directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastload import DataLoader, ParquetImages, TarShards
from tests.fixtures.s3 import upload_folder
from tests.test_shards import write_shards

pytestmark = pytest.mark.timeout(180)


def fastload(*args: str) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    script = str(Path(sys.executable).parent / "fastload")
    return subprocess.run([script, *args], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def dataset(s3_server, jpeg_root: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """On S3 below ``s3://warm-shards/ds``: 4 tar shards (webdataset's ShardWriter) in tar/,
    2 Parquet files in pq/ and one loose file."""
    local = tmp_path_factory.mktemp("warm-shards")
    write_shards(jpeg_root, local / "tar", per_shard=12)
    files = sorted(jpeg_root.rglob("*.jpg"))
    (local / "pq").mkdir()
    for n in range(2):
        part = files[n * 24:(n + 1) * 24]
        pq.write_table(pa.table({"image": pa.array([f.read_bytes() for f in part], pa.binary()),
                                 "label": pa.array([int(f.parent.name[-1]) for f in part])}),
                       local / "pq" / f"train-{n}.parquet", row_group_size=8)
    (local / "README.txt").write_text("not a shard")
    return upload_folder(s3_server.storage_options(), local, "s3://warm-shards/ds")


def test_a_warm_fills_the_shard_store_and_the_first_epochs_download_nothing(s3_server, dataset, tmp_path):
    cache = str(tmp_path / "cache")
    opts = ["-o", f"endpoint_url={s3_server.endpoint}", "-o", "use_listings_cache=false"]
    first = fastload("cache", "warm", dataset, "--cache", cache, *opts, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads(first.stdout)
    assert report["files"] == report["fetched"] == 7 and report["failed"] == []
    stats = json.loads(fastload("cache", "stats", cache, "--json").stdout)
    assert stats["shard_files"] == 6 and stats["entries"] == 1  # the shards whole; README an entry
    whole = sum(i["size"] for d in ("tar", "pq")
                for i in s3fs_listing(s3_server.storage_options(), f"warm-shards/ds/{d}"))
    assert stats["shard_bytes"] == whole

    options = s3_server.storage_options()
    shards = TarShards(f"{dataset}/tar/train-*.tar", storage_options=options, cache=cache, size=32)
    files = ParquetImages(f"{dataset}/pq/*.parquet", storage_options=options, cache=cache, size=32)
    s3_server.reset_counts()  # after the index builds: the epochs alone
    for ds in (shards, files):
        labels = [y for _, ys in DataLoader(ds, batch_size=8, shuffle=True, backend="threads")
                  for y in ys.tolist()]
        assert len(labels) == 48
        assert ds.shard_store.downloads == 0  # every file was there, under the key it looks up
    assert s3_server.gets("warm-shards/ds/") == {}

    again = fastload("cache", "warm", dataset, "--cache", cache, *opts, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["skipped"] == 7  # resumable
    assert s3_server.gets("warm-shards/ds/") == {}


def test_shards_past_the_budget_fail_by_name_and_the_warmed_ones_stay(s3_server, dataset, tmp_path):
    cache = str(tmp_path / "cache")
    options = s3_server.storage_options()
    sizes = [info["size"] for info in sorted(
        s3fs_listing(options, "warm-shards/ds/tar"), key=lambda i: i["name"])]
    budget = sizes[0] + sizes[1] + min(sizes[2:]) // 2  # two shards, not three
    opts = ["-o", f"endpoint_url={s3_server.endpoint}", "-o", "use_listings_cache=false"]
    run = fastload("cache", "warm", f"{dataset}/tar", "--cache", cache, "--size", str(budget),
                   "--jobs", "1", *opts, "--json")
    assert run.returncode == 1, run.stdout + run.stderr  # some failed
    report = json.loads(run.stdout)
    assert report["fetched"] == 2 and len(report["failed"]) == 2
    assert [url.rsplit("/", 1)[1] for url, _ in report["failed"]] == ["train-000002.tar",
                                                                      "train-000003.tar"]
    assert all("shard budget" in why and "raise the cache's shard_budget" in why
               for _, why in report["failed"])
    stats = json.loads(fastload("cache", "stats", cache, "--json").stdout)
    assert stats["shard_files"] == 2  # the first two were held, not evicted by the later ones


def s3fs_listing(options: dict, prefix: str) -> list[dict]:
    import s3fs

    return s3fs.S3FileSystem(**options).ls(prefix, detail=True)


def test_a_chained_url_reads_the_shards_warmed_under_the_plain_one(s3_server, dataset, tmp_path):
    """The shard store keys a file by its own URL: latency::s3://b/x.tar is s3://b/x.tar."""
    from fastload.cache.warm import warm

    cache = str(tmp_path / "cache")
    options = s3_server.storage_options()
    assert warm(f"{dataset}/tar", cache, storage_options=options).fetched == 4
    chained = TarShards(f"latency::{dataset}/tar/train-*.tar", size=32, cache=cache,
                        storage_options={"latency": {"latency": 0.0}, "s3": options})
    s3_server.reset_counts()
    assert len([y for _, ys in DataLoader(chained, batch_size=8, backend="threads") for y in ys]) == 48
    assert chained.shard_store.downloads == 0 and s3_server.gets("warm-shards/ds/") == {}


def test_a_warm_of_the_datasets_own_pattern_fills_only_its_files(s3_server, dataset, tmp_path):
    """`cache warm` takes the brace pattern or glob a TarShards was given, not only a folder."""
    cache = str(tmp_path / "cache")
    opts = ["-o", f"endpoint_url={s3_server.endpoint}", "-o", "use_listings_cache=false"]
    pattern = f"{dataset}/tar/train-{{000001..000002}}.tar"
    run = fastload("cache", "warm", pattern, "--cache", cache, *opts, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["url"] == pattern and report["files"] == report["fetched"] == 2
    stats = json.loads(fastload("cache", "stats", cache, "--json").stdout)
    assert stats["shard_files"] == 2 and stats["entries"] == 0  # not the other shards, nor README

    shards = TarShards(pattern, storage_options=s3_server.storage_options(), cache=cache, size=32)
    s3_server.reset_counts()
    assert len([y for _, ys in DataLoader(shards, batch_size=8, backend="threads") for y in ys]) == 24
    assert shards.shard_store.downloads == 0 and s3_server.gets("warm-shards/ds/") == {}

    every = fastload("cache", "warm", f"{dataset}/*/train-*", "--cache", cache, *opts, "--json")
    assert every.returncode == 0, every.stdout + every.stderr
    assert json.loads(every.stdout)["files"] == 6 and json.loads(every.stdout)["skipped"] == 2

    missing = fastload("cache", "warm", f"{dataset}/tar/train-{{000003..000005}}.tar", "--cache",
                       cache, *opts)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert (f"{dataset}/tar/train-000004.tar and 1 more named by "
            f"{dataset}/tar/train-{{000003..000005}}.tar do not exist") in missing.stderr


def test_a_warm_of_a_shard_index_file_fills_the_shards_it_lists(s3_server, dataset, tmp_path):
    """`cache warm URL/shards.json` warms what TarShards("URL/shards.json") reads."""
    import s3fs

    options = s3_server.storage_options()
    listing = json.dumps({"wids_version": 1, "shardlist": [  # beside the dataset, not in it
        {"url": f"../ds/tar/train-00000{i}.tar", "nsamples": 12} for i in (0, 3)]})
    index = "s3://warm-shards/index/two.json"
    s3fs.S3FileSystem(**options).pipe(index.removeprefix("s3://"), listing.encode())
    cache = str(tmp_path / "cache")
    opts = ["-o", f"endpoint_url={s3_server.endpoint}", "-o", "use_listings_cache=false"]
    run = fastload("cache", "warm", index, "--cache", cache, *opts, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["fetched"] == 2
    shards = TarShards(index, storage_options=options, cache=cache, size=32)
    assert shards.urls == [f"{dataset}/tar/train-00000{i}.tar" for i in (0, 3)]
    s3_server.reset_counts()
    assert len([y for _, ys in DataLoader(shards, batch_size=8, backend="threads") for y in ys]) == 24
    assert shards.shard_store.downloads == 0 and s3_server.gets("warm-shards/ds/") == {}
