"""The disk cache never adopts, follows into, overwrites or deletes a user's files: a user's
directory is refused, symlinks planted in a cache are never followed, `clear` deletes only
what it can prove is its own, and `verify` names everything else. Real files, real
symlinks, the real command line (``fastload.cli.main``)."""

import json
import os
import stat

import pytest

from fastload import ImageFolder
from fastload.cache import CacheConfig, DiskTier, open_cache
from fastload.cache.entry import encode_header
from fastload.cache.keys import digest
from click.testing import CliRunner

from fastload.cli import cli, main
from fastload.errors import CacheError

KEY = "s3://bucket/train/a.jpg#v=3:etag"
NAME = digest(KEY)


def snapshot(root):
    """Every name below ``root`` (symlinks not followed): bytes and mtime of files, link targets."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    seen[rel] = ("file", f.read(), st.st_mtime_ns)
            else:
                seen[rel] = ("other", stat.S_IFMT(st.st_mode))
    return seen


def run(*args):
    """``fastload cache ARGS`` through click: (exit code, stdout, the fastload error if any)."""
    result = CliRunner().invoke(cli, ["cache", *map(str, args)])
    error = result.exception if isinstance(result.exception, CacheError) else None
    assert error is not None or result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, str(error or "")


def run_main(capsys, *args):
    """``fastload cache ARGS`` through ``fastload.cli.main``: (exit code, stdout, stderr)."""
    code = main(["cache", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def outside(tmp_path):
    """A user's directory next to the cache, with a file that holds a valid entry of KEY."""
    root = tmp_path / "home"
    (root / "photos").mkdir(parents=True)
    (root / "photos" / "holiday.jpg").write_bytes(b"\xff\xd8 a holiday")
    (root / "victim.bin").write_bytes(encode_header(KEY, b"user data") + b"user data")
    return root


def user_directory(path):
    (path / "entries" / "2024").mkdir(parents=True)
    (path / "entries" / "2024" / "holiday.jpg").write_bytes(b"\xff\xd8 holiday")
    (path / "tmp").mkdir()
    (path / "tmp" / "notes.txt").write_text("notes")
    (path / "used").write_text("my own file called used\n")
    return path


@pytest.mark.timeout(60)
def test_a_user_directory_is_refused_everywhere_and_left_byte_identical(tmp_path, jpeg_root, capsys):
    home = user_directory(tmp_path / "dir")
    before = snapshot(home)
    for open_it in (
        lambda: DiskTier(home),
        lambda: DiskTier(home, create=False),
        lambda: open_cache(CacheConfig(disk=home, disk_size="1MB")),
        lambda: ImageFolder(jpeg_root, cache=str(home)),
    ):
        with pytest.raises(CacheError, match="is not empty and not a fastload cache"):
            open_it()
    for args in (("warm", jpeg_root, "--cache", home), ("clear", home), ("verify", home),
                 ("verify", home, "--drop"), ("stats", home)):
        code, out, err = run_main(capsys, *args)
        assert code == 2, (args, out, err)
        assert f"{home} is not empty and not a fastload cache" in err and "entries" in err
        assert len(err.strip().splitlines()) == 1  # one line: why, and what to do
    assert snapshot(home) == before


@pytest.mark.timeout(30)
def test_a_marker_fastload_did_not_write_is_refused(tmp_path, capsys):
    home = tmp_path / "dir"
    home.mkdir()
    (home / "fastload-cache.json").write_text(json.dumps({"format": 1, "default_size": 10}))
    (home / "used").write_text("mine")
    before = snapshot(home)
    with pytest.raises(CacheError, match="was not written by this fastload"):
        DiskTier(home)
    code, _, err = run_main(capsys, "clear", home)
    assert code == 2 and "no magic" in err
    assert snapshot(home) == before


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["empty", "new"])
def test_an_empty_or_new_directory_becomes_a_marked_cache(tmp_path, where):
    import fastload

    home = tmp_path / "a" / "b"
    if where == "empty":
        home.mkdir(parents=True)
    tier = DiskTier(home)
    assert tier.put(KEY, b"abc") and tier.get(KEY) == b"abc"
    marker = json.loads((home / "fastload-cache.json").read_text())
    assert marker["magic"] == "fastload cache directory" and marker["format"] == 2  # packed
    assert marker["fastload_version"] == fastload.__version__
    assert DiskTier(home, create=False).get(KEY) == b"abc"  # reopened, adopted by nobody


