"""The stored listing (NOTE [the stored listing]): a restart, a rank, a node reuses the
dataset's index from the cache instead of listing the root again, within listing_max_age.

Listing requests are counted on a ``latency::`` view of a real local folder (its
``find``/``ls``), and what a build sees is checked on real files: added, rewritten,
deleted. The concurrent start is two real processes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload import ImageFolder
from fastload.cache import open_cache
from fastload.data.index import DatasetIndex
from fastload.data.stored_listing import is_listing_key
from fastload.io.versions import local_version
from fastload.testing.synthetic import make_jpeg_folder

NO_LATENCY = {"latency": {"latency": 0.0}}


@pytest.fixture
def root(tmp_path) -> Path:
    return make_jpeg_folder(tmp_path / "data", images=8, classes=2, size=(48, 40))


def _listings(ds: ImageFolder) -> int:
    """Listings of the whole root this process sent through the dataset's latency::
    filesystem (the freshness check's one ``ls`` of the root is counted apart: _checks)."""
    return ds.storage.fs.requests["find"]


def _checks(ds: ImageFolder) -> int:
    """``ls`` requests of the root: a remote root's stamp and freshness check (NOTE
    [listing freshness]), one per build."""
    return ds.storage.fs.requests["ls"]


def _stored(cache_dir: Path) -> tuple[object, str]:
    """The disk tier of ``cache_dir`` and the key of the one listing stored there."""
    disk = open_cache(cache_dir).tiers[0]
    keys = [k for k in disk.keys() if is_listing_key(k)]  # noqa: SIM118 (a tier)
    assert len(keys) == 1, keys
    return disk, keys[0]


def _add_image(root: Path, like: str, name: str = "added.jpg") -> Path:
    path = root / Path(like).parent.name / name
    path.write_bytes(Path(like).read_bytes())
    return path


def test_the_second_build_lists_nothing(root, tmp_path):
    url, cache = f"latency::{root}", tmp_path / "cache"
    first = ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY)
    assert _listings(first) == 1 and _checks(first) == 1  # the stamp of its class folders
    first.storage.fs.reset_counts()
    second = ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY)
    assert _listings(second) == 0 and _checks(second) == 1  # checked against it
    assert second.samples == first.samples and second.classes == first.classes
    assert second.index.versions() == first.index.versions()
    assert second[3][1] == first[3][1]
    # listing_max_age=0 lists (and stores what it found)
    third = ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY, listing_max_age=0)
    assert _listings(third) == 1


def test_a_file_added_within_the_max_age_is_seen_by_the_next_build(root, tmp_path, caplog):
    cache = tmp_path / "cache"
    first = ImageFolder(root, size=16, cache=cache)
    reused = ImageFolder(root, size=16, cache=cache)
    assert "its folders are unchanged since, so no listing request" in caplog.text
    assert reused.samples == first.samples
    added = _add_image(root, first.samples[0][0])
    fresh = ImageFolder(root, size=16, cache=cache)  # its folder changed: listed again
    assert len(fresh) == 9 and str(added) in [p for p, _ in fresh.samples]
    assert f"{added.parent.name}/ changed (files added, removed or renamed)" in caplog.text
    # the fresh listing replaced the stored one: the next build reuses it
    assert ImageFolder(root, size=16, cache=cache).samples == fresh.samples
    # without a cache nothing is stored: every build lists
    added.unlink()
    assert len(ImageFolder(root, size=16)) == 8


def test_a_listing_older_than_the_max_age_is_listed_again(root, tmp_path):
    cache = tmp_path / "cache"
    first = ImageFolder(root, size=16, cache=cache)
    disk, key = _stored(cache)
    old = DatasetIndex.from_bytes(disk.get(key))
    aged = DatasetIndex.build(
        old.prefix, [p[len(old.prefix):] for p in old.paths()], old.labels.tolist(),
        classes=old.classes, versions=old.versions(), listed_at=time.time() - 7200, extra=old.extra,
    )
    disk.delete(key)
    assert disk.put(key, aged.to_bytes())
    _add_image(root, first.samples[0][0])
    assert len(ImageFolder(root, size=16, cache=cache, listing_max_age=3600)) == 9  # listed
    assert len(ImageFolder(root, size=16, cache=cache, listing_max_age=3 * 3600)) == 9  # the new one


def test_revalidate_picks_up_a_changed_file_and_rewrites_the_stored_listing(root, tmp_path):
    cache = tmp_path / "cache"
    ds = ImageFolder(root, size=16, cache=cache)
    path = ds.samples[2][0]
    old = ds.read_bytes(2)
    new = Path(ds.samples[5][0]).read_bytes()
    Path(path).write_bytes(new)
    # a build within the max age reuses the stored listing and its versions; a local read
    # stats its file all the same (NOTE [a stat per local read]), so it serves the new bytes
    snapshot = ImageFolder(root, size=16, cache=cache)
    assert snapshot.index.version(2) == ds.index.version(2) != local_version(os.stat(path))
    assert snapshot.read_bytes(2) == new != old
    assert ds.revalidate() == 1 and ds.read_bytes(2) == new
    later = ImageFolder(root, size=16, cache=cache)  # reuses the rewritten listing
    assert later.index.version(2) == local_version(os.stat(path))
    assert later.read_bytes(2) == new
    assert later.index.listed_at == ds.index.listed_at  # the sample set's age is kept
    assert later.index.versions_at > later.index.listed_at
    assert snapshot.revalidate() == 1 and snapshot.read_bytes(2) == new
    assert ds.revalidate() == 0


