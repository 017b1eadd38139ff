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
