"""ParquetImages: Parquet files written by Hugging Face ``datasets`` and by pyarrow as a
declared dataset: the index, the bytes, every engine and torch workers, the row-group order
(ranks, resume), on_error and the messages of bad files, the stored index, moto's S3."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets")

from fastload import DataLoader, EpochSampler, ImageFolder, ParquetImages
from fastload.errors import (
    ConfigError,
    CorruptSampleError,
    DatasetError,
    MissingSampleError,
    ObjectNotFoundError,
)
from tests.contracts import sharded
from tests.contracts.resume import interrupted, same_batches
from tests.fixtures.s3 import upload_folder

pytestmark = pytest.mark.timeout(180)

CLASSES = ["class_00", "class_01", "class_02", "class_03"]


def images_of(root: Path) -> list[tuple[str, bytes, int]]:
    """(key, JPEG bytes, class index) of the images below ``root``, in sorted order."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(str(f.relative_to(root).with_suffix("")), f.read_bytes(), classes.index(f.parent.name))
            for f in sorted(root.rglob("*.jpg"))]


def write_hf(root: Path, out: Path, *, per_file: int = 20, group: int = 6) -> str:
    """The images as Parquet files written by ``datasets`` (``Image()`` + ``ClassLabel``), of
    ``per_file`` rows in row groups of ``group``. Returns a glob of them."""
    from datasets import ClassLabel, Dataset, Features, Image

    rows = images_of(root)
    features = Features({"image": Image(), "label": ClassLabel(names=CLASSES)})
    out.mkdir(parents=True, exist_ok=True)
    for n, k in enumerate(range(0, len(rows), per_file)):
        part = rows[k: k + per_file]
        Dataset.from_dict({"image": [{"bytes": b, "path": key + ".jpg"} for key, b, _ in part],
                           "label": [label for _, _, label in part]},
                          features=features).to_parquet(str(out / f"train-{n:05d}.parquet"),
                                                        batch_size=group)
    return str(out / "train-*.parquet")


def write_arrow(root: Path, path: Path, *, group: int = 8, replace: dict | None = None,
                image: str = "img", label: str = "labels", names: bool = True) -> str:
    """The images as one file written by pyarrow: a binary column ``image`` and class names
    in ``label``; ``replace``: {row: bytes or None} put in place of those rows' images."""
    rows = images_of(root)
    data = [(replace or {}).get(i, b) for i, (_, b, _) in enumerate(rows)]
    labels = [CLASSES[c] if names else c for _, _, c in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({image: pa.array(data, pa.binary()), label: labels}), path,
                   row_group_size=group)
    return str(path)


