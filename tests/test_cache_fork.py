"""NOTE [locks across fork]: a worker forked while a thread of the parent holds the cache's
locks (the prefetcher does, all the time) must not inherit them held."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import fsspec
import pytest

from fastload.cache import DiskTier, open_cache


@pytest.mark.timeout(60)
def test_a_child_forked_while_the_cache_locks_are_held_reads_and_stores(tmp_path, jpeg_root):
    cache = open_cache({"disk": tmp_path / "c"})
    disk = next(t for t in cache.tiers if isinstance(t, DiskTier))
    fs = fsspec.filesystem("file")
    path = str(sorted(Path(jpeg_root).glob("*/*.jpg"))[0])
    expected = Path(path).read_bytes()

    def child() -> None:  # runs in the forked process: a miss takes both locks
        ok = cache.read(fs, path) == expected and disk.contains(cache.key(fs, path))
        raise SystemExit(0 if ok else 3)

    # The parent holds the read-through mutex and the directory's index lock while it forks.
    with cache._mutex, disk.cache_dir.index_lock(5):
        proc = multiprocessing.get_context("fork").Process(target=child)
        proc.start()
    proc.join(20)
    alive = proc.is_alive()
    if alive:
        proc.kill()
        proc.join()
    assert not alive, "the child waited on a lock only its parent's thread could release"
    assert proc.exitcode == 0