def test_a_deleted_file_is_named_when_read_and_a_new_build_leaves_it_out(root, tmp_path):
    cache = tmp_path / "cache"
    ds = ImageFolder(root, size=16, cache=cache)
    gone = ds.samples[6][0]
    os.remove(gone)
    with pytest.raises(FileNotFoundError, match=f"{gone}.*index 6.*build the ImageFolder again"):
        ds.read_bytes(6)
    assert ds.revalidate() == 1 and ds.revalidate() == 0  # counted once, not every epoch
    later = ImageFolder(root, size=16, cache=cache)  # as the error says: listed anew
    assert len(later) == 7 and gone not in [p for p, _ in later.samples]


def test_a_revalidation_that_finds_deleted_files_drops_the_stored_listing(tmp_path):
    """A remote root's class folders are unchanged when a file of one is deleted, so the
    freshness check cannot see it; the epoch's revalidation does, and drops the stored
    listing, so a new ImageFolder (what its warning advises) lists without the file."""
    root = make_jpeg_folder(tmp_path / "data", images=8, classes=2, size=(48, 40))
    url, cache = f"latency::{root}", tmp_path / "cache"
    ds = ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY)
    gone = ds.samples[6][0]
    os.remove(gone)
    assert len(ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY)) == 8  # unseen
    assert ds.revalidate() == 1
    ds.storage.fs.reset_counts()
    later = ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY)
    assert _listings(later) == 1 and len(later) == 7


@pytest.mark.parametrize("damage", ["garbage", "flipped", "format", "other_root"])
def test_a_stored_listing_that_fails_validation_is_ignored(root, tmp_path, caplog, damage):
    url, cache = f"latency::{root}", tmp_path / "cache"
    first = ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY)
    disk, key = _stored(cache)
    blob = disk.get(key)
    if damage == "garbage":
        bad = b"not an index at all"
    elif damage == "flipped":
        bad = bytearray(blob)
        bad[-5] ^= 0x01
        bad = bytes(bad)
    elif damage == "format":
        bad = blob.replace(b'"format":1', b'"format":9')
    else:  # a valid index, of another root
        bad = DatasetIndex.build(
            str(tmp_path / "x") + "/", ["a/1.jpg"], [0], classes=["a"], extra={"key": key}
        ).to_bytes()
    disk.delete(key)
    assert disk.put(key, bad)
    first.storage.fs.reset_counts()
    caplog.set_level(logging.DEBUG, logger="fastload.data.stored_listing")
    again = ImageFolder(url, size=16, cache=cache, storage_options=NO_LATENCY)
    assert _listings(again) == 1 and again.samples == first.samples
    assert "ignoring the stored listing" in caplog.text
    # and the good listing took its place
    assert DatasetIndex.from_bytes(disk.get(key)).versions() == first.index.versions()


def test_without_a_shared_tier_every_build_lists(root, tmp_path):
    url = f"latency::{root}"
    for _ in range(2):
        ds = ImageFolder(url, size=16, cache={"memory": "10MB"}, storage_options=NO_LATENCY)
        assert _listings(ds) >= 1
        ds.storage.fs.reset_counts()


def test_a_node_with_its_own_disk_reuses_the_listing_in_a_shared_redis(root, tmp_path, redis_url):
    url = f"latency::{root}"
    node_a = {"disk": tmp_path / "a", "redis": redis_url}
    node_b = {"disk": tmp_path / "b", "redis": redis_url}
    first = ImageFolder(url, size=16, cache=node_a, storage_options=NO_LATENCY)
    assert _listings(first) == 1
    first.storage.fs.reset_counts()
    other = ImageFolder(url, size=16, cache=node_b, storage_options=NO_LATENCY)
    assert _listings(other) == 0 and other.samples == first.samples
    _stored(tmp_path / "b")  # node b's disk now keeps it across its restarts


_CONCURRENT = r"""
import json, os, sys, time
from fastload import ImageFolder
url, cache, go = sys.argv[1], sys.argv[2], sys.argv[3]
open(go + "." + str(os.getpid()), "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
ds = ImageFolder(url, size=16, cache=cache, storage_options={"latency": {"latency": 1.0}})
print(json.dumps({"listings": ds.storage.fs.requests["find"],
                  "samples": len(ds)}))
"""


@pytest.mark.timeout(180)
def test_two_processes_starting_together_list_once(root, tmp_path):
    url, cache, go = f"latency::{root}", str(tmp_path / "cache"), str(tmp_path / "go")
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONCURRENT, url, cache, go],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("go.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        Path(go).touch()  # both are ready: they build at the same moment
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [r["samples"] for r in results] == [8, 8]
    assert sorted(r["listings"] for r in results) == [0, 1]  # one listed, the other waited
