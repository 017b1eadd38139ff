"""The starvation meter: what it records, the verdict on known-cost loops, the exports."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.utils.data
from torch.utils.data import Dataset, TensorDataset

import fastload
from fastload import DataLoader, ImageFolder, StarvationMeter
from fastload.errors import ConfigError, MissingDependencyError
from fastload.meter import Verdict, WorkerWork, batch_length, diagnose, measure, verdict_for
from fastload.meter.cuda import ReadbackQueue
from fastload.meter.report import BOTTLENECKS
from fastload.settings import Machine


class Timed(Dataset):
    """A dataset whose every sample takes ``ms`` milliseconds to produce."""

    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.ms:
            time.sleep(self.ms / 1000)
        return torch.full((3,), float(i)), i


def run(loader, step_s: float = 0.0, passes: int = 1) -> list:
    out = []
    for _ in range(passes):
        for batch in loader:
            out.append(batch)
            if step_s:
                time.sleep(step_s)
    return out


# -- verdict and diagnosis from plain numbers ---------------------------------------------


def test_verdict_bands_are_the_tf_profiler_bands():
    assert verdict_for(0.20) is Verdict.HIGHLY
    assert verdict_for(0.9) is Verdict.HIGHLY
    assert verdict_for(0.199) is Verdict.MODERATELY
    assert verdict_for(0.05) is Verdict.MODERATELY
    assert verdict_for(0.049) is Verdict.NOT
    assert verdict_for(0.0) is Verdict.NOT


def test_decode_bound_within_the_cores_asks_for_the_computed_number_of_workers():
    # 120 ms of worker work per batch against a 20 ms loop: ceil(120 / 20) = 6 workers.
    d = diagnose(
        share=0.5, wait_s=0.020, step_s=0.040, copy_s=None,
        work=WorkerWork(fetch_s=0.005, decode_s=0.110, collate_s=0.005),
        num_workers=2, cores=16, gpus=0,
    )
    assert d.bottleneck == "decode/transform"
    assert d.fix == "raise num_workers to 6"
    assert "120.0 ms" in d.evidence and "20.0 ms" in d.evidence


def test_decode_bound_beyond_the_cores_uses_dali_on_a_gpu_and_all_cores_without():
    common = {
        "share": 0.8, "wait_s": 0.080, "step_s": 0.100, "copy_s": None,
        "work": WorkerWork(fetch_s=0.001, decode_s=0.400, collate_s=0.001), "num_workers": 4, "cores": 8,
    }
    assert 'backend="dali"' in diagnose(**common, gpus=1).fix
    no_gpu = diagnose(**common, gpus=0)
    assert no_gpu.bottleneck == "decode/transform"
    assert "raise num_workers to 8" in no_gpu.fix


def test_fetch_bound_asks_for_the_cache():
    d = diagnose(
        share=0.3, wait_s=0.010, step_s=0.030, copy_s=None,
        work=WorkerWork(fetch_s=0.090, decode_s=0.010, collate_s=0.001),
        num_workers=8, cores=16, gpus=1,
    )
    assert d.bottleneck == "storage fetch"
    assert "enable the cache" in d.fix


def test_copy_bound_asks_for_the_device_copy():
    d = diagnose(
        share=0.4, wait_s=0.010, step_s=0.025, copy_s=0.008, work=None,
        num_workers=8, cores=16, gpus=1,
    )
    assert d.bottleneck == "host-to-device copy"
    assert "device='cuda'" in d.fix


def test_unsplit_loader_in_the_main_process_asks_for_workers():
    # 30 ms made in next() against a 10 ms loop: 3 workers.
    d = diagnose(
        share=0.75, wait_s=0.030, step_s=0.040, copy_s=None, work=None,
        num_workers=0, cores=16, gpus=0,
    )
    assert d.bottleneck == "loader"
    assert d.fix.startswith("raise num_workers to 3")


def test_not_input_bound_needs_no_fix():
    d = diagnose(
        share=0.01, wait_s=0.0002, step_s=0.020, copy_s=None, work=None,
        num_workers=0, cores=2, gpus=0,
    )
    assert d.bottleneck == "none"
    assert d.fix.startswith("none")


# -- the CUDA-event bookkeeping, with plain numbers -----------------------------------------


def test_readback_queue_reads_in_order_after_the_lag_and_stops_at_the_first_pending():
    q: ReadbackQueue[float] = ReadbackQueue(lag=2)
    for index, finish_time in enumerate([1.0, 2.0, 9.0, 3.0, 4.0]):
        q.push(index, finish_time)
    # Handles finishing by t=5: 0, 1 (then 2 is pending: stop, even though 3 is done).
    assert q.pop_done(lambda t: t <= 5.0) == [(0, 1.0), (1, 2.0)]
    assert q.pop_done(lambda t: t <= 5.0) == []
    # Everything is done by t=10, but the last `lag` items wait for newer pushes.
    assert q.pop_done(lambda t: t <= 10.0) == [(2, 9.0)]
    assert len(q) == 2
    assert q.pop_all() == [(3, 3.0), (4, 4.0)]
    assert len(q) == 0


def test_batch_length_counts_samples_in_common_batch_shapes():
    assert batch_length(torch.zeros(7, 3)) == 7
    assert batch_length((torch.zeros(5, 2), torch.arange(5))) == 5
    assert batch_length({"image": torch.zeros(4, 3), "label": torch.zeros(4)}) == 4
    assert batch_length([{"data": torch.zeros(6, 3)}]) == 6  # DALI's iterator
    assert batch_length(["a", "b", "c"]) == 3
    assert batch_length(torch.tensor(1.0)) == 1
    assert batch_length(42) == 1


# -- the verdict on loops of known cost -------------------------------------------------------


def test_a_30ms_producer_and_a_0ms_step_is_highly_input_bound():
    loader = DataLoader(Timed(24, ms=10), batch_size=3, num_workers=0)  # 30 ms per batch
    run(loader)
    s = loader.meter.summary()
    assert s.batches == 8 and s.samples == 24 and s.passes == 1
    assert s.verdict is Verdict.HIGHLY
    assert s.diagnosis.bottleneck == "loader"
    assert s.diagnosis.fix.startswith("raise num_workers to")
    assert s.wait_p50_s <= s.wait_p95_s <= s.wait_max_s
    assert "HIGHLY INPUT-BOUND" in str(s) and s.diagnosis.fix in str(s)
    assert "host wait around next() only" in str(s)


def test_a_0ms_producer_and_a_100ms_step_is_not_input_bound():
    loader = DataLoader(Timed(12, ms=0), batch_size=2, num_workers=0)
    run(loader, step_s=0.1)
    s = loader.meter.summary()
    assert s.batches == 6
    assert s.verdict is Verdict.NOT
    assert s.diagnosis.bottleneck == "none"


# -- drop-in behaviour ------------------------------------------------------------------------


def test_metered_loader_yields_torch_batches_and_keeps_iterator_semantics():
    data = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    torch.manual_seed(1)
    ref = run(torch.utils.data.DataLoader(data, batch_size=6, shuffle=True))
    torch.manual_seed(1)
    loader = DataLoader(data, batch_size=6, shuffle=True)
    got = run(loader)
    assert len(got) == len(ref) == 4
    for a, b in zip(got, ref):
        assert type(a) is type(b)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    it = iter(loader)
    assert len(it) == 4
    run_out = list(it)
    assert len(run_out) == 4
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert loader.meter.batches == 8 and loader.meter.summary().passes == 2


class FailsAt(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 2:
            raise ValueError("sample 2 is bad")
        return torch.tensor([i])


def test_an_error_in_the_dataset_leaves_the_metered_iterator_usable_like_torchs():
    expected = []
    for make in (torch.utils.data.DataLoader, DataLoader):
        it = iter(make(FailsAt(), batch_size=2))
        seen = [next(it).tolist()]
        with pytest.raises(ValueError, match="sample 2"):
            next(it)
        seen += [b.tolist() for b in it]
        expected.append(seen)
    assert expected[0] == expected[1] == [[[0], [1]], [[4], [5]]]


def test_meter_false_has_no_meter_and_the_same_batches():
    data = TensorDataset(torch.arange(10))
    loader = DataLoader(data, batch_size=4, meter=False)
    assert loader.meter is None
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_bad_meter_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="meter="):
        DataLoader(TensorDataset(torch.arange(4)), meter="yes")
    with pytest.raises(ConfigError, match="log_every=0"):
        StarvationMeter(log_every=0)


def test_a_given_meter_is_used_and_single_samples_count_as_one():
    meter = StarvationMeter()
    loader = DataLoader(TensorDataset(torch.zeros(5, 3)), batch_size=None, meter=meter)
    assert loader.meter is meter
    run(loader)
    assert meter.summary().samples == 5


# -- measure() around other loaders -----------------------------------------------------------


def test_measure_wraps_a_stock_torch_loader_without_changing_what_it_yields():
    stock = torch.utils.data.DataLoader(Timed(10, ms=0), batch_size=4)
    ref = run(stock)
    metered = measure(stock)
    assert len(metered) == 3 and metered.dataset is stock.dataset
    got = run(metered, passes=2)
    assert len(got) == 6
    for a, b in zip(got[:3], ref):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    s = metered.meter.summary()
    assert (s.batches, s.samples, s.passes, s.num_workers) == (6, 20, 2, 0)


def test_measure_wraps_any_iterable_and_counts_dict_batches():
    batches = [{"data": torch.zeros(8, 2)} for _ in range(5)]
    metered = measure(batches, num_workers=3)
    assert list(metered) == batches
    s = metered.meter.summary()
    assert s.samples == 40 and s.num_workers == 3


def test_a_break_leaves_the_last_step_unknown_and_the_rest_measured():
    metered = measure(range(10))
    for i in metered:
        if i == 4:
            break
    records = metered.meter.records()
    assert len(records) == 5
    assert records[-1]["step_s"] is None
    assert all(r["step_s"] is not None and r["step_s"] >= r["wait_s"] for r in records[:-1])


# -- declared datasets: worker-side timings, copy time ---------------------------------------


def test_declared_dataset_reports_fetch_and_decode_from_real_workers(jpeg_root: Path):
    folder = ImageFolder(jpeg_root, size=32, train=False)
    loader = DataLoader(folder, batch_size=8, num_workers=2)
    run(loader)
    s = loader.meter.summary()
    assert s.batches == 6 and s.samples == 48 and s.num_workers == 2
    assert s.work is not None and s.work.fetch_s > 0 and s.work.decode_s > 0
    records = loader.meter.records()
    assert sum(r["decode_s"] or 0 for r in records) > 0
    assert s.diagnosis.bottleneck in BOTTLENECKS
    assert s.worker_stats is not None and s.worker_stats.reporting == 2
    assert "worker-seconds" in str(s)


def test_device_loader_splits_the_copy_out_of_the_wait(jpeg_root: Path):
    folder = ImageFolder(jpeg_root, size=32, train=False, normalize=True)
    loader = DataLoader(folder, batch_size=16, num_workers=0, device="cpu")
    run(loader)
    s = loader.meter.summary()
    assert s.copy_mean_s is not None and s.copy_mean_s >= 0
    records = loader.meter.records()
    assert all(0 <= r["copy_s"] <= r["wait_s"] for r in records)


# -- exports ----------------------------------------------------------------------------------


def test_to_json_writes_one_record_per_batch_and_the_summary(tmp_path: Path):
    loader = DataLoader(Timed(9, ms=1), batch_size=2, num_workers=0)
    run(loader, passes=2)
    path = tmp_path / "meter.json"
    loader.meter.to_json(path)
    doc = json.loads(path.read_text())
    assert len(doc["batches"]) == 10
    assert doc["summary"]["batches"] == 10 and doc["summary"]["samples"] == 18
    assert doc["summary"]["verdict"] in {v.value for v in Verdict}
    assert [r["pass"] for r in doc["batches"]] == [0] * 5 + [1] * 5
    assert {"wait_s", "step_s", "copy_s", "fetch_s", "gpu_idle_s"} <= set(doc["batches"][0])
    assert "verdict" in doc["report"]


def test_plot_writes_a_png(tmp_path: Path):
    pytest.importorskip("matplotlib")
    metered = measure([torch.zeros(2, 2)] * 30)
    list(metered)
    path = tmp_path / "meter.png"
    metered.meter.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_periodic_logging_every_n_batches(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="fastload.meter")
    metered = measure(range(25), meter=StarvationMeter(log_every=10))
    list(metered)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("fastload.meter")]
    assert len(lines) == 2
    assert lines[0].startswith("batches 0-9: wait p50") and lines[1].startswith("batches 10-19")


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard would show from the event files in ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_gets_one_scalar_per_batch_that_tensorboard_reads_back(tmp_path: Path):
    pytest.importorskip("tensorboard")
    metered = measure(range(5))
    for _ in metered:
        time.sleep(0.002)
    metered.meter.to_tensorboard(tmp_path / "tb")
    scalars = _scalars(tmp_path / "tb")
    records = metered.meter.records()
    assert set(scalars) == {"fastload/wait_ms", "fastload/step_ms"}  # no GPU: no idle scalar
    assert [step for step, _ in scalars["fastload/wait_ms"]] == [0, 1, 2, 3, 4]
    for (step, value), r in zip(scalars["fastload/wait_ms"], records):
        assert value == pytest.approx(r["wait_s"] * 1e3, rel=1e-6, abs=1e-6)
    steps = [(r["batch"], r["step_s"] * 1e3) for r in records if r["step_s"] is not None]
    assert len(scalars["fastload/step_ms"]) == len(steps) == 5
    for (step, value), (batch, expected) in zip(scalars["fastload/step_ms"], steps):
        assert step == batch and value == pytest.approx(expected, rel=1e-6) and value >= 2.0


def test_periodic_tensorboard_scalars_every_n_batches(tmp_path: Path):
    pytest.importorskip("tensorboard")
    meter = StarvationMeter(log_every=10, tensorboard=tmp_path / "tb")
    list(measure(range(25), meter=meter))
    scalars = _scalars(tmp_path / "tb")
    assert [step for step, _ in scalars["fastload/wait_p50_ms"]] == [10, 20]
    assert all(0.0 <= share <= 1.0 for _, share in scalars["fastload/wait_share"])


def test_tensorboard_without_the_package_is_a_clear_error(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if absent
    metered = measure(range(5))
    list(metered)
    with pytest.raises(MissingDependencyError, match="fastload\\[tensorboard\\]"):
        metered.meter.to_tensorboard(tmp_path / "tb")


def test_empty_meter_summary_says_so():
    s = StarvationMeter(machine=Machine(cpu_cores=4, gpus=0)).summary()
    assert s.batches == 0 and "no batches" in str(s)
    assert math.isclose(s.wait_share, 0.0)


def test_public_names():
    assert fastload.StarvationMeter is StarvationMeter
    assert fastload.measure is measure


# -- the GPU path -------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_idle_is_measured_with_cuda_events(jpeg_root: Path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    folder = ImageFolder(jpeg_root, size=64, train=False, normalize=True)
    loader = DataLoader(folder, batch_size=8, num_workers=2, device="cuda")
    weight = torch.randn(3 * 64 * 64, 256, device="cuda")
    for epoch in range(2):
        for images, _ in loader:
            assert images.is_cuda
            images.flatten(1) @ weight
    s = loader.meter.summary()
    assert s.gpu_idle_share is not None and s.gpu_idle_p50_s is not None
    assert "CUDA events" in s.measured_by
    records = loader.meter.records()
    assert all(r["gpu_idle_s"] is not None and r["gpu_idle_s"] >= 0 for r in records)


def test_reset_mid_pass_starts_over_cleanly():
    metered = measure(range(6))
    it = iter(metered)
    next(it), next(it)
    metered.meter.reset()
    assert list(it) == [2, 3, 4, 5]
    s = metered.meter.summary()
    assert (s.batches, s.passes) == (4, 1)


def test_batches_of_torchs_batch_sampler_count_as_batch_size_and_the_short_last_one():
    data = TensorDataset(torch.arange(10))
    loader = DataLoader(data, batch_size=4)
    run(loader, passes=2)
    assert [r["samples"] for r in loader.meter.records()] == [4, 4, 2] * 2
    dropped = DataLoader(data, batch_size=4, drop_last=True)
    run(dropped)
    assert dropped.meter.summary().samples == 8
    left = DataLoader(data, batch_size=4)
    for _ in left:
        break
    assert left.meter.summary().samples == 4


def test_the_loaders_own_iterator_records_what_measure_records():
    # NOTE [the meter inside the loader's iterator]: a plain loader's iterator writes the
    # meter's records itself; the same batches through measure() give the same records.
    from fastload.loader.iterator import LoaderIterator

    data = TensorDataset(torch.arange(10))
    loader = DataLoader(data, batch_size=4)
    it = iter(loader)
    assert isinstance(it, LoaderIterator) and type(it).__name__ == "_MeteredPlain"
    mid = [next(it), next(it)]
    assert [r["samples"] for r in loader.meter.records()] == [4, 4]  # read mid-pass
    rest = list(it)
    got = [b[0].tolist() for b in mid + rest] + [b[0].tolist() for b in loader]
    wrapped = measure(torch.utils.data.DataLoader(data, batch_size=4))
    assert got == [b[0].tolist() for _ in range(2) for b in wrapped]
    mine, theirs = loader.meter.summary(), wrapped.meter.summary()
    assert (mine.batches, mine.samples, mine.passes) == (theirs.batches, theirs.samples, theirs.passes) == (6, 20, 2)
    assert [r["samples"] for r in loader.meter.records()] == [4, 4, 2] * 2
    assert all(r["wait_s"] >= 0 for r in loader.meter.records())
    assert loader.state_dict()["batches"] == 0 and loader.state.progress.done


def test_reset_mid_pass_of_the_loaders_iterator_opens_a_new_pass():
    loader = DataLoader(TensorDataset(torch.arange(24)), batch_size=4)
    it = iter(loader)
    next(it), next(it)
    loader.meter.reset()
    assert len(list(it)) == 4
    s = loader.meter.summary()
    assert (s.batches, s.samples, s.passes) == (4, 16, 1)
    assert loader.state.progress.batches == 6


def test_meter_off_loader_iterator_counts_for_resume_only():
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=4, meter=False)
    it = iter(loader)
    next(it)
    assert loader.meter is None and loader.state_dict()["batches"] == 1
    assert len(list(it)) == 2 and loader.state.progress.done


def test_the_summary_gives_each_pass_its_own_rate():
    """A cold first epoch and warm later ones average into one rate; each pass's is shown."""
    data = Timed(12, ms=5)
    loader = measure(torch.utils.data.DataLoader(data, batch_size=4))
    run(loader)
    data.ms = 0
    run(loader)
    s = loader.meter.summary()
    first, second = s.pass_samples_per_s
    assert s.passes == 2 and first > 0 and second > 0
    assert first <= 12 / 0.060  # its 12 samples slept 5 ms each: a bound, not a timing
    assert f"  per pass:   {first:,.0f}, {second:,.0f} samples/s (first to last)" in str(s)
    assert "per pass" not in str(measure([torch.zeros(2)]).meter.summary())
