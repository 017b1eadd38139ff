"""The framework examples run as a user runs them, on a tiny synthetic set (docs/integrations.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.launch import launch_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def run(*cmd: str) -> str:
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_lightning_example_under_ddp():
    pytest.importorskip("pytorch_lightning")
    out = run(sys.executable, str(EXAMPLES / "lightning_train.py"), "--devices", "2", "--images", "64")
    for rank in (0, 1):  # each rank trained on its half of each of the 2 epochs
        assert f"[rank {rank}] trained on 64 samples over 2 epochs; engine: threads" in out, out[-2000:]
        assert re.search(rf"\[rank {rank}\] fastload starvation meter: \d+ batches", out)


def test_accelerate_example_prepared_and_resumed():
    pytest.importorskip("accelerate")
    out = run(sys.executable, str(EXAMPLES / "accelerate_train.py"), "--images", "64", "--resume-demo")
    assert "epoch 1: rank 0 trained on 64 samples" in out
    assert "another DataLoader iterated this loader's sampler" in out  # it says its engine is not running
    assert "resume: the 1 batches after the 3rd are the uninterrupted run's" in out


def test_accelerate_example_fastload_mode_under_torchrun():
    pytest.importorskip("accelerate")
    out = run(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              str(EXAMPLES / "accelerate_train.py"), "--images", "64", "--mode", "fastload")
    assert "epoch 1: rank 0 trained on 32 samples" in out  # its half
    assert "engine: threads" in out and "fastload starvation meter" in out
