"""A shared Redis tier is not trusted blindly: no secret shown, ACL users kept, forged entries
refused (NOTE [authenticated entries], NOTE [denied commands]). Against a real redis-server."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import redis

from fastload import ImageFolder
from fastload.cache import CacheConfig, open_cache
from fastload.cache.config import HMAC_KEY_ENV
from fastload.cache.entry import encode_header, read_header
from fastload.cache.redis_auth import EntryAuth
from fastload.cache.redis_tier import RedisTier
from fastload.errors import ConfigError
from fastload.testing.synthetic import make_jpeg_folder

SECRET = "a-shared-secret-of-32-characters"
KEY = "s3://bucket/train/a.jpg#v=10:abc"


def _manifests(client: redis.Redis) -> dict[str, bytes]:
    """Every entry's Redis key by the cache key its header names: what SCAN shows anyone."""
    found = {}
    for mkey in client.scan_iter(match="*:m"):
        header, _ = read_header(client.get(mkey))
        found[header["key"]] = mkey
    return found


@pytest.mark.timeout(60)
def test_a_password_is_in_no_log_line_error_or_repr(redis_server, caplog):
    admin = redis_server.client()
    admin.config_set("requirepass", "right-password")
    host = f"127.0.0.1:{redis_server.port}"
    for url in (f"redis://:wrong-password@{host}/0", f"redis://trainer:wrong-password@{host}/0",
                f"rediss://:wrong-password@{host}/0"):  # a TLS handshake with a plain server
        tier = RedisTier(url, socket_timeout=2)
        assert tier.get(KEY) is None and not tier.put(KEY, b"x")  # a miss, never an error
        shown = [repr(tier), repr(CacheConfig(redis=url)), repr(open_cache({"redis": url}))]
        for text in (caplog.text, *shown):
            assert "wrong-password" not in text
        assert f":***@{host}" in caplog.text and f":***@{host}" in shown[0]
        caplog.clear()
    with pytest.raises(ConfigError) as refused:
        RedisTier(f"http://:wrong-password@{host}/0")
    assert "wrong-password" not in str(refused.value) and ":***@" in str(refused.value)
    # the right password works, and is shown nowhere either
    tier = RedisTier(f"redis://:right-password@{host}/0")
    assert tier.put(KEY, b"abc") and tier.get(KEY) == b"abc"
    assert "right-password" not in repr(tier) + caplog.text


@pytest.mark.timeout(60)
def test_an_acl_user_without_info_or_config_keeps_the_tier(redis_server, caplog):
    admin = redis_server.client()
    admin.acl_setuser("trainer", enabled=True, passwords=["+trainer-password"], keys=["*"],
                      channels=["*"], commands=["+@all", "-info", "-config"])
    url = f"redis://trainer:trainer-password@127.0.0.1:{redis_server.port}/0"
    tier = RedisTier(url)
    assert tier.put(KEY, b"abc") and tier.get(KEY) == b"abc"
    assert tier.maxmemory() is None  # CONFIG denied: no budget known, the tier stays on
    assert tier.available and tier.put("s3://bucket/b.jpg#v=1", b"def")
    assert RedisTier(url).get("s3://bucket/b.jpg#v=1") == b"def"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "may not run INFO" in w]) == 1, warnings
    assert len([w for w in warnings if "may not run what maxmemory needs" in w]) == 1, warnings
    assert not any("failed during" in w for w in warnings), warnings
    assert "trainer-password" not in caplog.text and "trainer:***@" in caplog.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("forgery", ["no MAC", "another key's MAC", "chunked, no MAC"])
