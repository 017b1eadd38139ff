"""NOTE [locks across fork]: a worker forked while a thread of the parent holds the cache's
locks (the prefetcher does, all the time) must not inherit them held."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import fsspec
import pytest

from fastload.cache import DiskTier, open_cache


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["files", "packed"])
def test_a_child_forked_while_the_cache_locks_are_held_reads_and_stores(tmp_path, jpeg_root, fmt):
    cache = open_cache({"disk": tmp_path / "c", "disk_format": fmt})
    disk = next(t for t in cache.tiers if isinstance(t, DiskTier))
    fs = fsspec.filesystem("file")
    path = str(sorted(Path(jpeg_root).glob("*/*.jpg"))[0])
    expected = Path(path).read_bytes()

    def child() -> None:  # runs in the forked process: a miss takes both locks
        ok = cache.read(fs, path) == expected and disk.contains(cache.key(fs, path))
        raise SystemExit(0 if ok else 3)

    # The parent holds the read-through mutex and the directory's index lock while it forks.
    with cache._misses._mutex, disk.cache_dir.index_lock(5):
        proc = multiprocessing.get_context("fork").Process(target=child)
        proc.start()
    proc.join(20)
    alive = proc.is_alive()
    if alive:
        proc.kill()
        proc.join()
    assert not alive, "the child waited on a lock only its parent's thread could release"
    assert proc.exitcode == 0


def _child_reads_and_writes(disk: DiskTier, keys: list[str]) -> None:
    ok = all(disk.get(k) == k.encode() for k in keys) and disk.put("child", b"child")
    raise SystemExit(0 if ok and disk.get("child") == b"child" else 3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_packed_store_reopens_in_forked_and_spawned_children(tmp_path, method):
    # A forked child gets the parent's tier object (its LMDB environment must not be used
    # there); a spawned one gets it pickled (__reduce__ reopens the directory).
    disk = DiskTier(tmp_path / "c", format="packed", policy="lru")
    keys = [f"k{i}" for i in range(50)]
    assert disk.put_many([(k, k.encode()) for k in keys]) == [True] * 50
    disk.get("k1")  # a pending read time, which the child must not write as its own
    proc = multiprocessing.get_context(method).Process(target=_child_reads_and_writes, args=(disk, keys))
    proc.start()
    proc.join(40)
    assert proc.exitcode == 0
    assert disk.get("child") == b"child" and disk.contains_many(keys) == [True] * 50
    assert disk.put("after", b"1") and disk.verify().corrupt == []
