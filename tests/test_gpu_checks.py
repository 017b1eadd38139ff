"""The GPU checks a lent GPU machine runs first (benchmarks/gpu/run_all.sh) run on this CPU
machine as they would there: fastload imports from the checkout, every check runs, each says
it skipped (no CUDA here), and the script exits 0. A check broken before it reaches its skip
(an import, a syntax error) fails here, not in the few minutes a GPU machine is lent for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)


def test_run_all_runs_every_check_and_each_skips_without_cuda(tmp_path):
    checks = sorted(p.name for p in (ROOT / "benchmarks" / "gpu").glob("check_*.py"))
    assert "check_dali_shards.py" in checks
    env = {**os.environ, "PY": sys.executable, "CUDA_VISIBLE_DEVICES": "",
           "WHEELS": str(tmp_path / "none")}  # not a developer's .whl/ of another Python's
    proc = subprocess.run(["bash", "benchmarks/gpu/run_all.sh"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "| CUDA: none | fastload" in out
    for name, section in zip(checks, out.split("== benchmarks/gpu/")[1:]):
        assert section.startswith(name) and "skipped" in section, section
    assert out.count("== benchmarks/gpu/") == len(checks)
