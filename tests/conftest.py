"""Shared test fixtures. Fixture modules for real servers live in tests/fixtures/."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from fastload.testing.synthetic import make_jpeg_folder

# Each module here starts a real server or builds real data; add yours to this list.
pytest_plugins: list[str] = ["tests.fixtures.redis", "tests.fixtures.s3"]


@pytest.fixture(scope="session")
def jpeg_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic class-per-folder JPEG set: 48 images in 4 classes, 160x120."""
    return make_jpeg_folder(
        tmp_path_factory.mktemp("jpegs"), images=48, classes=4, size=(160, 120)
    )


@pytest.fixture(autouse=True)
def no_leftover_threads():
    """Fail a test that leaves non-daemon threads behind."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    for t in left:
        t.join(timeout=5)
    left = [t for t in left if t.is_alive()]
    assert not left, f"test left threads running: {left}"


@pytest.fixture(autouse=True)
def _fastload_logs_visible(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="fastload")
    yield
