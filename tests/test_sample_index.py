"""The dataset index (fastload/data/index.py): numpy arrays, not Python objects per sample.

Lookups, the views ``ImageFolder.samples``/``.targets`` behave like torchvision's lists,
the serialized form refuses anything damaged, and the memory bound of NOTE [bounded bytes
per sample]: under 200 bytes a sample for the whole ImageFolder, in the main process, a
pickled copy (spawned workers) and forked workers that touch every sample.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import tracemalloc

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset

from fastload import ImageFolder
from fastload.cache import open_cache
from fastload.data import listing_stamp
from fastload.data.index import DatasetIndex, IndexFormatError
from fastload.data.folder_rules import FolderRules
from fastload.data.index_format import MAGIC, Columns, encode
from fastload.data.listing import prefix_of
from fastload.data.stored_listing import StoredListing
from fastload.errors import ConfigError
from fastload.io.storage import Storage

BIG = 200_000
"""Samples of the memory tests (ImageNet-like names and local-file versions)."""

BOUND = 200
"""Bytes of index per sample per process, at most (issue 14's target)."""


def _index(prefix: str = "/data/train/") -> DatasetIndex:
    return DatasetIndex.build(
        prefix, ["cat/1.jpg", "cat/2.jpg", "dog/1.jpg"], [0, 0, 1], classes=["cat", "dog"],
        versions=["10:1:2:3", "20:1", None],
    )


def test_the_index_answers_path_label_version_size_and_find():
    index = _index()
    assert len(index) == 3 and index.classes == ("cat", "dog")
    assert [index.path(i) for i in range(3)] == [
        "/data/train/cat/1.jpg", "/data/train/cat/2.jpg", "/data/train/dog/1.jpg"
    ]
    assert [index.label(i) for i in range(3)] == [0, 0, 1] and index.label(-1) == 1
    assert [index.version(i) for i in range(3)] == ["10:1:2:3", "20:1", None]
    assert [index.size(i) for i in range(3)] == [10, 20, None]
    assert index.find("/data/train/dog/1.jpg") == 2 and index.find("/data/train/dog/9.jpg") is None
    assert index.find("/elsewhere/cat/1.jpg") is None
    assert index.labels.dtype == np.uint8 and not index.labels.flags.writeable
    with pytest.raises(IndexError, match="out of range"):
        index.path(3)


def test_find_works_when_the_class_order_is_not_the_path_order():
    # "a" sorts before "a.b" as a class name, but "a.b/..." before "a/..." as a path
    paths = ["a/1.jpg", "a/2.jpg", "a.b/1.jpg", "b/\udcff.jpg"]  # and a non-UTF-8 file name
    index = DatasetIndex.build("/r/", paths, [0, 0, 1, 2], classes=["a", "a.b", "b"])
    assert [index.find("/r/" + p) for p in paths] == [0, 1, 2, 3]
    assert index.path(3) == "/r/b/\udcff.jpg"
    assert index.find("/r/a/3.jpg") is None


def test_replace_versions_is_seen_by_every_holder_and_keeps_the_sample_set():
    index = _index()
    clone = pickle.loads(pickle.dumps(index))
    holder = [index]
    listed = index.listed_at
    index.replace_versions(["11:1", None, "30:7"], at=listed + 5)
    assert holder[0].versions() == ["11:1", None, "30:7"] and index.size(2) == 30
    assert index.listed_at == listed and index.versions_at == listed + 5
    assert index.path(2) == "/data/train/dog/1.jpg" and index.generation == 1
    assert clone.versions() == ["10:1:2:3", "20:1", None]  # a pickled copy is its own
    assert not index.same_versions(clone) and clone.same_versions(pickle.loads(pickle.dumps(clone)))


def test_a_pickled_index_is_one_blob():
    index = _index()
    assert len(pickle.dumps(index)) < len(index.to_bytes()) + 200


def test_the_blob_round_trips_and_refuses_damage():
    index = _index()
    blob = index.to_bytes()
    again = DatasetIndex.from_bytes(blob)
    assert [again.path(i) for i in range(3)] == [index.path(i) for i in range(3)]
    assert again.versions() == index.versions() and again.listed_at == index.listed_at
    flipped = bytearray(blob)
    flipped[-3] ^= 0xFF  # a payload byte
    damaged = {
        "magic": b"NOTINDEX" + blob[8:],
        "truncated": blob[: len(blob) // 2],
        "checksum": bytes(flipped),
        "format": blob.replace(b'"format":1', b'"format":2'),
        "empty": b"",
    }
    for what, bad in damaged.items():
        with pytest.raises(IndexFormatError):
            DatasetIndex.from_bytes(bad)
        assert what  # each case raised


def test_decoding_checks_labels_offsets_and_order():
    meta = {"prefix": "", "classes": ["a"], "listed_at": 0.0, "versions_at": 0.0}
    ok = Columns.pack([b"x", b"y"], [b"1", b"2"], [0, 0], [1, 2])
    DatasetIndex(encode(meta, ok))
    with pytest.raises(IndexFormatError, match="label"):
        DatasetIndex(encode(meta, Columns.pack([b"x"], [b"1"], [1], [1])))  # 1 class only
    with pytest.raises(IndexFormatError, match="permutation"):
        DatasetIndex(encode(meta, Columns.pack([b"y", b"x"], [b"1", b"2"], [0, 0], [1, 2], [0, 0])))
    backwards = Columns(ok.path_data, ok.path_offsets[::-1].copy(), ok.version_data,
                        ok.version_offsets, ok.labels, ok.sizes)
    with pytest.raises(IndexFormatError, match="offsets"):
        DatasetIndex(encode(meta, backwards))
    assert encode(meta, ok).startswith(MAGIC)


def as_targets(pairs):
    return [label for _, label in pairs]


def test_samples_and_targets_are_read_only_views_that_behave_like_lists(jpeg_root):
    ds = ImageFolder(jpeg_root, size=16)
    samples, targets = ds.samples, ds.targets
    as_list = list(samples)
    assert len(samples) == len(as_list) == 48 and samples == as_list and samples[-1] == as_list[-1]
    assert samples[3:7] == as_list[3:7] and isinstance(samples[3:7], list)
    assert samples[np.int64(5)] == as_list[5] and as_list[5] in samples
    path, label = samples[5]
    assert isinstance(path, str) and isinstance(label, int) and type(targets[5]) is int
    assert targets == [label for _, label in as_list] and list(targets) == ds.index.labels.tolist()
    assert json.loads(json.dumps(as_list)) == [list(s) for s in as_list]
    assert samples != as_list[:-1] and targets != []
    extra = [("x.jpg", 0)]
    assert samples + extra == as_list + extra and extra + samples == extra + as_list  # new lists
    assert isinstance(samples + extra, list) and targets + [1] == [*as_targets(as_list), 1]
    with pytest.raises(ConfigError, match="read-only"):
        ds.samples = as_list[:4]
    with pytest.raises(ConfigError, match="read-only"):
        ds.targets = [0] * 48
    with pytest.raises(TypeError):
        samples[0] = ("x.jpg", 0)  # type: ignore[index]
    # an explicit list of its pairs is the same dataset
    again = ImageFolder(samples, size=16)
    assert again.samples == samples and again.classes == [str(i) for i in range(4)]


def test_storage_versions_are_the_index_s(jpeg_root, tmp_path):
    ds = ImageFolder(jpeg_root, size=16, cache=tmp_path / "c")
    path = ds.samples[7][0]
    assert ds.storage.versions[path] == ds.index.version(7)
    assert path in ds.storage.versions and "/nowhere.jpg" not in ds.storage.versions
    assert len(ds.storage.versions) == len(ds)


# -- memory ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[str, str]:
    """(root, cache) with a stored listing of BIG samples (the files need not exist)."""
    root = str(tmp_path_factory.mktemp("big_root"))
    cache_dir = str(tmp_path_factory.mktemp("big_cache"))
    classes = [f"n{c:08d}" for c in range(1000)]
    paths = [f"{classes[i % 1000]}/{classes[i % 1000]}_{i}.JPEG" for i in range(BIG)]
    order = sorted(range(BIG), key=lambda i: (i % 1000, paths[i]))
    paths = [paths[i] for i in order]
    labels = [i % 1000 for i in order]
    versions = [f"{100_000 + i}:1764403200{i:09d}:{5_308_443 + i}:1764403200{i:09d}" for i in order]
    storage = Storage(root)
    stored = StoredListing.of(open_cache(cache_dir), storage, FolderRules(), {})  # ImageFolder's defaults
    assert stored.save(DatasetIndex.build(
        prefix_of(storage), paths, labels, classes=classes, versions=versions,
        extra={**stored.extra(), "stamp": listing_stamp.take(storage)},  # the (empty) root's
    ))
    return root, cache_dir


def test_an_image_folder_of_200k_samples_holds_under_200_bytes_a_sample(big):
    root, cache_dir = big
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ds = ImageFolder(root, size=32, cache=cache_dir)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(ds) == BIG and ds.index.version(0) is not None  # the stored listing, versions too
    assert ds.index.nbytes / BIG < BOUND, ds.index
    assert held / BIG < BOUND, f"{held / BIG:.0f} bytes a sample held by ImageFolder"
    # what a spawned worker gets: the pickled dataset, one copy of the index
    assert len(pickle.dumps(ds)) / BIG < BOUND


class _TouchEverySample(Dataset):
    """One item: a forked worker reads every sample's path and label, and reports how much
    private memory (USS) that cost it."""

    def __init__(self, ds: ImageFolder) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return 1

    def __getitem__(self, _: int) -> torch.Tensor:
        me = psutil.Process()
        gc.collect()
        gc.disable()  # a collection would touch every object of the heap, not only the index
        try:
            before = me.memory_full_info().uss
            chars = 0
            for path, label in self.ds.samples:
                chars += len(path) + label
            grown = me.memory_full_info().uss - before
        finally:
            gc.enable()
        return torch.tensor([grown, chars], dtype=torch.int64)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.timeout(300)
def test_a_forked_worker_reading_every_sample_does_not_copy_the_index(big):
    root, cache_dir = big
    ds = ImageFolder(root, size=32, cache=cache_dir)
    loader = TorchLoader(_TouchEverySample(ds), batch_size=None, num_workers=1,
                         multiprocessing_context="fork")
    grown, chars = next(iter(loader)).tolist()
    assert chars > BIG * 20  # it did read them all
    # A list of (path, label) tuples copies ~30 MB of refcount-touched pages here (NOTE
    # [bounded bytes per sample]); the index's arrays are never written.
    assert grown < 20 * BIG, f"the worker's private memory grew {grown / BIG:.1f} bytes a sample"
