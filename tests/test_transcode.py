"""The transcoded cache tier: re-encoded images capped at max_side, keyed by their parameters,
read by ImageFolder, filled by `fastload cache warm --transcode`, suggested by the meter."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from PIL import Image

from fastload import DataLoader, ImageFolder
from fastload.cache import CacheConfig, open_cache
from fastload.cache.keys import derived_key, make_key
from fastload.cache.warm import warm
from fastload.data.stored_listing import is_listing_key
from fastload.data.transcode import Transcode, transcoding
from fastload.errors import CacheError, ConfigError, CorruptSampleError
from fastload.io.versions import local_version
from fastload.meter import WorkerWork, diagnose

IMAGES = 6
BIG = (800, 600)


def _jpeg(path: Path, size: tuple[int, int], shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A gradient, not a flat color: JPEG sizes then behave like photos'.
    img = Image.linear_gradient("L").resize(size).convert("RGB")
    img.paste((shade, 40, 200 - shade), (0, 0, size[0] // 3, size[1] // 3))
    img.save(path, format="JPEG", quality=95)


@pytest.fixture
def big_root(tmp_path: Path) -> Path:
    """Two classes of 800x600 JPEGs (and one PNG), larger than any max_side used here."""
    root = tmp_path / "data"
    for i in range(IMAGES):
        _jpeg(root / f"c{i % 2}" / f"{i}.jpg", BIG, 30 * i)
    Image.new("RGBA", (640, 900), (10, 200, 30, 128)).save(root / "c1" / "tall.png")
    return root


def _key(path: Path, tag: str | None = None) -> str:
    key = make_key(LocalFileSystem().unstrip_protocol(str(path)), local_version(path.stat()))
    return key if tag is None else derived_key(key, tag)


def _decoded_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        return img.size


# -- the derivation and its keys ----------------------------------------------------------------


def test_transcoded_entries_are_capped_smaller_and_keyed_by_their_parameters(big_root, tmp_path):
    cache = open_cache({"disk": tmp_path / "c"})
    disk = cache.tiers[0]
    fs = LocalFileSystem()
    t256 = Transcode(max_side=256)
    assert t256.tag == "transcode:max_side=256:quality=90:v1"
    small = cache.deriving(t256)
    for path in sorted(big_root.rglob("*.*")):
        original = path.read_bytes()
        data = small.read(fs, str(path))
        assert max(_decoded_size(data)) == 256 and len(data) < len(original)
        assert disk.get(_key(path, t256.tag)) == data  # stored under the derived key
        assert not disk.contains(_key(path))  # the original is not stored by a derived read
    files = len(list(big_root.rglob("*.*")))
    assert small.origin_reads == files
    # served from the cache now: no origin read
    again = cache.deriving(Transcode(256))
    assert [again.ensure(fs, str(p)) for p in sorted(big_root.rglob("*.*"))] == ["hit"] * files
    assert again.origin_reads == 0
    # other parameters miss, and the plain cache reads the original bytes, untouched
    for other in (Transcode(256, quality=80), Transcode(128)):
        view = cache.deriving(other)
        assert [view.ensure(fs, str(p)) for p in sorted(big_root.rglob("*.*"))] == ["fetched"] * files
    path = next(big_root.rglob("*.jpg"))
    assert cache.read(fs, str(path)) == path.read_bytes()
    assert max(_decoded_size(disk.get(_key(path, Transcode(128).tag)))) == 128


def test_images_within_max_side_are_stored_as_they_are(tmp_path):
    path = tmp_path / "small.jpg"
    _jpeg(path, (200, 150), 0)
    assert Transcode(256)(path.read_bytes()) == path.read_bytes()  # never upscaled or re-encoded
    assert _decoded_size(Transcode(100)(path.read_bytes())) == (100, 75)  # aspect kept


@pytest.mark.parametrize("spec, wrong", [
    ({"max_side": 0}, "max_side must be a whole number of pixels >= 1"),
    ({"max_side": 256.0}, "max_side must be a whole number"),
    ({"max_side": 256, "quality": 96}, "quality must be a JPEG quality from 1 to 95"),
    ({"max_side": 256, "quality": 0}, "quality must be a JPEG quality from 1 to 95"),
    ({"quality": 90}, "needs max_side"),
    ({"max_side": 256, "size": 3}, "unknown transcode option(s) ['size']"),
    (256, "must be a dict such as"),
])
def test_bad_transcode_specs_say_what_is_wrong(tmp_path, spec, wrong):
    with pytest.raises(ConfigError) as exc:
        CacheConfig(disk=tmp_path, transcode=spec)
    assert wrong in str(exc.value)


def test_transcode_spec_defaults_and_transcode_validates(tmp_path):
    assert CacheConfig(disk=tmp_path, transcode={"max_side": 64}).transcode == {"max_side": 64, "quality": 90}
    with pytest.raises(ConfigError, match="max_side"):
        Transcode(max_side=-1)
    with pytest.raises(ConfigError, match="quality"):
        Transcode(max_side=64, quality=100)


def test_a_transcoding_cache_pickles_with_its_derivation(tmp_path):
    cache = transcoding(open_cache({"disk": tmp_path / "c", "transcode": {"max_side": 64, "quality": 70}}))
    assert cache.derive == Transcode(64, 70)
    assert pickle.loads(pickle.dumps(cache)).derive == Transcode(64, 70)
    assert transcoding(cache) is cache and transcoding(None) is None


def test_the_fastload_protocol_refuses_transcode_it_cannot_apply(big_root, tmp_path):
    path = next(big_root.rglob("*.jpg"))
    spec = {"disk": str(tmp_path / "c"), "transcode": {"max_side": 64}}
    with pytest.raises(ConfigError, match="deriving"):
        with fsspec.open(f"fastload::file://{path}", fastload={"cache": spec}) as f:
            f.read()
    with fsspec.open(f"fastload::file://{path}", fastload={"cache": transcoding(open_cache(spec))}) as f:
        assert max(_decoded_size(f.read())) == 64


# -- ImageFolder --------------------------------------------------------------------------------


def test_image_folder_reads_transcoded_images_and_the_second_epoch_reads_no_origin(big_root, tmp_path):
    spec = {"disk": tmp_path / "c", "transcode": {"max_side": 128}}
    ds = ImageFolder(big_root, size=64, seed=0, cache=spec)
    plain = ImageFolder(big_root, size=64, seed=0)
    assert ds.samples == plain.samples and ds.classes == plain.classes
    loader = DataLoader(ds, batch_size=3, shuffle=True, num_workers=0)
    first = [(x.shape, y.tolist()) for x, y in loader]
    assert all(shape[1:] == (3, 64, 64) for shape, _ in first)
    assert sum(shape[0] for shape, _ in first) == len(ds)
    expected = [y.tolist() for _, y in DataLoader(plain, batch_size=3, shuffle=True, num_workers=0)]
    assert [labels for _, labels in first] == expected
    assert ds.cache.origin_reads == len(ds)  # once each: the prefetcher and reads share fetches
    disk = ds.cache.tiers[0]
    objects = [k for k in disk.keys() if not is_listing_key(k)]  # noqa: SIM118 (and the listing)
    assert sorted(objects) == sorted(_key(Path(p), Transcode(128).tag) for p, _ in ds.samples)
    for _ in loader:  # the second epoch: everything from the transcoded entries
        pass
    assert ds.cache.origin_reads == len(ds)


def test_worker_processes_read_the_transcoded_entries(big_root, tmp_path):
    spec = {"disk": tmp_path / "c", "transcode": {"max_side": 128}, "prefetch": False}
    ds = ImageFolder(big_root, size=32, cache=spec)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert sum(len(y) for _, y in batches) == len(ds)
    keys = {k for k in open_cache(tmp_path / "c").tiers[0].keys() if not is_listing_key(k)}  # noqa: SIM118
    assert keys == {_key(Path(p), Transcode(128).tag) for p, _ in ds.samples}


@pytest.fixture
def with_corrupt(big_root) -> tuple[Path, list[Path]]:
    bad = [big_root / "c0" / "garbage.jpg", big_root / "c1" / "truncated.jpg"]
    bad[0].write_bytes(b"this is not an image at all" * 100)
    _jpeg(bad[1], BIG, 9)
    bad[1].write_bytes(bad[1].read_bytes()[:2000])
    return big_root, bad


def test_a_corrupt_image_fails_as_without_transcoding(with_corrupt, tmp_path):
    root, bad = with_corrupt
    ds = ImageFolder(root, size=32, cache={"disk": tmp_path / "c", "transcode": {"max_side": 128}})
    plain = ImageFolder(root, size=32)
    for path in bad:
        index = [p for p, _ in ds.samples].index(str(path))
        with pytest.raises(CorruptSampleError) as got:
            ds[index]
        with pytest.raises(CorruptSampleError) as expected:
            plain[index]
        assert str(got.value) == str(expected.value) and got.value.path == str(path)
        assert str(path) in str(got.value)
        # nothing cached for it, under either key; asking to cache it says why
        disk = ds.cache.tiers[0]
        assert not disk.contains(_key(path, Transcode(128).tag)) and not disk.contains(_key(path))
        with pytest.raises(CacheError, match="not a decodable image"):
            ds.cache.ensure(ds.storage.fs, str(path), ds.storage.versions[str(path)])


def test_a_corrupt_image_is_skipped_under_on_error_skip(with_corrupt, tmp_path):
    root, bad = with_corrupt
    ds = ImageFolder(root, size=32, on_error="skip",
                     cache={"disk": tmp_path / "c", "transcode": {"max_side": 128}})
    data = DataLoader(ds, batch_size=4, num_workers=0)
    labels = [label for _, y in data for label in y.tolist()]
    assert len(labels) == len(ds) - len(bad)
    assert sorted(s.path for s in data.skipped) == sorted(str(p) for p in bad)


# -- fastload cache warm --transcode ------------------------------------------------------------


def _fastload(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastload", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_warm_transcode_fills_what_a_loader_reads(big_root, tmp_path):
    cache = str(tmp_path / "c")
    done = _fastload("cache", "warm", str(big_root), "--cache", cache, "--transcode", "128",
                     "--quality", "85", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["fetched"] == report["files"] == IMAGES + 1 and report["failed"] == []
    ds = ImageFolder(big_root, size=64, cache={"disk": cache, "transcode": {"max_side": 128, "quality": 85}})
    assert len(list(DataLoader(ds, batch_size=4, num_workers=0))) == 2
    assert ds.cache.origin_reads == 0
    stats = ds.cache.tiers[0].stats
    assert stats.misses == 0 and stats.hits == len(ds)
    again = _fastload("cache", "warm", str(big_root), "--cache", cache, "--transcode", "128",
                      "--quality", "85", "--json")
    assert json.loads(again.stdout)["skipped"] == IMAGES + 1


def test_cli_warm_transcode_names_a_corrupt_image_and_exits_1(with_corrupt, tmp_path):
    root, bad = with_corrupt
    done = _fastload("cache", "warm", str(root), "--cache", str(tmp_path / "c"), "--transcode", "128")
    assert done.returncode == 1
    for path in bad:
        assert f"FAILED {path}" in done.stdout and "not a decodable image" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--transcode", "0"], "max_side must be a whole number of pixels >= 1"),
    (["--transcode", "256", "--quality", "100"], "quality must be a JPEG quality from 1 to 95"),
    (["--quality", "80"], "--quality applies to --transcode"),
    (["--transcode", "big"], "'big' is not a valid integer"),
])
def test_cli_bad_transcode_values_exit_2(big_root, tmp_path, args, message):
    done = _fastload("cache", "warm", str(big_root), "--cache", str(tmp_path / "c"), *args)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "c").exists()  # nothing was created


def test_warm_refuses_a_transcode_spec_without_its_derivation(big_root, tmp_path):
    with pytest.raises(ConfigError, match="derive=Transcode"):
        warm(str(big_root), {"disk": tmp_path / "c", "transcode": {"max_side": 64}})


def test_the_cache_command_does_not_import_pillow_or_torch(tmp_path):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "fastload", "cache", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and "PIL" not in imported and "fastload.data.transcode" not in imported


# -- the meter ----------------------------------------------------------------------------------


def test_the_meter_suggests_the_transcoded_tier_when_decoding_outgrows_the_cores():
    decode_bound = dict(
        share=0.8, wait_s=0.080, step_s=0.100, copy_s=None,
        work=WorkerWork(fetch_s=0.001, decode_s=0.400, collate_s=0.001), num_workers=8, cores=8,
    )
    for gpus in (0, 1):
        fix = diagnose(**decode_bound, gpus=gpus).fix
        assert '"transcode": {"max_side": 256}' in fix and "changes pixels" in fix
        assert "--transcode" in fix
    within_cores = dict(decode_bound, num_workers=2, cores=64)
    assert "transcode" not in diagnose(**within_cores, gpus=0).fix  # more workers fix that
    fetch_bound = dict(decode_bound, work=WorkerWork(fetch_s=0.400, decode_s=0.010, collate_s=0.001))
    assert "transcode" not in diagnose(**fetch_bound, gpus=0).fix
