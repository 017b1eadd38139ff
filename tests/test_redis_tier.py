"""RedisTier against a real redis-server: namespaces, chunking, budget, outages, clusters.

The Tier contract itself (round trip, pickling, stats...) is tests/contracts/test_tiers.py."""

from __future__ import annotations

import logging

import pytest

from fastload.cache.redis_tier import RedisTier
from fastload.errors import ConfigError
from tests.fixtures.redis import RedisServer

KEY = "s3://bucket/train/a.jpg#v=10:abc"


def test_keys_are_namespaced_and_values_are_raw_bytes(redis_server):
    """Round trips, misses and deletes are the Tier contract (tests/contracts/test_tiers.py)."""
    tier = RedisTier(redis_server.url, namespace="ds1")
    assert tier.put(KEY, b"\xff\xd8jpeg bytes")
    raw_keys = [k.decode() for k in redis_server.client().keys("*")]
    assert len(raw_keys) == 1 and raw_keys[0].startswith("ds1:{") and raw_keys[0].endswith(":m")
    # The stored value is the bytes after a JSON header: nothing pickled.
    stored = redis_server.client().get(raw_keys[0])
    assert stored.endswith(b"\xff\xd8jpeg bytes") and b'"xxh64"' in stored
    other = RedisTier(redis_server.url, namespace="ds2")
    assert other.get(KEY) is None and list(other.keys()) == []
    tier.delete(KEY)
    assert redis_server.client().dbsize() == 0


def test_large_values_are_chunked_below_the_chunk_size(redis_server):
    tier = RedisTier(redis_server.url, chunk_size=4096)
    value = bytes(range(256)) * 70  # 17920 bytes -> 5 chunks
    assert tier.put(KEY, value)
    client = redis_server.client()
    sizes = [client.strlen(k) for k in client.keys("*:c:*")]
    assert len(sizes) == 5 and max(sizes) <= 4096
    assert RedisTier(redis_server.url, chunk_size=4096).get(KEY) == value
    # A second writer of the same object leaves one copy, not two.
    assert RedisTier(redis_server.url, chunk_size=4096).put(KEY, value)
    assert len(client.keys("*:c:*")) == 5
    tier.delete(KEY)
    assert client.dbsize() == 0


def test_corrupt_or_evicted_entries_are_dropped_not_served(redis_server, caplog):
    tier = RedisTier(redis_server.url, chunk_size=4096)
    client = redis_server.client()
    tier.put("small", b"abc")
    (mkey,) = client.keys("*:m")
    client.set(mkey, client.get(mkey)[:-1] + b"X")  # flip the last byte
    assert tier.get("small") is None and tier.stats.corrupt == 1
    assert client.dbsize() == 0
    assert "corrupt" in caplog.text
    tier.put("big", b"z" * 10_000)
    client.delete(client.keys("*:c:*:1")[0])  # as if Redis evicted one chunk
    assert tier.get("big") is None
    assert not tier.contains("big")


def test_full_redis_declines_puts_with_one_warning(tmp_path, caplog):
    server = RedisServer(tmp_path, maxmemory="2mb")
    try:
        tier = RedisTier(server.url, chunk_size=64 * 1024)
        results = [tier.put(f"k{i}", bytes([i % 256]) * 200_000) for i in range(20)]
        assert results[0] and not all(results)
        assert tier.stats.rejected == results.count(False)
        warnings = [r for r in caplog.records if "maxmemory" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        stored = [i for i, ok in enumerate(results) if ok]
        assert tier.get(f"k{stored[0]}") == bytes([stored[0]]) * 200_000
        assert tier.maxmemory() == 2 * 1024 * 1024
    finally:
        server.stop()


def test_unreachable_or_stopped_redis_is_a_miss_with_one_warning(redis_server, caplog):
    tier = RedisTier(redis_server.url, socket_timeout=0.5, retry_after=60)
    assert tier.put(KEY, b"v") and tier.get(KEY) == b"v"
    redis_server.stop()
    assert [tier.get(KEY) for _ in range(5)] == [None] * 5
    assert tier.put("other", b"x") is False and not tier.contains(KEY)
    assert list(tier.keys()) == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and redis_server.url in warnings[0].getMessage()
    assert not tier.available


def test_bad_url_names_the_fix():
    with pytest.raises(ConfigError, match="redis://host:6379/0"):
        RedisTier("127.0.0.1:6379")


def test_redis_stopped_mid_epoch_the_epoch_completes_with_one_warning(redis_server, jpeg_root, caplog):
    from fastload import DataLoader, ImageFolder

    dataset = ImageFolder(str(jpeg_root), size=32, cache={"redis": redis_server.url})
    loader = DataLoader(dataset, batch_size=6, shuffle=True, num_workers=0)
    labels = []
    for i, (images, y) in enumerate(loader):
        labels += y.tolist()
        if i == 2:
            redis_server.stop()
    assert sorted(labels) == sorted(dataset.targets)  # every sample, none lost
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "Redis" in r.getMessage()]
    assert len(warnings) == 1 and "Training goes on" in warnings[0].getMessage()


