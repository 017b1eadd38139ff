"""Per-sample failures: skipped and counted under on_error="skip", raised with index and path
under on_error="raise", the same with 0 and 2 real worker processes."""

from __future__ import annotations

import json
import os
import struct
import threading
import traceback
import zlib
from pathlib import Path

import psutil
import pytest
import torch

import fastload
from fastload import DataLoader, ImageFolder
from fastload.engines.probe import PROBE_BATCHES
from fastload.engines.threads import AHEAD
from fastload.engines.trial_torch import TRIAL_PREFETCH
from fastload.settings import MAX_WORKERS_WITHOUT_GPU
from fastload.testing.synthetic import make_jpeg_folder
from tests.fixtures.privileges import run_unprivileged

BAD = 3  # the index of the broken sample in every case
IMAGES = 8


def png_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A valid PNG header claiming width x height pixels: Pillow refuses it on open."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def break_file(path: Path, how: str) -> None:
    if how == "corrupt":
        path.write_bytes(b"this is not an image at all")
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif how == "zero_byte":
        path.write_bytes(b"")
    elif how == "bomb":
        path.write_bytes(png_bomb())
    elif how == "missing":
        path.unlink()
    elif how == "eloop":
        path.unlink()
        path.symlink_to(path.name)  # a link to itself: open() fails with ELOOP
    elif how == "denied":
        path.chmod(0o000)
    else:
        raise AssertionError(how)


EXPECTED = {
    "corrupt": fastload.CorruptSampleError,
    "truncated": fastload.CorruptSampleError,
    "zero_byte": fastload.CorruptSampleError,
    "bomb": fastload.CorruptSampleError,
    "missing": fastload.errors.MissingSampleError,
    "eloop": fastload.errors.UnreadableSampleError,
}


@pytest.fixture
def broken(tmp_path, request):
    """(samples, path of sample BAD, how): the (path, label) list of a whole folder, then
    one file broken, as when a file breaks between the listing and the read."""
    root = make_jpeg_folder(tmp_path / "data", images=IMAGES, classes=1, size=(48, 40))
    samples = list(ImageFolder(root).samples)  # a list of pairs (samples is a view)
    path = Path(samples[BAD][0])
    break_file(path, request.param)
    return samples, str(path), request.param


def loader(samples, on_error: str, workers: int) -> DataLoader:
    ds = ImageFolder(samples, size=16, on_error=on_error)
    return DataLoader(ds, batch_size=2, num_workers=workers, persistent_workers=False)


def outcome(samples, workers: int) -> tuple[type, int | None, str | None, str]:
    with pytest.raises(fastload.SampleError) as info:
        for _ in loader(samples, "raise", workers):
            pass
    exc = info.value
    return type(exc), exc.index, exc.path, str(exc)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broken", list(EXPECTED), indirect=True)
def test_raise_gives_the_same_error_with_and_without_workers(broken):
    samples, path, how = broken
    without = outcome(samples, 0)
    assert without[0] is EXPECTED[how]
    assert without[1] == BAD and without[2] == path
    assert path in without[3] and f"index {BAD}" in without[3] and "on_error='skip'" in without[3]
    assert outcome(samples, 2) == without


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("broken", list(EXPECTED), indirect=True)
def test_skip_counts_the_sample_and_finishes_the_epoch(broken, workers):
    samples, path, _ = broken
    data = loader(samples, "skip", workers)
    labels = [label for _, batch in data for label in batch.tolist()]
    assert len(labels) == IMAGES - 1
    assert [(s.index, s.path) for s in data.skipped] == [(BAD, path)]
    assert path in data.skipped[0].reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broken", ["missing", "eloop"], indirect=True)
def test_unreadable_samples_stay_storage_errors_with_the_cause(broken):
    samples, path, how = broken
    with pytest.raises(fastload.StorageError) as info:
        ImageFolder(samples, size=16)[BAD]
    assert isinstance(info.value, fastload.SampleError) and info.value.index == BAD
    assert isinstance(info.value.__cause__, OSError)
    if how == "missing":
        assert isinstance(info.value, fastload.ObjectNotFoundError)
        assert isinstance(info.value, FileNotFoundError)
    else:
        assert "symbolic link that loops" in str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broken", ["corrupt"], indirect=True)
def test_worker_error_keeps_its_cause_and_the_worker_traceback(broken):
    samples, path, _ = broken
    with pytest.raises(fastload.CorruptSampleError) as info:
        list(loader(samples, "raise", 2))
    exc = info.value
    assert exc.__cause__ is not None and type(exc.__cause__).__name__ == "UnidentifiedImageError"
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert "DataLoader worker process" in notes and "in load" in notes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broken", ["corrupt"], indirect=True)
def test_paths_without_envelopes_still_name_file_and_index(broken):
    samples, path, _ = broken
    ds = ImageFolder(samples, size=16)
    # one sample at a time (batch_size=None) through fastload's loader
    with pytest.raises(fastload.CorruptSampleError, match=f"index {BAD}") as info:
        list(DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=False))
    assert path in str(info.value)
    assert (info.value.index, info.value.path) == (BAD, path)  # intact across the workers
    # a stock torch loader: the error is raised inside the worker, torch keeps type and text
    with pytest.raises(fastload.CorruptSampleError, match=f"index {BAD}") as info:
        list(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2))
    assert path in str(info.value)
    # torch's iterator stays usable after a worker's error, so its workers live as long as
    # the traceback's frames hold it, and freed by the cycle collector it takes 5 s a worker
    # to shut down (TorchEngine.abandon says why): let it go now
    traceback.clear_frames(info.tb)


