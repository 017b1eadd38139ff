"""`fastload cache warm|stats|verify|clear` against the real S3 server, including an origin
that goes down in the middle of a warm."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fastload.cache import DiskTier
from fastload.cli import cli, main
from tests.cache_damage import damage
from tests.fixtures.s3 import S3Server, upload_folder


def _run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _script(*args):
    """The installed console script, as a user runs it (a wide terminal: no wrapped cells)."""
    fastload = str(Path(sys.executable).parent / "fastload")
    return subprocess.run([fastload, *args], check=False, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})


def _s3_opts(server):
    return ["-o", f"endpoint_url={server.endpoint}", "-o", "use_listings_cache=false"]


def test_warm_stats_verify_clear(s3_server, s3_jpegs, tmp_path):
    cache = str(tmp_path / "c")
    s3_server.reset_counts()
    first = _run("cache", "warm", s3_jpegs, "--cache", cache, "--jobs", "4", *_s3_opts(s3_server), "--json")
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    n = report["files"]
    assert report["fetched"] == n and report["failed"] == [] and n >= 48
    again = json.loads(_run("cache", "warm", s3_jpegs, "--cache", cache, *_s3_opts(s3_server), "--json").stdout)
    assert again["skipped"] == n and again["fetched"] == 0  # resumable: cached files are skipped
    assert max(s3_server.gets("fastload-jpegs/train/").values()) == 1

    stats = json.loads(_run("cache", "stats", cache, "--json").stdout)
    assert stats["entries"] == n and stats["puts"] == n and stats["bytes"] > report["bytes"]
    assert "entries" in _run("cache", "stats", cache).stdout

    assert _run("cache", "verify", cache).exit_code == 0
    victim = next(DiskTier(cache).keys())
    damage(DiskTier(cache), victim, lambda b: b[:-3])
    bad = _run("cache", "verify", cache)
    assert bad.exit_code == 1 and f"CORRUPT {victim}" in bad.stdout
    assert _run("cache", "verify", cache, "--drop").exit_code == 1
    assert _run("cache", "verify", cache).exit_code == 0

    cleared = _run("cache", "clear", cache)
    assert cleared.exit_code == 0 and f"{n - 1} entries" in cleared.stdout
    assert json.loads(_run("cache", "stats", cache, "--json").stdout)["entries"] == 0


def test_shards_split_the_dataset(s3_server, s3_jpegs, tmp_path):
    counts = []
    for i in range(2):
        out = _run("cache", "warm", s3_jpegs, "--cache", str(tmp_path / f"n{i}"), "--shard", f"{i}/2",
                   *_s3_opts(s3_server), "--json")
        counts.append(json.loads(out.stdout)["fetched"])
    keys = [set(DiskTier(tmp_path / f"n{i}").keys()) for i in range(2)]
    assert not keys[0] & keys[1] and abs(counts[0] - counts[1]) <= 1
    bad = _run("cache", "warm", s3_jpegs, "--cache", str(tmp_path / "x"), "--shard", "2/2")
    assert bad.exit_code == 2 and "--shard" in bad.output


def test_a_second_warm_completes_what_an_origin_outage_interrupted(s3_server, tmp_path):
    from fastload.cache.warm import warm
    from fastload.testing.synthetic import make_jpeg_folder

    server = S3Server().start()  # its own server: this test stops it
    opts = server.storage_options(config_kwargs={"retries": {"max_attempts": 1}})
    local = make_jpeg_folder(tmp_path / "jpegs", images=14, classes=2, size=(32, 24))
    url = upload_folder(opts, local, "s3://outage/train")
    seen = []

    def on_file(_url, _nbytes, outcome):
        seen.append(outcome)
        if len(seen) == 10:
            server.stop()  # the origin goes down mid-warm

    try:
        first = warm(url, tmp_path / "c", jobs=1, storage_options=opts, on_file=on_file)
        assert first.fetched == 10 and len(first.failed) == first.files - 10
        assert all(u.startswith("s3://outage/train/") for u, _ in first.failed)
        server = S3Server(port=server.port).start()  # back up, same buckets
        second = _run("cache", "warm", url, "--cache", str(tmp_path / "c"), "-o", f"endpoint_url={server.endpoint}", "--json")
        report = json.loads(second.stdout)
        assert second.exit_code == 0 and report["skipped"] == 10 and report["fetched"] == first.files - 10
        assert DiskTier(tmp_path / "c").verify().checked == first.files
    finally:
        server.stop()


def test_a_missing_dataset_root_exits_2_naming_it(s3_server, tmp_path, capsys):
    code = main(["cache", "warm", "s3://no-such-bucket/x", "--cache", str(tmp_path / "c"), *_s3_opts(s3_server)])
    assert code == 2 and "s3://no-such-bucket/x does not exist" in capsys.readouterr().err


def test_python_dash_m_fastload_cache(tmp_path):
    run = subprocess.run([sys.executable, "-m", "fastload", "cache", "verify", str(tmp_path)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "not a fastload cache directory" in run.stderr


@pytest.mark.parametrize("fmt, description", [
    ("packed", "LMDB, objects under 1 MiB; larger ones one file each"),
    ("files", "one file per entry"),
])
def test_stats_names_the_directory_format(tmp_path, fmt, description):
    tier = DiskTier(tmp_path / "c", format=fmt)
    assert tier.put("small", b"x" * 10) and tier.put("large", b"y" * (2 << 20))
    tier.close()
    as_json = _script("cache", "stats", str(tmp_path / "c"), "--json")
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout)
    assert (summary["format"], summary["format_description"]) == (fmt, description)
    assert summary["entries"] == 2
    table = _script("cache", "stats", str(tmp_path / "c"))
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if " format " in line)
    assert f"{fmt} ({description})" in row and "format_description" not in table.stdout


def test_warm_help_says_the_jobs_default_per_store():
    shown = _script("cache", "warm", "--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # click wraps the help text
    assert "64 on an async remote store" in text and "16 on local files" in text


def test_warm_without_jobs_on_local_files_uses_reader_threads(tmp_path):
    import fsspec

    from fastload.io.fetch import REMOTE_JOBS, SYNC_JOBS, default_jobs

    data = tmp_path / "data"
    data.mkdir()
    for i in range(40):
        (data / f"{i:03d}.bin").write_bytes(bytes([i]) * (100 + i))
    warmed = _script("cache", "warm", str(data), "--cache", str(tmp_path / "c"), "--json")
    assert warmed.returncode == 0, warmed.stderr
    report = json.loads(warmed.stdout)
    assert report["files"] == report["fetched"] == 40 and report["failed"] == []
    tier = DiskTier(tmp_path / "c")
    assert tier.verify().checked == 40
    again = json.loads(_script("cache", "warm", str(data), "--cache", str(tmp_path / "c"), "--json").stdout)
    assert again["skipped"] == 40 and again["fetched"] == 0
    # What the default is on each kind of store (NOTE [default jobs] in fastload/io/fetch.py).
    assert default_jobs(fsspec.filesystem("file")) == SYNC_JOBS == 16
    assert default_jobs(fsspec.filesystem("s3", anon=True)) == REMOTE_JOBS == 64
    assert default_jobs(fsspec.filesystem("http")) == REMOTE_JOBS
