"""What the local tiers promise beyond the Tier contract (tests/contracts/test_tiers.py):
policies, corrupt entries, hostile keys kept inside the directory, budgets, a full disk,
counters across processes."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from fastload.cache import DiskTier, MemoryTier
from fastload.cache.entry import encode_header, encode_packed
from tests.cache_damage import damage

FORMATS = ["files", "packed"]


@pytest.mark.parametrize("kind", ["memory", "disk-files", "disk-packed"])
def test_keep_admits_until_full_then_keeps_lru_evicts_the_oldest(kind, tmp_path, caplog):
    def make(policy):
        if kind == "memory":
            return MemoryTier(350, policy=policy)
        if kind == "disk-packed":
            one = len(encode_packed("k0", b"x" * 100))
        else:
            one = len(encode_header("k0", b"x" * 100)) + 100
        return DiskTier(tmp_path / policy, size=3 * one + 50, policy=policy, format=kind[5:])

    value = b"x" * 100
    keep, lru = make("keep"), make("lru")
    for t in (keep, lru):
        for i in range(3):
            assert t.put(f"k{i}", value)
        if kind == "disk-files":
            os.utime(t.path_of("k0"), (1, 1))  # the oldest, so LRU evicts it first
        elif kind == "disk-packed":
            t.get("k1"), t.get("k2")  # read after k0 (its reads noted in memory, not yet written)
        else:
            t.get("k0")  # read recently, so LRU keeps it
    caplog.clear()
    assert keep.put("k3", value) is False and keep.put("k4", value) is False
    assert sorted(keep.keys()) == ["k0", "k1", "k2"]
    if kind != "memory":
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
        assert "full" in caplog.text
    assert lru.put("k3", value) is True
    assert "k3" in set(lru.keys()) and len(set(lru.keys())) < 4
    if kind == "memory":
        assert "k0" in set(lru.keys())  # read recently, so kept
    else:
        assert "k0" not in set(lru.keys())  # the least recently read went first
        assert lru.read_used() <= lru.budget


@pytest.mark.parametrize(
    "how",
    [
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),   # a flipped bit
        lambda b: b[: len(b) // 2],              # truncated
        lambda b: b"garbage",                    # not an entry
        lambda b: b"",                           # empty
    ],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_corrupt_entry_is_dropped_never_served(tmp_path, how, fmt, caplog):
    tier = DiskTier(tmp_path / "c", format=fmt)
    tier.put("k", b"payload" * 100)
    damage(tier, "k", how)
    where = tier.path_of("k") if fmt == "files" else tier.cache_dir.packed_path() / "data.mdb"
    report = tier.verify()
    assert len(report.corrupt) == 1 and str(where) in report.corrupt[0][0]
    assert tier.get("k") is None
    assert tier.stats.corrupt == 1 and not tier.contains("k") and list(tier.keys()) == []
    assert "dropping corrupt cache entry k" in caplog.text
    assert tier.put("k", b"fresh") and tier.get("k") == b"fresh"
    size = tier.path_of("k").stat().st_size if fmt == "files" else len(encode_packed("k", b"fresh"))
    assert tier.rescan() == (1, size) and tier.read_used() == size


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_corrupt_entry_in_a_batch_read_is_dropped_and_the_others_served(tmp_path, fmt, caplog):
    tier = DiskTier(tmp_path / "c", format=fmt)
    assert tier.put_many([("a", b"A" * 300), ("k", b"payload" * 100), ("b", b"B" * 300)]) == [True] * 3
    damage(tier, "k", lambda b: b[:-1] + bytes([b[-1] ^ 1]))
    hits, misses = tier.stats.hits, tier.stats.misses
    assert tier.get_many(["a", "k", "b", "gone"]) == [b"A" * 300, None, b"B" * 300, None]
    assert tier.stats.corrupt == 1 and (tier.stats.hits - hits, tier.stats.misses - misses) == (2, 2)
    assert "dropping corrupt cache entry k" in caplog.text and not tier.contains("k")


@pytest.mark.parametrize(
    "key",
    ["../../../../etc/passwd", "/etc/passwd", "a/../../b", "..", "\x00nul", "é" * 3000, "C:\\x\\..\\..\\y"],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_keys_stay_inside_the_directory(tmp_path, key, fmt):
    root = tmp_path / "c"
    tier = DiskTier(root, format=fmt)
    assert tier.put(key, b"v") and tier.get(key) == b"v"
    assert list(tier.keys()) == [key]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and all(root in p.parents for p in files)
    assert tier.path_of(key).parent.parent == root / "entries"


def test_a_directory_that_is_not_a_cache_is_refused(tmp_path):
    from fastload.errors import CacheError

    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(CacheError, match="not empty and not a fastload cache"):
        DiskTier(tmp_path)
    with pytest.raises(CacheError, match="is not a fastload cache directory"):
        DiskTier(tmp_path / "missing", create=False)


@pytest.mark.parametrize("policy", ["keep", "lru"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_oversized_object_is_declined_but_the_tier_stays_useful(tmp_path, fmt, policy):
    tier = DiskTier(tmp_path / "c", size=1000, format=fmt, policy=policy)
    assert tier.put("kept", b"x" * 10) is True
    assert tier.put("big", b"x" * 5000) is False
    assert tier.put("small", b"x" * 10) is True
    assert sorted(tier.keys()) == ["kept", "small"]  # nothing was evicted for it


_FULL_DISK = textwrap.dedent(
    """
    import json, logging, resource, signal, sys
    from fastload.cache import open_cache
    import fsspec
    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    cache = open_cache({"disk": sys.argv[1], "disk_format": sys.argv[2]})
    fs = fsspec.filesystem("file")
    out = [len(cache.read(fs, p)) for p in sys.argv[3:]]
    cache.close()  # commits the puts written behind (NOTE [write-behind])
    print(json.dumps({"sizes": out, "rejected": cache.tiers[0].stats.rejected,
                      "origin": cache.origin_reads}))
    """
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_full_disk_turns_the_tier_into_pass_through_with_one_warning(tmp_path, fmt):
    # A real kernel refusal: the process's file size limit makes every large write fail.
    DiskTier(tmp_path / "c", format=fmt)
    objects = []
    for i in range(3):
        p = tmp_path / f"obj{i}"
        p.write_bytes(bytes([i]) * 50_000)
        objects.append(str(p))
    run = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path / "c"), fmt, *objects],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["sizes"] == [50_000] * 3 and result["origin"] == 3
    assert result["rejected"] == 3
    assert run.stderr.count("WARNING") == 1 and "pass-through" in run.stderr
    assert DiskTier(tmp_path / "c").verify().checked == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_counters_are_recorded_for_cache_stats(tmp_path, fmt):
    tier = DiskTier(tmp_path / "c", format=fmt)
    tier.put("a", b"1")
    tier.get("a")
    tier.get("b")
    tier.close()
    summary = DiskTier(tmp_path / "c", create=False).summary()
    assert (summary["entries"], summary["hits"], summary["misses"], summary["puts"]) == (1, 1, 1, 1)
    assert summary["hit_rate"] == 0.5


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("umask, mode", [(0o002, 0o664), (0o077, 0o600)])
def test_cache_files_follow_the_umask_so_a_group_can_share_the_cache(tmp_path, umask, mode, fmt):
    old = os.umask(umask)
    try:
        tier = DiskTier(tmp_path / "c", format=fmt)
        tier.put("a", b"1")
        with tier.lock("a", timeout=1) as got:
            assert got
        tier.close()
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "c").rglob("*") if p.is_file()]
    assert any(p.parent.name == "locks" for p in files) and (tmp_path / "c" / "stats.json").exists()
    assert {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files} == {
        str(p.relative_to(tmp_path)): oct(mode) for p in files
    }
