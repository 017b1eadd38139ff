"""ParquetImages through the shard cache (NOTE [a dataset on the shard store]): remote Parquet
files on moto's S3 server with a disk cache are downloaded whole, once per node (GETs counted
on the server), ahead in the epoch's order within the budget, serve every engine from the
local copies with the local run's batches, are never served stale, and are shared between
two cache directories through a real Redis."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pyarrow")
pytest.importorskip("datasets")

from fastload import DataLoader, ParquetImages
from fastload.errors import ConfigError, UnreadableSampleError
from tests.contracts.shard_cache import (
    ahead_in_order_within_budget,
    damage_copies,
    one_download_each,
    two_processes_download_once,
    whole_downloads,
)
from tests.fixtures.s3 import upload_folder
from tests.test_parquet import write_hf

pytestmark = pytest.mark.timeout(300)

BUCKET = "fastload-parquet-cache"


@pytest.fixture(scope="module")
def local_files(jpeg_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("parquet-cache")
    write_hf(jpeg_root, out)  # 48 images: 3 files of 20, 20, 8 rows in row groups of 6
    return [str(p) for p in sorted(out.glob("*.parquet"))]


@pytest.fixture(scope="module")
def remote(s3_options, local_files) -> list[str]:
    root = upload_folder(s3_options, Path(local_files[0]).parent, f"s3://{BUCKET}/train")
    return [f"{root}/{Path(p).name}" for p in local_files]


def file_gets(server, urls: list[str]) -> list[int]:
    return [server.count("GET", u.removeprefix("s3://")) for u in urls]


def remote_ds(urls, s3_options, cache, **kw) -> ParquetImages:
    return ParquetImages(urls, size=32, train=True, seed=5, cache=cache,
                         storage_options=s3_options, **kw)


def batches(ds: ParquetImages, backend: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = DataLoader(ds, batch_size=8, shuffle=True, backend=backend,
                        num_workers=2 if backend == "torch" else 0)
    return [(x.clone(), y.clone()) for x, y in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb)
                                    for (xa, ya), (xb, yb) in zip(a, b))


@pytest.mark.parametrize("backend", ["threads", "torch", "dali"])
def test_a_cold_epoch_downloads_each_file_once_and_equals_the_local_run(
        backend, remote, local_files, s3_options, s3_server, tmp_path):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    ds = remote_ds(remote, s3_options, {"disk": str(tmp_path / "cache")})
    assert ds.shard_store is not None
    s3_server.reset_counts()  # after the index (footers and label chunks)
    cold = batches(ds, backend)
    one_download_each(s3_server, remote, ds.shard_store, backend)
    local = ParquetImages(local_files, size=32, train=True, seed=5)
    assert same(cold, batches(local, backend))
    s3_server.reset_counts()
    assert same(batches(ds, backend), cold)  # warm: no request
    assert s3_server.gets(f"{BUCKET}/") == {}
    data = sorted(p.name for p in (tmp_path / "cache" / "shards").glob("*.data"))
    assert len(data) == len(remote)


def test_two_processes_on_a_node_download_each_file_once(remote, s3_options, s3_server, tmp_path):
    cache = {"disk": str(tmp_path / "cache")}
    remote_ds(remote, s3_options, cache)  # the index, stored for both
    s3_server.reset_counts()
    two_processes_download_once(ParquetImages, remote, s3_options, cache,
                                lambda: file_gets(s3_server, remote))


def test_a_file_changed_at_the_origin_is_not_served_stale(remote, local_files, s3_options,
                                                          tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options)
    copy = [u.replace("/train/", "/changing/") for u in remote]
    for src, dst in zip(remote, copy):
        fs.copy(src.removeprefix("s3://"), dst.removeprefix("s3://"))
    stale = remote_ds(copy, s3_options, {"disk": str(tmp_path / "cold")}, listing_max_age=0)
    fs.pipe_file(copy[0].removeprefix("s3://"), fs.cat_file(copy[1].removeprefix("s3://")))
    with pytest.raises(UnreadableSampleError, match=r"train-00000\.parquet \(row group 0, row 0\)"
                       r".*changed at the origin since it was indexed"):
        stale.read_bytes(0)  # indexed before the change, downloaded after: refused
    new = remote_ds(copy, s3_options, {"disk": str(tmp_path / "cold")}, listing_max_age=0)
    local = ParquetImages(local_files, size=32)
    assert new.read_bytes(0) == local.read_bytes(20)  # file 1's first row, now file 0's


@pytest.mark.parametrize("held", [False, True])
def test_a_damaged_local_copy_is_downloaded_again_or_read_from_the_origin(
        held, remote, s3_options, s3_server, tmp_path):
    cache = {"disk": str(tmp_path / "cache")}
    ds = remote_ds(remote, s3_options, cache)
    expected = [ds.read_bytes(i) for i in range(len(ds))]
    if not held:
        ds.shard_store.release_all()  # as a process that ended
    damage_copies(tmp_path / "cache" / "shards", "flip")
    s3_server.reset_counts()
    again = remote_ds(remote, s3_options, cache)  # a new process's store: checks each file
    assert [again.read_bytes(i) for i in range(len(again))] == expected
    if held:  # the first store still reads its copies: this one reads row groups by range
        assert again.shard_store.downloads == 0 and sum(file_gets(s3_server, remote)) > 0
    else:
        assert file_gets(s3_server, remote) == [1] * len(remote)


def test_redis_shares_files_between_two_cache_directories(
        remote, s3_options, s3_server, redis_url, tmp_path):
    node_a = remote_ds(remote, s3_options, {"disk": str(tmp_path / "a"), "redis": redis_url})
    s3_server.reset_counts()
    expected = [node_a.read_bytes(i) for i in range(len(node_a))]
    assert file_gets(s3_server, remote) == [1] * len(remote)
    s3_server.reset_counts()
    node_b = remote_ds(remote, s3_options, {"disk": str(tmp_path / "b"), "redis": redis_url})
    assert [node_b.read_bytes(i) for i in range(len(node_b))] == expected
    assert s3_server.gets(f"{BUCKET}/") == {}  # the index and the files from Redis
    assert node_b.shard_store.from_shared == len(remote) and node_b.shard_store.downloads == 0


def test_a_budget_below_the_files_an_epoch_reads_at_once_is_refused(remote, s3_options, tmp_path):
    with pytest.raises(ConfigError, match=r"shard budget \(1000 bytes\) is too low for "
                       r"ParquetImages: an epoch reads shuffle_window=4 row groups \(from as many "
                       r"files\) at once .* Raise the cache's shard_budget \(or disk_size\) to at "
                       r"least \d+ bytes, or lower shuffle_window"):
        remote_ds(remote, s3_options, {"disk": str(tmp_path / "c"), "shard_budget": 1000})


def test_files_are_downloaded_ahead_in_the_epoch_order_within_the_budget(
        remote, s3_options, s3_server, tmp_path):
    largest = max(remote_ds(remote, s3_options, None).index.sizes)
    budget = 2 * largest  # room for 2 of the 3 files: the reader's and 1 ahead
    ds = remote_ds(remote, s3_options, {"disk": str(tmp_path / "cache"), "shard_budget": budget},
                   shuffle_window=1)
    s3_server.reset_counts()
    ahead_in_order_within_budget(ds, lambda order: ds.index.group_file[ds.index.groups[order]],
                                 lambda: file_gets(s3_server, remote), ahead=1)


@pytest.fixture(scope="module")
def small_files(s3_options, jpeg_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The 48 images as 8 remote files of 6 rows in 3 row groups each."""
    out = tmp_path_factory.mktemp("parquet-small")
    write_hf(jpeg_root, out, per_file=6, group=2)
    root = upload_folder(s3_options, out, f"s3://{BUCKET}/small")
    return [f"{root}/{p.name}" for p in sorted(out.glob("*.parquet"))]


