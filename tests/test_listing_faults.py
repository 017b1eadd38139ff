"""Listing faults of local roots: unreadable folders (named, or skipped with stable labels),
FIFOs and other special files, dangling and looping symlinks (NOTE [local listing])."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from fastload import DataLoader, ImageFolder
from fastload.cache.warm import warm
from fastload.errors import StorageError
from fastload.io.storage import Storage
from fastload.testing.synthetic import make_jpeg_folder
from tests.fixtures.privileges import run_unprivileged

_BUILD = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING)
from fastload import ImageFolder
try:
    ds = ImageFolder(sys.argv[1], size=32, on_error=sys.argv[2])
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"classes": ds.classes, "samples": [[p, l] for p, l in ds.samples]}))
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_jpeg_folder(tmp_path / "data", images=12, classes=3, size=(64, 48))


def _build_unprivileged(root: Path, on_error: str) -> tuple[dict, str]:
    result = run_unprivileged(_BUILD, str(root), on_error)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.fixture
def locked(root: Path):
    """class_01 made unreadable (chmod 000) for the test's duration."""
    folder = root / "class_01"
    folder.chmod(0o000)
    yield folder
    folder.chmod(0o755)


@pytest.mark.timeout(60)
def test_an_unreadable_class_folder_fails_naming_it(root, locked, unprivileged):
    out, _ = _build_unprivileged(root, "raise")
    assert out["error"] == "StorageError"
    assert str(locked) in out["message"] and "check its permissions" in out["message"]
    assert "Permission denied" in out["message"]


@pytest.mark.timeout(60)
def test_an_unreadable_class_folder_keeps_every_label_under_skip(
    root, locked, unprivileged
):
    out, log = _build_unprivileged(root, "skip")
    assert out["classes"] == ["class_00", "class_01", "class_02"]
    labels = {Path(p).parent.name: label for p, label in out["samples"]}
    assert labels == {"class_00": 0, "class_02": 2}  # class_02 is not renumbered to 1
    assert len(out["samples"]) == 8
    assert "could not list 1 folders" in log and str(locked) in log and "class_01" in log


@pytest.mark.timeout(60)
def test_a_class_whose_only_subfolder_is_unreadable_keeps_its_label(
    root, unprivileged
):
    sub = root / "class_01" / "sub"
    sub.mkdir()
    for image in sorted((root / "class_01").glob("*.jpg")):
        image.rename(sub / image.name)
    sub.chmod(0o000)
    try:
        out, log = _build_unprivileged(root, "skip")
        raised, _ = _build_unprivileged(root, "raise")
    finally:
        sub.chmod(0o755)
    assert out["classes"] == ["class_00", "class_01", "class_02"]
    assert {label for _, label in out["samples"]} == {0, 2}
    assert str(sub) in log
    assert raised["error"] == "StorageError" and str(sub) in raised["message"]


@pytest.mark.timeout(60)
def test_an_unreadable_root_fails_naming_it_even_under_skip(root, unprivileged):
    root.chmod(0o000)
    try:
        out, _ = _build_unprivileged(root, "skip")
    finally:
        root.chmod(0o755)
    assert out["error"] == "StorageError" and str(root) in out["message"]


@pytest.mark.timeout(60)
def test_special_files_are_skipped_with_one_warning_naming_them(root, tmp_path, caplog):
    os.mkfifo(root / "class_01" / "x.jpg")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "class_02" / "s.jpg"))
    try:
        ds = ImageFolder(root, size=32)
        warnings = [r for r in caplog.records if "not regular files" in r.getMessage()]
        assert len(warnings) == 1
        message = warnings[0].getMessage()
        assert "skipped 2 entries" in message
        assert f"{root / 'class_01' / 'x.jpg'} (FIFO)" in message
        assert f"{root / 'class_02' / 's.jpg'} (socket)" in message
        assert len(ds) == 12 and ds.classes == ["class_00", "class_01", "class_02"]
        batches = list(DataLoader(ds, batch_size=6, num_workers=0))  # no read blocks on the FIFO
        assert sum(len(labels) for _, labels in batches) == 12
        report = warm(str(root), tmp_path / "cache")  # cache warm lists the same way
        assert report.files == 12 + 1 and not report.failed  # + the synthetic manifest
    finally:
        server.close()


