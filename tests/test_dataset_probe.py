"""The dataset probe: undeclared map-style datasets get workers only when a probe of a copy
shows they are safe and worth it (NOTE [the dataset probe], NOTE [workers from measurements]).

No timing assertions: datasets that sleep have a wall time that is at least their sleep,
and tiny ones are far below any threshold, whatever the machine is doing.
"""

from __future__ import annotations

import pickle
import random
import re
import socket
import sqlite3
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter
from torch.utils.data import Dataset, IterableDataset, Subset, TensorDataset

import fastload
from fastload.machine import Machine
from fastload.settings import resolve_settings, retune
from fastload.tuning import (
    DatasetProbe,
    choose_workers,
    probe_dataset,
    retune_workers,
    start_method,
)
from fastload.tuning.probe import MAX_SAMPLES
from fastload.tuning.workers import MIN_SAMPLE_S, WAIT_CAP

CPU2 = Machine(cpu_cores=2, gpus=0)
NUMBERS = re.compile(r"\d+(\.\d+)? (ms|µs) CPU and \d+(\.\d+)? (ms|µs) wall per sample")


class Sleepy(Dataset):
    """Waits ``sleep_s`` per sample and returns a small tensor that depends only on the index."""

    def __init__(self, n: int = 200, sleep_s: float = 0.01) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return torch.full((3,), float(i))


class Tiny(Dataset):
    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