def test_an_epoch_through_a_small_budget_downloads_each_file_once(
        small_files, s3_options, s3_server, tmp_path, caplog):
    # NOTE [row groups of files]: row groups shuffled as shards spread each file over the
    # whole epoch: through a budget of 3 of the 8 files, files were downloaded 1-3 times
    # each; files are now read shuffle_window at a time.
    uncached = remote_ds(small_files, s3_options, None, shuffle_window=2)
    assert uncached.index.group_sizes().tolist() == [2] * 24
    budget = 3 * max(uncached.index.sizes)  # the least accepted: the window (2) + 1
    ds = remote_ds(small_files, s3_options, {"disk": str(tmp_path / "cache"),
                                             "shard_budget": budget}, shuffle_window=2)
    caplog.set_level(logging.WARNING, logger="fastload")
    s3_server.reset_counts()
    loader = DataLoader(ds, batch_size=2, shuffle=True, backend="threads")
    labels = [y for _, ys in loader for y in ys.tolist()]
    assert sorted(labels) == sorted(uncached.targets.tolist())
    assert whole_downloads(s3_server, small_files) == [1] * len(small_files)
    assert ds.shard_store.files.used() <= budget and ds.shard_store.evicted >= 5
    assert not [r for r in caplog.records if "beyond it" in r.getMessage()]


def test_an_epoch_reads_files_a_window_at_a_time(small_files, s3_options):
    ds = remote_ds(small_files, s3_options, None, shuffle_window=2)
    order = np.asarray(ds.epoch_order.permutation(5, 1, shuffle=True, num_replicas=1))
    files = ds.index.group_file[ds.index.groups[order]]
    first = {f: int(np.flatnonzero(files == f)[0]) for f in range(8)}
    last = {f: int(np.flatnonzero(files == f)[-1]) for f in range(8)}
    at_once = [sum(first[f] <= p <= last[f] for f in range(8)) for p in range(len(order))]
    assert max(at_once) == 2  # the window's two files, never more
    # Each window of 2 groups mixes 2 files, but the first (the second file joins a round
    # after the first, so that files end one at a time: the reader needs one new file at a
    # time, not a window's worth) and the last (one file left).
    mixed = [len(set(files[w: w + 4].tolist())) for w in range(0, len(order), 4)]
    assert mixed[0] == 1 and set(mixed[1:-1]) == {2}
    assert sorted(order.tolist()) == list(range(48))
    ends = sorted(last.values())
    assert all(b - a >= 4 for a, b in zip(ends, ends[1:]))  # a group or more apart


def test_a_cache_without_a_disk_tier_and_local_files_keep_their_reads(
        remote, local_files, s3_options, redis_url, tmp_path):
    assert remote_ds(remote, s3_options, {"redis": redis_url}).shard_store is None  # entries
    assert ParquetImages(local_files, cache={"disk": str(tmp_path / "c")}).shard_store is None
    assert ParquetImages(local_files).follow_epoch([0, 1, 2]) is None