@pytest.fixture(scope="module")
def hf_files(jpeg_root: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_hf(jpeg_root, tmp_path_factory.mktemp("parquet"))


def test_index_matches_the_rows_and_hugging_face_class_names(hf_files, jpeg_root):
    ds = ParquetImages(hf_files, size=32)
    assert [os.path.basename(u) for u in ds.urls] == [f"train-0000{n}.parquet" for n in range(3)]
    assert len(ds) == 48 and ds.classes == CLASSES  # the ClassLabel's names, not "0".."3"
    assert ds.index.nbytes / len(ds) < 100 and ds.index.columns["leaf"] == "image.bytes"
    assert ds.index.group_sizes().tolist() == [6, 6, 6, 2] * 2 + [6, 2]
    rows = images_of(jpeg_root)
    for i, (key, data, label) in enumerate(rows):
        assert ds.read_bytes(i) == data and ds.label(i) == label
    table = pq.read_table(ds.urls[1])
    assert ds.sample_url(25) == f"{ds.urls[1]} (row group 0, row 5)"
    assert table.column("image")[5].as_py()["bytes"] == rows[25][1]


def test_samples_equal_image_folders_of_the_same_bytes(hf_files, jpeg_root):
    ds, folder = ParquetImages(hf_files, size=48), ImageFolder(str(jpeg_root), size=48)
    for i in (0, 17, 47):  # both sorted by path: the same order
        image, label = ds[i]
        expected, folder_label = folder[i]
        assert torch.equal(image, expected) and label == folder_label
    train = ParquetImages(hf_files, size=40, train=True, seed=4)
    folder = ImageFolder(str(jpeg_root), size=40, train=True, seed=4)
    assert torch.equal(train[9][0], folder[9][0])  # the same augmentation draw per index
    batches = [list(DataLoader(d, batch_size=8, backend="torch", num_workers=0))
               for d in (train, folder)]
    assert same_batches(*batches)  # one storage order, one seed: the same augmented epoch


def test_pyarrow_binary_column_name_labels_and_brace_patterns(jpeg_root, tmp_path, caplog,
                                                             monkeypatch):
    one = write_arrow(jpeg_root, tmp_path / "a-0.parquet")
    write_arrow(jpeg_root, tmp_path / "a-1.parquet", group=30)
    monkeypatch.setattr("fastload.data.parquet.HELD_WARNING_BYTES", 10_000)  # groups of ~50 KB
    ds = ParquetImages(str(tmp_path / "a-{0..1}.parquet"), size=32)
    assert "keeps 2 x shuffle_window=4 of them decoded" in caplog.text
    assert "Lower shuffle_window, or write smaller row groups" in caplog.text
    assert ds.index.columns == {"image": "img", "leaf": "img", "label": "labels"}
    assert ds.classes == CLASSES and len(ds) == 96  # names: their sorted position
    assert ds.index.group_sizes().tolist() == [8] * 6 + [30, 18]
    assert ds.targets.tolist() == [c for _, _, c in images_of(jpeg_root)] * 2
    unlabeled = ParquetImages([one], size=32, label_column=None)
    assert set(unlabeled.targets.tolist()) == {-1} and unlabeled[3][1] == -1


def test_null_labels_are_named_at_build_unless_no_labels_were_asked_for(jpeg_root, tmp_path, caplog):
    rows = images_of(jpeg_root)[:6]
    images = pa.array([{"bytes": b, "path": key + ".jpg"} for key, b, _ in rows])
    for name, labels in (("some", [0, None, 1, None, 2, 3]), ("none", [None] * 6)):
        pq.write_table(pa.table({"image": images, "label": pa.array(labels, pa.int64())}),
                       tmp_path / f"{name}.parquet", row_group_size=4)
    caplog.clear()
    ds = ParquetImages(str(tmp_path / "some.parquet"), size=32)
    assert ds.targets.tolist() == [0, -1, 1, -1, 2, 3]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "2 of 6 samples have a null in label column 'label'" in warned[0]
    assert "some.parquet (row group 0, row 1); " in warned[0] and "(row group 0, row 3)" in warned[0]
    caplog.clear()
    ParquetImages(str(tmp_path / "none.parquet"), size=32)  # a label column, null throughout
    assert "all 6 samples of" in caplog.text and "every label is -1" in caplog.text
    caplog.clear()
    unlabeled = ParquetImages(str(tmp_path / "none.parquet"), size=32, label_column=None)
    assert set(unlabeled.targets.tolist()) == {-1} and "label is -1" not in caplog.text


@pytest.mark.parametrize("backend", ["threads", "torch", "dali"])
def test_loader_gives_each_sample_once_with_every_engine(hf_files, backend):
    ds = ParquetImages(hf_files, size=32, train=True, seed=3, target_transform=lambda y: y * 10)
    sharded.each_sample_once(ds, backend)
    if backend == "threads":
        sharded.threads_match_workers(ds)


def test_a_subclass_that_overrides_the_read_path_runs_on_torch(hf_files):
    sharded.subclass_runs_on_torch(ParquetImages, hf_files, size=32)


def test_the_epoch_reads_each_row_group_once_and_is_metered(hf_files):
    ds = ParquetImages(hf_files, size=32, train=True, seed=1, shuffle_window=2)
    loader = DataLoader(ds, batch_size=5, shuffle=True, backend="torch", num_workers=0)
    order = list(loader.epoch_sampler)
    spans = {}
    for position, i in enumerate(order):
        spans.setdefault(ds.index.group_of(i), []).append(position)
    # a window of 2 row groups (of at most 6 rows): each group's rows within 12 positions
    assert max(p[-1] - p[0] for p in spans.values()) < 12 and order != sorted(order)
    assert sum(len(y) for _, y in loader) == 48
    assert ds.groups_loaded == len(ds.index.group_file)  # 10 row groups, each read once
    summary = loader.meter.summary()
    assert summary.samples == 48 and summary.work is not None and summary.work.fetch_s > 0
    auto = DataLoader(ds, batch_size=8, shuffle=True)  # settings and engine by fastload
    assert "ParquetImages declares fastload_worker_safe=True" in str(auto.settings)
    assert "measures threads, torch" in auto.backend_reason
    assert sorted(torch.cat([y for _, y in auto]).tolist()) == sorted(ds.targets.tolist())
    assert auto.backend in ("threads", "torch", "dali")


def test_exact_mid_epoch_resume(hf_files):
    def make():
        return DataLoader(ParquetImages(hf_files, size=32, train=True, seed=7), batch_size=5,
                          shuffle=True)
    full, resumed, state = interrupted(make, k=3)
    assert state["mode"] == "sharded" and state["consumed"] == 15
    assert same_batches(full, resumed)


def test_ranks_read_disjoint_runs_of_whole_row_groups(monkeypatch, hf_files):
    seen = []
    for rank in range(2):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        ds = ParquetImages(hf_files, size=16, seed=5, shuffle_window=1)
        loader = DataLoader(ds, batch_size=4, shuffle=True)
        mine = list(loader.epoch_sampler)
        assert len({ds.index.group_of(i) for i in mine}) <= 6  # 24 of 48: whole groups
        assert sorted(torch.cat([y for _, y in loader]).tolist()) == sorted(
            ds.label(i) for i in mine)
        seen.append(set(mine))
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 48
    order = ParquetImages(hf_files, size=16).epoch_order
    ranks = [list(EpochSampler(48, seed=0, num_replicas=2, rank=r, order=order)) for r in range(2)]
    assert sorted(ranks[0] + ranks[1]) == list(range(48))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_torchrun_ranks_read_disjoint_runs_of_whole_row_groups(hf_files, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    script = Path(__file__).parent / "dist_scripts" / "shards_ranks.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script), hf_files, "--out", str(tmp_path)],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["seed"] == ranks[1]["seed"]  # rank 0's, broadcast
    for epoch in range(2):
        parts = [r["epochs"][epoch] for r in ranks]
        assert len(set(parts[0]["keys"]) | set(parts[1]["keys"])) == 48 == sum(
            len(p["keys"]) for p in parts)
        for part in parts:
            assert part["labels"] == part["expected"]  # the loader ran that order
            groups = part["shards"]  # window 1: each row group's rows in one run
            runs = 1 + sum(a != b for a, b in itertools.pairwise(groups))
            assert runs == len(set(groups))
    assert ranks[0]["epochs"][0]["keys"] != ranks[0]["epochs"][1]["keys"]


def test_bad_rows_are_named_and_skipped(jpeg_root, tmp_path):
    path = write_arrow(jpeg_root, tmp_path / "bad.parquet", replace={9: b"not a jpeg", 20: None})
    ds = ParquetImages(path, size=32, on_error="skip")
    loader = DataLoader(ds, batch_size=8, backend="threads")
    assert sum(len(y) for _, y in loader) == 46
    assert sorted(s.path for s in loader.skipped) == ["bad.parquet:1:1", "bad.parquet:2:4"]
    workers = DataLoader(ds, batch_size=8, backend="torch", num_workers=2)
    assert sum(len(y) for _, y in workers) == 46 and len(workers.skipped) == 2
    strict = ParquetImages(path, size=32)
    with pytest.raises(CorruptSampleError, match=r"bad\.parquet \(row group 1, row 1\) \(index 9, "
                       r"column 'img'\): .*Replace or drop that row"):
        strict[9]
    with pytest.raises(CorruptSampleError, match=r"row group 2, row 4\) \(index 20\) is null.*"
                       r"on_error='skip'"):
        strict[20]
    with pytest.raises(CorruptSampleError, match=r"row group 1, row 1"):
        list(DataLoader(strict, batch_size=8, backend="threads"))


def test_missing_columns_and_files_that_are_not_parquet(jpeg_root, tmp_path):
    path = write_arrow(jpeg_root, tmp_path / "x.parquet", label="cls")
    with pytest.raises(DatasetError, match=r"x\.parquet has no label column named 'label' or "
                       r"'labels'; its columns: img, cls\. Pass label_column='<name>' or "
                       r"label_column=None"):
        ParquetImages(path)
    assert ParquetImages(path, size=32, label_column="cls").classes == CLASSES
    with pytest.raises(DatasetError, match=r"has no column 'picture' \(image_column\)"):
        ParquetImages(path, image_column="picture", label_column="cls")
    with pytest.raises(DatasetError, match=r"column 'cls' of .* is string, not image bytes"):
        ParquetImages(path, image_column="cls", label_column=None)
    scores = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"image": pa.array([b"x"], pa.binary()), "label": [0.5]}), scores)
    with pytest.raises(DatasetError, match=r"scores\.parquet: its label column 'label' holds "
                       r"float values \(0\.5\); labels are ints or class names"):
        ParquetImages(str(scores))
    text = tmp_path / "notes.parquet"
    text.write_bytes(b"hello " * 100)
    with pytest.raises(DatasetError, match=r"notes\.parquet is not a readable Parquet file: .*PAR1"):
        ParquetImages(str(text))
    with pytest.raises(DatasetError, match=r"no file matches .*nothing-\*\.parquet"):
        ParquetImages(str(tmp_path / "nothing-*.parquet"))
    with pytest.raises(ObjectNotFoundError, match=r"cannot index the Parquet file .*gone\.parquet: "
                       "it does not exist"):
        ParquetImages(str(tmp_path / "gone.parquet"))
    hf = write_hf(jpeg_root, tmp_path / "hf", per_file=48)
    with pytest.raises(DatasetError, match=r"x\.parquet has no column 'image' \(the first file"):
        ParquetImages([hf.replace("*", "00000"), path])
    binary = write_arrow(jpeg_root, tmp_path / "binary.parquet", image="image", label="label")
    with pytest.raises(DatasetError, match=r"column 'image' of .*binary\.parquet is binary, of the "
                       r"first file .* struct<bytes: binary, path: string>: write the files"):
        ParquetImages([hf.replace("*", "00000"), binary])


