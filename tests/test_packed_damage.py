"""A damaged, foreign, read-only or unflushed packed store never stops a run (issue 21).

NOTE [a store is checked before it is mapped] in fastload/cache/lmdbfile.py. Real LMDB files
cut with ``os.truncate`` and overwritten; every training read runs in a real subprocess, so
a SIGBUS shows as a negative return code; the command line is the installed console script.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import pytest

from fastload.cache.cachedir import UNSYNCED
from fastload.cache.lmdbfile import StoreDamaged, read_header, walk
from fastload.testing.synthetic import make_jpeg_folder
from tests.fixtures.privileges import run_unprivileged

FASTLOAD = str(Path(sys.executable).parent / "fastload")
REPO = Path(__file__).resolve().parents[1]
IMAGES = 6

# Reads every sample of ImageFolder(root, cache=cache) and prints the disk tier's counters.
TRAIN = textwrap.dedent("""
    import json, sys
    from fastload import DataLoader, ImageFolder
    ds = ImageFolder(sys.argv[1], cache=sys.argv[2], size=16)
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if workers:
        seen = sum(len(labels) for _, labels in DataLoader(ds, batch_size=2, num_workers=workers))
    else:
        seen = len([ds[i] for i in range(len(ds))])
    disk = [t for t in ds.cache.tiers if t.name == "disk"][0]
    print(json.dumps({"seen": seen, "hits": disk.stats.hits, "misses": disk.stats.misses}))
