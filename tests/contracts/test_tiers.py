"""The Tier contract (fastload.cache.tier), run on every tier: memory, disk (both formats:
one file per entry, and the packed LMDB store) and Redis.

Every tier must: round-trip bytes, answer a missing key with None, delete, list its keys,
accept the same put twice, pickle into another process (a shared tier keeps its entries),
count hits, misses and bytes, store large values whole, and take any key, hostile ones
included (a key is never a path). What only one tier promises (policies, corrupt entries,
chunking, outages) is tested next to it: tests/test_cache_tiers.py, tests/test_redis_tier.py.
"""

from __future__ import annotations

import pickle

import pytest

from fastload.cache import DiskTier, MemoryTier
from fastload.cache.keys import make_key

KEY = make_key("s3://b/a.jpg", "3:etag")

HOSTILE_KEYS = [
    "../../../../etc/passwd", "/etc/passwd", "a/../../b", "..", "\x00nul", "é" * 3000,
    "C:\\x\\..\\..\\y", "*", "{braces}:c:0",
]


@pytest.fixture(params=["memory", "disk-files", "disk-packed", "redis"])
def tier(request, tmp_path):
    if request.param == "memory":
        made = MemoryTier("64MB")
    elif request.param.startswith("disk-"):
        made = DiskTier(tmp_path / "cache", size="64MB", format=request.param.removeprefix("disk-"))
    else:
        from fastload.cache.redis_tier import RedisTier

        made = RedisTier(request.getfixturevalue("redis_server").url)
    yield made
    made.close()


def test_round_trip_missing_delete_and_keys(tier):
    assert tier.get(KEY) is None and not tier.contains(KEY)
    assert tier.put(KEY, b"abc") is True
    assert tier.get(KEY) == b"abc" and tier.contains(KEY)
    assert list(tier.keys()) == [KEY]
    tier.delete(KEY)
    assert tier.get(KEY) is None and not tier.contains(KEY) and list(tier.keys()) == []
    tier.delete(KEY)  # deleting a missing key is no error


def test_put_is_idempotent(tier):
    assert tier.put(KEY, b"abc") is True
    assert tier.put(KEY, b"abc") is True
    assert tier.get(KEY) == b"abc" and list(tier.keys()) == [KEY]


def test_stats_count_hits_misses_and_bytes(tier):
    tier.get(KEY)
    tier.put(KEY, b"abcd")
    tier.get(KEY)
    tier.contains(KEY)  # contains() counts nothing
    stats = tier.stats
    assert (stats.hits, stats.misses, stats.puts) == (1, 1, 1)
    assert stats.bytes_read == 4 and stats.bytes_written >= 4


def test_survives_pickling(tier):
    tier.put(KEY, b"v")
    clone = pickle.loads(pickle.dumps(tier))
    try:
        assert type(clone) is type(tier)
        assert clone.get(KEY) == (b"v" if tier.shared else None)
    finally:
        clone.close()


def test_large_values_round_trip_whole(tier):
    value = bytes(range(256)) * (12 * 1024 * 1024 // 256)  # 12 MiB, above Redis chunking
    assert tier.put(KEY, value) is True
    assert tier.get(KEY) == value


@pytest.mark.parametrize("key", HOSTILE_KEYS, ids=range(len(HOSTILE_KEYS)))
def test_any_key_is_a_key_never_a_path(tier, key):
    assert tier.put(key, b"v") is True
    assert tier.get(key) == b"v" and tier.contains(key)
    assert list(tier.keys()) == [key]
    tier.delete(key)
    assert tier.get(key) is None


def test_batches_store_and_check_each_item(tier):
    items = [(f"{KEY}/{i}", bytes([i]) * (i + 1)) for i in range(5)]
    assert tier.put_many(items[:3]) == [True, True, True]
    assert tier.put_many(items) == [True] * 5  # the first three are already there
    assert tier.contains_many([k for k, _ in items] + ["missing"]) == [True] * 5 + [False]
    assert [tier.get(k) for k, _ in items] == [v for _, v in items]
    assert tier.put_many([]) == [] and tier.contains_many([]) == []


def test_get_many_reads_each_key_as_get_does_and_counts_each(tier):
    items = [(f"{KEY}/{i}", bytes([i]) * (i + 1)) for i in range(4)]
    assert tier.put_many(items) == [True] * 4
    before = (tier.stats.hits, tier.stats.misses)
    got = tier.get_many([items[2][0], "missing", items[0][0], items[2][0]])
    assert got == [items[2][1], None, items[0][1], items[2][1]]
    assert (tier.stats.hits - before[0], tier.stats.misses - before[1]) == (3, 1)
    assert tier.get_many([]) == []
