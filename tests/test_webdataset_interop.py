"""webdataset interop: ``fastload::`` URLs in webdataset's gopen (shards written by webdataset's
own ShardWriter, on moto's S3 server, read through fastload's cache), and a webdataset pipeline
handed to ``fastload.DataLoader`` (settings, batches equal to torch's, WebLoader-like use)."""

from __future__ import annotations

import importlib
import io
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
import webdataset as wds

import fastload
from fastload.errors import ConfigError
from tests.contracts.shard_cache import wait_for
from tests.fixtures.s3 import upload_folder

pytestmark = pytest.mark.timeout(180)

BUCKET = "fastload-wds"


@pytest.fixture(autouse=True)
def gopen_table():
    """Each test starts from webdataset's own gopen table, and leaves it as it was."""
    table = importlib.import_module("webdataset.gopen").gopen_schemes
    before = dict(table)
    table.pop("fastload", None)
    yield table
    table.clear()
    table.update(before)


def write_shards(root: Path, out: Path, *, per_shard: int = 12) -> list[Path]:
    """The conftest's JPEGs as shards by webdataset's ShardWriter (``jpg`` + ``cls``)."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for f in sorted(root.rglob("*.jpg")):
            sink.write({"__key__": str(f.relative_to(root).with_suffix("")), "jpg": f.read_bytes(),
                        "cls": str(classes.index(f.parent.name)).encode()})
    return sorted(out.glob("train-*.tar"))


def samples(urls) -> list[tuple[str, int, bytes]]:
    return [(s["__key__"], int(s["cls"]), s["jpg"])
            for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]


@pytest.fixture(scope="module")
def local_shards(jpeg_root, tmp_path_factory) -> list[Path]:
    return write_shards(jpeg_root, tmp_path_factory.mktemp("wds"))


@pytest.fixture(scope="module")
def s3_shards(local_shards, s3_options) -> str:
    """The same shards in moto's S3; the brace pattern of their URLs."""
    upload_folder(s3_options, local_shards[0].parent, f"s3://{BUCKET}/train")
    return f"s3://{BUCKET}/train/train-{{000000..{len(local_shards) - 1:06d}}}.tar"


def test_fastload_urls_in_webdataset_read_through_the_cache(
        s3_shards, local_shards, s3_server, s3_options, tmp_path):
    local = samples([str(p) for p in local_shards])
    assert len(local) == 48
    with pytest.raises(ValueError, match="no gopen handler defined"):
        samples(fastload.gopen_urls("fastload::" + s3_shards))
    fastload.register_gopen(tmp_path / "cache", {"s3": s3_options})
    urls = fastload.gopen_urls("fastload::" + s3_shards)
    assert urls == [f"fastload::s3://{BUCKET}/train/{p.name}" for p in local_shards]
    s3_server.reset_counts()
    assert samples(urls) == local
    keys = [f"{BUCKET}/train/{p.name}" for p in local_shards]
    assert s3_server.gets(f"{BUCKET}/train/") == {k: 1 for k in keys}  # one GET per shard
    s3_server.reset_counts()
    assert samples(urls) == local
    assert s3_server.gets(f"{BUCKET}/train/") == {}  # served by the cache
    assert all(s3_server.count("HEAD", k) == 1 for k in keys)  # its version, checked once


def test_large_shards_are_read_as_streams_over_the_shard_store_not_memory(
        s3_shards, local_shards, s3_server, s3_options, tmp_path):
    """NOTE [large objects through fastload::]: shards of at least ``large_bytes`` (here
    every one) are downloaded into the cache's shard store and read as streams over the
    download and the local copy, not whole into memory; a second pass reads the same copies,
    asking only versions."""
    cache = tmp_path / "cache"
    fastload.register_gopen(cache, {"s3": s3_options, "fastload": {"large_bytes": 1}})
    urls = fastload.gopen_urls("fastload::" + s3_shards)
    local = samples([str(p) for p in local_shards])
    s3_server.reset_counts()
    assert samples(urls) == local
    keys = [f"{BUCKET}/train/{p.name}" for p in local_shards]
    assert s3_server.gets(f"{BUCKET}/train/") == {k: 1 for k in keys}  # one range each
    assert all(s3_server.get_ranges(k)[0].startswith("bytes=0-") for k in keys)
    def copies() -> list[Path]:  # each stream's download renames its file when whole
        return sorted((cache / "shards").glob("*.data"))

    wait_for(lambda: len(copies()) == len(local_shards), "the downloads to end")
    assert sorted(p.read_bytes() for p in copies()) == sorted(p.read_bytes() for p in local_shards)
    with fsspec.open(urls[0], "rb", fastload={"cache": str(cache), "large_bytes": 1},
                     s3=s3_options) as f:  # a stream over the shard store, not bytes in memory
        assert isinstance(f, io.BufferedReader) and f.name == urls[0].removeprefix("fastload::")
        assert f.read() == local_shards[0].read_bytes()
    s3_server.reset_counts()
    assert samples(urls) == local
    assert s3_server.gets(f"{BUCKET}/train/") == {}
    assert all(s3_server.count("HEAD", k) == 1 for k in keys)


