"""NOTE [write-behind] (fastload/cache/writebehind.py): puts of the read path without a fetch
lock are buffered per process and committed in batches; the Tier contract still holds."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from fastload import DataLoader, ImageFolder
from fastload.cache import DiskTier, open_cache, writebehind
from fastload.cache.entry import encode_packed
from fastload.cache.tiered import url_of

FLUSH_ENTRIES = writebehind.FLUSH_ENTRIES

VALUE = b"w" * 1000


@pytest.fixture
def no_age_flush(monkeypatch):
    """Only size, close and fork commit: a slow machine must not flush by age mid-test."""
    monkeypatch.setattr(writebehind, "FLUSH_AGE_S", 1e9)


def _other_process_sees(directory: Path, keys: list[str]) -> list[bool]:
    """Which of ``keys`` a new process finds in the disk cache at ``directory`` (a hit each)."""
    script = (
        "import json, sys\n"
        "from fastload.cache import DiskTier\n"
        "tier = DiskTier(sys.argv[1], create=False)\n"
        "print(json.dumps([tier.get(k) is not None for k in json.loads(sys.stdin.read())]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(directory)], input=json.dumps(keys),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_buffered_put_is_seen_here_at_once_and_elsewhere_after_the_flush(tmp_path, no_age_flush):
    tier = DiskTier(tmp_path / "c")
    tier.put_later("k1", VALUE)
    assert tier.get("k1") == VALUE and tier.contains("k1") and tier.contains_many(["k1", "x"]) == [True, False]
    assert DiskTier(tmp_path / "c").get("k1") == VALUE  # another tier of this process: one buffer
    assert _other_process_sees(tmp_path / "c", ["k1"]) == [False]  # not committed yet
    tier.flush_puts()
    assert _other_process_sees(tmp_path / "c", ["k1"]) == [True]
    assert tier.stats.puts == 1 and tier.stats.hits == 1


def test_a_batch_is_committed_when_full_and_listing_or_closing_commits_the_rest(tmp_path, no_age_flush):
    tier = DiskTier(tmp_path / "c")
    keys = [f"k{i:04d}" for i in range(FLUSH_ENTRIES + 3)]
    for key in keys:
        tier.put_later(key, VALUE)
    assert _other_process_sees(tmp_path / "c", keys) == [True] * FLUSH_ENTRIES + [False] * 3
    assert sorted(tier.keys()) == keys  # keys() commits what is pending first
    tier.put_later("last", VALUE)
    tier.close()
    assert _other_process_sees(tmp_path / "c", ["last"]) == [True]


def test_delete_forgets_a_pending_put(tmp_path):
    tier = DiskTier(tmp_path / "c")
    tier.put_later("gone", VALUE)
    tier.delete("gone")
    tier.flush_puts()
    assert tier.get("gone") is None and list(tier.keys()) == []


def test_the_budget_holds_for_buffered_puts(tmp_path, caplog):
    one = len(encode_packed("k0000", VALUE))
    tier = DiskTier(tmp_path / "c", size=10 * one)
    for i in range(30):
        tier.put_later(f"k{i:04d}", VALUE)
    assert tier.read_used() == 10 * one  # committed first, then counted: 10 fit
    assert tier.stats.puts == 10 and tier.stats.rejected == 20
    tier.put_later("more", VALUE)  # pass-through now: not even buffered
    assert tier.get("more") is None and tier.stats.rejected == 21
    assert "is full" in caplog.text


def test_format_files_and_large_objects_are_stored_at_once(tmp_path):
    files = DiskTier(tmp_path / "f", format="files")
    files.put_later("small", VALUE)
    packed = DiskTier(tmp_path / "p")
    packed.put_later("large", b"L" * (1 << 20))
    assert _other_process_sees(tmp_path / "f", ["small"]) == [True]
    assert _other_process_sees(tmp_path / "p", ["large"]) == [True]


def _read_all(directory: str, paths: list[str]) -> None:
    cache = open_cache({"disk": directory})
    fs = fsspec.filesystem("file")
    for path in paths:
        cache.read(fs, path)
    # no close: the exit of the process commits the buffered puts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_process_commits_its_buffered_puts_as_it_exits(tmp_path, jpeg_root, method):
    paths = [str(p) for p in sorted(Path(jpeg_root).glob("*/*.jpg"))][:10]
    proc = multiprocessing.get_context(method).Process(target=_read_all, args=(str(tmp_path / "c"), paths))
    proc.start()
    proc.join(90)
    assert proc.exitcode == 0
    cache = open_cache({"disk": tmp_path / "c"})
    keys = [cache.key(fsspec.filesystem("file"), p) for p in paths]
    assert _other_process_sees(tmp_path / "c", keys) == [True] * len(paths)


@pytest.mark.timeout(180)
def test_loader_workers_commit_their_puts_when_the_epoch_ends(tmp_path, jpeg_root):
    ds = ImageFolder(jpeg_root, size=16, cache={"disk": tmp_path / "c"})
    for _ in DataLoader(ds, batch_size=8, num_workers=2):
        pass  # fewer objects than a batch of puts: only the workers' exit commits them
    fs = fsspec.filesystem("file")
    keys = [ds.cache.key(fs, str(p)) for p in sorted(Path(jpeg_root).glob("*/*.jpg"))]
    assert _other_process_sees(tmp_path / "c", keys) == [True] * len(keys)


def test_a_fork_commits_the_parents_buffer_first(tmp_path):
    tier = DiskTier(tmp_path / "c")
    tier.put_later("before-fork", VALUE)
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_exit_found, args=(str(tmp_path / "c"), "before-fork"))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0  # the child, with no buffer of its own, found it in the store


def _exit_found(directory: str, key: str) -> None:
    raise SystemExit(0 if DiskTier(directory).get(key) == VALUE else 3)


def test_a_fetch_under_the_fetch_lock_is_stored_at_once(tmp_path, jpeg_root):
    """A remote origin (fsspec's memory filesystem) and a local file under a derivation are
    fetched under the key's lock: the entry is committed before the lock is released."""
    mem = fsspec.filesystem("memory")
    mem.pipe("/bucket/a.bin", b"remote bytes")
    cache = open_cache({"disk": tmp_path / "c"})
    assert cache.read(mem, "/bucket/a.bin") == b"remote bytes"
    local = str(min(Path(jpeg_root).glob("*/*.jpg")))
    deriving = cache.deriving(_Upper())
    fs = fsspec.filesystem("file")
    assert deriving.read(fs, local) == Path(local).read_bytes().upper()
    keys = [cache.key(mem, "/bucket/a.bin"), deriving.key(fs, local)]
    assert _other_process_sees(tmp_path / "c", keys) == [True, True]


class _Upper:
    tag = "upper:v1"

    def __call__(self, data: bytes) -> bytes:
        return data.upper()


def test_a_local_read_without_the_lock_is_buffered(tmp_path, jpeg_root, no_age_flush):
    cache = open_cache({"disk": tmp_path / "c"})
    fs = fsspec.filesystem("file")
    path = str(min(Path(jpeg_root).glob("*/*.jpg")))
    assert cache.read(fs, path) == Path(path).read_bytes()
    key = cache.key(fs, path)
    assert _other_process_sees(tmp_path / "c", [key]) == [False]
    assert cache.read(fs, path) == Path(path).read_bytes() and cache.origin_reads == 1  # served here
    cache.close()
    assert _other_process_sees(tmp_path / "c", [key]) == [True]


_WRITER = """
import os, sys
from fastload.cache import DiskTier, writebehind
writebehind.FLUSH_AGE_S = 1e9  # batches of FLUSH_ENTRIES only
tier = DiskTier(sys.argv[1])
i = 0
while True:
    tier.put_later(f"k{i:07d}", bytes([i % 251]) * (500 + i % 900))
    i += 1
"""


@pytest.mark.timeout(120)
def test_a_process_killed_mid_batch_leaves_whole_entries_or_none(tmp_path):
    directory = tmp_path / "c"
    DiskTier(directory).close()
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(directory)])
    try:
        reader = DiskTier(directory)
        deadline = time.monotonic() + 60
        while reader.store.used() < 20 * FLUSH_ENTRIES * 500 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    tier = DiskTier(directory)
    report = tier.verify()
    assert report.corrupt == [] and report.checked >= 20 * FLUSH_ENTRIES * 500 // 1400
    keys = sorted(tier.keys())
    assert len(keys) % FLUSH_ENTRIES == 0  # whole batches only
    for key in keys:
        i = int(key[1:])
        assert tier.get(key) == bytes([i % 251]) * (500 + i % 900)


def test_url_of_is_unstrip_protocol():
    fs = fsspec.filesystem("file")
    for path in ["/a/b.jpg", "/a//b.jpg", "/a/./b", "/x:/y", "/a b/c%20d", "relative/p", "/d/"]:
        assert url_of(fs, path) == fs.unstrip_protocol(path)
    mem = fsspec.filesystem("memory")
    assert url_of(mem, "/bucket/a") == mem.unstrip_protocol("/bucket/a")
