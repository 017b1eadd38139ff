"""The exit codes of the installed ``fastload`` console script and of ``python -m fastload``.

Contract: 0 success; 1 failures (objects not fetched, corrupt entries, origin unavailable);
2 bad usage or bad input; 130 interrupted (SIGINT), 143 stopped (SIGTERM). Run as
subprocesses: click's test runner bypasses the console script's ``sys.exit(main())``, which
is where the codes were once lost.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import fastload
from fastload.io.origin import READ_DEADLINE_S
from fastload.cache import DiskTier
from tests.cache_damage import damage
from tests.fixtures.s3 import DUMMY_ENV

FASTLOAD = str(Path(sys.executable).parent / "fastload")


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([FASTLOAD, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **DUMMY_ENV})


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastload", *args], capture_output=True,
                          text=True, timeout=60)


def _dataset(root: Path, files: int = 4) -> Path:
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"{i:02d}.bin").write_bytes(bytes([i]) * 100)
    return root


@pytest.mark.timeout(120)
def test_version_and_help_exit_0():
    version = _run("--version")
    assert version.returncode == 0 and fastload.__version__ in version.stdout
    for args in (["--help"], ["cache", "--help"], ["cache", "warm", "--help"]):
        shown = _run(*args)
        assert shown.returncode == 0 and "Usage:" in shown.stdout, args
    warm_help = _run("cache", "warm", "--help").stdout
    assert "--max-failures" in warm_help
    assert f"[default: {READ_DEADLINE_S:g}]" in " ".join(warm_help.split())  # the library's
    module = _module("--version")
    assert module.returncode == 0 and fastload.__version__ in module.stdout


@pytest.mark.timeout(60)
def test_verify_exits_0_on_a_sound_cache_and_1_on_a_corrupt_entry(tmp_path):
    cache = tmp_path / "cache"
    tier = DiskTier(cache)
    for i in range(3):
        assert tier.put(f"file:///data/{i}.bin", bytes([i]) * 1000)
    tier.close()
    sound = _run("cache", "verify", str(cache))
    assert sound.returncode == 0 and "0 corrupt" in sound.stdout, sound

    victim = next(DiskTier(cache).keys())
    damage(DiskTier(cache), victim, lambda b: b[:-3])
    corrupt = _run("cache", "verify", str(cache))
    assert corrupt.returncode == 1 and f"CORRUPT {victim}" in corrupt.stdout, corrupt
    assert _module("cache", "verify", str(cache)).returncode == 1
    assert json.loads(_run("cache", "verify", str(cache), "--json").stdout)["ok"] is False


@pytest.mark.timeout(180)
def test_bad_usage_and_bad_input_exit_2(tmp_path):
    (tmp_path / "not-a-cache").mkdir()
    (tmp_path / "not-a-cache" / "notes.txt").write_text("mine")
    data = _dataset(tmp_path / "data")
    cases = {
        "a missing cache directory": (["cache", "verify", str(tmp_path / "missing")], "does not exist"),
        "stats of a missing directory": (["cache", "stats", str(tmp_path / "missing")], "missing"),
        "a directory that is no cache": (["cache", "clear", str(tmp_path / "not-a-cache")],
                                         "not a fastload cache"),
        "warming into a foreign directory": (["cache", "warm", str(data), "--cache",
                                              str(tmp_path / "not-a-cache")], "not a fastload cache"),
        "a bad --shard": (["cache", "warm", str(data), "--cache", str(tmp_path / "c"),
                           "--shard", "4/4"], "--shard"),
        "a missing dataset root": (["cache", "warm", str(tmp_path / "nothing"), "--cache",
                                    str(tmp_path / "c")], "does not exist"),
        "an unknown option": (["cache", "warm", str(data), "--cash", "x"], "No such option"),
        "an unknown command": (["cahce"], "No such command"),
        "a bad --jobs": (["cache", "warm", str(data), "--cache", str(tmp_path / "c"),
                          "--jobs", "0"], "--jobs"),
        "a bad --read-timeout": (["cache", "warm", str(data), "--cache", str(tmp_path / "c"),
                                  "--read-timeout", "0"], "--read-timeout"),
    }
    for case, (args, said) in cases.items():
        run = _run(*args)
        assert run.returncode == 2, (case, run.stdout, run.stderr)
        assert said in run.stderr, (case, run.stderr)
    assert (tmp_path / "not-a-cache" / "notes.txt").read_text() == "mine"
    module = _module("cache", "verify", str(tmp_path / "missing"))
    assert module.returncode == 2 and "does not exist" in module.stderr


@pytest.mark.timeout(60)
def test_warm_exits_0_then_resumes(tmp_path):
    data = _dataset(tmp_path / "data")
    cache = str(tmp_path / "cache")
    first = _run("cache", "warm", str(data), "--cache", cache, "--json")
    assert first.returncode == 0 and json.loads(first.stdout)["fetched"] == 4, first.stderr
    again = _run("cache", "warm", str(data), "--cache", cache)
    assert again.returncode == 0 and "4 already cached" in again.stdout
    assert "warm: 4/4 files" in again.stderr  # a plain progress line: stderr is no terminal


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux /proc")
def test_warm_with_failed_objects_exits_1_naming_a_few(tmp_path):
    data = _dataset(tmp_path / "data", files=3)
    for i in range(8):  # listed as regular files; reading them at offset 0 fails with EIO
        (data / f"bad{i}.bin").symlink_to("/proc/self/mem")
    run = _run("cache", "warm", str(data), "--cache", str(tmp_path / "cache"))
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "3 fetched" in run.stdout and "8 failed" in run.stdout
    assert run.stdout.count("FAILED ") == 5 and "... and 3 more failed" in run.stdout
    assert "run the same command again" in run.stdout
    listed = json.loads(_run("cache", "warm", str(data), "--cache", str(tmp_path / "cache"),
                             "--json").stdout)
    assert len(listed["failed"]) == 8 and listed["skipped"] == 3 and listed["ok"] is False


@pytest.mark.timeout(60)
def test_an_unreachable_origin_exits_1_saying_to_run_again(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A warm that does not give up within 45 s is a hang: TimeoutExpired fails the test.
    run = _run("cache", "warm", "s3://bucket/train", "--cache", str(tmp_path / "cache"),
               "-o", f"endpoint_url=http://127.0.0.1:{port}", timeout=45)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "cannot warm s3://bucket/train" in run.stderr and "run the same command again" in run.stderr


def _sigint_default() -> None:
    """In the child before it runs: SIGINT handled by default. A test run started in the
    background of a non-interactive shell ignores SIGINT, and a child inherits that: Python
    then never turns it into KeyboardInterrupt and the warm runs to a normal exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _warm_until_progress(data: Path, cache: Path) -> subprocess.Popen:
    """A warm of ``data`` over a slow store (1 s a request, one at a time: 30 s for 30 files),
    returned once it printed a progress line with files done ("warm: 4/30 files, ..."; one
    every 5 s), so a signal sent now arrives mid-run with entries kept, however busy the
    machine is: the test waits for the line, not for a time, and a slower machine only
    leaves more files to do."""
    warm = subprocess.Popen(
        [FASTLOAD, "cache", "warm", f"latency::file://{data}", "--cache", str(cache),
         "--jobs", "1", "-o", 'latency={"latency": 1.0}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_sigint_default,  # noqa: PLW1509 - no thread of this test runs at the fork
    )
    assert warm.stderr is not None
    for line in warm.stderr:
        if line.startswith("warm: ") and "/30 files" in line and not line.startswith("warm: 0/"):
            return warm
    raise AssertionError(f"no progress line: {warm.communicate()}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_warm_saying_what_is_kept(tmp_path, sig, code):
    data, cache = _dataset(tmp_path / "data", files=30), tmp_path / "cache"
    warm = _warm_until_progress(data, cache)
    try:
        warm.send_signal(sig)
        out, err = warm.communicate(timeout=60)
    finally:
        if warm.poll() is None:
            warm.kill()
            warm.communicate()
    name = signal.Signals(sig).name
    assert warm.returncode == code, (out, err)
    assert f"fastload: aborted by {name} after " in err and "Traceback" not in err, err
    assert "Run the same command again to resume" in err
    said = err.split(f"aborted by {name} after ", 1)[1]
    kept = int(said.split(": ", 1)[1].split(" are in the cache", 1)[0])
    assert 0 < kept < 30, err
    # what it said it kept is there, whole: the same warm run again skips exactly those
    again = _run("cache", "warm", f"latency::file://{data}", "--cache", str(cache),
                 "-o", 'latency={"latency": 0}')
    assert again.returncode == 0, again
    assert f"{30 - kept} fetched, {kept} already cached" in again.stdout, again
    assert _run("cache", "verify", str(cache)).returncode == 0


@pytest.mark.timeout(120)
def test_bench_tells_an_unreachable_store_from_a_wrong_path(tmp_path, s3_server, s3_jpegs):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = _run("bench", f"http://127.0.0.1:{port}/data/", "--duration", "1")
    assert refused.returncode == 1, refused
    assert f"cannot list http://127.0.0.1:{port}/data/: the store is unreachable" in refused.stderr
    assert "Cannot connect to host" in refused.stderr and "Traceback" not in refused.stderr
    s3_refused = _run("bench", "s3://bucket/train", "-o", f"endpoint_url=http://127.0.0.1:{port}",
                      "--duration", "1")
    assert s3_refused.returncode == 1 and "EndpointConnectionError" in s3_refused.stderr, s3_refused
    # -o reaches the store: the moto server answers, and a path it lacks is bad input
    wrong = _run("bench", f"{s3_jpegs}/nothing-here", "-o", f"endpoint_url={s3_server.endpoint}",
                 "--duration", "1")
    assert wrong.returncode == 2 and "does not exist; check the path or URL" in wrong.stderr, wrong
    assert _run("bench", str(tmp_path / "missing"), "--duration", "1").returncode == 2
    bad = _run("bench", str(tmp_path), "-o", "novalue")
    assert bad.returncode == 2 and "is not KEY=VALUE" in bad.stderr


def test_bench_takes_a_brace_pattern_of_shards_and_names_a_missing_one(jpeg_root, tmp_path):
    """`fastload bench` takes the pattern a TarShards was given, as `cache warm` does."""
    from tests.test_shards import write_shards

    write_shards(jpeg_root, tmp_path)  # 48 images: 5 shards of 10, 10, 10, 10, 8
    names = sorted(p.name for p in tmp_path.glob("*.tar"))
    pattern = str(tmp_path / names[0].replace("000000", "{000001..000002}"))
    run = _run("bench", pattern, "--duration", "2", "--max-concurrency", "2", "--json",
               timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert doc["url"] == pattern and doc["inventory"]["files"] == 2
    assert doc["samples_per_file"] == 10  # the two shards' images, not the other three's
    index = tmp_path / "two.json"  # a wids shard index names files too
    index.write_text(json.dumps({"wids_version": 1, "shardlist": [
        {"url": names[1], "nsamples": 10}, {"url": names[2], "nsamples": 10}]}))
    by_index = _run("bench", str(index), "--duration", "2", "--max-concurrency", "2", "--json",
                    timeout=180)
    assert by_index.returncode == 0, by_index.stdout + by_index.stderr
    assert json.loads(by_index.stdout)["inventory"]["files"] == 2
    missing = _run("bench", pattern.replace("{000001..000002}", "{000004..000006}"),
                   "--duration", "1")
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert names[0].replace("000000", "000005") + " and 1 more named by" in missing.stderr