class GlobalRandom(Dataset):
    """Draws from torch's, numpy's and Python's global generators."""

    def __init__(self, n: int = 40, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.rand(2) + float(np.random.rand()) + random.random() + i


class Counting(Sleepy):
    """Counts its fetches: it mutates itself."""

    def __init__(self) -> None:
        super().__init__(n=200, sleep_s=0.005)
        self.count = 0

    def __getitem__(self, i: int) -> torch.Tensor:
        self.count += 1
        return super().__getitem__(i)


class ClassCounting(Sleepy):
    calls = 0

    def __getitem__(self, i: int) -> torch.Tensor:
        type(self).calls += 1
        return super().__getitem__(i)


class WithLambda(Sleepy):
    def __init__(self) -> None:
        super().__init__(n=200, sleep_s=0.005)
        self.transform = lambda x: x * 2

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(super().__getitem__(i))


class Raises(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        raise KeyError(f"no sample {i}")


class ReadsWorkerInfo(Sleepy):
    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        return super().__getitem__(i) + (info.id if info else -1)


class WithEpoch(Sleepy):
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class Holding(Sleepy):
    def __init__(self, handle) -> None:
        super().__init__(n=200, sleep_s=0.005)
        self.handle = handle


class OnCuda(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i], device="cuda")


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


class DeclaredUnsafe(Sleepy):
    fastload_worker_safe = False


def settings(dataset, **kwargs):
    kwargs.setdefault("machine", CPU2)
    return resolve_settings(dataset, warn=False, **kwargs)


class Jpegs(Dataset):
    """A user's own Pillow dataset: decode, crop, resize to 224, blur (a few ms of CPU: far
    above what repays a worker on any machine), to a float tensor. Each file
    counts ``repeats`` times, so that an epoch lasts far longer than workers take to start
    whatever the machine's speed (a short one stays in-process, NOTE [workers from
    measurements])."""

    def __init__(self, root, repeats: int = 20) -> None:
        self.files = sorted(str(p) for p in root.rglob("*.jpg"))
        self.repeats = repeats

    def __len__(self) -> int:
        return len(self.files) * self.repeats

    def __getitem__(self, i: int) -> torch.Tensor:
        with Image.open(self.files[i % len(self.files)]) as im:
            im = im.convert("RGB").crop((10, 10, 330, 330)).resize((224, 224), Image.BILINEAR)
            im = im.filter(ImageFilter.GaussianBlur(4))
            return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div(255)


# -- what the probe sees ------------------------------------------------------------------

def test_cpu_bound_jpeg_dataset_gets_about_one_worker_per_core(tmp_path):
    from fastload.testing.synthetic import make_jpeg_folder

    make_jpeg_folder(tmp_path, images=96, classes=2)
    s = settings(Jpegs(tmp_path), batch_size=16)
    probe = s.probe
    assert probe is not None and probe.usable and probe.copied == "pickles"
    assert probe.sample_bytes > 3 * 224 * 224 * 4  # float32 image, pickled
    n = s.num_workers.value
    if probe.waits:  # a busy machine can make decoding look like waiting; still bounded
        assert 2 <= n <= WAIT_CAP * 2
    else:
        assert n == 2 and "CPU-bound" in s.num_workers.reason
    assert NUMBERS.search(s.num_workers.reason)
    assert s.persistent_workers.value is True
    assert s.prefetch_factor.value is not None


def test_waiting_dataset_gets_more_workers_than_cores_bounded():
    s = settings(Sleepy(n=200, sleep_s=0.01), batch_size=32)
    n = s.num_workers.value
    assert 2 < n <= WAIT_CAP * 2
    assert s.probe.waits and s.probe.wall_s >= 0.01
    assert "waits on I/O" in s.num_workers.reason and "MB per worker" in s.num_workers.reason
    assert NUMBERS.search(s.num_workers.reason)
    assert s.probe.samples <= MAX_SAMPLES


def test_tensor_dataset_and_tiny_datasets_stay_in_process():
    s = settings(TensorDataset(torch.zeros(100, 3)))
    assert s.num_workers.value == 0 and s.probe is None and "in memory" in s.num_workers.reason
    s = settings(Tiny())
    assert s.num_workers.value == 0 and s.probe is not None and s.probe.usable
    assert s.num_workers.reason.startswith("in-process:") and "repays a worker" in s.num_workers.reason
    assert NUMBERS.search(s.num_workers.reason)
    assert s.prefetch_factor.value is None and s.persistent_workers.value is False


def test_short_epoch_stays_in_process():
    s = settings(Sleepy(n=8, sleep_s=0.002))
    assert s.num_workers.value == 0 and "an epoch" in s.num_workers.reason


def test_global_rng_is_detected_and_the_users_stream_is_untouched():
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    before = torch.get_rng_state(), np.random.get_state(), random.getstate()
    loader = fastload.DataLoader(GlobalRandom(), batch_size=4)
    assert torch.equal(torch.get_rng_state(), before[0])
    np_now = np.random.get_state()
    assert (np_now[1] == before[1][1]).all() and np_now[2:] == before[1][2:]
    assert random.getstate() == before[2]
    assert loader.settings.probe.rng == ("torch", "numpy", "random")
    assert "draws from the main process's torch/numpy/random RNG" in loader.settings.num_workers.reason


def test_global_rng_dataset_gets_one_worker_per_core_seeded_like_torch():
    s = settings(GlobalRandom(n=400, sleep_s=0.003), batch_size=4)
    assert s.num_workers.value == 2
    assert "global RNG" in s.num_workers.reason and "seeded by torch" in s.num_workers.reason
    assert s.persistent_workers.value is False  # fresh workers each epoch, as torch's


@pytest.mark.parametrize("dataset, words", [
    (Counting(), "mutates the dataset (.count: 0 -> "),
    (ClassCounting(), "class attribute ClassCounting.calls changed"),
    (Raises(), "raised KeyError"),
    (ReadsWorkerInfo(), "get_worker_info"),
])
def test_unsafe_datasets_stay_in_process_with_the_reason(dataset, words):
    s = settings(dataset)
    assert s.num_workers.value == 0
    assert words in s.num_workers.reason
    assert s.persistent_workers.value is False


def test_the_users_dataset_is_untouched_by_the_probe():
    counting, classy = Counting(), ClassCounting()
    settings(counting)
    settings(classy)
    assert counting.count == 0
    assert ClassCounting.calls == 0  # the probe's copy shares the class: put back


def test_unpicklable_dataset_under_spawn_stays_in_process_but_fork_probes_a_deep_copy():
    s = settings(WithLambda(), multiprocessing_context="spawn")
    assert s.num_workers.value == 0
    assert "does not pickle" in s.num_workers.reason and "spawn" in s.num_workers.reason
    ctx = torch.multiprocessing.get_context("fork")
    s = settings(WithLambda(), multiprocessing_context=ctx)
    assert s.probe.copied.startswith("does not pickle, probed on a deep copy")
    assert s.num_workers.value >= 2


def test_fork_hazards_stay_in_process():
    conn = sqlite3.connect(":memory:")
    sock = socket.socket()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        for handle, words in ((conn, "sqlite3 connection"), (sock, "open socket"), (thread, "running thread")):
            s = settings(Holding(handle), multiprocessing_context="fork")
            assert s.num_workers.value == 0, words
            assert words in s.num_workers.reason and "at dataset.handle" in s.num_workers.reason
            assert s.probe.samples == 0  # not fetched at all
    finally:
        stop.set()
        sock.close()
        conn.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_samples_stay_in_process():
    s = settings(OnCuda())
    assert s.num_workers.value == 0 and "cuda tensor" in s.num_workers.reason


def test_cuda_tensor_in_a_sample_is_a_problem_without_cuda():
    # The sample walker on a tensor that is not on the CPU ("meta" stands in for "cuda").
    from fastload.tuning.probe import _Fetched, _sample_problem

    out = _Fetched((set(), []))
    assert "meta tensor" in _sample_problem({"x": [torch.empty(2, device="meta")]}, 0, out)
    assert _sample_problem({"x": [torch.empty(2)]}, 0, out) is None and list(out.blobs) == [0]


def test_opt_outs(monkeypatch):
    s = settings(Sleepy(), num_workers=1)
    assert s.probe is None and s.num_workers.source == "argument"
    assert settings(DeclaredUnsafe()).probe is None
    assert settings(DeclaredUnsafe()).num_workers.value == 0
    s = settings(Stream())
    assert s.probe is None and s.num_workers.value == 0
    monkeypatch.setenv("FASTLOAD_PROBE", "0")
    s = settings(Sleepy())
    assert s.probe is None and s.num_workers.value == 0 and "FASTLOAD_PROBE=0" in s.num_workers.reason
    assert s.pin_memory.value is False and s.persistent_workers.value is False
    monkeypatch.setenv("FASTLOAD_PROBE", "1")
    monkeypatch.setenv("FASTLOAD_NUM_WORKERS", "3")
    s = settings(Sleepy())
    assert s.probe is None and s.num_workers.value == 3


def test_set_epoch_keeps_workers_fresh_each_epoch():
    s = settings(WithEpoch())
    assert s.num_workers.value > 0 and s.persistent_workers.value is False
    assert "set_epoch" in s.persistent_workers.reason


def test_wrappers_are_probed_as_a_whole():
    s = settings(Subset(Counting(), list(range(100))))
    assert s.num_workers.value == 0 and "mutates" in s.num_workers.reason


def test_settings_table_shows_the_probe():
    text = str(settings(Sleepy(), batch_size=32))
    assert "probe: " in text and "pickles" in text and "no self-mutation" in text


def test_start_method():
    assert start_method("spawn") == "spawn"
    assert start_method(torch.multiprocessing.get_context("forkserver")) == "forkserver"
    assert start_method(None) in ("fork", "spawn", "forkserver")


# -- the batches: same as torch's --------------------------------------------------------

def test_index_only_dataset_gives_the_batches_of_torch_defaults():
    ds = Sleepy(n=96, sleep_s=0.003)
    torch.manual_seed(7)
    stock = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
    expected = [[b.tolist() for b in stock] for _ in range(2)]
    after_torch = torch.get_rng_state()
    torch.manual_seed(7)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True)
    assert loader.settings.num_workers.value > 0  # the comparison means something
    assert loader.settings.persistent_workers.value is True  # and draws like torch's iterator
    assert [[b.tolist() for b in loader] for _ in range(2)] == expected
    assert torch.equal(torch.get_rng_state(), after_torch)