_DENIED_SCRIPT = """
import json, sys
import fastload
from fastload import DataLoader, ImageFolder
samples, out = [tuple(s) for s in json.loads(sys.argv[1])], {}
for workers in (0, 2):
    try:
        for _ in DataLoader(ImageFolder(samples, size=16), batch_size=2, num_workers=workers,
                            persistent_workers=False):
            pass
        out[f"raise{workers}"] = None
    except fastload.SampleError as exc:
        out[f"raise{workers}"] = [type(exc).__name__, exc.index, exc.path, str(exc),
                                  isinstance(exc, fastload.StorageError),
                                  type(exc.__cause__).__name__]
    data = DataLoader(ImageFolder(samples, size=16, on_error="skip"), batch_size=2,
                      num_workers=workers, persistent_workers=False)
    n = sum(len(labels) for _, labels in data)
    out[f"skip{workers}"] = [n, [[s.index, s.path] for s in data.skipped]]
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("broken", ["denied"], indirect=True)
def test_permission_denied_sample(broken, unprivileged):
    samples, path, _ = broken
    try:
        result = run_unprivileged(_DENIED_SCRIPT, json.dumps(samples), timeout=100)
    finally:
        os.chmod(path, 0o644)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    name, index, got_path, message, is_storage, cause = out["raise0"]
    assert (name, index, got_path, is_storage) == ("UnreadableSampleError", BAD, path, True)
    assert cause == "StorageError"  # the storage's error; its own cause is the PermissionError
    assert "Permission denied" in message and path in message and f"index {BAD}" in message and "readable" in message
    assert out["raise2"] == out["raise0"]
    for workers in (0, 2):
        assert out[f"skip{workers}"] == [IMAGES - 1, [[BAD, path]]]



def children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def workers_alive(before: set[int]) -> set[int]:
    """The pids of this process's live children that were not in ``before``."""
    alive = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def raise_twice(data: DataLoader, path: str, before: set[int]) -> list[set[int]]:
    """Run two epochs that raise the error of ``path``; the live workers right after each,
    while its traceback (which holds the epoch's iterator) is still in hand."""
    alive = []
    for _ in range(2):
        with pytest.raises(fastload.CorruptSampleError) as info:
            for _ in data:
                pass
        assert info.value.path == path
        alive.append(workers_alive(before))
    return alive


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broken", ["corrupt"], indirect=True)
def test_an_epoch_that_raised_stops_its_workers_at_once(broken):
    samples, path, _ = broken
    before = children()
    assert raise_twice(loader(samples, "raise", 2), path, before) == [set(), set()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broken", ["corrupt"], indirect=True)
def test_persistent_workers_outlive_an_epoch_that_raised(broken):
    samples, path, _ = broken
    data = DataLoader(ImageFolder(samples, size=16), batch_size=2, num_workers=2, persistent_workers=True)
    before = children()
    first, second = raise_twice(data, path, before)
    assert len(first) == 2 and second == first  # the next epoch ran on the same workers
    data.engine.close()
    assert workers_alive(before) == set()


@pytest.mark.timeout(90)
def test_a_first_epoch_measuring_engines_stops_them_when_it_raises(tmp_path, monkeypatch):
    # backend="auto" times the threaded engine on the first batches, then torch workers: the
    # broken sample falls in torch's share, so the error comes while its workers run (each
    # candidate fed its quota only: no second-long window, NOTE [a second of each]); enough
    # images for every candidate's share with as many workers as fastload may choose (torch
    # gets its queue and PROBE_BATCHES rounds of one batch per worker; DALI's share is < 48)
    images = (AHEAD + 1 + PROBE_BATCHES + (TRIAL_PREFETCH + PROBE_BATCHES) * MAX_WORKERS_WITHOUT_GPU
              + 48)
    root = make_jpeg_folder(tmp_path / "data", images=images, classes=1, size=(48, 40))
    samples = list(ImageFolder(root).samples)
    bad = PROBE_BATCHES + AHEAD + 1 + 2
    break_file(Path(samples[bad][0]), "corrupt")
    monkeypatch.setattr(fastload.engines.probe, "PROBE_SECONDS", 0.0)
    data = DataLoader(ImageFolder(samples, size=16), batch_size=1, backend="auto")
    assert data.num_workers >= 1  # the torch candidate runs worker processes
    before = children()
    assert raise_twice(data, samples[bad][0], before) == [set(), set()]
    assert [m.name for m in data.engine.measures[:2]] == ["threads", "torch"]
    assert not [t for t in threading.enumerate() if t.name.startswith("fastload")]
