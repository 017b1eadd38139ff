"""A stored listing is never silently stale (NOTE [listing freshness]), and a stored listing's
paths never leave the dataset root. Real folders changed between builds, and moto's S3.

Every case builds the dataset again after a change and compares it with a build without a
cache (which always lists): the same samples and the same ``class_to_idx``, cached or not.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import pytest
import s3fs

from fastload import DataLoader, ImageFolder
from fastload.cache import open_cache
from fastload.data import listing_stamp
from fastload.data.index import DatasetIndex
from fastload.data.stored_listing import is_listing_key
from fastload.errors import MissingSampleError
from fastload.testing.synthetic import make_jpeg_folder
from tests.fixtures.s3 import upload_folder


@pytest.fixture
def root(tmp_path) -> Path:
    return make_jpeg_folder(tmp_path / "data", images=12, classes=3, size=(40, 32))


def _uncached(root: Path | str, **kw) -> ImageFolder:
    return ImageFolder(str(root), size=16, **kw)


def _same_as_uncached(ds: ImageFolder, **kw) -> None:
    fresh = _uncached(ds.root, **kw)
    assert ds.class_to_idx == fresh.class_to_idx
    assert list(ds.samples) == list(fresh.samples)


def _copy_class(root: Path, src: str, dst: str) -> None:
    shutil.copytree(root / src, root / dst)


def _change(root: Path, how: str) -> None:
    """One change to a local dataset tree, as a user (or rsync) would make it."""
    first = min((root / "class_01").glob("*.jpg"))
    if how == "class added":
        _copy_class(root, "class_01", "a")  # sorts first: every label would shift
    elif how == "files added to a class":
        shutil.copy(first, root / "class_02" / "new.jpg")
    elif how == "class deleted":
        shutil.rmtree(root / "class_00")
    elif how == "class renamed":
        (root / "class_02").rename(root / "class_zz")
    elif how == "file deleted":
        first.unlink()
    elif how == "nested file added":
        (root / "class_00" / "2024" / "01").mkdir(parents=True)
        shutil.copy(first, root / "class_00" / "2024" / "01" / "deep.jpg")
    elif how == "file added, folder times set back":
        st = os.stat(root / "class_02")
        shutil.copy(first, root / "class_02" / "new.jpg")
        os.utime(root / "class_02", ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -d, rsync -t


CHANGES = ["class added", "files added to a class", "class deleted", "class renamed",
           "file deleted", "nested file added", "file added, folder times set back"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", CHANGES)
def test_a_change_to_a_local_tree_is_seen_by_the_next_build(root, tmp_path, how, caplog):
    if how == "nested file added":  # a class folder with a subfolder already, before the listing
        (root / "class_00" / "2024").mkdir()
    cache = tmp_path / "cache"
    before = ImageFolder(str(root), size=16, cache=cache)
    assert ImageFolder(str(root), size=16, cache=cache).samples == before.samples  # reused
    _change(root, how)
    caplog.clear()
    after = ImageFolder(str(root), size=16, cache=cache)
    assert "is out of date" in caplog.text and "listing again" in caplog.text
    _same_as_uncached(after)
    assert list(after.samples) != list(before.samples)
    # the new listing is stored: the build after that reuses it, with no warning
    caplog.clear()
    again = ImageFolder(str(root), size=16, cache=cache)
    assert list(again.samples) == list(after.samples) and "unchanged since" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert again.listing_note is None


@pytest.mark.timeout(120)
def test_a_deleted_class_is_named_when_read_and_the_advice_works(root, tmp_path):
    cache = tmp_path / "cache"
    ds = ImageFolder(str(root), size=16, cache=cache)
    shutil.rmtree(root / "class_00")
    with pytest.raises(MissingSampleError) as gone:
        ds.read_bytes(0)
    message = str(gone.value)
    assert "class_00" in message and "build the ImageFolder again to re-list" in message
    rebuilt = ImageFolder(str(root), size=16, cache=cache)  # what the message says to do
    assert rebuilt.classes == ["class_01", "class_02"] and len(rebuilt) == 8
    assert [rebuilt.read_bytes(i) for i in range(len(rebuilt))]  # every sample reads
    _same_as_uncached(rebuilt)


@pytest.mark.timeout(120)
def test_a_tree_past_the_folder_cap_keeps_its_class_folders_and_warns(root, tmp_path, caplog,
                                                                     monkeypatch):
    monkeypatch.setattr(listing_stamp, "MAX_FOLDERS", 3)  # the root and 3 class folders: 4
    (root / "class_00" / "sub").mkdir()
    cache = tmp_path / "cache"
    ImageFolder(str(root), size=16, cache=cache)
    reused = ImageFolder(str(root), size=16, cache=cache)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("more than 3 folders" in w and "listing_max_age=0" in w for w in warned), warned
    assert "more than 3 folders" in reused.listing_note
    _copy_class(root, "class_01", "a")  # a class folder is still checked
    assert ImageFolder(str(root), size=16, cache=cache).classes[0] == "a"


def _stored(cache_dir: Path) -> tuple[object, str]:
    disk = open_cache(cache_dir).tiers[0]
    (key,) = [k for k in disk.keys() if is_listing_key(k)]  # noqa: SIM118 - a tier, not a dict
    return disk, key


def _with_path(index: DatasetIndex, path: str) -> DatasetIndex:
    """``index`` with one more sample at relative ``path``: what a forger would store."""
    rel = [p[len(index.prefix) :] for p in index.paths()] + [path]
    return DatasetIndex.build(
        index.prefix, rel, [*index.labels.tolist(), 0], classes=index.classes,
        versions=[*index.versions(), "9:1:2:3"], listed_at=index.listed_at, extra=index.extra,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("escape", ["../secret.txt", "class_00/../../secret.txt", "/etc/hostname"])
def test_a_stored_path_outside_the_root_is_refused_and_never_read(root, tmp_path, caplog, escape):
    secret = tmp_path / "secret.txt"
    secret.write_text("not a sample")
    cache = tmp_path / "cache"
    first = ImageFolder(str(root), size=16, cache=cache)
    disk, key = _stored(cache)
    forged = _with_path(DatasetIndex.from_bytes(disk.get(key)), escape)
    disk.delete(key)
    assert disk.put(key, forged.to_bytes())
    ds = ImageFolder(str(root), size=16, cache=cache)
    assert list(ds.samples) == list(first.samples)  # listed again, from the folders
    assert all(str(root) in p and ".." not in p for p, _ in ds.samples)
    assert f"its path {escape!r} does not lie below the dataset root" in caplog.text
    assert "redis_hmac_key" in caplog.text
    assert DatasetIndex.from_bytes(disk.get(key)).escaping_path() is None  # replaced


@pytest.mark.timeout(120)
def test_a_forged_listing_in_redis_is_refused_before_a_file_outside_the_root_is_read(
    root, tmp_path, redis_server, caplog
):
    """The issue's case: a listing in a shared Redis with '../secret.txt' added. With no
    HMAC key the entry is read, and its path check refuses it; nothing outside is read."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"secret bytes")
    node_a = {"redis": redis_server.url}
    first = ImageFolder(str(root), size=16, cache=node_a)
    redis_tier = open_cache(node_a).tiers[0]
    (key,) = [k for k in redis_tier.keys() if is_listing_key(k)]  # noqa: SIM118 - a tier
    forged = _with_path(DatasetIndex.from_bytes(redis_tier.get(key)), "../secret.txt")
    redis_tier.delete(key)
    assert redis_tier.put(key, forged.to_bytes())
    other = ImageFolder(str(root), size=16, cache={"redis": redis_server.url})
    assert list(other.samples) == list(first.samples)
    for i in range(len(other)):
        assert other.read_bytes(i) != b"secret bytes"
    assert not [k for k in redis_tier.keys() if "secret" in k]  # noqa: SIM118 - a tier
    assert "does not lie below the dataset root" in caplog.text