def test_plain_storage_urls_read_through_the_cache_when_registered(
        s3_shards, local_shards, s3_server, s3_options, tmp_path):
    # webdataset splits a string on "::", so a string pattern needs the storage's own scheme
    fastload.register_gopen(tmp_path / "cache", {"s3": s3_options}, protocols=("s3",))
    local = samples([str(p) for p in local_shards])
    assert samples(s3_shards) == local
    s3_server.reset_counts()
    assert samples(s3_shards) == local and s3_server.gets(f"{BUCKET}/train/") == {}


def test_a_handler_of_the_users_is_kept_and_writes_are_refused(gopen_table, local_shards, tmp_path):
    def mine(url, mode="rb", bufsize=8192, **kw):
        return open(url.removeprefix("fastload::"), mode)

    gopen_table["fastload"] = mine
    fastload.register_gopen(tmp_path / "cache")
    assert gopen_table["fastload"] is mine
    fastload.register_gopen(tmp_path / "cache", replace=True)
    assert gopen_table["fastload"] is not mine
    with pytest.raises(ConfigError, match=r"fastload::/x.tar with mode 'wb'.*without fastload::"):
        wds.gopen("fastload::/x.tar", "wb")


def pipeline(shards) -> wds.WebDataset:
    return (wds.WebDataset([str(p) for p in shards], shardshuffle=False)
            .decode("torchrgb").to_tuple("jpg", "cls"))


def equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_a_webdataset_pipeline_gets_workers_and_torchs_batches(local_shards):
    loader = fastload.DataLoader(pipeline(local_shards), batch_size=5, meter=False)
    settings = loader.settings
    assert settings.num_workers.value == max(1, min(16, settings.machine.cores_per_rank))
    assert "splits its shards between workers (split_by_worker)" in settings.num_workers.reason
    assert settings.persistent_workers.value is False
    assert "webdataset pipeline carries state" in settings.persistent_workers.reason
    ours = list(loader)
    torchs = list(torch.utils.data.DataLoader(pipeline(local_shards), batch_size=5,
                                              **settings.as_dict()))
    assert equal(ours, torchs) and sum(len(b[1]) for b in ours) == 48
    assert equal(list(loader), torchs)  # a second epoch, fresh workers: the same


def test_a_pipeline_that_does_not_split_keeps_one_process_and_says_why(local_shards):
    plain = wds.DataPipeline(wds.SimpleShardList([str(p) for p in local_shards]),
                             wds.tarfile_to_samples(), wds.to_tuple("jpg", "cls"))
    loader = fastload.DataLoader(plain, batch_size=8, meter=False)
    assert loader.settings.num_workers.value == 0
    assert "has no split_by_worker stage" in loader.settings.num_workers.reason
    assert sum(len(b[1]) for b in loader) == 48


def test_shuffle_or_a_sampler_is_refused_with_the_pipelines_way(local_shards):
    with pytest.raises(ConfigError, match=r"shuffle=True.*\.shuffle\(1000\)"):
        fastload.DataLoader(pipeline(local_shards), batch_size=4, shuffle=True)
    with pytest.raises(ConfigError, match="sampler="):
        fastload.DataLoader(pipeline(local_shards), batch_size=4, sampler=range(4))


def test_webloader_like_use_rebatches_a_fastload_loader(local_shards):
    """wds.WebLoader is a pipeline over a DataLoader; the same over fastload's loader."""
    loader = fastload.DataLoader(pipeline(local_shards).batched(4), batch_size=None, meter=False)
    assert loader.settings.num_workers.value >= 1
    rebatched = wds.FluidWrapper(loader).unbatched().batched(16)
    labels = np.concatenate([b[1].numpy() for b in rebatched])
    expected = [s[1] for s in samples([str(p) for p in local_shards])]
    assert sorted(labels.tolist()) == sorted(expected)
    assert [len(b[1]) for b in rebatched] == [16, 16, 16]


def test_a_loader_over_a_pipeline_opens_fastload_urls(local_shards, monkeypatch, tmp_path):
    """No register_gopen call: the loader registers the handler, with the default cache."""
    monkeypatch.setenv("HOME", str(tmp_path))
    loader = fastload.DataLoader(pipeline([f"fastload::{p}" for p in local_shards]),
                                 batch_size=6, num_workers=0, meter=False)
    assert equal(list(loader), list(torch.utils.data.DataLoader(pipeline(local_shards), batch_size=6)))
    assert (tmp_path / ".cache" / "fastload").is_dir()


@pytest.mark.timeout(300)
def test_spawned_workers_open_fastload_urls_registered_in_the_main_process(local_shards, tmp_path):
    fastload.register_gopen(tmp_path / "cache")
    urls = [f"fastload::{p}" for p in local_shards]
    loader = fastload.DataLoader(pipeline(urls), batch_size=6, num_workers=2,
                                 multiprocessing_context="spawn")
    labels = sorted(torch.cat([y for _, y in loader]).tolist())
    assert labels == sorted(s[1] for s in samples([str(p) for p in local_shards]))
    assert (tmp_path / "cache").is_dir()


def test_with_a_gpu_a_pipeline_gets_pinned_memory_and_workers_per_gpu(local_shards):
    from fastload.settings import Machine, resolve_settings

    settings = resolve_settings(pipeline(local_shards), machine=Machine(cpu_cores=32, gpus=1))
    assert settings.num_workers.value == 8 and "8 per GPU" in settings.num_workers.reason
    assert settings.pin_memory.value is True and "CUDA device" in settings.pin_memory.reason
    assert settings.prefetch_factor.value == 2 and settings.persistent_workers.value is False
