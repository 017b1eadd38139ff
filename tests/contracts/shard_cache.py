"""Shared checks of a sharded dataset on the shard store (TarShards, ParquetImages).

:func:`two_processes_read_everything` runs two fresh (spawned) processes that build the
dataset over one cache directory and read every sample: each file must be downloaded once
between them. :func:`wait_for` polls a condition of a background downloader, bounded.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any


def _read_all(source: type, urls: list[str], options: dict, cache: Any, out: Any) -> None:
    ds = source(urls, size=32, cache=cache, storage_options=options)
    data = [ds.read_bytes(i) for i in range(len(ds))]
    out.put((sum(len(d) for d in data), ds.shard_store.downloads))


def two_processes_read_everything(source: type, urls: list[str], options: dict,
                                  cache: Any) -> list[tuple[int, int]]:
    """(bytes read, files downloaded) of each of two processes reading all of ``source``."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_read_all, args=(source, urls, options, cache, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return results


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)
