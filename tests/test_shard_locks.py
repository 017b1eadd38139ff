"""The shard store's locks between processes of a node: a wait for another's download ends
when the shard is whole, not when the other process stops reading it."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading

import pytest

import fastload.cache.shardstore as shardstore
from fastload.cache.keys import digest
from fastload.cache.shardstore import ShardRef
from tests.test_shard_cache import remote, local_shards, remote_ds  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


def test_a_reader_waiting_for_anothers_download_reads_the_shard_once_it_is_whole(
        remote, s3_options, tmp_path, monkeypatch, caplog):  # noqa: F811 - a fixture
    # NOTE [waiting for another's download]: a process that found the shard missing waited
    # for its lock exclusively, while the process that downloaded it read on holding the lock
    # shared: the wait ran out lock_timeout and read from the origin (60 s stalls of torch
    # workers). Here the other process is this test: it holds the lock shared, as a reader
    # of what it downloaded does, and puts the whole shard in place once the store waits.
    caplog.set_level(logging.WARNING, logger="fastload")
    first = remote_ds(remote, s3_options, {"disk": str(tmp_path / "a")})
    expected = first.read_bytes(0)  # sample 0 lies in the first shard: now whole in a/shards
    first.shard_store.release_all()
    (data,) = (tmp_path / "a" / "shards").glob("*.data")
    record = data.with_suffix(".json")

    second = remote_ds(remote, s3_options, {"disk": str(tmp_path / "b"), "lock_timeout": 30})
    shards = tmp_path / "b" / "shards"
    waiting = threading.Event()
    real = shardstore.lock_to_fill

    def lock_to_fill(*args, **kwargs):
        waiting.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(shardstore, "lock_to_fill", lock_to_fill)
    lock = os.open(shards / record.with_suffix(".lock").name, os.O_RDWR | os.O_CREAT)
    got: dict[str, object] = {}
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)  # the other process, between its look and its fill
        reader = threading.Thread(target=lambda: got.update(bytes=second.read_bytes(0)))
        reader.start()
        assert waiting.wait(30), "the store never waited for the shard"
        shutil.copyfile(data, shards / data.name)  # the other's download, whole, then read on
        shutil.copyfile(record, shards / record.name)
        reader.join(60)
        assert not reader.is_alive()
    finally:
        os.close(lock)
    assert got["bytes"] == expected
    store = second.shard_store
    assert store.downloads == 0 and store.around == 0
    assert not [r for r in caplog.records if "held by another process" in r.getMessage()]


def test_a_download_ahead_that_cannot_see_the_shard_whole_holds_nothing(
        remote, s3_options, tmp_path):  # noqa: F811 - a fixture
    # ShardStore.ensure said "hit" when another process held the shard's lock past its
    # wait: a shard it had not seen whole, which the downloader ahead then counted as held
    # while the store held nothing. It says "busy" now; once it sees the shard, it holds it.
    ds = remote_ds(remote, s3_options, {"disk": str(tmp_path / "c"), "lock_timeout": 1})
    store = ds.shard_store
    size = int(ds.index.versions[0].split(":")[0])
    ref = ShardRef(remote[0], remote[0].removeprefix("s3://"), ds.index.versions[0], size)
    lock = os.open(tmp_path / "c" / "shards" / f"{digest(ref.key)}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process filling it, for long
        assert store.ensure(ds.fs, ref, must=True, hold=True) == "busy"
        fcntl.flock(lock, fcntl.LOCK_UN)
        assert store.ensure(ds.fs, ref, must=True, hold=True) == "fetched"  # now held
        assert not fcntl_free(lock, fcntl.LOCK_EX)  # the hold: shared, so no exclusive
        store.release_hold(ref)
        assert fcntl_free(lock, fcntl.LOCK_EX)
    finally:
        os.close(lock)


def fcntl_free(fd: int, mode: int) -> bool:
    """Whether ``flock(fd, mode)`` is free now (taken and given back at once)."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True
