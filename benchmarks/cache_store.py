"""Candidate stores for the disk tier's small entries, side by side (fastload issue 14, item 1).

Each candidate stores fastload entries (a header with key, size and xxh64, then the value;
every get validates the checksum) under the same keys, and is measured in one run:

* ``files``: the per-file disk tier (``DiskTier(format="files")``): a file, an index lock
  and a rename per put.
* ``packed``: the disk tier's packed format (``DiskTier(format="packed")``, LMDB), as the
  cache uses it: budget, policy, validation, counters.
* ``lmdb-nosync`` / ``lmdb-sync``: raw LMDB (``lmdb`` package) without the tier around it;
  commits not flushed (``sync=False``) or flushed (``sync=True, metasync=False``: one
  fdatasync per commit).
* ``sqlite+seg``: a prototype of python-diskcache's layout: an SQLite index (WAL,
  ``synchronous=NORMAL``) over append-only segment files, one per writing process.

For each value size (1 KB, 100 KB): put/s one transaction per put, put_many/s (batches of
256), get/s and contains/s (random order), and put/s with 2 processes writing distinct keys
at once (each opens the store itself). Prints a table and each candidate's ratio to
``files``. Small N only on a shared machine; the quiet runs are the lead's.

    python benchmarks/cache_store.py --n 2000
    python benchmarks/cache_store.py                  # N=20,000 (2 GB written at 100 KB)
    python benchmarks/cache_store.py --only packed,files --sizes 1024
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lmdb

from fastload.cache import entry
from fastload.cache.disk import DiskTier

BATCH = 256
MAP_SIZE = 1 << 36  # 64 GiB of address space; the file grows with what is written


class Candidate:
    """put/put_many/get/contains over fastload entries; opened in the process that uses it."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def put(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        for key, value in items:
            self.put(key, value)

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def contains(self, key: str) -> bool:
        return self.get(key) is not None

    def close(self) -> None:
        pass


class TierCandidate(Candidate):
    def __init__(self, directory: str, fmt: str) -> None:
        super().__init__(directory)
        self.tier = DiskTier(directory, size="100GB", format=fmt)

    def put(self, key, value):
        self.tier.put(key, value)

    def put_many(self, items):
        self.tier.put_many(items)

    def get(self, key):
        return self.tier.get(key)

    def contains(self, key):
        return self.tier.contains(key)

    def close(self):
        self.tier.close()


class LmdbCandidate(Candidate):
    def __init__(self, directory: str, sync: bool) -> None:
        super().__init__(directory)
        self.env = lmdb.open(directory, map_size=MAP_SIZE, sync=sync, metasync=False,
                             readahead=False, max_readers=256)

    def _record(self, key, value):
        return entry.packed_digest(key), entry.encode_packed(key, value)

    def put(self, key, value):
        with self.env.begin(write=True) as txn:
            txn.put(*self._record(key, value))

    def put_many(self, items):
        with self.env.begin(write=True) as txn:
            for key, value in items:
                txn.put(*self._record(key, value))

    def get(self, key):
        with self.env.begin(buffers=True) as txn:
            blob = txn.get(entry.packed_digest(key))
            return None if blob is None else entry.decode_packed(blob, expect_key=key)

    def contains(self, key):
        with self.env.begin(buffers=True) as txn:
            return txn.get(entry.packed_digest(key)) is not None

    def close(self):
        self.env.close()


