"""Tests of fastload.bench on a local synthetic JPEG folder: sanity of every number, no timings."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from fastload import DataLoader, ImageFolder
from fastload.bench import accelerators, decode, throughput
from fastload.bench.inventory import take_inventory
from fastload.bench.rawfiles import RawFiles
from fastload.bench.workloads import WORKLOADS, workload
from fastload.cli import main
from fastload.errors import ConfigError, EmptyDatasetError, ObjectNotFoundError, StorageError
from fastload.io.storage import Storage


def _image_files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*.jpg"))


def test_inventory_counts_files_and_bytes(jpeg_root: Path) -> None:
    inv = take_inventory(Storage(jpeg_root))
    files = _image_files(jpeg_root)  # the hidden manifest of the synthetic set is left out
    assert inv.files == len(files) == 48
    assert [e.path for e in inv.entries] == files
    assert inv.total_bytes == sum(os.path.getsize(p) for p in files)
    assert min(os.path.getsize(p) for p in files) <= inv.size_bytes_p50 <= inv.size_bytes_p95
    assert inv.listing_s >= 0


def test_inventory_errors_name_the_url(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError, match="missing"):
        take_inventory(Storage(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptyDatasetError, match="empty"):
        take_inventory(Storage(tmp_path / "empty"))


@pytest.mark.parametrize("chunk_bytes", [throughput.CHUNK_BYTES, 4096])  # one request / streamed
def test_read_sweep_bytes_read_equal_bytes_reported(jpeg_root: Path, chunk_bytes: int) -> None:
    storage = Storage(jpeg_root)
    inv = take_inventory(storage)
    points = throughput.read_sweep(
        storage, inv.entries, levels=[1, 2], seconds_per_level=60.0,
        bytes_per_level=inv.total_bytes, chunk_bytes=chunk_bytes, stop_at_plateau=False,
    )
    assert [p.concurrency for p in points] == [1, 2]
    for p in points:
        # the byte budget equals the dataset: each level reads every file exactly once
        assert sorted(p.paths) == [e.path for e in inv.entries]
        assert p.objects == len(p.latencies_s) == inv.files
        assert p.bytes == sum(os.path.getsize(path) for path in p.paths) == inv.total_bytes
        assert p.to_json()["read_bytes"] == p.bytes
    assert throughput.best_point(points) in points


def test_range_reads_count_their_bytes(jpeg_root: Path) -> None:
    storage = Storage(jpeg_root)
    inv = take_inventory(storage)
    result = throughput.range_reads(storage, inv.entries, concurrency=2, seconds=0.3, read_bytes=1024)
    assert result.skipped_reason is None
    assert result.reads > 0
    assert result.bytes == result.reads * 1024
    assert len(result.latencies_s) == result.reads


def test_range_reads_skip_tiny_files(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    storage = Storage(tmp_path)
    result = throughput.range_reads(storage, take_inventory(storage).entries, concurrency=1)
    assert result.reads == 0 and "too small" in result.skipped_reason


def test_a_failing_range_read_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 8192)
    storage = Storage(tmp_path)
    entries = take_inventory(storage).entries
    (tmp_path / "a.bin").unlink()  # gone after the listing: a storage failure, not a skip
    with pytest.raises(StorageError, match=r"byte range of .*a\.bin"):
        throughput.range_reads(storage, entries, concurrency=1, read_bytes=1024)


class BackendFailure(Exception):
    """A backend's own error type, outside OSError (as botocore's and aiohttp's are)."""


class FailingOpenFileSystem(LocalFileSystem):
    """Local files whose listing works and whose every open fails with a non-OSError."""

    protocol = "fastload-test-failing-open"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        raise BackendFailure(f"connection reset while opening {path}")


@pytest.mark.parametrize("chunk_bytes", [throughput.CHUNK_BYTES, 4096])  # one request / streamed
def test_a_non_oserror_backend_failure_in_the_bench_copy_is_a_storage_error(
    tmp_path: Path, chunk_bytes: int
) -> None:
    fsspec.register_implementation(FailingOpenFileSystem.protocol, FailingOpenFileSystem,
                                   clobber=True)
    (tmp_path / "a.bin").write_bytes(b"x" * 8192)
    storage = Storage(f"{FailingOpenFileSystem.protocol}://{tmp_path}")
    entries = take_inventory(storage).entries
    with pytest.raises(StorageError, match=r"cannot read .*a\.bin: BackendFailure") as info:
        throughput.read_sweep(storage, entries, levels=[1], chunk_bytes=chunk_bytes)
    assert isinstance(info.value.__cause__, BackendFailure)


def test_concurrency_levels() -> None:
    assert throughput.concurrency_levels(1) == [1]
    assert throughput.concurrency_levels(8) == [1, 2, 4, 8]
    assert throughput.concurrency_levels(12) == [1, 2, 4, 8, 12]
    with pytest.raises(ConfigError):
        throughput.concurrency_levels(0)


def test_pillow_decode_rate(jpeg_root: Path) -> None:
    storage = Storage(jpeg_root)
    samples = decode.read_samples(storage, take_inventory(storage).entries, limit=8)
    assert len(samples) == 8
    rate = decode.pillow_rate(samples, seconds=0.2)
    assert rate.skipped_reason is None
    assert rate.images >= len(samples)  # every sample decoded at least once
    assert rate.cpu_seconds > 0 and rate.images_per_s_per_core > 0
    assert decode.pillow_rate([]).skipped_reason


