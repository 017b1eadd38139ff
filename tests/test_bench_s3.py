"""fastload bench against a real S3 server (moto on loopback): counts checked on the server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fastload.bench import run_bench, throughput
from fastload.bench.inventory import take_inventory
from fastload.cli import main
from fastload.io.storage import Storage

pytest.importorskip("s3fs")


def test_s3_reads_match_the_server(s3_server: Any, s3_options: dict[str, Any], s3_jpegs: str) -> None:
    storage = Storage(s3_jpegs, s3_options)
    inv = take_inventory(storage)
    assert inv.files == 48  # the synthetic set's hidden manifest is left out
    sizes = {e.path: e.size for e in inv.entries}
    s3_server.reset_counts()
    (point,) = throughput.read_sweep(
        storage, inv.entries, levels=[4], seconds_per_level=120.0, bytes_per_level=inv.total_bytes
    )
    assert point.objects == 48 and point.bytes == inv.total_bytes
    assert point.bytes == sum(sizes[p] for p in point.paths)
    gets = s3_server.gets("fastload-jpegs/train/")
    assert len(gets) == 48 and set(gets.values()) == {1}  # each object fetched exactly once


def test_s3_bench_cold_and_warm_cache(
    s3_server: Any, s3_options: dict[str, Any], s3_jpegs: str, tmp_path: Any
) -> None:
    report = run_bench(
        s3_jpegs, gpus=1, model="resnet50", cache=str(tmp_path / "cache"), duration_s=4,
        max_concurrency=4, num_workers=0, storage_options=s3_options,
    )
    cold, warm = report.measurements
    assert (cold.label, warm.label) == ("cold", "warm")
    # NOTE [cold means cold]: the cold sweep reads each object at most once in all
    assert sum(p.objects for p in cold.reads) <= 48
    assert len({p for point in cold.reads for p in point.paths}) == sum(p.objects for p in cold.reads)
    assert cold.range_reads.skipped_reason is None and warm.range_reads.skipped_reason
    # the cold emulation runs at most one epoch
    assert all(r.samples <= 48 for r in (cold.probe, *cold.runs))
    doc = json.loads(json.dumps(report.to_json()))
    assert [m["condition"] for m in doc["measurements"]] == ["cold", "warm"]
    assert "once warm" in doc["verdict"]
    assert list((tmp_path / "cache").iterdir()) == []  # the scratch cache is removed


def test_s3_cli_json(
    s3_server: Any, s3_jpegs: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import s3fs

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached default instance may target elsewhere
    code = main(["bench", s3_jpegs, "--duration", "2", "--max-concurrency", "2", "--workers", "0",
                 "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(out)
    assert doc["inventory"]["files"] == 48
    assert doc["measurements"][0]["best_read_bytes_per_s"] > 0


@pytest.fixture(scope="module")
def s3_tar_shards(s3_server: Any, s3_options: dict[str, Any], jpeg_root: Any, tmp_path_factory: Any) -> str:
    """The conftest's 48 JPEGs as 4 tar shards of 12 (webdataset's ShardWriter) on S3."""
    from tests.fixtures.s3 import upload_folder
    from tests.test_shards import write_shards

    local = tmp_path_factory.mktemp("bench-shards")
    write_shards(jpeg_root, local, per_shard=12)
    return upload_folder(s3_options, local, "s3://bench-shards/train")


def test_bench_over_tar_shards_counts_images_not_shards(
    s3_server: Any, s3_options: dict[str, Any], s3_tar_shards: str, tmp_path: Any
) -> None:
    """NOTE [bench over shards]: a shard read whole is its 12 images; the emulation reads
    TarShards, so its samples are images, decoded as in training."""
    from fastload import TarShards
    from fastload.bench.inventory import FileEntry
    from fastload.bench.runner import emulation_dataset
    from fastload.bench.shardsets import shard_kind

    storage = Storage(s3_tar_shards, s3_options)
    inv = take_inventory(storage)
    assert inv.files == 4 and shard_kind(inv.entries) == "tar"
    assert shard_kind([*inv.entries, FileEntry("bench-shards/notes.txt", 10)]) is None  # mixed: raw
    assert shard_kind([FileEntry("b/train-0.parquet", 10)]) == "parquet"
    assert isinstance(emulation_dataset(s3_tar_shards, storage, inv, None), TarShards)
    report = run_bench(s3_tar_shards, gpus=1, model="resnet50", cache=str(tmp_path / "cache"),
                       duration_s=4, max_concurrency=4, num_workers=0, storage_options=s3_options)
    assert report.samples_per_file == 12.0
    pillow = report.decode[0]
    assert pillow.skipped_reason is None and pillow.images >= 12  # images taken from the shards
    cold, _ = report.measurements
    assert cold.probe.samples > 4  # images delivered, where 4 files were at most 4 samples before
    images_per_s = cold.best_read.objects_per_s * 12  # the storage's rate in images
    decoding = report.decode_images_per_s
    assert report.limit(cold).startswith("decoding") == (images_per_s > decoding)
    if images_per_s <= decoding:
        assert f" files/s = {images_per_s:,.0f} images/s, " in report.limit(cold)
    assert "once warm" in report.verdict
    assert list((tmp_path / "cache").iterdir()) == []  # the scratch cache is removed
