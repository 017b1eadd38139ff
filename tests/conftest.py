"""Shared test fixtures. Fixture modules for real servers live in tests/fixtures/."""

from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path

import psutil
import pytest
from PIL import Image, ImageFilter

from fastload.testing.synthetic import make_jpeg_folder

# Each module here starts a real server or builds real data; add yours to this list.
pytest_plugins: list[str] = [
    "tests.fixtures.privileges", "tests.fixtures.redis", "tests.fixtures.s3", "tests.fixtures.launch",
]


@pytest.fixture(scope="session")
def jpeg_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic class-per-folder JPEG set: 48 images in 4 classes, 160x120."""
    return make_jpeg_folder(
        tmp_path_factory.mktemp("jpegs"), images=48, classes=4, size=(160, 120)
    )


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Photo-like (smooth) 320x240 JPEGs: the synthetic ones blurred, 9 in 3 classes."""
    noisy = make_jpeg_folder(tmp_path_factory.mktemp("noisy"), images=9, classes=3, size=(320, 240))
    root = tmp_path_factory.mktemp("photos")
    for path in sorted(noisy.rglob("*.jpg")):
        out = root / path.parent.name / path.name
        out.parent.mkdir(exist_ok=True)
        with Image.open(path) as img:
            img.convert("RGB").filter(ImageFilter.GaussianBlur(2)).save(out, quality=95)
    return root


LEFTOVER_GRACE_S = 5.0
"""How long a test's threads and child processes get to finish after it, all together."""

# Process-wide helpers multiprocessing starts once and keeps on purpose: not a test's leak.
_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _watched(thread: threading.Thread) -> bool:
    """Threads a test must not leave: fastload's own (daemon or not) and any non-daemon one."""
    return thread.name.startswith("fastload") or not thread.daemon


def _children() -> dict[int, psutil.Process]:
    """Live child processes of this test process, by pid (zombies have finished)."""
    alive = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(helper in " ".join(child.cmdline()) for helper in _MP_HELPERS):
                continue
        except psutil.Error:  # gone, or not ours to read
            continue
        alive[child.pid] = child
    return alive


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest):
    """Fail a test that leaves threads or child processes behind.

    Watched: threads named ``fastload*`` (the library's prefetch, warm and read threads are
    daemon threads, which the interpreter would kill silently), any non-daemon thread, and
    any child process. The baseline is taken after the session and module fixtures are up
    (pytest sets up wider scopes first), so their servers are not counted; the check runs
    after the test's own fixtures are torn down. Leftovers get LEFTOVER_GRACE_S to finish.
    A test that failed is not checked: its traceback holds its loaders, and their workers.
    """
    threads_before = set(threading.enumerate())
    children_before = set(_children())
    yield
    gc.collect()  # an unreferenced loader iterator shuts its workers down when collected
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    threads = [t for t in threading.enumerate() if t not in threads_before and _watched(t)]
    while threads and time.monotonic() < deadline:
        # A task still running when the loop's epoch raised holds its engine until it ends;
        # the engine is then garbage in a cycle (the error's traceback), freed by a collection.
        threads[0].join(timeout=0.2)
        gc.collect()
        threads = [t for t in threads if t.is_alive()]
    children = [c for pid, c in _children().items() if pid not in children_before]
    _, children = psutil.wait_procs(children, timeout=max(0.0, deadline - time.monotonic()))
    if request.node.stash.get(_CALL_FAILED, False):
        return
    described = [f"{c.pid} {' '.join(_cmdline(c))[:200]}" for c in children]
    assert not threads and not children, (
        f"test left threads running: {threads}; child processes: {described}"
    )


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return ["(gone)"]


@pytest.fixture(autouse=True)
def _fastload_logs_visible(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="fastload")
    yield