def test_sharded_warmers_fill_one_shared_redis(tmp_path, redis_server, s3_server, s3_options, s3_jpegs):
    from fastload.cache.warm import warm
    from fastload.cli import main

    s3_server.reset_counts()
    spec = {"redis": redis_server.url}
    first = warm(s3_jpegs, spec, shard=(0, 2), storage_options=s3_options)
    # The second "node" runs the command, with its own local directory.
    opts = [f"-o{k}={v}" for k, v in s3_options.items() if k in ("key", "secret", "endpoint_url")]
    code = main(["cache", "warm", s3_jpegs, "--cache", str(tmp_path / "node1"), "--redis",
                 redis_server.url, "--shard", "1/2", "--json", *opts])
    assert code == 0
    check = warm(s3_jpegs, spec, shard=(1, 2), storage_options=s3_options)
    assert first.ok and first.fetched == first.files and abs(first.files - check.files) <= 1
    assert check.skipped == check.files and check.fetched == 0  # the command filled Redis
    objects = first.files + check.files  # the 48 JPEGs and the synthetic set's manifest
    gets = s3_server.gets(s3_jpegs.removeprefix("s3://") + "/")
    assert len(gets) == objects and set(gets.values()) == {1}  # each object once, across warmers
    assert len(list(RedisTier(redis_server.url).keys())) == objects


def test_a_redis_cluster_works_from_the_url_of_any_node(redis_cluster):
    from redis.cluster import RedisCluster as ClusterClient

    tier = RedisTier(redis_cluster.nodes[1].url, chunk_size=4096)
    keys = [f"s3://bucket/img_{i:03d}.jpg@etag{i}" for i in range(40)]
    for i, key in enumerate(keys):
        assert tier.put(key, bytes([i]) * (100 + i))
    big = bytes(range(256)) * 70  # chunked: manifest and 5 chunks share one slot
    assert tier.put("s3://bucket/big.bin@v1", big)
    assert isinstance(tier.client, ClusterClient)

    fresh = RedisTier(redis_cluster.url, chunk_size=4096)  # another node's URL, another process
    assert all(fresh.get(key) == bytes([i]) * (100 + i) for i, key in enumerate(keys))
    assert fresh.get("s3://bucket/big.bin@v1") == big
    assert sorted(fresh.keys()) == sorted(keys + ["s3://bucket/big.bin@v1"])
    per_node = [node.client().dbsize() for node in redis_cluster.nodes]
    assert sum(1 for n in per_node if n) >= 2  # the entries really are spread over the nodes
    fresh.delete("s3://bucket/big.bin@v1")
    assert fresh.get("s3://bucket/big.bin@v1") is None and tier.contains(keys[0])
    # A batch spans the nodes: the cluster pipeline sends each node its own entries.
    batch = [(f"s3://bucket/batch_{i:03d}.jpg@e{i}", bytes([i]) * (50 + i)) for i in range(60)]
    batch.append(("s3://bucket/big2.bin@v1", big))
    assert fresh.put_many(batch) == [True] * 61
    assert tier.contains_many([k for k, _ in batch] + ["s3://bucket/none@v0"]) == [True] * 61 + [False]
    assert all(tier.get(k) == v for k, v in batch)


# -- batches: put_many / contains_many (NOTE [redis batches]) --------------------------------


def _reads(server: RedisServer) -> int:
    """Read events the server processed so far (one per request burst it received)."""
    return server.client().info("stats")["total_reads_processed"]


def test_put_many_stores_validated_entries_small_and_chunked(redis_server):
    from fastload.cache import entry

    tier = RedisTier(redis_server.url, chunk_size=4096)
    items = [(f"s3://b/img_{i:03d}.jpg#v={i}", bytes([i]) * (10 + 40 * i)) for i in range(60)]
    items[7] = ("s3://b/big_a.bin#v=1", bytes(range(256)) * 70)  # 5 chunks
    items[33] = ("s3://b/big_b.bin#v=1", b"q" * 4097)  # one byte over: 2 chunks
    assert tier.put_many(items) == [True] * 60
    assert tier.stats.puts == 60 and tier.stats.rejected == 0
    assert tier.stats.bytes_written == sum(len(v) for _, v in items)

    client = redis_server.client()
    assert len(client.keys("*:m")) == 60 and len(client.keys("*:c:*")) == 5 + 2
    fresh = RedisTier(redis_server.url, chunk_size=4096)  # another process's view
    assert all(fresh.get(key) == value for key, value in items)
    # Inline entries are put's format: the entry header with the key and the checksum.
    small_key, small_value = items[3]
    (raw,) = [client.get(k) for k in client.keys("*:m") if small_key.encode() in client.get(k)]
    assert entry.decode(raw, expect_key=small_key) == small_value
    # A second batch of the same objects stores nothing twice and still says True.
    assert fresh.put_many(items) == [True] * 60 and fresh.stats.puts == 0
    assert len(client.keys("*")) == 60 + 7
    assert fresh.put_many([]) == [] and fresh.contains_many([]) == []


