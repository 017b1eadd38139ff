"""Clairvoyant prefetch: bounded look-ahead, clean stop, and the loader filling the cache
ahead of its workers on emulated-remote S3."""

import threading

import fsspec
import pytest

from fastload import DataLoader, ImageFolder
from fastload.cache import open_cache
from fastload.cache.prefetcher import Prefetcher


@pytest.fixture
def remote(s3_options, s3_jpegs):
    """The S3 JPEG set behind 10 ms of emulated network latency per request."""
    url = f"latency::{s3_jpegs}"
    return url, {"latency": {"latency": 0.01}, "s3": s3_options}


def _files(url, options):
    fs, root = fsspec.core.url_to_fs(url, **options)
    return fs, sorted(p for p in fs.find(root) if p.endswith(".jpg"))


def test_look_ahead_is_bounded_and_follows_the_consumer(remote, tmp_path):
    fs, paths = _files(*remote)
    cache = open_cache(tmp_path / "c")
    p = Prefetcher(cache, fs, paths, ahead=5, jobs=3).start()
    try:
        for t in p._threads:
            t.join(0.5)  # they park at the window's edge
        assert p.fetched == 5 and cache.origin_reads == 5
        p.advance(10)
    finally:
        p.stop()
    for t in p._threads:
        t.join(5)
    assert 5 <= p.fetched <= 15 + 3
    assert not any(t.is_alive() for t in p._threads)


def test_follow_fills_everything_and_stops_at_the_end(remote, tmp_path):
    fs, paths = _files(*remote)
    cache = open_cache(tmp_path / "c")
    p = Prefetcher(cache, fs, paths, ahead=len(paths), jobs=4).start()
    consumed = list(p.follow(iter(range(3)), per_item=1))
    assert consumed == [0, 1, 2]
    assert all(not t.is_alive() for t in p._threads)
    p2 = Prefetcher(cache, fs, paths, ahead=len(paths), jobs=4).start()
    for t in p2._threads:
        t.join(10)
    assert p2.fetched + p.fetched == len(paths) and cache.origin_reads == len(paths)


def test_a_loader_prefetches_a_cached_image_folder_ahead_of_its_workers(remote, tmp_path):
    url, options = remote
    ds = ImageFolder(url, size=32, seed=0, storage_options=options,
                     cache={"disk": tmp_path / "c", "prefetch_jobs": 8})
    plain = ImageFolder(url, size=32, seed=0, storage_options=options)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    before = set(threading.enumerate())
    got = [y.tolist() for _, y in loader]
    expected = [y.tolist() for _, y in DataLoader(plain, batch_size=4, shuffle=True, num_workers=0)]
    assert got == expected
    # the main process's prefetcher fetched objects the workers then read from the disk
    assert ds.cache.origin_reads > 0
    assert not [t for t in threading.enumerate() if t not in before and t.name.startswith("fastload-prefetch")]
    # every image, and the stored listing (NOTE [the stored listing])
    assert open_cache(tmp_path / "c").tiers[0].rescan()[0] == len(ds) + 1


def test_prefetch_can_be_turned_off(remote, tmp_path):
    url, options = remote
    ds = ImageFolder(url, size=32, storage_options=options,
                     cache={"disk": tmp_path / "c", "prefetch": False})
    it = iter(DataLoader(ds, batch_size=8, num_workers=0))
    next(it)
    assert not [t for t in threading.enumerate() if t.name.startswith("fastload-prefetch")]
    assert ds.cache.origin_reads == 8  # only what the loop itself read


def test_after_a_resume_the_prefetcher_looks_ahead_from_the_next_unseen_sample(remote, tmp_path):
    from fastload.loader import prefetch

    url, options = remote

    def loader():
        ds = ImageFolder(url, size=16, seed=3, storage_options=options, cache={"disk": tmp_path / "c"})
        return DataLoader(ds, batch_size=4, shuffle=True, num_workers=0)

    first = loader()
    it = iter(first)
    consumed = [next(it) for _ in range(3)]
    state = first.state_dict()
    expected_rest = [first.dataset.samples[i][0] for i in first.sampler.indices()][12:]
    del it, consumed

    resumed = loader()
    resumed.load_state_dict(state)
    it = iter(resumed)
    next(it)
    running = prefetch._running[resumed]
    assert list(running.paths) == expected_rest  # what is left of the epoch, in order
    assert running._consumed <= 4  # counted from the resume point, not from the epoch start
    del it


def test_a_local_dataset_is_not_prefetched_its_reads_fill_the_cache(jpeg_root, tmp_path):
    from fastload.loader import prefetch

    ds = ImageFolder(jpeg_root, size=16, cache={"disk": tmp_path / "c"})
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=0)
    assert sum(1 for _ in loader) == len(loader)
    assert loader not in prefetch._running  # no prefetcher was started
    stored = open_cache(tmp_path / "c").tiers[0]
    assert all(stored.contains(ds.cache.key(ds.storage.fs, p, ds.storage.versions[p])) for p, _ in ds.samples)
