"""What the disk tier's packed format (fastload/cache/packed.py) promises beyond the shared
tests: the budget under concurrent writers, damage inside the store, large objects in files,
and the store made anew after an OS crash (NOTE [packed durability])."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from click.testing import CliRunner

from fastload.cache import DiskTier
from fastload.cache.cachedir import UNSYNCED
from fastload.cache.entry import encode_packed
from fastload.cli import cli
from tests.cache_damage import flip_on_disk

VALUE = b"v" * 1000
ONE = len(encode_packed("w0-0000", VALUE))


def _write(directory: str, who: int, start) -> None:
    tier = DiskTier(directory)
    start.wait()
    for i in range(0, 200, 10):
        tier.put_many([(f"w{who}-{j:04d}", VALUE) for j in range(i, i + 10)])
    tier.close()


@pytest.mark.timeout(120)
def test_two_processes_writing_at_once_never_overshoot_the_budget(tmp_path):
    directory = str(tmp_path / "c")
    DiskTier(directory, size=150 * ONE, format="packed").close()  # 150 of the 400 fit
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_write, args=(directory, who, start)) for who in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0
    tier = DiskTier(directory)
    entries, used = tier.rescan()
    assert entries == 150 and used == 150 * ONE == tier.read_used()
    assert tier.verify().corrupt == []


def test_a_byte_flipped_inside_the_store_is_found_and_dropped(tmp_path, caplog):
    tier = DiskTier(tmp_path / "c")
    for i in range(20):
        assert tier.put(f"k{i}", bytes([i]) * 3000)
    flip_on_disk(tier, "k7")
    result = CliRunner().invoke(cli, ["cache", "verify", str(tier.directory)])
    assert result.exit_code == 1 and "CORRUPT k7 (" in result.stdout and "checksum" in result.stdout
    assert tier.get("k7") is None and tier.stats.corrupt == 1
    assert "dropping corrupt cache entry k7" in caplog.text and not tier.contains("k7")
    assert [tier.get(f"k{i}") for i in (6, 8)] == [bytes([6]) * 3000, bytes([8]) * 3000]
    assert CliRunner().invoke(cli, ["cache", "verify", str(tier.directory)]).exit_code == 0


def test_large_objects_get_a_file_each_indexed_by_the_store(tmp_path):
    tier = DiskTier(tmp_path / "c", size="10MB")
    big, small = os.urandom(2 << 20), b"s" * 100
    assert tier.put_many([("big", big), ("small", small)]) == [True, True]
    assert tier.path_of("big").exists() and not tier.path_of("small").exists()
    assert tier.get("big") == big and tier.contains_many(["big", "small"]) == [True, True]
    assert sorted(tier.keys()) == ["big", "small"]
    assert tier.read_used() == tier.path_of("big").stat().st_size + len(encode_packed("small", small))
    tier.path_of("big").write_bytes(b"torn")  # the file damaged: a miss, dropped with its pointer
    assert tier.get("big") is None and "big" not in set(tier.keys())
    assert tier.read_used() == len(encode_packed("small", small))
    assert tier.put("big", big) and tier.get("big") == big
    tier.delete("big")
    assert not tier.path_of("big").exists() and tier.get("big") is None


def test_a_mark_of_another_boot_makes_the_store_anew_and_keeps_the_large_files(tmp_path, caplog):
    tier = DiskTier(tmp_path / "c")
    big = os.urandom(2 << 20)
    assert tier.put("small", b"s") and tier.put("big", big)
    tier.close()
    assert not [n for n in os.listdir(tier.cache_dir.packed_path()) if n.startswith(UNSYNCED)]
    # What a process that was writing when the machine went down leaves behind:
    (tier.cache_dir.packed_path() / f"{UNSYNCED}{'0' * 8}-0000-0000-0000-{'0' * 12}-1").touch()
    reopened = DiskTier(tmp_path / "c")
    assert "system went down" in caplog.text
    assert reopened.get("small") is None  # the records may have been damaged: gone
    assert reopened.get("big") == big  # a whole file, checked: indexed again
    assert reopened.read_used() == reopened.path_of("big").stat().st_size


def test_commits_are_marked_until_flushed(tmp_path):
    tier = DiskTier(tmp_path / "c")
    marks = lambda: [n for n in os.listdir(tier.cache_dir.packed_path()) if n.startswith(UNSYNCED)]
    assert marks() == []
    tier.put("k", b"v")
    assert marks() == [f"{UNSYNCED}{open('/proc/sys/kernel/random/boot_id').read().strip()}-{os.getpid()}"]
    tier.close()  # flushed: the mark goes
    assert marks() == [] and DiskTier(tmp_path / "c").get("k") == b"v"