@pytest.mark.timeout(60)
def test_symlinks_to_files_and_folders_are_followed_broken_ones_skipped(root, tmp_path, caplog):
    elsewhere = make_jpeg_folder(tmp_path / "elsewhere", images=2, classes=1, size=(64, 48))
    target = sorted((elsewhere / "class_00").glob("*.jpg"))[0]
    (root / "class_00" / "linked.jpg").symlink_to(target)
    (root / "class_03").symlink_to(elsewhere / "class_00", target_is_directory=True)
    (root / "class_01" / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (root / "class_01" / "self.jpg").symlink_to(root / "class_01" / "self.jpg")
    (root / "class_02" / "up").symlink_to(root, target_is_directory=True)  # a folder loop
    ds = ImageFolder(root, size=32)
    assert ds.classes == ["class_00", "class_01", "class_02", "class_03"]
    paths = [p for p, _ in ds.samples]
    assert str(root / "class_00" / "linked.jpg") in paths
    assert sum(1 for p in paths if "/class_03/" in p) == 2
    assert len(ds) == 12 + 1 + 2
    assert ds[paths.index(str(root / "class_00" / "linked.jpg"))][0].shape == (3, 32, 32)
    message = next(r.getMessage() for r in caplog.records if "not regular files" in r.getMessage())
    assert "skipped 3 entries" in message
    assert f"{root / 'class_01' / 'dangling.jpg'} (dangling symlink)" in message
    assert f"{root / 'class_01' / 'self.jpg'} (looping symlink)" in message
    assert f"{root / 'class_02' / 'up'} (symlink loop to a folder above it)" in message


@pytest.mark.timeout(30)
def test_storage_find_lists_regular_files_only_and_names_a_missing_root(root, tmp_path):
    os.mkfifo(root / "fifo")
    found = Storage(root).find()
    assert str(root / "fifo") not in found and len(found) == 12 + 1  # + the synthetic manifest
    assert found == sorted(found)
    with pytest.raises(StorageError, match="does not exist"):
        Storage(tmp_path / "missing").find()
    with pytest.raises(StorageError, match="is a file"):
        Storage(root / "fifo").find()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cached", [False, True])
def test_a_fifo_in_an_explicit_list_fails_naming_it(tmp_path, cached):
    """A listing skips special files; an explicit file list can still name one. Reading it,
    directly or through the cache, must not wait for a writer: it fails at once, naming it."""
    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    cache = {"disk": tmp_path / "cache"} if cached else None
    ds = ImageFolder([(str(fifo), 0)], size=16, cache=cache)
    with pytest.raises(StorageError, match=r"x\.jpg.*not a regular file") as info:
        list(DataLoader(ds, batch_size=1, num_workers=0))
    assert info.value.index == 0 and info.value.path == str(fifo)


@pytest.mark.timeout(30)
def test_a_walk_without_details_lists_the_same_files_without_a_stat_each(root, tmp_path):
    os.mkfifo(root / "class_01" / "x.jpg")
    (root / "class_00" / "linked.jpg").symlink_to(min((root / "class_02").glob("*.jpg")))
    full = Storage(root).listing(warn=False)
    bare = Storage(root).listing(warn=False, details=False)
    assert list(bare.files) == list(full.files) and bare.skipped == full.skipped
    assert all(info["size"] > 0 and info["version"] for info in full.files.values())
    linked = str(root / "class_00" / "linked.jpg")
    plain = [p for p in bare.files if p != linked]
    assert all(bare.files[p]["version"] is None and bare.files[p]["size"] is None for p in plain)
    assert bare.files[linked]["version"] == full.files[linked]["version"]  # a symlink is stat'ed
    # Without a cache ImageFolder needs no versions; with one, its keys carry them.
    assert ImageFolder(root, size=16).samples == ImageFolder(root, size=16, cache=tmp_path / "c").samples
