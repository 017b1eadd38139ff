"""The meter's fix when fetching holds the loop up (NOTE [the source's own fix]): the dataset
says what to change, naming its own URL and cache; the diagnosis asks for more workers only
where more would do and an engine reads with workers at all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.data import TensorDataset

from fastload import DataLoader, ImageFolder, TarShards
from fastload.errors import ConfigError
from fastload.meter import WorkerWork, diagnose
from fastload.meter.diagnosis import most_workers
from tests.fixtures.s3 import upload_folder
from tests.test_shards import write_shards

pytestmark = pytest.mark.timeout(300)

BUCKET = "fastload-meterfix"

# A bare loop over a remote folder without a cache, as measured on moto + 15 ms (2 cores, the
# threads engine): 3,761 ms of reads and 394 ms of decoding a batch, 1.1 ms of loop.
BARE = {"share": 0.997, "wait_s": 0.3468, "step_s": 0.3479, "copy_s": None,
        "work": WorkerWork(fetch_s=3.761, decode_s=0.394, collate_s=0.0004), "cores": 2, "gpus": 0}


def test_a_loop_no_number_of_workers_keeps_up_with_is_not_told_to_raise_them():
    d = diagnose(**BARE, num_workers=2)
    assert d.bottleneck == "storage fetch"
    assert "3778 worker(s) keep up" in d.evidence  # ceil(4.1554 s / 1.1 ms): the number stands
    assert "raise num_workers" not in d.fix
    assert "More workers are no fix here: keeping up with this loop would take 3778" in d.fix


def test_a_fetch_bound_loop_within_reach_is_told_the_workers_it_needs():
    d = diagnose(share=0.3, wait_s=0.010, step_s=0.030, copy_s=None,
                 work=WorkerWork(fetch_s=0.090, decode_s=0.010, collate_s=0.001),
                 num_workers=2, cores=16, gpus=1)
    assert d.fix.endswith("or raise num_workers to 6 (fetching waits on storage, not cores)")
    assert most_workers(2) == 32 and most_workers(16) == 64


def test_the_datasets_own_fix_replaces_the_general_one():
    own = "ImageFolder reads each image of s3://b/train with a request of its own"
    d = diagnose(**BARE, num_workers=2, fetch_fix=own, engine="torch")
    assert d.fix.startswith(own + ". More workers are no fix here")
    assert "enable the cache" not in d.fix


def test_an_in_process_engine_is_not_told_to_raise_num_workers():
    # 6 workers would do for torch workers; the threads engine reads with threads of its own.
    numbers = {"share": 0.3, "wait_s": 0.010, "step_s": 0.030, "copy_s": None,
               "work": WorkerWork(fetch_s=0.090, decode_s=0.010, collate_s=0.001),
               "num_workers": 2, "cores": 16, "gpus": 0, "fetch_fix": "pass cache=DIR"}
    torch_workers = diagnose(**numbers, engine="torch")
    threads = diagnose(**numbers, engine="threads")
    assert "raise num_workers to 6" in torch_workers.fix
    assert threads.fix == "pass cache=DIR"
    assert threads.evidence.startswith("the threads engine's threads spend 101.0 ms per batch")


# -- what each dataset says ---------------------------------------------------------------


@pytest.fixture(scope="module")
def local_shards(jpeg_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("meterfix")
    write_shards(jpeg_root, out)
    return sorted(str(p) for p in out.glob("*.tar"))


@pytest.fixture(scope="module")
def remote_folder(s3_options, jpeg_root: Path) -> str:
    return upload_folder(s3_options, jpeg_root, f"s3://{BUCKET}/train")


@pytest.fixture(scope="module")
def remote_shards(s3_options, local_shards: list[str]) -> list[str]:
    root = upload_folder(s3_options, Path(local_shards[0]).parent, f"s3://{BUCKET}/shards")
    return [f"{root}/{Path(p).name}" for p in local_shards]


def test_a_remote_folder_without_a_cache_names_its_url_the_cache_and_pack(remote_folder, s3_options):
    fix = ImageFolder(remote_folder, storage_options=s3_options).fetch_fix()
    assert fix.startswith(f"ImageFolder reads each image of {remote_folder} with a request of its own")
    assert "cache='~/.cache/fastload'" in fix
    assert f"`fastload pack {remote_folder} DST`" in fix and "fastload.TarShards" in fix


def test_a_remote_folder_with_a_cache_says_to_warm_it(remote_folder, s3_options, tmp_path):
    cache = str(tmp_path / "cache")
    fix = ImageFolder(remote_folder, storage_options=s3_options, cache=cache).fetch_fix()
    assert f"its cache at {cache} did not hold them yet" in fix
    assert f"`fastload cache warm {remote_folder} --cache {cache}`" in fix
    assert f"`fastload cache stats {cache}`" in fix
    stats = re.search(r"`(fastload cache stats [^`]+)`", fix).group(1).split()  # runs as given
    script = str(Path(sys.executable).parent / "fastload")
    assert subprocess.run([script, *stats[1:]], capture_output=True, timeout=60).returncode == 0
    memory_only = ImageFolder(remote_folder, storage_options=s3_options, cache={"memory": "64MB"})
    assert "its cache has no disk tier" in memory_only.fetch_fix()


def test_a_local_folder_says_its_disk_is_the_slow_part(jpeg_root: Path):
    fix = ImageFolder(str(jpeg_root)).fetch_fix()
    assert fix.startswith(f"ImageFolder reads each image of {jpeg_root} from local files")
    assert "a network mount, or a cold disk" in fix


def test_shards_say_whether_they_read_ranges_download_or_sit_on_a_slow_disk(
    local_shards, remote_shards, s3_options, tmp_path
):
    n = len(remote_shards)
    ranges = TarShards(remote_shards, storage_options=s3_options).fetch_fix()
    assert ranges.startswith(f"TarShards reads {remote_shards[0]} and its other {n - 1} files "
                             "range by range and keeps nothing")
    assert f"`fastload cache warm s3://{BUCKET}/shards --cache DIR`" in ranges
    cache = str(tmp_path / "cache")
    store = TarShards(remote_shards, storage_options=s3_options, cache=cache).fetch_fix()
    assert f"whole into the shard store at {cache}" in store
    assert f"`fastload bench s3://{BUCKET}/shards`" in store and "shard_budget=" in store
    assert "the slow part" in TarShards(local_shards).fetch_fix()


# -- the loader hands it to its meter -----------------------------------------------------


@pytest.mark.parametrize("backend", ["threads", "torch"])
def test_the_loader_gives_its_meter_the_datasets_fix_and_its_engine(jpeg_root: Path, backend):
    ds = ImageFolder(str(jpeg_root), size=32)
    loader = DataLoader(ds, batch_size=8, backend=backend, num_workers=2 if backend == "torch" else 1)
    assert loader.meter.fetch_fix == ds.fetch_fix()
    for _ in loader:
        pass
    summary = loader.meter.summary()
    assert summary.engine == backend == loader.meter.engine_of()
    in_process = "  workers     none: the threads engine makes batches in the loop's process"
    assert (in_process in str(summary)) == (backend == "threads")


def test_a_dataset_of_ones_own_gets_the_general_fix():
    import torch

    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4)
    assert loader.meter.fetch_fix is None
    assert loader.meter.engine_of() == "torch"


def test_a_decode_bound_shard_dataset_is_told_to_pack_smaller_not_to_transcode_its_cache(
    local_shards, tmp_path
):
    numbers = {"share": 0.9, "wait_s": 0.045, "step_s": 0.050, "copy_s": None,
               "work": WorkerWork(fetch_s=0.004, decode_s=0.400, collate_s=0.0), "num_workers": 2,
               "cores": 2, "gpus": 0, "engine": "threads"}
    shards = TarShards(local_shards, size=32)
    d = diagnose(**numbers, smaller_fix=shards.smaller_fix())
    assert d.bottleneck == "decode/transform"
    assert "to decode fewer pixels, pack the original images again" in d.fix
    assert "`fastload pack SRC DST --transcode 256`" in d.fix and "transcoded cache tier does not" in d.fix
    assert "opt in to the transcoded cache tier" in diagnose(**numbers).fix  # a folder's way
    loader = DataLoader(shards, batch_size=8, backend="threads")
    assert loader.meter.smaller_fix == shards.smaller_fix()

    with pytest.raises(ConfigError, match=r"TarShards\(cache=\{\.\.\., 'transcode': \.\.\.\}\): "
                       r"the transcoded tier .* would do nothing.*fastload pack SRC DST --transcode"):
        TarShards(local_shards, cache={"disk": str(tmp_path / "c"), "transcode": {"max_side": 64}})