class SqliteSegments(Candidate):
    """An SQLite index (digest -> segment, offset, length) over append-only segment files."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        os.makedirs(directory, exist_ok=True)
        self.db = sqlite3.connect(os.path.join(directory, "index.sqlite"), timeout=60,
                                  isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS e (k BLOB PRIMARY KEY, seg TEXT, off INT, n INT) WITHOUT ROWID")
        self.segment = f"seg-{os.getpid()}-{os.urandom(4).hex()}"
        self.fd = os.open(os.path.join(directory, self.segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        self.offset = 0
        self.readers: dict[str, int] = {}

    def _append(self, key, value):
        blob = entry.encode_packed(key, value)
        os.write(self.fd, blob)
        row = (entry.packed_digest(key), self.segment, self.offset, len(blob))
        self.offset += len(blob)
        return row

    def put(self, key, value):
        row = self._append(key, value)
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT OR IGNORE INTO e VALUES (?,?,?,?)", row)
        self.db.execute("COMMIT")

    def put_many(self, items):
        rows = [self._append(k, v) for k, v in items]
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("INSERT OR IGNORE INTO e VALUES (?,?,?,?)", rows)
        self.db.execute("COMMIT")

    def _row(self, key):
        return self.db.execute("SELECT seg, off, n FROM e WHERE k=?", (entry.packed_digest(key),)).fetchone()

    def get(self, key):
        row = self._row(key)
        if row is None:
            return None
        seg, off, n = row
        fd = self.readers.get(seg)
        if fd is None:
            fd = self.readers[seg] = os.open(os.path.join(self.directory, seg), os.O_RDONLY)
        return entry.decode_packed(os.pread(fd, n, off), expect_key=key)

    def contains(self, key):
        return self._row(key) is not None

    def close(self):
        os.close(self.fd)
        for fd in self.readers.values():
            os.close(fd)
        self.db.close()


CANDIDATES: dict[str, Callable[[str], Candidate]] = {
    "files": lambda d: TierCandidate(d, "files"),
    "packed": lambda d: TierCandidate(d, "packed"),
    "lmdb-nosync": lambda d: LmdbCandidate(d, sync=False),
    "lmdb-sync": lambda d: LmdbCandidate(d, sync=True),
    "sqlite+seg": SqliteSegments,
}


def _rate(n: int, fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def _writer(name: str, directory: str, keys: list[str], value: bytes, start, out) -> None:
    store = CANDIDATES[name](directory)
    start.wait()
    t0 = time.perf_counter()
    for k in keys:
        store.put(k, value)
    out.put((t0, time.perf_counter()))
    store.close()


def measure(name: str, n: int, size: int, root: Path) -> dict[str, float]:
    """The rates of candidate ``name`` at value ``size`` bytes, N entries each (objects/s)."""
    value = os.urandom(size)
    keys = [f"s3://bench/train/{i:07d}.jpg#v={size}:etag{i}" for i in range(n)]
    shuffled = random.Random(0).sample(keys, n)
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix=f"store-{name}-", dir=root) as d:
        store = CANDIDATES[name](os.path.join(d, "one"))
        half = n // 2
        rates["put"] = _rate(half, lambda: [store.put(k, value) for k in keys[:half]])
        rest = keys[half:]
        rates["put_many"] = _rate(len(rest), lambda: [
            store.put_many([(k, value) for k in rest[i:i + BATCH]]) for i in range(0, len(rest), BATCH)
        ])
        rates["get"] = _rate(n, lambda: [store.get(k) for k in shuffled])
        rates["contains"] = _rate(n, lambda: [store.contains(k) for k in shuffled])
        store.close()
        # Two processes writing distinct keys at once, one put per transaction each.
        shared = os.path.join(d, "two")
        CANDIDATES[name](shared).close()  # created once, so both open an existing store
        ctx = mp.get_context("fork")
        start, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_writer, args=(name, shared, keys[i::2], value, start, out)) for i in range(2)]
        for p in procs:
            p.start()
        spans = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        rates["put_2proc"] = n / (max(e for _, e in spans) - min(s for s, _ in spans))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000, help="entries per candidate and size")
    parser.add_argument("--sizes", default="1024,102400", help="value sizes in bytes")
    parser.add_argument("--only", default=",".join(CANDIDATES), help="candidates to run")
    parser.add_argument("--dir", default=None, help="where the stores go (default: the system temp dir)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.gettempdir())
    names = [c for c in args.only.split(",") if c]
    cols = ("put", "put_many", "get", "contains", "put_2proc")
    for size in (int(s) for s in args.sizes.split(",")):
        results = {name: measure(name, args.n, size, root) for name in names}
        print(f"\nvalues of {size} bytes, N={args.n} (objects/s; get validates size and xxh64)")
        print(f"{'candidate':<13}" + "".join(f"{c:>12}" for c in cols) + f"{'us/get':>9}")
        for name, r in results.items():
            print(f"{name:<13}" + "".join(f"{r[c]:>12,.0f}" for c in cols) + f"{1e6 / r['get']:>9.1f}")
        if "files" in results:
            print("ratio to files")
            for name, r in results.items():
                if name != "files":
                    print(f"{name:<13}" + "".join(f"{r[c] / results['files'][c]:>11.1f}x" for c in cols))


if __name__ == "__main__":
    main()