def test_global_rng_dataset_gives_the_batches_of_torch_with_the_same_workers():
    ds = GlobalRandom(n=64, sleep_s=0.004)
    torch.manual_seed(3)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True)
    n = loader.settings.num_workers.value
    assert n > 0
    got = [[b.tolist() for b in loader] for _ in range(2)]
    torch.manual_seed(3)
    stock = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=n)
    expected = [[b.tolist() for b in stock] for _ in range(2)]
    assert got == expected


# -- the pure parts ----------------------------------------------------------------------

def probe_of(**kw) -> DatasetProbe:
    facts = {"context": "fork", "length": 10_000, "samples": 8, "cpu_s": 0.004, "wall_s": 0.0042,
             "sample_bytes": 600_000, "dataset_bytes": 10_000, "copied": "pickles"}
    facts.update(kw)
    return DatasetProbe(**facts)


def test_choose_workers_from_numbers():
    assert choose_workers(probe_of(), cores=8, batch_size=32).workers == 8
    waiting = probe_of(cpu_s=0.0002, wall_s=0.01, sample_bytes=100)
    assert choose_workers(waiting, cores=2, batch_size=32).workers == 8  # 4 per core
    assert choose_workers(waiting, cores=2, batch_size=2).workers == 2  # a batch every 20 ms
    cheap = probe_of(cpu_s=MIN_SAMPLE_S / 10, wall_s=MIN_SAMPLE_S / 10)
    assert choose_workers(cheap, cores=8).workers == 0
    short = probe_of(length=10)
    assert choose_workers(short, cores=8).workers == 0
    spawned = probe_of(context="spawn", length=100)  # 0.42 s an epoch < 3 spawn start-ups
    assert choose_workers(spawned, cores=8).workers == 0