# -- remote roots (moto S3) ------------------------------------------------------------------


@pytest.fixture
def s3_root(s3_server, s3_options, root) -> str:
    """The 3-class tree in a fresh prefix of the moto server."""
    return upload_folder(s3_options, root, f"s3://freshness/{uuid.uuid4().hex[:8]}")


def _put(options: dict, url: str, data: bytes) -> None:
    s3fs.S3FileSystem(**options).pipe_file(url.removeprefix("s3://"), data)


def _rm(options: dict, url: str) -> None:
    s3fs.S3FileSystem(**options).rm(url.removeprefix("s3://"), recursive=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["class added", "class deleted"])
def test_a_class_added_or_deleted_on_s3_is_seen_by_the_next_build(s3_root, s3_options, root,
                                                                  tmp_path, how, caplog):
    cache = tmp_path / "cache"
    before = ImageFolder(s3_root, size=16, cache=cache, storage_options=s3_options)
    jpeg = (root / "class_01" / min(os.listdir(root / "class_01"))).read_bytes()
    if how == "class added":
        _put(s3_options, f"{s3_root}/a/new.jpg", jpeg)
    else:
        _rm(s3_options, f"{s3_root}/class_00")
    after = ImageFolder(s3_root, size=16, cache=cache, storage_options=s3_options)
    said = "added: a" if how == "class added" else "removed: class_00"
    assert f"class folders {said}" in caplog.text
    assert after.classes != before.classes
    _same_as_uncached(after, storage_options=s3_options)


@pytest.mark.timeout(180)
def test_files_added_within_an_s3_class_are_a_loud_snapshot(s3_root, s3_options, root,
                                                            tmp_path, caplog):
    cache = tmp_path / "cache"
    ImageFolder(s3_root, size=16, cache=cache, storage_options=s3_options)
    jpeg = (root / "class_01" / min(os.listdir(root / "class_01"))).read_bytes()
    _put(s3_options, f"{s3_root}/class_02/new.jpg", jpeg)
    caplog.clear()
    snapshot = ImageFolder(s3_root, size=16, cache=cache, storage_options=s3_options)
    assert len(snapshot) == 12  # the stored sample set: an object store has no folder times
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "the sample set is the listing stored in the cache" in warned[0]
    assert "files added to or deleted from a class folder since are not seen" in warned[0]
    assert "pass listing_max_age=0 to list now" in warned[0]
    settings = str(DataLoader(snapshot, batch_size=4).settings)
    assert "dataset: " in settings and "s ago (12 images, 3 classes)" in settings
    listed = ImageFolder(s3_root, size=16, cache=cache, storage_options=s3_options,
                         listing_max_age=0)  # what the warning says to do
    assert len(listed) == 13
    _same_as_uncached(listed, storage_options=s3_options)
