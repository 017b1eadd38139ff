"""NOTE [batched reads]: ``TieredCache.read_many`` and ``ImageFolder.read_batch`` serve,
store, promote and count what one read per object does, with each failure in its place."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import torch

from fastload import DataLoader, ImageFolder
from fastload.cache import open_cache
from fastload.errors import ObjectNotFoundError


def test_read_many_serves_stores_promotes_and_names_a_missing_file(tmp_path, jpeg_root):
    fs = fsspec.filesystem("file")
    paths = [str(p) for p in sorted(Path(jpeg_root).glob("*/*.jpg"))[:4]]
    gone = str(tmp_path / "gone.jpg")
    cache = open_cache({"memory": "10MB", "disk": tmp_path / "c"})
    memory, disk = cache.tiers
    got = cache.read_many(fs, paths[:2] + [gone] + paths[2:], [None] * 5)
    assert got[:2] + got[3:] == [Path(p).read_bytes() for p in paths]
    assert isinstance(got[2], ObjectNotFoundError) and gone in str(got[2])
    assert cache.origin_reads == 4 and disk.stats.misses == 4 and memory.stats.misses == 4
    assert cache.read_many(fs, paths, [None] * 4) == got[:2] + got[3:]
    assert memory.stats.hits == 4 and disk.stats.hits == 0 and cache.origin_reads == 4
    disk.flush_puts()
    fresh = open_cache({"memory": "10MB", "disk": tmp_path / "c"})  # another process's view
    assert fresh.read_many(fs, paths, [None] * 4) == got[:2] + got[3:]
    assert fresh.tiers[1].stats.hits == 4 and fresh.origin_reads == 0
    assert all(fresh.tiers[0].contains(fresh.key(fs, p)) for p in paths)  # promoted


def test_a_local_file_rewritten_between_batches_is_read_anew(tmp_path, jpeg_root):
    fs = fsspec.filesystem("file")
    source = sorted(Path(jpeg_root).glob("*/*.jpg"))
    path = tmp_path / "a.jpg"
    path.write_bytes(source[0].read_bytes())
    cache = open_cache({"disk": tmp_path / "c"})
    assert cache.read_many(fs, [str(path)], [None]) == [source[0].read_bytes()]
    path.write_bytes(source[1].read_bytes())
    assert cache.read_many(fs, [str(path)], [None]) == [source[1].read_bytes()]


def test_a_cached_batch_gives_the_tensors_of_an_uncached_one(tmp_path, jpeg_root):
    plain = ImageFolder(jpeg_root, size=32, seed=3)
    cached = ImageFolder(jpeg_root, size=32, seed=3, cache=tmp_path / "c")
    indices = [5, 0, 3, 3, 1]
    want = plain.__getitems__(indices)
    for _ in range(2):  # cold, then warm
        got = cached.__getitems__(indices)
        assert [label for _, label in got] == [label for _, label in want]
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, want))


def test_a_deleted_file_in_a_cached_batch_is_skipped_and_named(tmp_path, jpeg_root):
    root = tmp_path / "data"
    for p in Path(jpeg_root).glob("*/*.jpg"):
        (root / p.parent.name).mkdir(parents=True, exist_ok=True)
        (root / p.parent.name / p.name).write_bytes(p.read_bytes())
    ds = ImageFolder(root, size=32, cache=tmp_path / "c", on_error="skip")
    gone = ds.samples[2][0]
    os.remove(gone)
    loader = DataLoader(ds, batch_size=4, num_workers=0)
    assert sum(len(labels) for _, labels in loader) == len(ds) - 1
    assert [s.path for s in loader.skipped] == [gone]