def test_put_many_entries_are_validated_on_read(redis_server):
    tier = RedisTier(redis_server.url)
    tier.put_many([("a", b"alpha"), ("b", b"beta")])
    client = redis_server.client()
    for mkey in client.keys("*:m"):
        client.set(mkey, client.get(mkey)[:-1] + b"X")  # corrupt both values
    assert tier.get("a") is None and tier.get("b") is None and tier.stats.corrupt == 2
    assert tier.contains_many(["a", "b"]) == [False, False]  # dropped, not kept


def test_contains_many_answers_per_key_in_order(redis_server):
    tier = RedisTier(redis_server.url, chunk_size=4096)
    keys = [f"k{i}" for i in range(600)]  # three pipelines of PIPELINE_ENTRIES
    assert all(tier.put_many([(k, b"v" * (i % 7)) for i, k in enumerate(keys) if i % 3 == 0]))
    assert tier.put("big", b"z" * 10_000)
    asked = keys + ["big", "never"]
    expected = [i % 3 == 0 for i in range(600)] + [True, False]
    assert tier.contains_many(asked) == expected
    assert tier.contains_many(asked) == [tier.contains(k) for k in asked]
    assert tier.stats.hits == tier.stats.misses == 0  # uncounted, as contains


def test_a_batch_costs_a_few_round_trips_not_one_per_entry(redis_server):
    tier = RedisTier(redis_server.url)
    tier.contains("warm-up")  # connect first: the connection's own commands are not counted
    client = redis_server.client()
    items = [(f"s3://b/{i:04d}.jpg#v=1", bytes([i % 256]) * 32) for i in range(200)]
    sets_before = client.info("commandstats").get("cmdstat_set", {}).get("calls", 0)
    before = _reads(redis_server)
    assert all(tier.put_many(items))
    batch_reads = _reads(redis_server) - before - 1  # less the second INFO's own read
    before = _reads(redis_server)
    assert tier.contains_many([k for k, _ in items]) == [True] * 200
    contains_reads = _reads(redis_server) - before - 1
    before = _reads(redis_server)
    assert all(tier.put(f"{k}-single", v) for k, v in items)
    loop_reads = _reads(redis_server) - before - 1
    sets = client.info("commandstats")["cmdstat_set"]["calls"] - sets_before
    assert sets == 400  # one SET NX per entry either way: the batch adds no commands
    assert loop_reads >= 200  # the default loop: a round trip per entry
    assert batch_reads <= 20 and contains_reads <= 20


def test_full_redis_declines_part_of_a_batch_with_one_warning(tmp_path, caplog):
    server = RedisServer(tmp_path, maxmemory="2mb")
    try:
        tier = RedisTier(server.url, chunk_size=64 * 1024)
        items = [(f"k{i}", bytes([i]) * 50_000) for i in range(80)]  # 4 MB into 2 MB
        results = tier.put_many(items)
        assert results[0] and not all(results)
        assert tier.stats.rejected == results.count(False) and tier.stats.puts == results.count(True)
        assert tier.contains_many([k for k, _ in items]) == results
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "maxmemory" in warnings[0].getMessage()
        assert tier.available  # a full Redis is not a down one
        assert all(tier.get(k) == v for (k, v), ok in zip(items, results) if ok)
    finally:
        server.stop()


def test_a_batch_while_redis_is_stopped_is_false_with_one_warning(redis_server, caplog):
    tier = RedisTier(redis_server.url, chunk_size=4096, socket_timeout=0.5, retry_after=60)
    assert tier.put_many([("before", b"v")]) == [True]
    redis_server.stop()
    items = [(f"k{i}", b"x" * 100) for i in range(600)] + [("big", b"z" * 10_000)]
    assert tier.put_many(items) == [False] * 601  # no exception
    assert tier.stats.rejected == 601
    assert tier.contains_many(["before", "k1"]) == [False, False]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and redis_server.url in warnings[0].getMessage()
    assert not tier.available


def test_a_batch_against_a_stalled_redis_times_out_false_with_one_warning(redis_server, caplog):
    tier = RedisTier(redis_server.url, socket_timeout=0.3, retry_after=60)
    tier.contains("warm-up")
    # The server stops answering writes (as a stalled or overloaded one); the pipeline's
    # replies never come within socket_timeout.
    redis_server.client().execute_command("CLIENT", "PAUSE", "3000", "WRITE")
    items = [(f"k{i}", b"x" * 100) for i in range(300)]
    assert tier.put_many(items) == [False] * 300
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "TimeoutError" in warnings[0].getMessage()
    assert tier.contains_many(["k0"]) == [False] and not tier.available