""")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def train(root: Path, cache: Path, *args: str, **env: str) -> tuple[int, dict, str]:
    """(return code, the counters printed, stderr) of a training read in a new process."""
    run = subprocess.run([sys.executable, "-c", TRAIN, str(root), str(cache), *args], cwd=REPO,
                         capture_output=True, text=True, timeout=240, env=_env(**env), check=False)
    out = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {}
    return run.returncode, out, run.stderr


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FASTLOAD, *args], capture_output=True, text=True, timeout=120, env=_env(),
                          check=False)


@pytest.fixture
def warmed(tmp_path: Path) -> tuple[Path, Path]:
    """(dataset root, cache directory) warmed by `fastload cache warm`, packed format."""
    root = make_jpeg_folder(tmp_path / "data", images=IMAGES, classes=2, size=(64, 48))
    cache = tmp_path / "cache"
    run = cli("cache", "warm", str(root), "--cache", str(cache))
    assert run.returncode == 0, run.stderr
    return root, cache


def _data(cache: Path) -> Path:
    return cache / "packed" / "data.mdb"


def _marks(cache: Path) -> list[str]:
    return [n for n in os.listdir(cache / "packed") if n.startswith(UNSYNCED)]


def _set_aside(cache: Path) -> list[str]:
    return sorted(n for n in os.listdir(cache) if n.startswith("packed.damaged-"))


def _cut_to_a_third(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 3)


def _junk(path: Path) -> None:
    path.write_bytes(os.urandom(21))


def _headers_overwritten(path: Path) -> None:
    with open(path, "r+b") as f:  # the size stays, both meta pages are junk
        f.write(os.urandom(2 * 4096))


def _cut_to_its_headers(path: Path) -> None:
    os.truncate(path, 2 * 4096)


DAMAGE = {"cut to a third": _cut_to_a_third, "overwritten with 21 bytes": _junk,
          "headers overwritten": _headers_overwritten, "cut to its headers": _cut_to_its_headers}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_store_never_stops_training_and_is_made_anew(warmed, how):
    root, cache = warmed
    DAMAGE[how](_data(cache))
    code, counts, err = train(root, cache)
    assert code == 0, (code, err)  # a SIGBUS would be -7
    assert counts["seen"] == IMAGES and "Traceback" not in err
    assert err.count("disk cache ") == 1 and f"disk cache {cache}: its packed store was damaged" in err
    assert f"fastload cache verify {cache} --drop" in err and f"fastload cache clear {cache}" in err
    assert len(_set_aside(cache)) == 1  # moved whole, never deleted
    code, counts, err = train(root, cache)  # the new store was filled by the first run
    assert code == 0 and counts["misses"] == 0 and counts["hits"] >= IMAGES and "disk cache" not in err, err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["cut to a third", "overwritten with 21 bytes"])
def test_the_command_line_says_a_damaged_store_in_one_line_and_repairs_it(warmed, how):
    _, cache = warmed
    DAMAGE[how](_data(cache))
    stats = cli("cache", "stats", str(cache))
    assert stats.returncode == 1 and "Traceback" not in stats.stderr
    assert stats.stderr.count("\n") == 1 and "packed store" in stats.stderr and "damaged" in stats.stderr
    verify = cli("cache", "verify", str(cache))
    assert verify.returncode == 1 and "Traceback" not in verify.stderr + verify.stdout
    assert verify.stdout.count("\n") == 1 and verify.stdout.startswith(f"DAMAGED {_data(cache)}: ")
    assert f"fastload cache verify {cache} --drop" in verify.stdout
    repaired = cli("cache", "verify", str(cache), "--drop")
    assert repaired.returncode == 1 and "set aside and deleted" in repaired.stdout, repaired
    assert _set_aside(cache) == [] and cli("cache", "verify", str(cache)).returncode == 0
    assert cli("cache", "stats", str(cache)).returncode == 0


@pytest.mark.timeout(300)
def test_clear_repairs_a_damaged_store_and_deletes_the_copies_set_aside(warmed):
    root, cache = warmed
    _cut_to_a_third(_data(cache))
    assert train(root, cache)[0] == 0  # sets the first damaged store aside
    copy = cache / _set_aside(cache)[0]
    _junk(_data(cache))
    verify = cli("cache", "verify", str(cache))
    assert verify.returncode == 1 and f"DAMAGED {copy}: a damaged packed store set aside" in verify.stdout
    cleared = cli("cache", "clear", str(cache))
    assert cleared.returncode == 0 and "Traceback" not in cleared.stderr, cleared
    assert cleared.stdout.count("DELETED ") == 2 and _set_aside(cache) == []
    assert cli("cache", "verify", str(cache)).returncode == 0


def _flip_page_headers(path: Path, seed: int) -> None:
    """Flip bits in the page and node headers of every page after the two meta pages."""
    rng = random.Random(seed)
    data = bytearray(path.read_bytes())
    for page in range(2, len(data) // 4096):
        for _ in range(4):
            data[page * 4096 + rng.randrange(64)] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1, 3, 8])
def test_verify_finds_damaged_pages_without_mapping_them(warmed, seed):
    _, cache = warmed
    fd = os.open(_data(cache), os.O_RDONLY)
    try:
        assert walk(fd, _data(cache)) > 0  # the sound store's pages
    finally:
        os.close(fd)
    _flip_page_headers(_data(cache), seed)  # these seeds made a training read die with SIGBUS
    verify = cli("cache", "verify", str(cache))
    assert verify.returncode == 1 and verify.stdout.startswith(f"DAMAGED {_data(cache)}: page "), verify
    cleared = cli("cache", "clear", str(cache))
    assert cleared.returncode == 0 and "DELETED " in cleared.stdout, cleared
    assert cli("cache", "verify", str(cache)).returncode == 0


@pytest.mark.timeout(300)
def test_a_store_cut_while_in_use_is_dropped_for_the_origin(warmed):
    root, cache = warmed
    script = textwrap.dedent("""
        import json, os, sys
        from fastload import ImageFolder
        ds = ImageFolder(sys.argv[1], cache=sys.argv[2], size=16)
        disk = [t for t in ds.cache.tiers if t.name == "disk"][0]
        first = [ds[i] for i in range(len(ds))]
        hits = disk.stats.hits
        os.truncate(sys.argv[3], os.path.getsize(sys.argv[3]) // 3)   # another tool cuts it
        again = [ds[i] for i in range(len(ds))]
        print(json.dumps({"hits": hits, "again": len(again), "hits_after": disk.stats.hits}))
    """)
    run = subprocess.run([sys.executable, "-c", script, str(root), str(cache), str(_data(cache))],
                         cwd=REPO, capture_output=True, text=True, timeout=240, env=_env(), check=False)
    assert run.returncode == 0, run.stderr
    counts = json.loads(run.stdout.splitlines()[-1])
    assert counts == {"hits": IMAGES, "again": IMAGES, "hits_after": IMAGES}  # the origin's
    assert run.stderr.count("disk cache ") == 1 and "while in use" in run.stderr


@pytest.mark.timeout(300)
def test_workers_check_the_store_when_they_reopen_it(warmed):
    """A store cut after the loader's process opened it, before its forked workers reopen it."""
    root, cache = warmed
    script = textwrap.dedent("""
        import json, os, sys
        from fastload import DataLoader, ImageFolder
        ds = ImageFolder(sys.argv[1], cache=sys.argv[2], size=16)
        os.truncate(sys.argv[3], os.path.getsize(sys.argv[3]) // 3)
        loader = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
        print(json.dumps({"seen": sum(len(labels) for _, labels in loader)}))
    """)
    run = subprocess.run([sys.executable, "-c", script, str(root), str(cache), str(_data(cache))],
                         cwd=REPO, capture_output=True, text=True, timeout=240, env=_env(), check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"seen": IMAGES}
    assert "damaged" in run.stderr and "Traceback" not in run.stderr


def _foreign_store(path: Path) -> bytes:
    """Replace the store with a sound LMDB store of someone else's (a database 'users')."""
    shutil.rmtree(path.parent)
    path.parent.mkdir()
    env = lmdb.open(str(path.parent), max_dbs=2, map_size=1 << 24)
    with env.begin(write=True, db=env.open_db(b"users")) as txn:
        txn.put(b"alice", b"secret")
    env.close()
    return path.read_bytes()


@pytest.mark.timeout(300)
def test_a_store_fastload_did_not_make_is_never_used_moved_or_deleted(warmed):
    root, cache = warmed
    before = _foreign_store(_data(cache))
    code, counts, err = train(root, cache)
    assert code == 0 and counts["misses"] == IMAGES and counts["hits"] == 0, err
    assert err.count("disk cache ") == 1 and "databases fastload never makes ('users')" in err
    verify = cli("cache", "verify", str(cache))
    assert verify.returncode == 1 and f"FOREIGN {_data(cache)}" in verify.stdout
    cleared = cli("cache", "clear", str(cache))
    assert cleared.returncode == 0 and f"LEFT {_data(cache)}" in cleared.stdout, cleared
    assert _data(cache).read_bytes() == before and _set_aside(cache) == []
    with pytest.raises(StoreDamaged, match="fastload never makes") as caught:
        fd = os.open(_data(cache), os.O_RDONLY)
        try:
            walk(fd, _data(cache))
        finally:
            os.close(fd)
    assert caught.value.foreign


@pytest.mark.timeout(60)
def test_the_header_check_reads_what_lmdb_wrote(warmed):
    _, cache = warmed
    fd = os.open(_data(cache), os.O_RDONLY)
    try:
        header = read_header(fd, _data(cache))
        assert header is not None and header.page_size == 4096
        assert header.needed == os.fstat(fd).st_size  # LMDB grows the file page by page
    finally:
        os.close(fd)


# -- a run that ends normally leaves a store that survives a reboot --------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_that_ends_normally_leaves_no_crash_mark(tmp_path, workers):
    root = make_jpeg_folder(tmp_path / "data", images=IMAGES, classes=2, size=(64, 48))
    cache = tmp_path / "cache"
    code, counts, err = train(root, cache, workers)
    assert code == 0 and counts["seen"] == IMAGES, err
    assert _marks(cache) == []
    stats = cli("cache", "stats", str(cache), "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["entries"] == IMAGES + 1  # and the listing
    assert _marks(cache) == []
    # The next boot: no mark, so nothing is thrown away.
    code, counts, err = train(root, cache, workers, FASTLOAD_BOOT_ID="0" * 8 + "-0000-0000-0000-" + "0" * 12)
    assert code == 0 and "went down" not in err, err
    assert json.loads(cli("cache", "stats", str(cache), "--json").stdout)["entries"] == IMAGES + 1
    if workers == "0":
        assert counts["misses"] == 0 and counts["hits"] >= IMAGES


@pytest.mark.timeout(300)
def test_a_killed_writer_leaves_its_mark_and_a_reboot_remakes_the_store(tmp_path):
    """The other side of the rule: commits not known to be on disk are not trusted after a boot."""
    root = make_jpeg_folder(tmp_path / "data", images=IMAGES, classes=2, size=(64, 48))
    cache = tmp_path / "cache"
    script = ("import os, sys, signal\nfrom fastload.cache import DiskTier\n"
              "t = DiskTier(sys.argv[1])\nt.put('k', b'v')\nos.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.run([sys.executable, "-c", script, str(cache)], cwd=REPO, env=_env(), timeout=120,
                         check=False)
    assert run.returncode == -signal.SIGKILL and len(_marks(cache)) == 1
    code, _, err = train(root, cache, FASTLOAD_BOOT_ID="1" * 8 + "-0000-0000-0000-" + "0" * 12)
    assert code == 0 and "went down" in err and _marks(cache) == []


# -- read-only cache directories ------------------------------------------------------------


_READ_ONLY_SCRIPT = """
set -u
mount --bind "$CACHE" "$CACHE" && mount -o remount,ro,bind "$CACHE" || exit 77
run() { echo "== $1"; shift; "$@" 2>&1; echo "rc=$?"; }
run train "$PY" -c "$TRAIN" "$ROOT" "$CACHE"
run stats "$FASTLOAD" cache stats "$CACHE" --json
run verify "$FASTLOAD" cache verify "$CACHE"
run drop "$FASTLOAD" cache verify "$CACHE" --drop
run clear "$FASTLOAD" cache clear "$CACHE"
run warm "$FASTLOAD" cache warm "$ROOT" --cache "$CACHE"
"""


def _read_only_run(root: Path, cache: Path) -> dict[str, tuple[int, str]]:
    """Each step of _READ_ONLY_SCRIPT in a private mount namespace where ``cache`` is a
    read-only bind mount: {step: (exit code, its output)}. Skips where mounting is refused."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare (util-linux) to mount a read-only filesystem")
    run = subprocess.run([unshare, "-m", "--propagation", "private", "bash", "-c", _READ_ONLY_SCRIPT],
                         capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
                         env=_env(CACHE=str(cache), ROOT=str(root), PY=sys.executable, TRAIN=TRAIN,
                                  FASTLOAD=FASTLOAD))
    if run.returncode == 77 or (run.returncode != 0 and "== train" not in run.stdout):
        pytest.skip(f"cannot mount a read-only filesystem here: {run.stderr.strip()[:200]}")
    steps: dict[str, tuple[int, str]] = {}
    for block in ("\n" + run.stdout).split("\n== ")[1:]:
        name, _, rest = block.partition("\n")
        body, _, code = rest.rpartition("rc=")
        steps[name] = (int(code.split()[0]), body)
    return steps


@pytest.mark.timeout(600)
def test_a_read_only_cache_serves_what_it_holds_and_the_commands_say_why_in_one_line(warmed):
    root, cache = warmed
    steps = _read_only_run(root, cache)
    code, out = steps["train"]
    assert code == 0 and "Traceback" not in out, out
    assert json.loads(out.strip().splitlines()[-1])["hits"] == IMAGES
    assert out.count("disk cache ") == 1 and "read-only (its filesystem is mounted read-only)" in out
    code, out = steps["stats"]
    assert code == 0 and '"read_only": "its filesystem is mounted read-only"' in out
    assert steps["verify"][0] == 0
    for step in ("drop", "clear", "warm"):
        code, out = steps[step]
        assert code == 2 and out.count("\n") == 1 and "read-only" in out and "Traceback" not in out, (step, out)
    assert _marks(cache) == []


@pytest.mark.timeout(600)
def test_a_damaged_store_on_a_read_only_filesystem_is_not_read(warmed):
    root, cache = warmed
    _cut_to_a_third(_data(cache))
    steps = _read_only_run(root, cache)
    code, out = steps["train"]
    assert code == 0 and "Traceback" not in out, out
    assert json.loads(out.strip().splitlines()[-1])["misses"] == IMAGES
    assert out.count("disk cache ") == 1 and "is damaged" in out
    assert steps["stats"][0] == 1 and steps["verify"][0] == 1
    assert _set_aside(cache) == []  # nothing could be moved, nothing was


@pytest.mark.timeout(300)
def test_a_cache_this_user_may_not_write_is_read(warmed, unprivileged):
    root, cache = warmed
    for where, _, files in os.walk(cache):
        for name in files:
            os.chmod(Path(where) / name, 0o444)
        os.chmod(where, 0o555)
    try:
        run = run_unprivileged(TRAIN, str(root), str(cache), timeout=240)
    finally:
        for where, _, _ in os.walk(cache):
            os.chmod(where, 0o755)
    # LMDB needs its lock file to read safely beside writers: the store is not read.
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["misses"] == IMAGES
    assert run.stderr.count("disk cache ") == 1 and "may not write it" in run.stderr
    assert "cannot open the packed store" in run.stderr


@pytest.mark.timeout(300)
def test_an_immutable_cache_directory_is_read(warmed):
    root, cache = warmed
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("needs chattr (e2fsprogs)")
    dirs = [str(cache), str(cache / "packed")]
    made = subprocess.run([chattr, "+i", *dirs], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"this filesystem has no immutable flag: {made.stderr.strip()}")
    try:
        code, counts, err = train(root, cache)
    finally:
        subprocess.run([chattr, "-i", *dirs], check=True)
    assert code == 0 and counts["hits"] == IMAGES and "Traceback" not in err, err
    assert err.count("disk cache ") == 1 and "an immutable directory" in err
