"""TarShards: WebDataset tar shards (written by webdataset's own ShardWriter) as a declared
dataset: the index, the bytes, every in-process engine and torch workers, on_error, the stored
index, DALI index files, the shard-aware order (ranks, resume, shuffle quality)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds

from fastload import DataLoader, EpochSampler, ImageFolder, TarShards
from fastload.data.shard_order import ShardOrder, shuffle_quality
from fastload.data.tarfiles import index_url_of, split_key, write_dali_index
from fastload.errors import ConfigError, CorruptSampleError, DatasetError, MissingSampleError
from fastload.io.file_urls import expand_braces
from tests.contracts import sharded
from tests.contracts.resume import interrupted, same_batches

pytestmark = pytest.mark.timeout(180)


def write_shards(root: Path, out: Path, *, per_shard: int = 10, broken: str | None = None) -> str:
    """The images below ``root`` as shards of ``per_shard`` samples by webdataset's ShardWriter
    (label members ``.cls``); ``broken``: a key whose jpg is not a JPEG. Returns the pattern."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = sorted(root.rglob("*.jpg"))
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for f in files:
            key = str(f.relative_to(root).with_suffix(""))
            data = b"not a jpeg" if key == broken else f.read_bytes()
            label = str(classes.index(f.parent.name)).encode()
            sink.write({"__key__": key, "jpg": data, "cls": label})
    count = len(list(out.glob("train-*.tar")))
    return str(out / f"train-{{000000..{count - 1:06d}}}.tar")


