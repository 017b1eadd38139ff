"""Cache specs: human sizes, CacheConfig checks, and the tier stack open_cache builds."""

import pickle

import pytest

from fastload.cache import CacheConfig, DiskTier, MemoryTier, TieredCache, open_cache, parse_size
from fastload.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("20GB", 20 * 10**9), ("64kib", 65536), ("1.5g", 1_500_000_000), (" 7 B ", 7), (512, 512)],
)
def test_sizes_in_human_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["20 parsecs", "GB", "-1", -5, True])
def test_a_bad_size_names_the_option_and_the_units(bad):
    with pytest.raises(ConfigError, match="disk_size"):
        parse_size(bad, name="disk_size")


def test_specs_build_the_tier_stack_fastest_first(tmp_path):
    assert open_cache(None) is None
    only_disk = open_cache(str(tmp_path / "a"))
    assert [type(t) for t in only_disk.tiers] == [DiskTier]
    both = open_cache({"memory": "1MB", "disk": tmp_path / "b", "disk_size": "10MB", "policy": "lru"})
    assert [type(t) for t in both.tiers] == [MemoryTier, DiskTier]
    assert both.tiers[1].budget == 10**7 and both.tiers[0].policy == "lru"
    assert open_cache(both) is both
    extra = MemoryTier("1KB")
    assert open_cache(CacheConfig(disk=tmp_path / "c", tiers=[extra])).tiers[-1] is extra


def test_the_redis_option_builds_the_redis_tier_below_the_disk(tmp_path):
    cache = open_cache({"disk": tmp_path / "d", "redis": "redis://127.0.0.1:1/0"})
    assert [t.name for t in cache.tiers][:1] == ["disk"] and len(cache.tiers) == 2
    assert type(cache.tiers[1]).__name__ == "RedisTier"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"disk": "/x", "sise": "1GB"}, "unknown cache option.*sise"),
        ({"memory": "1GB", "policy": "fifo"}, "policy must be 'keep' or 'lru'"),
        ({}, "no tier"),
        (3.5, "not a cache spec"),
    ],
)
def test_bad_specs_say_what_to_write(spec, match):
    with pytest.raises(ConfigError, match=match):
        open_cache(spec)


def test_a_cache_pickles_into_workers_with_fresh_memory(tmp_path):
    cache = open_cache({"memory": "1MB", "disk": tmp_path / "c"})
    cache.tiers[0].put("k", b"v")
    clone = pickle.loads(pickle.dumps(cache))
    assert isinstance(clone, TieredCache)
    assert clone.tiers[0].get("k") is None  # memory is per process
    assert clone.tiers[1].directory == cache.tiers[1].directory


def test_redis_without_the_redis_package_names_the_pip_command(tmp_path, monkeypatch):
    import sys

    import fastload.cache
    from fastload.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "redis", None)  # as Python blocks a module
    monkeypatch.delitem(sys.modules, "fastload.cache.redis_tier", raising=False)
    monkeypatch.delattr(fastload.cache, "redis_tier", raising=False)
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastload\[redis\]'") as info:
        open_cache({"disk": tmp_path / "d", "redis": "redis://127.0.0.1:1/0"})
    assert isinstance(info.value, ImportError)


def test_disk_format_new_directories_are_packed_old_ones_keep_files(tmp_path):
    new = open_cache(str(tmp_path / "new")).tiers[0]
    assert new.format == "packed" and new.cache_dir.marker["format"] == 2
    old = DiskTier(tmp_path / "old", format="files")  # as the code before the packed store made it
    assert old.put("k", b"v") and old.cache_dir.marker["format"] == 1
    reopened = open_cache({"disk": tmp_path / "old"}).tiers[0]  # no disk_format: the directory's
    assert reopened.format == "files" and reopened.get("k") == b"v"
    assert any((tmp_path / "old" / "entries").rglob("*")) and not (tmp_path / "old" / "packed").exists()
    both = open_cache(CacheConfig(disk=tmp_path / "files2", disk_format="files")).tiers[0]
    assert both.format == "files"


@pytest.mark.parametrize(("have", "ask"), [("files", "packed"), ("packed", "files")])
def test_asking_for_another_disk_format_names_the_directory(tmp_path, have, ask):
    DiskTier(tmp_path / "c", format=have)
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'c'} holds a disk cache of format '{have}', not '{ask}'"):
        open_cache({"disk": tmp_path / "c", "disk_format": ask})
    with pytest.raises(ConfigError, match="disk_format must be 'packed' or 'files'"):
        CacheConfig(disk=tmp_path / "c", disk_format="sqlite")
