"""TarShards over a wids shard index file (NOTE [a shard index file]): the JSON that
``wids.ShardListDataset`` takes and ``fastload pack`` writes, locally and on the real S3
server, with wids' rules for relative URLs, sub-datasets and a stale sample count."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fastload import DataLoader, ImageFolder, TarShards
from fastload.errors import DatasetError, ObjectNotFoundError
from fastload.io.wids_index import _join, read_shard_index
from tests.fixtures.s3 import upload_folder
from tests.test_shards import write_shards

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def shard_dir(jpeg_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wids")
    write_shards(jpeg_root, out, per_shard=12)  # 48 images: 4 shards of 12
    return out


def index(path: Path, shardlist: list[dict], **more) -> str:
    path.write_text(json.dumps({"wids_version": 1, "shardlist": shardlist, **more}))
    return str(path)


def test_urls_resolve_as_wids_resolves_them():
    assert _join("s3://b/train", "x-0.tar") == "s3://b/train/x-0.tar"
    assert _join("s3://b/train", "../val/x-0.tar") == "s3://b/val/x-0.tar"
    assert _join("s3://b/train", "/other/x-0.tar") == "s3://b/other/x-0.tar"  # same bucket
    assert _join("s3://b/train", "gs://c/x-0.tar") == "gs://c/x-0.tar"
    assert _join("latency::s3://b/train", "x-0.tar") == "latency::s3://b/train/x-0.tar"
    assert _join("/data/train", "x-0.tar") == "/data/train/x-0.tar"
    assert _join("/data/train", "/elsewhere/x-0.tar") == "/elsewhere/x-0.tar"


def test_an_index_file_reads_the_shards_it_lists_in_its_order(shard_dir, tmp_path, caplog):
    names = sorted(p.name for p in shard_dir.glob("*.tar"))
    sub = tmp_path / "sub.json"
    index(sub, [{"url": names[3], "nsamples": 12}], base=str(shard_dir))
    top = index(shard_dir / "train.json",
                [{"url": names[1], "nsamples": 12}, {"url": names[0], "nsamples": 12}],
                datasets=[{"shardlist": [{"url": names[2], "nsamples": 12}]},
                          {"source_url": str(sub)}])
    with caplog.at_level(logging.WARNING, logger="fastload.data.shards"):
        ds = TarShards(top, size=32)
    assert ds.urls == [str(shard_dir / n) for n in (names[1], names[0], names[2], names[3])]
    by_list = TarShards([str(shard_dir / n) for n in (names[1], names[0], names[2], names[3])],
                        size=32)
    assert len(ds) == 48 and ds.targets.tolist() == by_list.targets.tolist()
    assert "holds" not in caplog.text  # the counts agree: no warning

    stale = index(shard_dir / "stale.json", [{"url": n, "nsamples": 10} for n in names])
    with caplog.at_level(logging.WARNING, logger="fastload.data.shards"):
        TarShards(stale, size=32)
    assert (f"{stale} says {shard_dir / names[0]} holds 10 samples, and its headers hold 12 "
            "(4 shard(s) differ)") in caplog.text


def test_what_fastload_pack_writes_is_an_index_tarshards_takes(jpeg_root, tmp_path):
    out = tmp_path / "packed"
    script = Path(sys.executable).parent / "fastload"
    subprocess.run([str(script), "pack", str(jpeg_root), str(out), "--shard-size", "200KB"],
                   check=True, capture_output=True, timeout=120)
    ds = TarShards(str(out / "shards.json"), size=32)
    assert ds.urls == sorted(str(p) for p in out.glob("*.tar")) and len(ds) == 48
    folder = ImageFolder(str(jpeg_root), size=32)
    assert ds.classes == folder.classes and ds.class_to_idx == folder.class_to_idx  # names, not "0"
    assert sorted(ds.targets.tolist()) == sorted(folder.targets)
    assert TarShards(str(out / "*.tar"), size=32).classes == [str(i) for i in range(len(ds.classes))]


def test_an_index_on_s3_names_shards_beside_it(shard_dir, s3_options, s3_server):
    names = sorted(p.name for p in shard_dir.glob("*.tar"))
    local = shard_dir.parent / "wids-remote"
    local.mkdir(exist_ok=True)
    for n in names:
        (local / n).write_bytes((shard_dir / n).read_bytes())
    index(local / "shards.json", [{"url": n, "nsamples": 12} for n in names])
    root = upload_folder(s3_options, local, "s3://fastload-wids/train")
    listed = read_shard_index(f"{root}/shards.json", s3_options)
    assert listed.shards == [(f"{root}/{n}", 12) for n in names] and listed.classes is None
    ds = TarShards(f"{root}/shards.json", size=32, storage_options=s3_options)
    labels = [y for _, ys in DataLoader(ds, batch_size=16, backend="threads") for y in ys.tolist()]
    assert len(labels) == 48 and ds.urls == [f"{root}/{n}" for n in names]


def test_a_file_that_is_not_an_index_is_named_and_says_what_it_takes(tmp_path):
    with pytest.raises(ObjectNotFoundError, match=r"shard index .*missing\.json does not exist"):
        TarShards(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DatasetError, match=r"bad\.json is not a wids shard index: it is not JSON"):
        TarShards(str(bad))
    other = index(tmp_path / "other.json", [], wids_version=2)
    with pytest.raises(DatasetError, match=r"other\.json is not a wids shard index: it has no "
                                           r"\"wids_version\": 1.*fastload pack"):
        TarShards(other)
    empty = index(tmp_path / "empty.json", [])
    with pytest.raises(DatasetError, match="it lists no shards"):
        TarShards(empty)
    shapeless = index(tmp_path / "shapeless.json", ["a.tar"])
    with pytest.raises(DatasetError, match="its 'shardlist' is not a list of"):
        TarShards(shapeless)


def test_commands_read_an_index_for_its_shards_and_any_other_json_as_a_file(shard_dir, tmp_path):
    from fastload.io.file_urls import files_named

    names = sorted(p.name for p in shard_dir.glob("*.tar"))
    two = index(tmp_path / "two.json", [{"url": str(shard_dir / n)} for n in names[:2]])
    assert files_named(two, {}, owner="cache warm") == [str(shard_dir / n) for n in names[:2]]
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"cat": 0}))
    assert files_named(str(labels), {}, owner="cache warm") is None  # warmed as the file it is
    assert files_named(str(shard_dir), {}, owner="cache warm") is None  # a folder
    with pytest.raises(ObjectNotFoundError):
        files_named(str(tmp_path / "gone.json"), {}, owner="cache warm")