def test_published_workloads() -> None:
    w = workload("resnet50", "h100")
    assert (w.step_s, w.batch_size, w.au_target) == (0.224, 400, 0.90)
    assert w.sample_s == pytest.approx(0.224 / 400)
    assert w.source.endswith("resnet50_h100.yaml")
    assert all(v.step_s > 0 and 0 < v.au_target <= 1 for v in WORKLOADS.values())
    custom = workload("mine", samples_per_sec=250)
    assert custom.sample_s == pytest.approx(0.004) and custom.au_target == 0.90
    with pytest.raises(ConfigError, match="resnet50"):
        workload("gpt5")
    with pytest.raises(ConfigError, match="samples_per_sec"):
        workload(samples_per_sec=0)


def test_largest_fed_follows_au_definition() -> None:
    w = workload("mine", samples_per_sec=100)  # one accelerator eats 100 samples/s, bar 90%
    assert accelerators.largest_fed(0, w) == 0
    assert accelerators.largest_fed(89, w) == 0
    assert accelerators.largest_fed(90, w) == 1
    assert accelerators.largest_fed(900, w) == 10
    assert accelerators.largest_fed(900, w, au_target=0.5) == 18


def test_one_epoch_delivers_every_sample_once(jpeg_root: Path) -> None:
    ds = ImageFolder(jpeg_root, size=32, train=True)
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=1)
    w = workload("tiny", samples_per_sec=1e6)
    run = accelerators.AcceleratorEmulator(loader, w, 3, seconds=120.0, one_epoch=True).run()
    assert run.samples == len(ds) == 48  # counts equal files
    assert sum(u.batches for u in run.usage) == 10  # ceil(48 / 5)
    assert len(run.usage) == 3
    for u in run.usage:
        assert 0.0 <= u.au <= 1.0
        assert u.compute_s == pytest.approx(u.samples * w.sample_s, rel=1e-6, abs=1e-9)
    assert run.to_json()["samples"] == 48


def test_emulation_of_raw_files_is_time_bounded(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"part{i}.npz").write_bytes(os.urandom(1000 + i))
    storage = Storage(tmp_path)
    inv = take_inventory(storage)
    loader = DataLoader(RawFiles(storage, [e.path for e in inv.entries]), batch_size=2,
                        num_workers=0, collate_fn=list)
    assert sum(len(b) for batch in loader for b in batch) == inv.total_bytes
    run = accelerators.AcceleratorEmulator(loader, workload("raw", samples_per_sec=1000), 2, seconds=0.5).run()
    assert run.samples > 0 and 0.0 <= run.au <= 1.0
    assert run.samples == sum(u.samples for u in run.usage)


def test_cli_json_report(jpeg_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", str(jpeg_root), "--duration", "2", "--gpus", "2",
                 "--max-concurrency", "4", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(out)
    assert doc["inventory"]["files"] == 48
    assert doc["inventory"]["total_bytes"] == sum(os.path.getsize(p) for p in _image_files(jpeg_root))
    (m,) = doc["measurements"]
    assert m["condition"] == "origin"
    for key in ("read_bytes_per_s", "objects_per_s", "latency_ms_p50", "latency_ms_p95",
                "latency_ms_p99", "read_bytes", "seconds"):
        assert key in m["reads"][0]
    assert [r["concurrency"] for r in m["reads"]][:2] == [1, 2]
    assert "range_reads_per_s" in m["range_reads"]
    assert m["feed_samples_per_s"] > 0
    assert 2 in [e["accelerators"] for e in m["emulations"]]
    for e in m["emulations"]:
        assert len(e["per_accelerator"]) == e["accelerators"]
        assert e["samples"] == sum(a["samples"] for a in e["per_accelerator"])
    assert doc["decode"][0]["images_per_s_per_core"] > 0
    assert doc["workload"]["source"].endswith("resnet50_h100.yaml")
    assert doc["verdict"].startswith("this storage")
    assert "H100" in doc["verdict"]


def test_cli_human_report(jpeg_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", str(jpeg_root), "--duration", "2", "--max-concurrency", "2",
                 "--model", "unet3d", "--accelerator", "a100", "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "verdict:" in out and "A100" in out and "unet3d" in out


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("{tmp}/missing", "does not exist"),
        ("{tmp}/empty", "no files"),
        ("nosuchproto://bucket/train", "protocol"),
        ("gs://bucket/train", "gcsfs"),
    ],
)
def test_cli_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, expected: str
) -> None:
    (tmp_path / "empty").mkdir()
    code = main(["bench", url.format(tmp=tmp_path), "--duration", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_cli_unreachable_endpoint_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s3fs = pytest.importorskip("s3fs")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    # fsspec caches s3fs instances by their arguments, not by the environment: an instance an
    # earlier test made (bound to the moto server) would otherwise answer for this endpoint.
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        code = main(["bench", "s3://bucket/train", "--duration", "1"])
    finally:  # fsspec caches the instance, bound to this endpoint: later tests need a new one
        s3fs.S3FileSystem.clear_instance_cache()
    err = capsys.readouterr().err
    assert code == 1  # the store is down, not the path wrong (that is exit 2)
    assert "cannot list s3://bucket/train: the store is unreachable" in err
    assert "EndpointConnectionError" in err and "Traceback" not in err


def test_cli_bad_option_exits_2(jpeg_root: Path) -> None:
    assert main(["bench", str(jpeg_root), "--model", "gpt5", "--duration", "1"]) == 2
    assert main(["bench", str(jpeg_root), "--workers", "many"]) == 2


def test_storage_error_is_an_oserror() -> None:
    assert issubclass(StorageError, OSError)