def test_a_file_gone_since_the_index_is_named_and_skipped(jpeg_root, tmp_path):
    pattern = write_hf(jpeg_root, tmp_path / "gone")
    ds = ParquetImages(pattern, size=32, on_error="skip")
    os.remove(ds.urls[2])
    loader = DataLoader(ds, batch_size=8, backend="torch", num_workers=2,
                        multiprocessing_context="spawn")  # pickled into fresh processes
    assert sum(len(y) for _, y in loader) == 40 and len(loader.skipped) == 8
    raising = ds.with_pipeline(ds.pipeline)
    raising.on_error = "raise"
    with pytest.raises(MissingSampleError, match=r"train-00002\.parquet \(row group 0, row 3\)"):
        raising[43]


def test_the_index_is_stored_in_the_cache_and_reused(jpeg_root, tmp_path):
    pattern = write_hf(jpeg_root, tmp_path / "s")
    cache = {"disk": str(tmp_path / "cache")}
    first = ParquetImages(pattern, size=32, cache=cache)
    damaged = Path(first.urls[0])
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"\0" * 8)  # no footer any more
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        ParquetImages(pattern, size=32)  # a fresh build reads the footer
    again = ParquetImages(pattern, size=32, cache=cache)  # the stored index: no footer read
    assert np.array_equal(again.index.group_start, first.index.group_start)
    assert again.classes == CLASSES and torch.equal(again[3][0], first[3][0])
    with pytest.raises(DatasetError):
        ParquetImages(pattern, size=32, cache=cache, listing_max_age=0)