@pytest.fixture(scope="module")
def shards(jpeg_root: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_shards(jpeg_root, tmp_path_factory.mktemp("shards"))


def test_brace_patterns_expand_as_webdataset_does():
    expanded = expand_braces("s3://b/t-{008..011}.tar")
    assert expanded == [f"s3://b/t-{i:03d}.tar" for i in range(8, 12)]
    assert expand_braces("/d/{a,b}-{1..2}.tar") == ["/d/a-1.tar", "/d/a-2.tar", "/d/b-1.tar",
                                                   "/d/b-2.tar"]
    assert split_key("x/n01.a.b.jpg") == ("x/n01", "a.b.jpg")
    assert index_url_of("s3://b/x.tar") == "s3://b/x.idx"


def test_globs_and_lists_name_the_shards_and_a_directory_is_refused_with_the_glob(shards):
    urls = expand_braces(shards)
    folder = Path(urls[0]).parent
    assert TarShards(str(folder / "train-*.tar"), size=32).urls == urls  # sorted
    assert TarShards([Path(u) for u in urls[:2]], size=32).urls == urls[:2]
    with pytest.raises(ConfigError, match=r"is a directory: pass its tar shards as a glob \('.*/\*\.tar'\)"):
        TarShards(str(folder), size=32)
    with pytest.raises(DatasetError, match=r"no file matches .*nothing-\*\.tar"):
        TarShards(str(folder / "nothing-*.tar"), size=32)
    with pytest.raises(ConfigError, match=r"TarShards needs tar shard URLs: a glob"):
        TarShards(7, size=32)


def test_index_matches_the_tar_members_and_labels(shards, jpeg_root):
    ds = TarShards(shards, size=32)
    urls = expand_braces(shards)
    assert ds.urls == urls and len(ds) == 48 and ds.classes == ["0", "1", "2", "3"]
    assert ds.index.nbytes / len(ds) < 100  # numpy rows and keys, not tuples
    row = 0
    for shard, url in enumerate(urls):
        with tarfile.open(url) as tar:
            for member in (m for m in tar.getmembers() if m.name.endswith(".jpg")):
                key = member.name[:-4]
                assert ds.index.key(row) == key and int(ds.index.shards[row]) == shard
                assert int(ds.index.offsets[row]) == member.offset_data
                assert ds.index.lengths[row] == member.size
                assert ds.read_bytes(row) == (jpeg_root / member.name).read_bytes()
                assert ds.label(row) == int(tar.extractfile(key + ".cls").read())
                row += 1
    assert row == len(ds)


def test_samples_equal_image_folders_of_the_same_files(shards, jpeg_root):
    ds, folder = TarShards(shards, size=48), ImageFolder(str(jpeg_root), size=48)
    paths = [os.path.relpath(p, jpeg_root) for p, _ in folder.samples]
    for i in (0, 17, 47):
        j = paths.index(ds.index.key(i) + ".jpg")
        image, label = ds[i]
        expected, folder_label = folder[j]
        assert torch.equal(image, expected) and label == folder_label


@pytest.mark.parametrize("backend", ["threads", "torch", "dali"])
def test_loader_gives_each_sample_once_with_the_threads_engine_and_workers(shards, backend):
    ds = TarShards(shards, size=32, train=True, seed=3, target_transform=lambda y: y * 10)
    sharded.each_sample_once(ds, backend)
    if backend == "threads":
        sharded.threads_match_workers(ds)


def test_a_subclass_that_overrides_the_read_path_runs_on_torch(shards):
    sharded.subclass_runs_on_torch(TarShards, shards, size=32)


def test_exact_mid_epoch_resume(shards):
    make = lambda: DataLoader(TarShards(shards, size=32, train=True, seed=7), batch_size=5,
                              shuffle=True)
    full, resumed, state = interrupted(make, k=3)
    assert state["mode"] == "sharded" and state["consumed"] == 15
    assert same_batches(full, resumed)


def test_skip_names_a_corrupt_member_and_raise_raises_it(jpeg_root, tmp_path):
    pattern = write_shards(jpeg_root, tmp_path / "bad", broken="class_01/img_000005")
    ds = TarShards(pattern, size=32, on_error="skip")
    loader = DataLoader(ds, batch_size=8, backend="threads")
    assert sum(len(y) for _, y in loader) == 47
    assert [s.path for s in loader.skipped] == ["train-000001.tar:class_01/img_000005"]
    strict = TarShards(pattern, size=32)
    bad = next(i for i in range(len(strict)) if strict.index.key(i) == "class_01/img_000005")
    with pytest.raises(CorruptSampleError, match=r"train-000001\.tar#class_01/img_000005"):
        strict[bad]


def test_a_shard_gone_since_the_index_is_named_and_skipped(jpeg_root, tmp_path):
    pattern = write_shards(jpeg_root, tmp_path / "gone")
    ds = TarShards(pattern, size=32, on_error="skip")
    os.remove(expand_braces(pattern)[2])
    loader = DataLoader(ds, batch_size=8, backend="torch", num_workers=2,
                        multiprocessing_context="spawn")  # pickled into fresh processes
    assert sum(len(y) for _, y in loader) == 38 and len(loader.skipped) == 10
    raising = ds.with_pipeline(ds.pipeline)
    raising.on_error = "raise"
    with pytest.raises(MissingSampleError, match=r"train-000002\.tar#.*build the TarShards again"):
        raising[25]


def test_samples_without_a_label_member_are_named_at_build(jpeg_root, tmp_path, caplog):
    files = sorted(jpeg_root.rglob("*.jpg"))[:4]
    with wds.TarWriter(str(tmp_path / "some-0.tar")) as sink:  # two of four with a label
        for k, f in enumerate(files):
            sink.write({"__key__": f"s{k}", "jpg": f.read_bytes(), **({"cls": b"1"} if k % 2 else {})})
    with wds.TarWriter(str(tmp_path / "none-0.tar")) as sink:
        for k, f in enumerate(files):
            sink.write({"__key__": f"s{k}", "jpg": f.read_bytes()})
    caplog.set_level("INFO", logger="fastload.data.sharded")
    ds = TarShards(str(tmp_path / "some-0.tar"), size=32)
    assert ds.targets.tolist() == [-1, 1, -1, 1]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "2 of 4 samples have no label member" in warned[0]
    assert "some-0.tar#s0; " in warned[0] and "some-0.tar#s2" in warned[0]
    caplog.clear()
    unlabeled = TarShards(str(tmp_path / "none-0.tar"), size=32)  # no labels at all: said, not warned
    assert set(unlabeled.targets.tolist()) == {-1}
    said = [r for r in caplog.records if "every label is -1" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_the_index_is_stored_in_the_cache_and_reused(jpeg_root, tmp_path):
    pattern = write_shards(jpeg_root, tmp_path / "s")
    cache = {"disk": str(tmp_path / "cache")}
    first = TarShards(pattern, size=32, cache=cache)
    first_shard = expand_braces(pattern)[0]
    Path(first_shard).write_bytes(os.urandom(1024) + Path(first_shard).read_bytes()[1024:])
    with pytest.raises(DatasetError, match="not a readable tar shard"):
        TarShards(pattern, size=32)  # a fresh build reads the damaged header
    again = TarShards(pattern, size=32, cache=cache)  # the stored index: no header read
    assert np.array_equal(again.index.offsets, first.index.offsets)
    assert again.classes == first.classes
    with pytest.raises(DatasetError):
        TarShards(pattern, size=32, cache=cache, listing_max_age=0)


def test_a_dali_index_file_replaces_the_header_walk(shards, tmp_path):
    headers = TarShards(shards, size=32)
    for url in expand_braces(shards):
        copy = tmp_path / os.path.basename(url)
        copy.write_bytes(Path(url).read_bytes())
        with tarfile.open(url) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
        samples: dict[str, list] = {}
        for m in members:
            key, ext = split_key(m.name)
            samples.setdefault(key, []).append((ext, m.offset_data, m.size, m.name))
        Path(index_url_of(str(copy))).write_text(write_dali_index(list(samples.values())))
        with open(copy, "r+b") as f:  # headers unreadable: only the index file can say where
            f.write(bytes(512))
    indexed = TarShards(str(tmp_path / os.path.basename(shards)), size=32)
    assert np.array_equal(indexed.index.offsets, headers.index.offsets)
    assert np.array_equal(indexed.index.labels, headers.index.labels)


def test_shard_order_is_seeded_and_each_rank_reads_whole_shards():
    order = ShardOrder([25] * 16, window=2)
    a, b = (order.permutation(0, 1, shuffle=True, num_replicas=1) for _ in range(2))
    assert a == b and sorted(a) == list(range(400))
    assert a != order.permutation(0, 2, shuffle=True, num_replicas=1)
    assert order.permutation(0, 1, shuffle=False, num_replicas=1) == list(range(400))
    ranks = [EpochSampler(400, seed=0, num_replicas=4, rank=r, order=order) for r in range(4)]
    shares = [list(s) for s in ranks]
    assert sorted(i for s in shares for i in s) == list(range(400))
    for share in shares:  # 100 samples = 4 whole shards, read as 2 windows of 2
        assert len({i // 25 for i in share}) == 4
        assert all(len({i // 25 for i in share[w:w + 50]}) == 2 for w in (0, 50))


def test_shard_order_reads_files_of_several_shards_a_window_at_a_time():
    # NOTE [row groups of files]: 30 shards (Parquet's row groups) of 10 samples in 9 files
    # of 1-6 shards; window 3
    files = [0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 3, 3, 4, 4, 4, 5, 6, 6, 6, 6, 7, 7, 7, 8, 8, 8, 8, 8,
             1, 5]
    order = ShardOrder([10] * 30, window=3, files=files)
    a = order.permutation(3, 1, shuffle=True, num_replicas=1)
    assert a == order.permutation(3, 1, shuffle=True, num_replicas=1)
    assert sorted(a) == list(range(300)) and a != order.permutation(3, 2, shuffle=True,
                                                                    num_replicas=1)
    file_at = np.asarray(files)[np.asarray(a) // 10]
    spans = {f: (np.flatnonzero(file_at == f)[0], np.flatnonzero(file_at == f)[-1])
             for f in range(9)}
    at_once = [sum(lo <= p <= hi for lo, hi in spans.values()) for p in range(300)]
    assert max(at_once) <= 3 + 1  # the window's files, one more where one gives way
    windows = [set((np.asarray(a[w: w + 30]) // 10).tolist()) for w in range(0, 300, 30)]
    assert all(len(w) == 3 for w in windows)  # 3 whole shards a window, as without files
    assert order.permutation(3, 1, shuffle=False, num_replicas=1) == list(range(300))
    with pytest.raises(ValueError, match="2 files given for 30 shards"):
        ShardOrder([10] * 30, window=3, files=[0, 1])


def test_shard_order_splits_unevenly_sized_shards_with_padding():
    order = ShardOrder([7, 3, 11, 5], window=2)
    for ranks, drop in ((3, False), (3, True), (4, False)):
        shares = [list(EpochSampler(26, seed=1, num_replicas=ranks, rank=r, drop_last=drop,
                                    order=order)) for r in range(ranks)]
        assert len({len(s) for s in shares}) == 1
        seen = [i for s in shares for i in s]
        assert set(seen) <= set(range(26))
        assert len(set(seen)) == len(seen) if drop else set(seen) == set(range(26))


def test_shuffle_quality_against_a_uniform_permutation():
    sizes = [100] * 64
    shard_of = np.repeat(np.arange(64), 100)
    shard_order = ShardOrder(sizes, window=4).permutation(0, 0, shuffle=True, num_replicas=1)
    windowed = shuffle_quality(shard_order, shard_of)
    permutation = torch.randperm(6400, generator=torch.Generator().manual_seed(0))
    uniform = shuffle_quality(permutation.tolist(), shard_of)
    # Both decorrelate storage from epoch position; the window reads 4 shards at a time.
    assert abs(windowed["position_correlation"]) < 0.2
    assert abs(uniform["position_correlation"]) < 0.1
    assert 0.15 < windowed["same_shard_neighbours"] < 0.35
    assert uniform["same_shard_neighbours"] < 0.05
    assert windowed["shards_per_span"] <= 8 and uniform["shards_per_span"] > 60  # of 256 samples


def ranked_loader(monkeypatch, shards: str, world: int, rank: int) -> DataLoader:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))
    ds = TarShards(shards, size=16, seed=5, shuffle_window=1)
    return DataLoader(ds, batch_size=4, shuffle=True)


def test_a_state_saved_mid_epoch_over_another_order_is_refused(shards):
    # NOTE [a changed order]: resumed over another permutation, the rest of the epoch would
    # repeat some samples and skip others with no word
    def loader(window: int, seed: int = 3) -> DataLoader:
        return DataLoader(TarShards(shards, size=16, seed=seed, shuffle_window=window),
                          batch_size=4, shuffle=True, backend="threads")

    saved = loader(2)
    it = iter(saved)
    seen = [y for _ in range(3) for y in next(it)[1].tolist()]
    state = saved.state_dict()
    del it
    other = loader(4, seed=5)  # its seed other than the saved one, to see it kept on refusal
    with pytest.raises(ConfigError, match=r"12 samples a rank into epoch 0, but this loader's "
                       r"order for that epoch is not the saved one .* read epoch 0 again from "
                       r"its start: state\['span'\] = \[0, 48\]; state\['consumed'\] = 0"):
        other.load_state_dict(state)
    assert other.epoch_sampler.seed == 5  # as it was
    same = loader(2)
    same.load_state_dict(state)  # the same order: the rest of the epoch, each sample once
    rest = [y for _, ys in same for y in ys.tolist()]
    assert sorted(seen + rest) == sorted(TarShards(shards, size=16).targets.tolist())
    state.update(span=[0, 48], consumed=0)  # the epoch again from its start: any order
    other.load_state_dict(state)
    assert len([y for _, ys in other for y in ys.tolist()]) == 48


def test_ranks_read_whole_shards_and_an_elastic_restart_covers_the_rest_once(monkeypatch, shards):
    keys = {}
    for rank in range(2):  # 48 samples in shards of 10, 10, 10, 10, 8: 24 per rank
        loader = ranked_loader(monkeypatch, shards, 2, rank)
        ds = loader.dataset
        mine = list(loader.epoch_sampler)
        keys[rank] = {ds.index.key(i) for i in mine}
        # whole shards, one split at an end
        assert len({int(ds.index.shards[i]) for i in mine}) <= 3
    assert not keys[0] & keys[1] and len(keys[0] | keys[1]) == 48
    states, before = [], []
    for rank in range(2):  # two batches on each of 2 ranks, then a restart on 3
        loader = ranked_loader(monkeypatch, shards, 2, rank)
        it = iter(loader)
        before += [y for _ in range(2) for y in next(it)[1].tolist()]
        states.append(loader.state_dict())
        ds = loader.dataset
    after = []
    for rank in range(3):
        loader = ranked_loader(monkeypatch, shards, 3, rank)
        loader.load_state_dict(states[rank % 2])
        after += [i for i in loader.epoch_sampler]
    consumed = [
        i for r in range(2)
        for i in EpochSampler(48, seed=states[r]["seed"], num_replicas=2, rank=r,
                              order=ds.epoch_order).indices(0)[:8]
    ]
    assert len(set(consumed)) == 16 and set(after) | set(consumed) == set(range(48))
    assert len(after) - 32 < 3  # the rest once; the new split pads by repeating the epoch's head


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_torchrun_ranks_agree_on_the_order_and_read_disjoint_whole_shards(shards, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    script = Path(__file__).parent / "dist_scripts" / "shards_ranks.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script), shards, "--out", str(tmp_path)],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["seed"] == ranks[1]["seed"]  # rank 0's, broadcast
    for epoch in range(2):
        parts = [r["epochs"][epoch] for r in ranks]
        assert not set(parts[0]["keys"]) & set(parts[1]["keys"])
        assert len(set(parts[0]["keys"]) | set(parts[1]["keys"])) == 48
        for part in parts:
            assert part["labels"] == part["expected"]  # the loader ran that order
            assert len(set(part["shards"])) <= 3  # whole shards, one split at an end
    assert ranks[0]["epochs"][0]["keys"] != ranks[0]["epochs"][1]["keys"]


def test_a_local_shard_rewritten_between_epochs_stops_the_next_one(jpeg_root, tmp_path):
    from fastload.cache.shardstore import ShardChangedError

    write_shards(jpeg_root, tmp_path / "shards")
    urls = sorted(str(p) for p in (tmp_path / "shards").glob("*.tar"))
    loader = DataLoader(TarShards(urls, size=24), batch_size=16)
    assert sum(len(y) for _, y in loader) == 48
    Path(urls[1]).write_bytes(Path(urls[4]).read_bytes())  # another shard's members now
    with pytest.raises(ShardChangedError, match="changed at the origin"):
        list(loader)


def test_shards_on_two_filesystems_are_refused_naming_both(shards):
    first = expand_braces(shards)[0]
    with pytest.raises(ConfigError, match=r"TarShards reads tar shards of one filesystem, and "
                                          r"these mix LocalFileSystem, S3FileSystem \(first "
                                          rf"{first}, last s3://b/x\.tar\): put them all on one"):
        TarShards([first, "s3://b/x.tar"], storage_options={"anon": True})