def _cache_with_a_neighbour(tmp_path, fmt="files"):
    tier = DiskTier(tmp_path / "c", format=fmt)
    assert tier.put("s3://bucket/other#v=1", b"neighbour")
    return tier


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plant", ["subdir", "entry", "fifo"])
def test_a_symlink_below_entries_is_never_followed(tmp_path, outside, plant, capsys):
    tier = _cache_with_a_neighbour(tmp_path)
    sub = tier.directory / "entries" / NAME[:2]
    if plant == "subdir":  # entries/<xx> -> a user's directory
        if sub.exists():
            for f in sub.iterdir():
                f.unlink()
            sub.rmdir()
        sub.symlink_to(outside)
        (outside / NAME).symlink_to(outside / "victim.bin")  # a valid entry, through the link
        planted = sub
    elif plant == "entry":  # entries/<xx>/<hash> -> a user's file holding a valid entry
        sub.mkdir(exist_ok=True)
        (sub / NAME).symlink_to(outside / "victim.bin")
        planted = sub / NAME
    else:  # a FIFO where the entry belongs: a read must not hang
        sub.mkdir(exist_ok=True)
        os.mkfifo(sub / NAME)
        planted = sub / NAME
    before = snapshot(outside)

    assert tier.get(KEY) is None  # never read through it
    assert not tier.contains(KEY) and KEY not in set(tier.keys())
    assert tier.put(KEY, b"fresh") is False  # never written through it
    tier.delete(KEY)
    code, out, _ = run("verify", tier.directory, "--drop")
    assert code == 1 and f"FOREIGN {planted}" in out
    code, out, _ = run("clear", tier.directory)
    assert code == 0 and "1 entries" in out and f"LEFT {planted}" in out
    assert os.path.lexists(planted)
    assert snapshot(outside) == before
    assert tier.get("s3://bucket/other#v=1") is None  # the cache's own entry was cleared


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["used", "stats.json", "tmp", "locks", ".index.lock", "fastload-cache.json"])
def test_a_symlinked_fixed_name_is_refused_when_the_cache_opens(tmp_path, outside, jpeg_root, name, capsys):
    tier = _cache_with_a_neighbour(tmp_path)
    tier.close()
    home = tier.directory
    target = outside / ("photos" if name in ("tmp", "locks") else "victim.bin")
    if name == "fastload-cache.json":  # a copy of a real marker, outside
        target = outside / "marker.json"
        target.write_bytes((home / name).read_bytes())
    planted = home / name
    if planted.is_dir():
        os.rename(planted, home / "moved-away")
    else:
        planted.unlink(missing_ok=True)
    planted.symlink_to(target)
    before = snapshot(outside)

    with pytest.raises(CacheError, match=rf"{name}.* symlink to {target}"):
        DiskTier(home)
    for args in (("warm", jpeg_root, "--cache", home), ("verify", home), ("clear", home), ("stats", home)):
        code, _, err = run_main(capsys, *args)
        assert code == 2 and str(planted) in err and "symlink" in err, (args, err)
    assert snapshot(outside) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["used", "stats.json", "tmp", "locks", ".index.lock", "lockfile"])
def test_a_symlink_planted_while_a_process_uses_the_cache_is_not_followed(tmp_path, outside, name):
    tier = DiskTier(tmp_path / "c", size="1MB", format="files")
    cache = open_cache({"disk": tier.directory})
    home = tier.directory
    if name == "lockfile":
        stripe = int(NAME[:3], 16) % 4096
        planted = home / "locks" / f"{stripe:03x}.lock"
    else:
        planted = home / name
    target = outside / ("photos" if name in ("tmp", "locks") else "victim.bin")
    if planted.is_dir():
        os.rename(planted, home / f"{name}-moved")  # the open descriptor still points here
    else:
        planted.unlink(missing_ok=True)
    planted.symlink_to(target)
    before = snapshot(outside)

    tier.put(KEY, b"value")
    tier.get(KEY)
    with tier.lock(KEY, timeout=1) as got:
        assert got is (name != "lockfile")  # a foreign lock file is not used
    tier.delete(KEY)
    tier.close()
    src = tmp_path / "obj.bin"
    src.write_bytes(b"an object")
    import fsspec

    assert cache.read(fsspec.filesystem("file"), str(src)) == b"an object"  # training goes on
    cache.close()
    assert snapshot(outside) == before
    assert os.path.islink(planted)
    if name == "lockfile":  # verify names it; any other planted name refuses the next open
        assert [p for p, _ in tier.verify().foreign] == [str(planted)]
    else:
        with pytest.raises(CacheError, match="symlink"):
            DiskTier(home)


@pytest.mark.timeout(30)
def test_a_hard_linked_used_file_is_not_written(tmp_path, outside):
    tier = DiskTier(tmp_path / "c", format="files")  # format "packed" keeps no used file
    assert tier.put("s3://bucket/other#v=1", b"neighbour")
    (tier.directory / "used").unlink()
    os.link(outside / "victim.bin", tier.directory / "used")
    before = snapshot(outside)
    assert tier.put(KEY, b"value") is False  # the counter cannot be written: not stored as counted
    tier.delete("s3://bucket/other#v=1")
    assert snapshot(outside) == before