def test_memory_caps_workers():
    choice = choose_workers(probe_of(dataset_bytes=1 << 30), cores=8, available_bytes=4 << 30)
    assert choice.workers == 1 and "capped by memory" in choice.reason
    assert choice.per_worker_bytes > 1 << 30


def test_unusable_probe_gives_no_workers():
    choice = choose_workers(probe_of(mutation=".n: 0 -> 1"), cores=8)
    assert choice.workers == 0 and "mutates" in choice.reason


def test_retune_workers():
    assert retune_workers(2, input_bound=True, workers_busy=0.95, cores=8)[0] == 3
    assert retune_workers(4, input_bound=True, workers_busy=0.95, cores=8)[0] == 6
    assert retune_workers(8, input_bound=True, workers_busy=0.95, cores=8) is None  # no headroom
    assert retune_workers(4, input_bound=True, workers_busy=0.95, cores=8, cpu_busy=0.95) is None
    assert retune_workers(8, input_bound=False, workers_busy=0.1, cores=8)[0] == 2
    assert retune_workers(8, input_bound=False, workers_busy=0.5, cores=8) is None
    assert retune_workers(0, input_bound=True, workers_busy=1.0, cores=8) is None
    assert retune_workers(2, input_bound=True, workers_busy=None, cores=8) is None


def test_retune_settings():
    s = settings(Sleepy(), batch_size=32)
    limit = s.worker_limit
    assert limit >= s.num_workers.value
    down = retune(s, input_bound=False, workers_busy=0.05, cores=2)
    assert down is not None and down.value < s.num_workers.value and down.source == "auto"
    assert retune(settings(Sleepy(), num_workers=2), input_bound=False, workers_busy=0.05, cores=2) is None
    rng = settings(GlobalRandom(n=400, sleep_s=0.003))
    assert retune(rng, input_bound=True, workers_busy=0.99, cores=8) is None
    declared = resolve_settings(DeclaredSafe(), machine=Machine(cpu_cores=8, gpus=0), warn=False)
    assert retune(declared, input_bound=False, workers_busy=0.1, cores=8).value == 2


class DeclaredSafe(Tiny):
    fastload_worker_safe = True


def test_probe_dataset_direct():
    p = probe_dataset(Tiny(), context="spawn")
    assert p.usable and p.samples == MAX_SAMPLES and p.copied == "pickles" and p.dataset_bytes > 0
    assert p.rng == () and p.mutation is None
    assert "no main-process RNG" in p.summary()


class RaisingGetattr(Tiny):
    def __getattr__(self, name):
        raise RuntimeError(f"no {name}")


def test_odd_datasets_do_not_break_the_loader():
    for ds in ([1, 2, 3], range(10), {"a": 1}, RaisingGetattr()):
        s = settings(ds)
        assert s.num_workers.value == 0, ds
    assert "raised KeyError" in settings({"a": 1}).num_workers.reason
    big = TensorHolder()
    assert "not copied" in settings(big).num_workers.reason


class TensorHolder(Tiny):
    def __init__(self) -> None:
        self.x = torch.zeros(100 << 20, dtype=torch.uint8)


