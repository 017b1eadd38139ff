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
