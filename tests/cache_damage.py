"""Damage one entry of a disk cache the way a bad disk or a crash would, in either format.

Format "files": the entry file is rewritten. Format "packed": the record is rewritten by
another process through LMDB (a record of any bytes: the store itself checks nothing), or,
for ``flip_on_disk``, one byte of the value is flipped in ``packed/data.mdb`` itself.

Example::

    damage(tier, "k", lambda b: b[: len(b) // 2])   # the entry is now truncated
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from fastload.cache import DiskTier
from fastload.cache.entry import encode_packed, packed_digest

_REWRITE = """
import sys, lmdb
env = lmdb.open(sys.argv[1], map_size=1 << 30, max_dbs=3)
db = env.open_db(b"entries")
with env.begin(write=True, db=db) as txn:
    txn.put(bytes.fromhex(sys.argv[2]), sys.stdin.buffer.read())
env.close()
"""


def damage(tier: DiskTier, key: str, how: Callable[[bytes], bytes]) -> None:
    """Replace the stored bytes of ``key`` (its file, or its record) with ``how(bytes)``."""
    if tier.format == "files":
        path = tier.path_of(key)
        path.write_bytes(how(path.read_bytes()))
        return
    value = tier.get(key)
    assert value is not None, f"{key} is not cached"
    record = encode_packed(key, value)
    run = subprocess.run(
        [sys.executable, "-c", _REWRITE, str(tier.cache_dir.packed_path()), packed_digest(key).hex()],
        input=how(record), capture_output=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr.decode()


def flip_on_disk(tier: DiskTier, key: str) -> None:
    """Flip the last byte of ``key``'s value inside ``packed/data.mdb`` (format "packed")."""
    value = tier.get(key)
    assert value is not None
    record = encode_packed(key, value)
    path = tier.cache_dir.packed_path() / "data.mdb"
    data = path.read_bytes()
    at = data.index(record) + len(record) - 1
    assert data.count(record) == 1
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 1]))