@pytest.mark.timeout(60)
def test_clear_deletes_only_its_own_entries_and_lists_the_rest(tmp_path, capsys):
    tier = DiskTier(tmp_path / "c", format="files")
    for i in range(5):
        assert tier.put(f"s3://b/{i}#v=1", b"x" * 100)
    home = tier.directory
    own = tier.path_of("s3://b/0#v=1")
    foreign = {
        own.parent / "notes.txt": b"a note",                               # not an entry name
        home / "entries" / "2024" / "holiday.jpg": b"\xff\xd8",            # not an entry subdir
        home / "entries" / own.parent.name / ("ff" + "0" * 30): b"x",      # in the wrong subdir
        home / "tmp" / "notes.txt": b"mine",                               # not a temp name
        home / "README": b"mine",                                          # not fastload's
    }
    for path, data in foreign.items():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    misnamed = tier.path_of("s3://b/1#v=1")  # an entry whose header names another key
    misnamed.write_bytes(encode_header("s3://b/elsewhere#v=1", b"x") + b"x")
    (home / "tmp" / ".fastload-tmp-0123abcd").write_bytes(b"stale")   # fastload's own temp file

    code, out, _ = run("clear", home)
    assert code == 0 and "cleared" in out and " 4 entries" in out
    for path, data in foreign.items():
        shown = path.parent if path.parent.name == "2024" else path  # a foreign directory, whole
        assert path.read_bytes() == data and f"LEFT {shown}: " in out
    assert misnamed.exists() and f"LEFT {misnamed}" in out
    assert not (home / "tmp" / ".fastload-tmp-0123abcd").exists()
    assert not own.exists() and list(tier.keys()) == ["s3://b/elsewhere#v=1"]
    report = json.loads(run("clear", home, "--json")[1])
    assert report["entries"] == 0 and len(report["foreign"]) == len(foreign) + 1


@pytest.mark.timeout(60)
def test_verify_reports_an_entry_whose_header_key_was_altered(tmp_path, capsys, caplog):
    tier = DiskTier(tmp_path / "c", format="files")
    assert tier.put(KEY, b"payload")
    path = tier.path_of(KEY)
    path.write_bytes(encode_header("s3://bucket/forged#v=1", b"payload") + b"payload")
    code, out, _ = run("verify", tier.directory)
    assert code == 1 and "CORRUPT s3://bucket/forged#v=1" in out and "does not digest" in out
    report = tier.verify()
    assert report.checked == 1 and len(report.corrupt) == 1 and str(path) in report.corrupt[0][0]
    code, out, _ = run("verify", tier.directory, "--drop")
    assert code == 1 and "(deleted)" in out and not path.exists()
    assert run("verify", tier.directory)[0] == 0
    # and a training read drops such an entry, so the object is cached again
    assert tier.put(KEY, b"payload")
    path.write_bytes(encode_header("s3://bucket/forged#v=1", b"payload") + b"payload")
    assert tier.get(KEY) is None and "dropping corrupt cache entry" in caplog.text
    assert tier.put(KEY, b"payload") and tier.get(KEY) == b"payload"


@pytest.mark.timeout(60)
def test_stats_shows_the_budget_the_loader_used(tmp_path, jpeg_root, capsys):
    home = tmp_path / "c"
    ds = ImageFolder(jpeg_root, cache={"disk": str(home), "disk_size": "3MB"})
    ds[0]
    ds.cache.close()
    summary = json.loads(run("stats", home, "--json")[1])
    assert summary["budget"] == 3_000_000 and summary["budget_source"] == "disk_size"
    assert summary["entries"] == 2  # the image and the stored listing (docs/cache.md)
    code, out, _ = run("stats", home)
    assert code == 0 and "3000000, set by disk_size" in out
    assert DiskTier(home).budget == 3_000_000  # later opens without disk_size keep it
    fresh = json.loads(run("stats", DiskTier(tmp_path / "d").directory, "--json")[1])
    assert fresh["budget_source"] == "default" and fresh["budget"] > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb"])
def test_a_symlink_for_the_packed_store_is_never_opened(tmp_path, outside, name, capsys):
    tier = _cache_with_a_neighbour(tmp_path, "packed")
    tier.close()
    home = tier.directory
    planted = home / "packed" / name
    planted.unlink()
    planted.symlink_to(outside / "victim.bin")
    before = snapshot(outside)
    code, _, err = run_main(capsys, "verify", home)
    assert code == 2 and str(planted) in err and "symlink" in err
    with pytest.raises(CacheError, match="symlink"):
        DiskTier(home)
    assert snapshot(outside) == before


@pytest.mark.timeout(60)
def test_packed_clear_and_verify_leave_foreign_names_alone(tmp_path):
    tier = _cache_with_a_neighbour(tmp_path, "packed")
    assert tier.put(KEY, b"x" * (2 << 20))  # a large object: a file in entries/
    foreign = tier.directory / "packed" / "notes.txt"
    foreign.write_text("mine")
    code, out, _ = run("verify", tier.directory)
    assert code == 1 and f"FOREIGN {foreign}" in out and "0 corrupt" in out
    code, out, _ = run("clear", tier.directory)
    assert code == 0 and " 2 entries" in out and f"LEFT {foreign}" in out
    assert foreign.read_text() == "mine" and list(tier.keys()) == []
    assert not tier.path_of(KEY).exists() and tier.read_used() == 0
    assert (tier.directory / "packed" / "data.mdb").exists()  # emptied, not deleted