def test_a_class_attribute_that_cannot_be_put_back_is_reported_as_such():
    from fastload.tuning.state import class_state, restore_classes

    class Frozen(type):
        def __setattr__(cls, name, value):
            raise AttributeError(f"{cls.__name__} is frozen")

    class Counted(metaclass=Frozen):
        calls = 0

    obj = Counted()
    before = class_state(obj)
    type.__setattr__(Counted, "calls", 1)  # what a fetch did, around the metaclass
    said = restore_classes(before)
    assert said is not None and "Counted.calls" in said and "could not be restored" in said
    assert Counted.calls == 1


# -- the probe's samples, reused in the first epoch (NOTE [probe samples reused]) ----------

class Logged(Dataset):
    """Index-only samples; every fetch appends its index to a file, which a copy shares."""

    def __init__(self, path, n: int, sleep_s: float = 0.0) -> None:
        self.path, self.n, self.sleep_s = str(path), n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.full((2,), float(i))


def fetches(path) -> dict[int, int]:
    counts: dict[int, int] = {}
    if path.exists():
        for line in path.read_text().split():
            counts[int(line)] = counts.get(int(line), 0) + 1
    return counts


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [False, True], ids=["in-process", "workers"])
def test_probe_samples_are_served_once_in_the_first_epoch_with_torchs_batches(tmp_path, shuffle, workers):
    log = tmp_path / "fetches.log"
    # 3 ms waits x 96 samples repay fork workers; a cheap sample stays in-process.
    ds = Logged(log, n=96, sleep_s=0.003) if workers else Logged(log, n=40)
    torch.manual_seed(11)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=shuffle)
    assert (loader.settings.num_workers.value > 0) is workers
    kept = loader.settings.probe.kept
    assert kept is not None and kept.count == MAX_SAMPLES
    assert f"{MAX_SAMPLES} samples reused" in str(loader.settings)
    first = [b.tolist() for b in loader]
    # the probe fetched 0..7 from its copy; the epoch served them: once each in all
    assert fetches(log) == dict.fromkeys(range(ds.n), 1)
    assert kept.held == 0  # the main process dropped them
    second = [b.tolist() for b in loader]
    assert fetches(log) == dict.fromkeys(range(ds.n), 2)  # the second epoch fetches all
    torch.manual_seed(11)
    stock = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=shuffle)
    assert [[b.tolist() for b in stock] for _ in range(2)] == [first, second]


def test_probe_samples_reach_workers_without_the_meter(tmp_path):
    log = tmp_path / "fetches.log"
    loader = fastload.DataLoader(Logged(log, n=96, sleep_s=0.003), batch_size=8, meter=False)
    assert loader.num_workers > 0 and loader.worker_parts.worker_init_fn is not None
    assert [b[:, 0].tolist() for b in loader] == [[float(i) for i in range(j, j + 8)] for j in range(0, 96, 8)]
    assert fetches(log) == dict.fromkeys(range(96), 1)


def test_global_rng_samples_are_fetched_again(tmp_path):
    p = probe_dataset(GlobalRandom(), context="fork")
    assert p.kept is None and p.refetch == "it draws from the global RNG"
    assert p.summary().endswith("samples fetched again: it draws from the global RNG")
    mutating = probe_dataset(Counting(), context="fork")
    assert mutating.kept is None and "fetched again: it mutates itself" in mutating.summary()


class Offset(Logged):
    def __init__(self, path) -> None:
        super().__init__(path, n=24)
        self.offset = 0.0

    def __getitem__(self, i: int) -> torch.Tensor:
        return super().__getitem__(i) + self.offset


def test_a_dataset_changed_after_the_probe_is_fetched_again(tmp_path):
    ds = Offset(tmp_path / "fetches.log")
    loader = fastload.DataLoader(ds, batch_size=4)
    assert loader.settings.probe.kept.count == MAX_SAMPLES
    ds.offset = 100.0  # after the probe, before the first epoch
    first = torch.cat(list(loader))
    assert first[:, 0].tolist() == [i + 100.0 for i in range(24)]  # nothing stale
    assert "fetched again: the dataset changed after the probe" in loader.settings.probe.summary()
    assert fetches(tmp_path / "fetches.log")[0] == 2  # the probe's and the epoch's


