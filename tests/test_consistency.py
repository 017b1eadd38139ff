"""The consistency model of cached datasets (docs/reliability.md): a stat per local read,
remote versions revalidated once per epoch, rewrites seen through the cache, local rewrites
that keep size and mtime, and bytes never stored under a version they are not, locally and
on S3 (moto)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import s3fs
import torch

from fastload import DataLoader, ImageFolder
from fastload.cache.keys import make_key
from fastload.io.versions import local_version, version_size
from fastload.errors import ObjectNotFoundError
from fastload.testing.synthetic import make_jpeg_folder
from tests.fixtures.s3 import upload_folder


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_jpeg_folder(tmp_path / "data", images=8, classes=2, size=(64, 48))


def _images(loader: DataLoader) -> torch.Tensor:
    return torch.cat([images for images, _ in loader])


def _rewrite(path: str, data: bytes, *, keep_times: bool = False) -> None:
    """Overwrite ``path`` in place; with ``keep_times`` set its mtime back as ``cp -p`` would."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()
    if keep_times:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _same_size_other_image(ds: ImageFolder, index: int, other: int) -> bytes:
    """The bytes of image ``other`` padded or cut to the size of image ``index`` (still a JPEG)."""
    size = os.path.getsize(ds.samples[index][0])
    data = Path(ds.samples[other][0]).read_bytes()
    return data[:size] + b"\0" * max(0, size - len(data))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_rewritten_between_epochs_is_read_anew_through_the_cache(
    root, tmp_path, workers, caplog
):
    ds = ImageFolder(root, size=32, cache=tmp_path / "cache")
    assert ds.reads_current_versions
    loader = DataLoader(ds, batch_size=4, num_workers=workers, persistent_workers=workers > 0)
    first = _images(loader)
    kept = loader.engine.kept_iterator
    path = ds.samples[0][0]
    listed = ds.index.version(0)
    Path(path).write_bytes(Path(ds.samples[5][0]).read_bytes())  # a new file, another image
    second = _images(loader)
    fresh = ImageFolder(root, size=32)  # no cache: what the origin holds now
    assert torch.equal(second[0], fresh[0][0])
    assert not torch.equal(second[0], first[0])
    assert torch.equal(second[1:], first[1:])
    # NOTE [a stat per local read]: each read stats its file, so the loader listed nothing
    # (the index keeps the listed version) and kept its persistent workers
    assert ds.index.version(0) == listed != local_version(os.stat(path))
    assert "images changed" not in caplog.text and "restarted" not in caplog.text
    if workers:
        assert loader.engine.kept_iterator is kept and kept is not None


@pytest.mark.timeout(60)
def test_a_cached_local_file_rewritten_or_deleted_is_never_served_with_its_old_bytes(root, tmp_path):
    ds = ImageFolder(root, size=32, cache=tmp_path / "cache")
    old = ds.read_bytes(0)
    assert ds.read_bytes(0) == old  # cached now, in memory and on disk
    new = _same_size_other_image(ds, 0, 5)
    path = ds.samples[0][0]
    _rewrite(path, new, keep_times=True)  # same size, same mtime: only ctime tells
    assert ds.read_bytes(0) == new  # within the epoch, no revalidation
    disk, url = ds.cache.tiers[-1], ds.storage.fs.unstrip_protocol(path)
    assert disk.contains(make_key(url, local_version(os.stat(path))))
    os.remove(path)
    with pytest.raises(ObjectNotFoundError, match=f"{path}.*index 0"):
        ds.read_bytes(0)


@pytest.mark.timeout(120)
def test_persistent_workers_are_kept_when_nothing_changed(root, tmp_path, caplog):
    ds = ImageFolder(root, size=32, cache=tmp_path / "cache")
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    first = _images(loader)
    kept = loader.engine.kept_iterator
    assert torch.equal(_images(loader), first)
    assert loader.engine.kept_iterator is kept and kept is not None
    assert "restarted" not in caplog.text


@pytest.mark.timeout(60)
def test_a_rewrite_that_keeps_size_and_mtime_gets_a_new_version(root, tmp_path):
    cache = tmp_path / "cache"
    ds = ImageFolder(root, size=32, cache=cache)
    old = ds.read_bytes(0)
    new = _same_size_other_image(ds, 0, 5)
    assert new != old and len(new) == len(old)
    path = ds.samples[0][0]
    mtime = os.stat(path).st_mtime_ns
    _rewrite(path, new, keep_times=True)
    assert os.stat(path).st_mtime_ns == mtime and os.path.getsize(path) == len(old)
    # A new dataset that lists (a stored listing would be the snapshot: test_stored_listing)
    assert ImageFolder(root, size=32, cache=cache, listing_max_age=0).read_bytes(0) == new
    assert ds.revalidate() == 1  # and the old one, revalidated
    assert ds.read_bytes(0) == new
    assert ds.revalidate() == 0