def test_a_forged_entry_is_dropped_counted_and_never_served(redis_server, forgery, caplog):
    chunk = 4096
    tier = RedisTier(redis_server.url, hmac_key=SECRET, chunk_size=chunk)
    genuine = b"genuine bytes" * (1000 if forgery.startswith("chunked") else 1)
    assert tier.put(KEY, genuine) and tier.get(KEY) == genuine
    client = redis_server.client()
    mkey = _manifests(client)[KEY]
    evil = b"evil bytes" * (1000 if forgery.startswith("chunked") else 1)
    if forgery == "another key's MAC":
        mac = EntryAuth(b"the attacker's own key, 32 bytes").mac(KEY, evil)
        client.set(mkey, encode_header(KEY, evil, mac=mac) + evil)
    elif forgery == "no MAC":
        client.set(mkey, encode_header(KEY, evil) + evil)  # right header and checksum
    else:  # rewrite the chunks and the manifest as a writer without the key would
        RedisTier(redis_server.url, chunk_size=chunk).delete(KEY)
        assert RedisTier(redis_server.url, chunk_size=chunk).put(KEY, evil)
    reader = RedisTier(redis_server.url, hmac_key=SECRET, chunk_size=chunk)
    assert reader.get(KEY) is None  # dropped, never served
    assert reader.stats.forged == 1 and reader.stats.corrupt == 0
    assert client.dbsize() == 0  # gone from Redis: a genuine entry can take its place
    why = "wrong MAC" if forgery == "another key's MAC" else "no MAC"
    assert f"fails authentication ({why}; key {KEY})" in caplog.text
    assert reader.put(KEY, genuine) and reader.get(KEY) == genuine and reader.stats.forged == 1


@pytest.mark.timeout(120)
def test_a_loader_reads_the_origin_instead_of_a_forged_entry(redis_server, tmp_path, monkeypatch):
    root = make_jpeg_folder(tmp_path / "data", images=4, classes=2, size=(32, 24))
    monkeypatch.setenv(HMAC_KEY_ENV, SECRET)  # every node sets it; none passes it in code
    ds = ImageFolder(root, size=16, cache={"redis": redis_server.url})
    path = ds.samples[1][0]
    original = Path(path).read_bytes()
    assert ds.read_bytes(1) == original
    client = redis_server.client()
    forged = [k for k in _manifests(client) if k.startswith(f"file://{path}#")]
    assert len(forged) == 1, list(_manifests(client))
    evil = Path(ds.samples[2][0]).read_bytes()
    client.set(_manifests(client)[forged[0]], encode_header(forged[0], evil) + evil)
    again = ImageFolder(root, size=16, cache={"redis": redis_server.url})
    assert again.read_bytes(1) == original  # from the origin
    tier = again.cache.tiers[0]
    assert tier.authenticated and tier.stats.forged == 1
    assert again.read_bytes(1) == original and tier.stats.hits >= 1  # the genuine entry is back
    assert tier.stats.forged == 1
    monkeypatch.delenv(HMAC_KEY_ENV)
    explicit = open_cache({"redis": redis_server.url, "redis_hmac_key": "x" * 16}).tiers[0]
    assert explicit.authenticated and explicit.get(forged[0]) is None  # another key: forged


def test_a_short_or_odd_key_is_refused_without_showing_it():
    with pytest.raises(ConfigError, match="at least 16 bytes") as short:
        CacheConfig(redis="redis://127.0.0.1:6379/0", redis_hmac_key="hunter2")
    assert "hunter2" not in str(short.value)
    with pytest.raises(ConfigError, match="str or bytes"):
        CacheConfig(redis="redis://127.0.0.1:6379/0", redis_hmac_key=12345678901234567890)
    shown = repr(CacheConfig(redis="redis://127.0.0.1:6379/0", redis_hmac_key=SECRET))
    assert SECRET not in shown and "redis_hmac_key='***'" in shown


def test_an_unauthenticated_redis_across_a_network_warns_once(caplog):
    # Nothing connects when a tier is made: TEST-NET-1 addresses are never reached here.
    RedisTier("redis://192.0.2.17:6379/0")
    RedisTier("redis://192.0.2.17:6379/0")
    RedisTier("redis://192.0.2.18:6379/0", hmac_key=SECRET)
    RedisTier("redis://127.0.0.1:6379/0")
    RedisTier(f"unix://{os.devnull}")
    warned = [r.getMessage() for r in caplog.records if "not authenticated" in r.getMessage()]
    assert len(warned) == 1 and "192.0.2.17" in warned[0] and HMAC_KEY_ENV in warned[0]
