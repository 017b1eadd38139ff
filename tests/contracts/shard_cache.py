"""Shared checks of a sharded dataset on the shard store (TarShards, ParquetImages).

:func:`two_processes_download_once` runs two fresh (spawned) processes that build the
dataset over one cache directory and read every sample: each file must be downloaded once
between them. :func:`ahead_in_order_within_budget` checks ``follow_epoch``: the files an
epoch reads first are downloaded ahead, no other, as far as the budget allows, then the rest
as the reader moves on. :func:`damage_copies` damages the local copies in a cache's
``shards/``; :func:`whole_downloads` counts whole-file downloads on the S3 server.
:func:`wait_for` polls a condition of a background downloader, bounded.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _read_all(source: type, urls: list[str], options: dict, cache: Any, out: Any) -> None:
    ds = source(urls, size=32, cache=cache, storage_options=options)
    data = [ds.read_bytes(i) for i in range(len(ds))]
    out.put((sum(len(d) for d in data), ds.shard_store.downloads))


def two_processes_download_once(source: type, urls: list[str], options: dict, cache: Any,
                                gets: Callable[[], list[int]]) -> None:
    """Two spawned processes read every sample of ``source`` over one cache (its index stored
    there, request counts just reset): the same bytes, each file downloaded once between
    them, one GET per file (``gets()``: GETs per file, files under 8 MiB)."""
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
    assert results[0][0] == results[1][0] > 0
    assert sum(downloads for _, downloads in results) == len(urls)
    assert gets() == [1] * len(urls)


def damage_copies(shards: Path, how: str) -> None:
    """Damage every local copy (``*.data``) in ``shards``: "truncate" to half its size, or
    "flip" the byte at offset 700."""
    for f in shards.glob("*.data"):
        with open(f, "r+b") as fh:
            if how == "truncate":
                fh.truncate(os.path.getsize(f) // 2)
                continue
            fh.seek(700)
            byte = fh.read(1)
            fh.seek(700)
            fh.write(bytes([byte[0] ^ 0xFF]))


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def ahead_in_order_within_budget(ds: Any, file_of: Callable[[np.ndarray], np.ndarray],
                                 gets: Callable[[], list[int]], *, ahead: int) -> None:
    """``ds`` (``shuffle_window=1``, a shard budget of ``ahead + 1`` of its largest files,
    request counts just reset): the files of an epoch's order are downloaded ahead in the order
    of first use (``file_of(order)``: the file of each sample), the first ``ahead + 1`` before
    the reader moves, then the rest, evicting within the budget. ``gets()``: GETs per file."""
    files = len(gets())
    order = ds.epoch_order.permutation(5, 1, shuffle=True, num_replicas=1)
    follow = ds.follow_epoch(order)
    try:
        assert follow.ahead == ahead
        wait_for(lambda: follow.fetched == ahead + 1, f"{ahead + 1} files ahead")
        first = [int(f) for f in dict.fromkeys(file_of(np.asarray(order)).tolist())]
        fetched = [i for i, n in enumerate(gets()) if n]
        assert sorted(fetched) == sorted(first[:ahead + 1])  # the next ones in the order only
        follow.advance(len(order))  # the reader is at the end: the rest come, evicting the first
        wait_for(lambda: follow.fetched == files, "every file")
    finally:
        follow.stop()
    store = ds.shard_store
    assert store.files.used() <= store.budget and store.evicted == files - ahead - 1
    assert gets() == [1] * files


def whole_downloads(server: Any, urls: list[str]) -> list[int]:
    """Whole-file downloads of each of ``urls`` that ``server`` (the S3 fixture) saw: GETs
    from byte 0 (a sample's range never starts there: a tar member's header, Parquet's magic
    come first)."""
    return [sum(r.startswith("bytes=0-") for r in server.get_ranges(u.removeprefix("s3://")))
            for u in urls]


def one_download_each(server: Any, urls: list[str], store: Any, backend: str) -> None:
    """The GETs ``server`` (the S3 fixture) saw of each of ``urls`` over a cold epoch.

    Each file is downloaded once on the node: one GET from byte 0 (files under 8 MiB: one
    range request). Every other GET is one sample's range (a sample's bytes never start at
    byte 0: a tar member's header, Parquet's magic come first), read from the origin by a
    process while it downloaded the file itself (NOTE [reads around a download]): with the
    threads engine they are the store's ``around``; torch's workers count theirs in their own
    stores (a worker reads a batch's row groups in threads), out of this process's sight."""
    ranges = [server.get_ranges(u.removeprefix("s3://")) for u in urls]
    downloads = whole_downloads(server, urls)
    assert downloads == [1] * len(ranges), downloads
    if backend == "torch":
        return
    assert sum(len(rs) for rs in ranges) == len(ranges) + store.around
    assert store.downloads == store.requests == len(ranges)
