"""The commands that need no tensors start without torch (issue 14: start in under 0.5 s).

``fastload --help``, ``--version``, ``cache stats``, ``cache verify`` and ``cache clear`` run
through the installed console script with ``PYTHONPROFILEIMPORTTIME`` set, and the modules
that process imported are read from its stderr: torch, numpy's heavy users and the loader
must not be among them. How long they take is measured by benchmarks/scale.py, not here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastload.cache import DiskTier
from fastload.cache.keys import make_key

FASTLOAD = str(Path(sys.executable).parent / "fastload")
HEAVY = ("torch", "torchvision", "PIL", "fastload.loader", "fastload.engines", "fastload.data")


def _imports(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    done = subprocess.run([FASTLOAD, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "import time:" in line}
    return done, imported


@pytest.fixture
def cache_dir(tmp_path):
    tier = DiskTier(tmp_path / "cache", size="10MB")
    assert tier.put(make_key("file:///data/a.jpg", "1:2"), b"x" * 100)
    tier.close()
    return tmp_path / "cache"


@pytest.mark.parametrize("args, code", [
    (("--help",), 0),
    (("--version",), 0),
    (("cache", "--help"), 0),
    (("cache", "stats", "{cache}"), 0),
    (("cache", "verify", "{cache}"), 0),
    (("cache", "clear", "{cache}"), 0),
    (("cache", "stats", "{missing}"), 2),
])
def test_commands_without_tensors_do_not_import_torch(cache_dir, tmp_path, args, code):
    argv = [a.format(cache=cache_dir, missing=tmp_path / "nothing-here") for a in args]
    done, imported = _imports(*argv)
    assert done.returncode == code, done.stderr[-2000:]
    assert imported, "PYTHONPROFILEIMPORTTIME gave no import lines"
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY or m.startswith(HEAVY))
    assert heavy == [], f"`fastload {' '.join(argv)}` imported {heavy[:10]}"


def test_clear_through_the_console_script_empties_the_cache(cache_dir):
    done, _ = _imports("cache", "clear", str(cache_dir))
    assert done.returncode == 0
    assert list(DiskTier(cache_dir, create=False).keys()) == []


def test_warm_is_imported_only_by_the_warm_command(cache_dir):
    _, imported = _imports("cache", "stats", str(cache_dir))
    assert "fastload.cache.warm" not in imported and "fsspec" not in imported
    done, _ = _imports("cache", "warm", "--help")
    assert done.returncode == 0 and "[default: 10;" in " ".join(done.stdout.split())  # MAX_FAILURES
