"""``fastload pack``: folders and file lists into WebDataset shards that webdataset reads
unchanged; resumable; exit codes; through the installed console script. And TarShards over
shards on moto's S3 server, packed there."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from fastload import DataLoader, ImageFolder, TarShards
from fastload.data.pack import pack
from fastload.data.pack_read import open_files
from fastload.data.pack_tar import MTIME, ShardFile
from fastload.errors import MissingSampleError, UnreadableSampleError
from tests.fixtures.s3 import DUMMY_ENV

pytestmark = pytest.mark.timeout(240)

FASTLOAD = str(Path(sys.executable).parent / "fastload")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FASTLOAD, *args], check=False, capture_output=True, text=True,
                          timeout=180, env={**os.environ, **DUMMY_ENV})


def expected(root: Path) -> dict[str, tuple[int, bytes]]:
    folder = ImageFolder(str(root))
    return {os.path.relpath(p, root)[:-4]: (label, Path(p).read_bytes())
            for p, label in folder.samples}


def contents(ds: TarShards) -> dict[str, tuple[int, bytes]]:
    return {ds.index.key(i): (ds.label(i), ds.read_bytes(i)) for i in range(len(ds))}


def read_with_webdataset(urls: list[str]) -> dict[str, tuple[int, bytes]]:
    out = {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        assert sample["__key__"] not in out
        out[sample["__key__"]] = (int(sample["cls"]), sample["jpg"])
    return out


@pytest.mark.timeout(300)
def test_pack_a_folder_reads_back_in_webdataset_and_tarshards(jpeg_root, tmp_path):
    dst = tmp_path / "shards"
    done = run("pack", str(jpeg_root), str(dst), "--shard-size", "100KB", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["samples"] == 48 and report["shards"] > 3 and "shard 1: " in done.stderr
    manifest = json.loads((dst / "shards.json").read_text())
    assert manifest["__kind__"] == "wids-shard-index-v1"
    assert sum(s["nsamples"] for s in manifest["shardlist"]) == 48
    tars = sorted(str(p) for p in dst.glob("shard-*.tar"))
    assert all(os.path.getsize(t) <= 100_000 for t in tars) and len(tars) == report["shards"]
    assert read_with_webdataset(tars) == expected(jpeg_root)
    ds = TarShards(tars, size=32)  # its index files: no header read
    assert contents(ds) == expected(jpeg_root)


@pytest.mark.timeout(300)
def test_an_interrupted_pack_continues_and_writes_the_same_shards(jpeg_root, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert run("pack", str(jpeg_root), str(whole), "--shard-size", "100KB").returncode == 0
    assert run("pack", str(jpeg_root), str(cut), "--shard-size", "100KB").returncode == 0
    manifest = json.loads((cut / "shards.json").read_text())  # as if stopped after shard 2
    for shard in manifest["fastload"]["shards"][2:]:
        (cut / shard["url"]).unlink()
    manifest["fastload"]["shards"] = manifest["fastload"]["shards"][:2]
    (cut / "shards.json").write_text(json.dumps(manifest))
    (cut / "shard-000001.tar").write_bytes(b"torn")  # a damaged shard is written again
    again = run("pack", str(jpeg_root), str(cut), "--shard-size", "100KB")
    assert again.returncode == 0 and "(1 from an earlier run)" in again.stdout
    for tar in sorted(whole.glob("*.tar")):
        assert (cut / tar.name).read_bytes() == tar.read_bytes()


def test_a_file_list_packs_with_its_labels(jpeg_root, tmp_path):
    files = sorted(jpeg_root.rglob("*.jpg"))[:5]
    listing = tmp_path / "files.txt"
    listing.write_text("".join(f"{f} {k % 2}\n" for k, f in enumerate(files)))
    done = run("pack", str(listing), str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    got = read_with_webdataset([str(tmp_path / "out" / "shard-000000.tar")])
    assert sorted(got.values()) == sorted((k % 2, f.read_bytes()) for k, f in enumerate(files))


def test_exit_codes_bad_input_2_store_failure_1(jpeg_root, tmp_path):
    missing = run("pack", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert run("pack", str(jpeg_root), str(tmp_path / "o"), "--shard-size", "lots").returncode == 2
    (tmp_path / "file").write_text("x")
    blocked = run("pack", str(jpeg_root), str(tmp_path / "file" / "shards"))
    assert blocked.returncode == 1 and str(tmp_path / "file") in blocked.stderr
    bad_list = tmp_path / "bad.txt"
    bad_list.write_text("a.jpg notalabel\n")
    assert run("pack", str(bad_list), str(tmp_path / "o2")).returncode == 2


@pytest.mark.timeout(300)
def test_tarshards_on_s3_packed_there_through_the_cache(s3_jpegs, s3_options, s3_server,
                                                        jpeg_root, tmp_path):
    dst = "s3://fastload-test-shards/train"
    fs = fsspec.filesystem("s3", **s3_options)
    if not fs.exists("fastload-test-shards"):
        fs.mkdir("fastload-test-shards")
    report = pack(s3_jpegs, dst, shard_size=100_000, storage_options=s3_options,
                  dst_options=s3_options)
    cache = {"disk": str(tmp_path / "c")}
    ds = TarShards(report.urls, size=32, cache=cache, storage_options=s3_options)
    assert contents(ds) == expected(jpeg_root)
    loader = DataLoader(ds, batch_size=8, shuffle=True, backend="threads")
    labels = np.concatenate([y.numpy() for _, y in loader])
    assert sorted(labels.tolist()) == sorted(ds.index.labels.tolist())
    s3_server.reset_counts()
    TarShards(report.urls, size=32, storage_options=s3_options).read_bytes(0)  # no cache: S3
    assert s3_server.gets("fastload-test-shards/train/")
    s3_server.reset_counts()
    again = TarShards(report.urls, size=32, cache=cache, storage_options=s3_options)
    assert contents(again) == contents(ds)
    assert not s3_server.gets("fastload-test-shards/")  # the index and every member: from the cache


@pytest.mark.timeout(300)
def test_pack_transcode_bakes_small_images_into_readable_shards(jpeg_root, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(jpeg_root, src)
    first, second = sorted(p.name for p in src.iterdir() if p.is_dir())[:2]
    small = src / first / "small.png"  # within MAX_SIDE: kept as it is, a PNG
    Image.new("RGB", (40, 30), (200, 10, 10)).save(small)
    broken = src / second / "broken.jpg"  # not decodable: packed as it is, with a warning
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    dst = tmp_path / "shards"
    done = run("pack", str(src), str(dst), "--shard-size", "60KB", "--transcode", "64",
               "--quality", "85")
    assert done.returncode == 0, done.stderr
    assert "transcoded 48 samples" in done.stdout and "1 not decodable" in done.stdout
    assert "broken.jpg" in done.stderr and "shard 1: " in done.stderr
    tars = sorted(str(p) for p in dst.glob("shard-*.tar"))
    got = {}
    for sample in wds.WebDataset(tars, shardshuffle=False, empty_check=False):
        ext = next(e for e in ("jpg", "png") if e in sample)
        got[sample["__key__"]] = (int(sample["cls"]), ext, sample[ext])
    assert len(got) == 50 and got[f"{first}/small"][1:] == ("png", small.read_bytes())
    assert got[f"{second}/broken"][2] == broken.read_bytes()
    originals = expected(jpeg_root)
    for key, (label, ext, data) in got.items():
        if key in originals:
            assert label == originals[key][0] and ext == "jpg"
            with Image.open(io.BytesIO(data)) as img:
                img.load()  # decodable
                assert img.format == "JPEG" and img.size == (64, 48)  # 160x120, longer side 64
    ds = TarShards(tars, size=32, on_error="skip")  # the DALI index files, read by fastload
    assert len(ds) == 50 and next(ds.read_bytes(i) for i in range(len(ds)) if ds.index.key(i) == f"{first}/small") == small.read_bytes()
    manifest = json.loads((dst / "shards.json").read_text())
    assert manifest["fastload"]["plan"]["transcode"] == "transcode:max_side=64:quality=85:v1"

    again = run("pack", str(src), str(dst), "--shard-size", "60KB", "--transcode", "64",
                "--quality", "85")
    assert again.returncode == 0 and f"({len(tars)} from an earlier run)" in again.stdout
    other = run("pack", str(src), str(dst), "--shard-size", "60KB", "--transcode", "32", "--json")
    assert other.returncode == 0 and json.loads(other.stdout)["resumed_from"] == 0  # another plan


def test_pack_transcode_bad_values_exit_2(jpeg_root, tmp_path):
    zero = run("pack", str(jpeg_root), str(tmp_path / "o"), "--transcode", "0")
    assert zero.returncode == 2 and "max_side" in zero.stderr
    alone = run("pack", str(jpeg_root), str(tmp_path / "o"), "--quality", "80")
    assert alone.returncode == 2 and "--quality applies only with --transcode" in alone.stderr
    assert run("pack", str(jpeg_root), str(tmp_path / "o"), "--transcode", "64",
               "--quality", "120").returncode == 2


@pytest.mark.parametrize("max_side", [None, 64])
def test_wids_reads_the_packed_shards_by_their_shard_index(jpeg_root, tmp_path, max_side):
    wids = pytest.importorskip("wids", reason="wids is not installed (pip install wids)")
    args = ["--transcode", str(max_side)] if max_side else []
    assert run("pack", str(jpeg_root), str(tmp_path / "out"), "--shard-size", "100KB",
               *args).returncode == 0
    ds = wids.ShardListDataset(str(tmp_path / "out" / "shards.json"),
                               cache_dir=str(tmp_path / "wids-cache"), transformations=[])
    originals = expected(jpeg_root)
    assert len(ds) == len(originals)
    for i in range(len(ds)):
        sample = ds[i]
        label, data = int(sample[".cls"].read()), sample[".jpg"].read()
        assert label == originals[sample["__key__"]][0]
        with Image.open(io.BytesIO(data)) as img:
            assert img.size == ((160, 120) if max_side is None else (64, 48))
        assert max_side is not None or data == originals[sample["__key__"]][1]


def tarfile_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """What ``tarfile`` writes for ``members`` as pack adds them (NOTE [pack's tar bytes]):
    what pack's own tar writing must equal."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), MTIME, 0o444
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tarfile_shards(folder: ImageFolder, manifest: dict) -> dict[str, bytes]:
    """The shards of ``manifest`` as ``tarfile`` writes the same samples."""
    out = {}
    for shard in manifest["fastload"]["shards"]:
        members = []
        for path, label in folder.samples[shard["start"]:shard["stop"]]:
            stem, _, ext = os.path.relpath(path, folder.root).rpartition(".")
            key = stem.replace(".", "_")
            members += [(f"{key}.{ext}", Path(path).read_bytes()),
                        (f"{key}.cls", str(label).encode())]
        out[shard["url"]] = tarfile_bytes(members)
    return out


@pytest.fixture
def odd_names(jpeg_root, tmp_path) -> Path:
    """The JPEG set plus names tarfile writes with a pax header: longer than 100 bytes, not
    ASCII, and a dot in a folder name."""
    src = tmp_path / "odd"
    shutil.copytree(jpeg_root, src)
    first, second = sorted(p.name for p in src.iterdir() if p.is_dir())[:2]
    some = sorted((src / first).glob("*.jpg"))
    (src / first / ("x" * 120 + ".jpg")).write_bytes(some[0].read_bytes())
    (src / second / "ünïcode café.jpg").write_bytes(some[1].read_bytes())
    (src / second / "v1.2").mkdir()
    (src / second / "v1.2" / "dotted.name.jpg").write_bytes(some[2].read_bytes())
    return src


@pytest.mark.timeout(300)
def test_pack_writes_the_bytes_tarfile_writes(odd_names, tmp_path):
    report = pack(str(odd_names), str(tmp_path / "out"), shard_size=100_000)
    assert report.samples == 51 and report.shards > 3
    manifest = json.loads((tmp_path / "out" / "shards.json").read_text())
    want = tarfile_shards(ImageFolder(str(odd_names)), manifest)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.tar")} == want
    assert not list((tmp_path / "out").glob("*tmp*"))
    got = read_with_webdataset(sorted(str(p) for p in (tmp_path / "out").glob("*.tar")))
    assert len(got) == 51 and ("x" * 120 in "".join(got))


@pytest.mark.parametrize("copy", ShardFile.COPIES)
def test_every_way_of_copying_a_file_writes_the_same_tar(jpeg_root, tmp_path, copy):
    files = sorted(jpeg_root.rglob("*.jpg"))[:3]
    shard = ShardFile(str(tmp_path / "x.tar"), copy=copy)
    for k, path in enumerate(files):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert shard.add_file(f"{k}.jpg", fd, os.fstat(fd).st_size, str(path)) % 512 == 0
        finally:
            os.close(fd)
        shard.add(f"{k}.cls", str(k).encode())
    size = shard.finish(sync=True)
    want = tarfile_bytes([member for k, path in enumerate(files) for member in
                          ((f"{k}.jpg", path.read_bytes()), (f"{k}.cls", str(k).encode()))])
    assert (tmp_path / "x.tar").read_bytes() == want and size == len(want)


def test_a_file_that_changes_while_it_is_copied_is_an_error_naming_it(jpeg_root, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(jpeg_root, src)
    folder = ImageFolder(str(src))
    samples = open_files(folder, range(len(folder)))
    first = next(samples)
    with open(first.path, "ab") as f:  # grows after its size was taken
        f.write(b"more")
    with pytest.raises(UnreadableSampleError, match="changed while it was packed") as caught:
        next(samples)
    assert first.path in str(caught.value)


@pytest.mark.timeout(300)
def test_a_file_gone_mid_pack_keeps_the_finished_shards_and_a_rerun_completes(jpeg_root, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(jpeg_root, src)
    folder = ImageFolder(str(src))
    whole = pack(folder, str(tmp_path / "whole"), shard_size=100_000)
    late, _ = folder.samples[40]
    kept = Path(late).read_bytes()
    Path(late).unlink()  # listed, then gone
    with pytest.raises(MissingSampleError, match=late):
        pack(folder, str(tmp_path / "cut"), shard_size=100_000)
    cut = tmp_path / "cut"
    assert not list(cut.glob("*tmp*"))  # the unfinished shard is not left behind
    recorded = json.loads((cut / "shards.json").read_text())["fastload"]["shards"]
    assert recorded and recorded[-1]["stop"] <= 40
    Path(late).write_bytes(kept)
    again = pack(folder, str(cut), shard_size=100_000)
    assert again.resumed_from == len(recorded) and again.shards == whole.shards
    for tar in (tmp_path / "whole").glob("*.tar"):
        assert (cut / tar.name).read_bytes() == tar.read_bytes()


@pytest.mark.timeout(300)
def test_pack_between_s3_and_local_disk_writes_the_same_shards(s3_jpegs, s3_options, jpeg_root,
                                                               tmp_path):
    local = pack(str(jpeg_root), str(tmp_path / "local"), shard_size=100_000)
    want = {p.name: p.read_bytes() for p in (tmp_path / "local").glob("*")}
    from_s3 = pack(s3_jpegs, str(tmp_path / "from-s3"), shard_size=100_000,
                   storage_options=s3_options)  # read ahead by the thread pool
    assert from_s3.samples == local.samples
    assert {p.name: p.read_bytes() for p in (tmp_path / "from-s3").glob("*.tar")} == {
        name: data for name, data in want.items() if name.endswith(".tar")}
    fs = fsspec.filesystem("s3", **s3_options)
    if not fs.exists("fastload-test-shards"):
        fs.mkdir("fastload-test-shards")
    dst = "s3://fastload-test-shards/from-local"
    to_s3 = pack(str(jpeg_root), dst, shard_size=100_000, dst_options=s3_options)  # spooled
    assert to_s3.shards == local.shards
    assert not list(Path(tempfile.gettempdir()).glob(f"fastload-pack-{os.getpid()}-*"))
    for name, data in want.items():
        if name.endswith((".tar", ".idx", ".labels")):
            assert fs.cat_file(f"fastload-test-shards/from-local/{name}") == data, name


@pytest.mark.timeout(300)
def test_a_rerun_removes_the_temps_of_a_killed_pack_and_nothing_else(jpeg_root, tmp_path):
    """A pack killed with SIGKILL leaves <shard>.tmp-<pid>; the next run deletes those of a
    process that is gone, and keeps a live process's temps and files it did not write."""
    dst = tmp_path / "dst"
    dst.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [dst / f"shard-000000.tar.tmp-{dead.pid}", dst / f"shard-000000.idx.tmp-{dead.pid}",
             dst / f"shard-000000.labels.tmp-{dead.pid}", dst / f"shards.json.tmp-{dead.pid}"]
    kept = [dst / f"shard-000001.tar.tmp-{os.getppid()}", dst / "notes.tmp-1", dst / "mine.tar"]  # a live pid
    for path in stale + kept:
        path.write_bytes(b"x")
    report = pack(ImageFolder(str(jpeg_root)), str(dst), shard_size=100_000)
    assert report.shards > 0
    assert not any(p.exists() for p in stale)
    assert all(p.read_bytes() == b"x" for p in kept)
