"""Auto settings: resolved from a Machine, explicit values win, unsafe datasets keep torch's defaults
(undeclared map-style datasets are probed: tests/test_dataset_probe.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset

import fastload
from fastload.machine import Machine, usable_cpu_cores
from fastload.settings import resolve_settings, worker_safety


class Plain(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


class Declared(Plain):
    fastload_worker_safe = True


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


class ShardedStream(Stream):
    fastload_worker_safe = True


GPU_NODE = Machine(cpu_cores=64, gpus=8, local_world_size=8)
BIG_GPU_BOX = Machine(cpu_cores=32, gpus=1)
CPU_BOX = Machine(cpu_cores=4, gpus=0)


def test_declared_dataset_gets_workers_by_the_per_gpu_rule():
    s = resolve_settings(Declared(), machine=BIG_GPU_BOX)
    assert s.num_workers.value == 8 and s.num_workers.source == "auto"
    assert "per GPU" in s.num_workers.reason
    assert s.pin_memory.value is True
    assert s.persistent_workers.value is True
    assert s.prefetch_factor.value == 2


def test_workers_are_bounded_by_cores_per_rank():
    s = resolve_settings(Declared(), machine=GPU_NODE)
    assert s.num_workers.value == 8  # 64 cores / 8 ranks = 8 each
    s = resolve_settings(Declared(), machine=Machine(cpu_cores=16, gpus=8, local_world_size=8))
    assert s.num_workers.value == 2
    assert "8 ranks" in s.num_workers.reason


def test_without_gpu_one_worker_per_core_and_no_pinning():
    s = resolve_settings(Declared(), machine=CPU_BOX)
    assert s.num_workers.value == 4
    assert s.pin_memory.value is False
    assert s.prefetch_factor.value == 2


def test_few_workers_prefetch_more_batches_each():
    s = resolve_settings(Declared(), machine=Machine(cpu_cores=2, gpus=0))
    assert s.prefetch_factor.value == 4


def test_undeclared_dataset_keeps_torch_defaults_and_warns_once_without_the_probe(caplog, monkeypatch):
    monkeypatch.setenv("FASTLOAD_PROBE", "0")
    fastload.tuning.safety._warned_types.discard(Plain)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        s = resolve_settings(Plain(), machine=BIG_GPU_BOX)
        resolve_settings(Plain(), machine=BIG_GPU_BOX)
    assert s.num_workers.value == 0
    assert s.prefetch_factor.value is None
    assert s.persistent_workers.value is False
    assert s.pin_memory.value is False  # might make CUDA tensors: torch default kept
    warnings = [r for r in caplog.records if "Plain" in r.getMessage()]
    assert len(warnings) == 1
    assert "fastload_worker_safe" in warnings[0].getMessage()
    assert s.probe is None and "FASTLOAD_PROBE=0" in s.num_workers.reason


def test_undeclared_cheap_dataset_is_probed_and_stays_in_process_quietly(caplog):
    fastload.tuning.safety._warned_types.discard(Plain)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        s = resolve_settings(Plain(), machine=BIG_GPU_BOX)
    assert s.probe is not None and s.probe.usable  # safe, but far too cheap for workers
    assert s.num_workers.value == 0 and s.num_workers.reason.startswith("in-process:")
    assert s.prefetch_factor.value is None and s.persistent_workers.value is False
    assert s.pin_memory.value is False
    assert not [r for r in caplog.records if "Plain" in r.getMessage()]


def test_iterable_dataset_uses_workers_only_if_it_declares_sharding():
    assert resolve_settings(Stream(), machine=CPU_BOX, warn=False).num_workers.value == 0
    assert resolve_settings(ShardedStream(), machine=CPU_BOX).num_workers.value == 4


def test_tensor_dataset_stays_in_process_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="fastload"):
        s = resolve_settings(TensorDataset(torch.zeros(3)), machine=CPU_BOX)
    assert s.num_workers.value == 0
    assert "in memory" in s.num_workers.reason
    assert not caplog.records


def test_wrappers_inherit_safety():
    assert worker_safety(Subset(Declared(), [0, 1])).safe
    assert worker_safety(ConcatDataset([Declared(), Declared()])).safe
    assert not worker_safety(ConcatDataset([Declared(), Plain()])).safe


def test_explicit_values_win_over_everything(monkeypatch):
    monkeypatch.setenv("FASTLOAD_NUM_WORKERS", "3")
    s = resolve_settings(
        Plain(), num_workers=1, pin_memory=True, prefetch_factor=7, persistent_workers=False,
        machine=CPU_BOX,
    )
    assert (s.num_workers.value, s.num_workers.source) == (1, "argument")
    assert s.pin_memory.value is True and s.prefetch_factor.value == 7


def test_environment_wins_over_auto(monkeypatch):
    monkeypatch.setenv("FASTLOAD_NUM_WORKERS", "3")
    monkeypatch.setenv("FASTLOAD_PIN_MEMORY", "false")
    s = resolve_settings(Declared(), machine=BIG_GPU_BOX)
    assert (s.num_workers.value, s.num_workers.source) == (3, "environment")
    assert (s.pin_memory.value, s.pin_memory.source) == (False, "environment")


def test_bad_environment_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FASTLOAD_NUM_WORKERS", "many")
    with pytest.raises(fastload.ConfigError, match="FASTLOAD_NUM_WORKERS='many'"):
        resolve_settings(Declared(), machine=CPU_BOX)


def test_device_cpu_never_pins():
    s = resolve_settings(Declared(), machine=BIG_GPU_BOX, device=torch.device("cpu"))
    assert s.pin_memory.value is False


def test_settings_print_every_value_with_its_reason():
    text = str(resolve_settings(Declared(), machine=CPU_BOX))
    for name in ("num_workers=4", "pin_memory=False", "prefetch_factor=2", "persistent_workers=True"):
        assert name in text
    assert "4 usable CPU cores" in text


def test_probe_reads_this_machine():
    m = Machine.probe()
    assert m.cpu_cores == usable_cpu_cores() >= 1
    assert m.gpus == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_machine_keeps_its_old_import_paths():
    import fastload.settings

    assert fastload.Machine is fastload.settings.Machine is Machine