def test_s3_reads_one_range_per_row_group_and_then_the_cache(
        hf_files, s3_server, s3_options, redis_url):
    # a cache without a disk tier keeps row groups' chunks as entries (with one, whole files
    # are kept in its shard store: tests/test_parquet_cache.py)
    url = upload_folder(s3_options, Path(hf_files).parent, "s3://fastload-parquet/hf")
    cache = {"redis": redis_url}
    s3_server.reset_counts()
    ds = ParquetImages(f"{url}/train-*.parquet", size=32, cache=cache, storage_options=s3_options)
    assert ds.classes == CLASSES and len(ds) == 48 and ds.shard_store is None
    indexed = s3_server.gets("fastload-parquet/")
    # per file its end, and its row groups' label chunks in one merged read (NOTE [reading
    # through small gaps]; one read a row group before)
    assert sum(indexed.values()) == 3 + 3
    loader = DataLoader(ds, batch_size=8, shuffle=True, backend="torch", num_workers=2)
    local = ParquetImages(hf_files, size=32)
    assert sorted(torch.cat([y for _, y in loader]).tolist()) == sorted(local.targets.tolist())
    reads = sum(s3_server.gets("fastload-parquet/").values()) - sum(indexed.values())
    assert reads <= 2 * len(ds.index.group_file)  # a row group once per worker at most
    assert torch.equal(ds[30][0], local[30][0])
    uncached = ParquetImages(f"{url}/train-*.parquet", size=32, storage_options=s3_options)
    threads = DataLoader(uncached, batch_size=8, shuffle=True, backend="threads")  # read threads
    assert sorted(torch.cat([y for _, y in threads]).tolist()) == sorted(local.targets.tolist())
    s3_server.reset_counts()
    again = ParquetImages(f"{url}/train-*.parquet", size=32, cache=cache,
                          storage_options=s3_options)
    images = torch.stack([again[i][0] for i in range(48)])  # every row group from the cache
    assert torch.equal(images[30], local[30][0])
    assert s3_server.gets("fastload-parquet/") == {}  # a listing of the glob only (no GET)