class Views(Dataset):
    def __init__(self) -> None:
        self.data = torch.arange(64.0).reshape(32, 2)

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class Batched(Tiny):
    def __getitems__(self, indices):
        return [self[i] for i in indices]


class Warns(Tiny):
    def __getitem__(self, i: int) -> torch.Tensor:
        import warnings

        warnings.warn("deprecated field", DeprecationWarning, stacklevel=1)
        return super().__getitem__(i)


class Big(Tiny):
    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((300_000,), float(i))  # 1.2 MB each


def test_samples_that_are_not_a_pure_function_of_the_index_are_not_kept():
    views = probe_dataset(Views())
    assert views.kept is None and "view of the dataset's memory" in views.refetch
    held = probe_dataset([torch.tensor([i]) for i in range(20)])
    assert held.kept is None and "an object the dataset holds" in held.refetch
    assert probe_dataset(Batched()).refetch == "it fetches batches with __getitems__"
    assert probe_dataset(Subset(Tiny(), list(range(50)))).kept.count == MAX_SAMPLES
    assert "warn" in probe_dataset(Warns()).refetch
    assert "set_epoch" in probe_dataset(WithEpoch(n=20, sleep_s=0)).refetch
    big = probe_dataset(Big())
    assert big.kept is not None and big.kept.count == 3 and big.kept.nbytes <= 4 << 20
    assert "5 more over the 4 MB kept at most" in big.summary()


def test_kept_samples_travel_pickled_only_to_a_worker_being_started():
    from fastload.meter import measured_worker_init

    kept = probe_dataset(Tiny()).kept
    again = pickle.loads(pickle.dumps(kept))
    assert again.held == kept.held == MAX_SAMPLES and again.note == kept.note
    init = measured_worker_init(None, 2, False, samples=kept)
    assert init.samples is kept
    assert pickle.loads(pickle.dumps(init)).samples is None  # not being spawned: none
    kept.drop()
    assert measured_worker_init(None, 2, False, samples=kept) is None


def test_no_probe_no_reuse(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTLOAD_PROBE", "0")
    log = tmp_path / "fetches.log"
    loader = fastload.DataLoader(Logged(log, n=16), batch_size=4)
    assert loader.settings.probe is None
    list(loader)
    assert fetches(log) == dict.fromkeys(range(16), 1)


def test_kept_samples_follow_torchs_fetch_for_any_batch_of_indices(tmp_path):
    log = tmp_path / "fetches.log"
    ds = Logged(log, n=16)
    batches = [(0, 9), iter([1, 10]), [np.int64(2), 11], [3, 3, 4]]  # tuple, generator, numpy, repeat
    loader = fastload.DataLoader(ds, batch_sampler=batches)
    assert loader.settings.probe.kept.count == MAX_SAMPLES
    got = [b[:, 0].tolist() for b in loader]
    assert got == [[0.0, 9.0], [1.0, 10.0], [2.0, 11.0], [3.0, 3.0, 4.0]]
    counts = fetches(log)
    assert counts[0] == counts[4] == 1  # the probe's, served from it
    assert counts[1] == counts[2] == 2  # a generator and a numpy index: torch's fetch, as given
    assert counts[3] == 2  # served once, then fetched for its repeat
    unbatched = fastload.DataLoader(Logged(tmp_path / "single.log", n=12), batch_size=None)
    assert [int(x[0]) for x in unbatched] == list(range(12))
    assert fetches(tmp_path / "single.log") == dict.fromkeys(range(12), 1)


class Cheap(Dataset):
    """A sample costs well under a microsecond's worth of checking per batch to serve."""

    def __len__(self) -> int:
        return 200_000

    def __getitem__(self, i: int) -> int:
        return i


def test_in_process_reuse_only_where_it_pays():
    # 8 samples of ~1 us saved against 200,000 batches checked for them (~0.76 us each).
    loader = fastload.DataLoader(Cheap(), batch_size=1)
    assert loader.num_workers == 0 and loader.settings.probe.kept.held == 0
    assert "looking for them in every batch would cost more" in loader.settings.probe.summary()
    from fastload.tuning.reuse import KeptSamples

    kept = KeptSamples({0: pickle.dumps(0)}, fetch_s=0.010)
    assert kept.pays(1000, 32) and not kept.pays(100_000, 32)