@pytest.mark.timeout(60)
def test_a_local_file_rewritten_after_its_listing_is_never_cached_under_the_old_version(
    root, tmp_path, caplog
):
    ds = ImageFolder(root, size=32, cache=tmp_path / "cache")
    path = ds.samples[0][0]
    listed = ds.storage.versions[path]
    new = _same_size_other_image(ds, 0, 5)
    _rewrite(path, new, keep_times=True)  # after the listing, before the first read
    with caplog.at_level(logging.WARNING, logger="fastload"):
        assert ds.read_bytes(0) == new
    assert "changed since" not in caplog.text  # read at its own version: nothing to warn of
    disk, url = ds.cache.tiers[-1], ds.storage.fs.unstrip_protocol(path)
    assert not disk.contains(make_key(url, listed))
    assert disk.contains(make_key(url, local_version(os.stat(path))))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_file_deleted_between_epochs_is_named_or_skipped(root, tmp_path, on_error, caplog):
    ds = ImageFolder(root, size=32, cache=tmp_path / "cache", on_error=on_error)
    loader = DataLoader(ds, batch_size=4, num_workers=0)
    assert len(_images(loader)) == 8
    gone = ds.samples[3][0]
    os.remove(gone)
    if on_error == "raise":
        with pytest.raises(ObjectNotFoundError, match=f"{gone}.*index 3"):
            _images(loader)
    else:
        assert len(_images(loader)) == 7
        assert [s.path for s in loader.skipped] == [gone]
    assert "images were deleted" not in caplog.text  # a local dataset is not listed again
    assert len(ds) == 8  # the sample set is fixed when the dataset is built
    assert ds.revalidate() == 1 and "1 of 8 images were deleted" in caplog.text


@pytest.mark.timeout(60)
def test_an_explicit_file_list_is_revalidated_too(root, tmp_path):
    files = sorted(str(p) for p in root.rglob("*.jpg"))
    ds = ImageFolder([(p, 0) for p in files[:3]], size=32, cache=tmp_path / "cache")
    assert ds.read_bytes(1) == Path(files[1]).read_bytes()
    Path(files[1]).write_bytes(Path(files[4]).read_bytes())
    assert ds.revalidate() == 1
    assert ds.read_bytes(1) == Path(files[4]).read_bytes()


@pytest.fixture
def s3_data(s3_options, jpeg_root, request) -> str:
    url = f"s3://fastload-consistency/{request.node.name.replace('[', '-').strip(']')}"
    return upload_folder(s3_options, jpeg_root, url)


@pytest.mark.timeout(120)
def test_s3_revalidation_is_one_listing_and_sees_a_rewritten_object(
    s3_server, s3_options, s3_data, tmp_path
):
    s3 = s3fs.S3FileSystem(**s3_options)
    ds = ImageFolder(s3_data, size=32, cache=tmp_path / "cache", storage_options=s3_options)
    old = ds.read_bytes(0)
    path = ds.samples[0][0]
    new = s3.cat_file(ds.samples[7][0])
    s3.pipe_file(path, new)
    s3_server.reset_counts()
    assert ds.revalidate() == 1
    requests = dict(s3_server.counter.counts)
    assert not any(method == "HEAD" for method, _ in requests), requests
    assert requests == {("GET", "fastload-consistency"): 1}, requests  # one listing, one page
    assert ds.read_bytes(0) == new != old


@pytest.mark.timeout(180)
def test_an_s3_object_rewritten_between_epochs_is_read_anew_and_workers_restart(
    s3_options, s3_data, tmp_path, caplog
):
    s3 = s3fs.S3FileSystem(**s3_options)
    ds = ImageFolder(s3_data, size=32, cache=tmp_path / "cache", storage_options=s3_options)
    assert not ds.reads_current_versions  # remote: the loader revalidates (one listing)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    first = _images(loader)
    s3.pipe_file(ds.samples[0][0], s3.cat_file(ds.samples[7][0]))
    with caplog.at_level(logging.INFO, logger="fastload"):
        second = _images(loader)
    fresh = ImageFolder(s3_data, size=32, storage_options=s3_options)  # no cache
    assert torch.equal(second[0], fresh[0][0]) and not torch.equal(second[0], first[0])
    assert torch.equal(second[1:], first[1:])
    assert f"1 of {len(ds)} images changed" in caplog.text
    assert "restarted the loader's persistent workers" in caplog.text


@pytest.mark.timeout(60)
def test_s3_object_of_another_size_than_listed_is_served_but_not_cached(
    s3_options, s3_data, tmp_path, caplog
):
    s3 = s3fs.S3FileSystem(**s3_options)
    ds = ImageFolder(s3_data, size=32, cache=tmp_path / "cache", storage_options=s3_options)
    path = ds.samples[0][0]
    new = s3.cat_file(ds.samples[7][0])
    assert len(new) != version_size(ds.storage.versions[path])
    s3.pipe_file(path, new)  # after the listing, before the first read
    with caplog.at_level(logging.WARNING, logger="fastload"):
        assert ds.read_bytes(0) == new
    assert "changed since it was listed" in caplog.text and path in caplog.text
    url = ds.storage.fs.unstrip_protocol(path)
    assert not ds.cache.tiers[-1].contains(make_key(url, ds.storage.versions[path]))