def test_the_row_group_lru_loads_a_group_once_and_keeps_at_least_its_minimum():
    from concurrent.futures import ThreadPoolExecutor

    from fastload.data.parquet_read import GroupLRU

    lru, calls = GroupLRU(keep=2, budget=0), []

    def load(group):
        calls.append(group)
        if group < 0:
            raise OSError("unreadable")
        return pa.array([b"x" * 100] * 10, pa.binary())

    with ThreadPoolExecutor(8) as pool:  # threads asking for one group at once: one load
        values = list(pool.map(lambda _: lru.get(7, load), range(32)))
    assert calls == [7] and all(v is values[0] for v in values)
    lru.get(8, load), lru.get(9, load)  # over the budget: only the `keep` newest stay
    assert 7 not in lru and 8 in lru and 9 in lru and lru.loads == 3
    with pytest.raises(OSError, match="unreadable"):
        lru.get(-1, load)
    with pytest.raises(OSError):
        lru.get(-1, load)  # a failed load is not kept: the next asks again
    assert calls.count(-1) == 2
    roomy = GroupLRU(keep=1)  # the default budget keeps more than `keep` small groups
    for g in range(5):
        roomy.get(g, load)
    assert all(g in roomy for g in range(5))


def test_a_hub_file_is_versioned_by_its_blob_id():
    # the fields of huggingface_hub's HfFileSystem.info() (hf:// cannot be reached here); the
    # index and the shard store's check at download both version a file with version_of
    from fastload.io.versions import version_of

    info = {"name": "datasets/o/d/train-0.parquet", "size": 10, "type": "file",
            "blob_id": "9f3a", "lfs": {"sha256": "ab", "size": 10}, "last_commit": None}
    assert version_of(info) == "10:9f3a"
    assert version_of({**info, "blob_id": None}) == "10:ab"
    assert version_of({"size": 10, "ETag": '"e1"'}) == '10:"e1"'


def test_bad_arguments_say_what_to_pass(hf_files):
    from fastload.errors import ConfigError

    with pytest.raises(ConfigError, match=r"ParquetImages needs Parquet file URLs"):
        ParquetImages([])
    with pytest.raises(ConfigError, match=r"image_column=3"):
        ParquetImages(hf_files, image_column=3)
    with pytest.raises(ConfigError, match="on_error"):
        ParquetImages(hf_files, on_error="ignore")


def test_a_cache_that_asks_for_transcoding_is_refused_with_the_pack_to_use(hf_files, tmp_path):
    with pytest.raises(ConfigError, match=r"ParquetImages\(cache=.*would do nothing.*"
                                          r"fastload pack SRC DST --transcode 256"):
        ParquetImages(hf_files, cache={"disk": str(tmp_path / "c"), "transcode": {"max_side": 64}})
