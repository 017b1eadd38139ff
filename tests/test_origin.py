"""read_whole returns the whole object on every filesystem, also where ranges are unsupported;
aread_whole (its coroutine form) reads the same, retries transient errors, never a missing
object, and gives up at its deadline; read_local reads a file as it is, whatever a stat before
it said."""

from __future__ import annotations

import functools
import http.server
import os
import socket
import threading
from pathlib import Path
from typing import ClassVar

import fsspec
import fsspec.asyn
import pytest

from fastload.errors import StorageError
from fastload.io.origin import aread_whole, read_local, read_local_range, read_whole
from fastload.io.versions import local_version


@pytest.fixture
def plain_http(tmp_path: Path):
    """Python's http.server on loopback: it ignores Range headers and answers 200."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_read_whole_over_local_files_and_a_server_without_range_support(tmp_path, plain_http):
    data = bytes(range(256)) * 400
    (tmp_path / "a.bin").write_bytes(data)
    assert read_whole(fsspec.filesystem("file"), str(tmp_path / "a.bin")) == data
    http = fsspec.filesystem("http", skip_instance_cache=True)
    assert read_whole(http, f"{plain_http}/a.bin") == data


class _Flaky(http.server.SimpleHTTPRequestHandler):
    """Answers 503 to the first ``failures`` GETs of each path, then serves the file."""

    failures = 2
    seen: ClassVar[dict[str, int]] = {}

    def do_GET(self):
        count = self.seen[self.path] = self.seen.get(self.path, 0) + 1
        if count <= self.failures:
            self.send_error(503, "busy")
            return
        super().do_GET()

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def flaky_http(tmp_path: Path):
    _Flaky.seen = {}
    handler = functools.partial(_Flaky, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", _Flaky.seen
    server.shutdown()
    server.server_close()
    thread.join()


def _aread(fs, path, **kwargs):
    return fsspec.asyn.sync(fs.loop, aread_whole, fs, path, **kwargs)


def test_aread_whole_reads_what_read_whole_reads(tmp_path, plain_http):
    data = bytes(range(256)) * 400
    (tmp_path / "a.bin").write_bytes(data)
    http = fsspec.filesystem("http", skip_instance_cache=True)
    assert _aread(http, f"{plain_http}/a.bin") == data == read_whole(http, f"{plain_http}/a.bin")


def test_aread_whole_retries_transient_errors_but_never_a_missing_object(tmp_path, flaky_http):
    url, seen = flaky_http
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    http = fsspec.filesystem("http", skip_instance_cache=True)
    assert _aread(http, f"{url}/a.bin") == b"x" * 1000
    assert seen["/a.bin"] == 3  # two 503s, then the object (ATTEMPTS = 3)

    _Flaky.failures = 0
    try:
        with pytest.raises(FileNotFoundError):
            _aread(http, f"{url}/missing.bin")
    finally:
        _Flaky.failures = 2
    assert seen["/missing.bin"] == 1


def test_aread_whole_gives_up_at_its_deadline_on_a_stalled_server():
    with socket.socket() as server:  # accepts connections (the backlog), never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        http = fsspec.filesystem("http", skip_instance_cache=True)  # no read timeout of its own
        with pytest.raises(TimeoutError) as caught:
            _aread(http, f"http://127.0.0.1:{port}/a.bin", deadline=0.5)
    # fsspec's sync() re-raises a coroutine's TimeoutError as its own, the original as cause
    error = caught.value if "no complete" in str(caught.value) else caught.value.__cause__
    assert isinstance(error, TimeoutError) and "no complete answer within 0.5 s" in str(error)


def test_read_local_with_the_version_a_stat_gave(tmp_path):
    """NOTE [a stat per local read]: ``expect`` stands for the fstat before the read; a file
    rewritten, replaced or made a FIFO since the stat is still read as it is now."""
    path = tmp_path / "a.jpg"
    path.write_bytes(b"first")
    stated = local_version(os.stat(path))
    assert read_local(str(path), expect=stated) == (b"first", stated)
    path.write_bytes(b"second, longer")  # after the stat, before the read
    data, version = read_local(str(path), expect=stated)
    assert data == b"second, longer" and version == local_version(os.stat(path)) != stated
    other = tmp_path / "b.jpg"
    other.write_bytes(b"third!")
    stated = local_version(os.stat(path))
    os.replace(other, path)  # another inode renamed into place
    assert read_local(str(path), expect=stated) == (b"third!", local_version(os.stat(path)))
    os.remove(path)
    os.mkfifo(path)
    with pytest.raises(StorageError, match="not a regular file"):
        read_local(str(path), expect=stated)
    os.remove(path)
    with pytest.raises(FileNotFoundError):
        read_local(str(path), expect=stated)


def test_read_local_range_reads_a_members_bytes_and_stops_at_the_end(tmp_path):
    path = tmp_path / "shard.tar"
    data = os.urandom(10_000)
    path.write_bytes(data)
    assert read_local_range(str(path), 512, 3000) == data[512:3512]
    assert read_local_range(str(path), 9_000, 3000) == data[9_000:]  # cut at the end
    assert read_local_range(str(path), 20_000, 10) == b""
    assert read_local_range(str(path), 0, 0) == b""
    with pytest.raises(FileNotFoundError):
        read_local_range(str(tmp_path / "missing.tar"), 0, 10)
    fifo = tmp_path / "fifo.tar"
    os.mkfifo(fifo)
    with pytest.raises(StorageError, match="fifo.tar is not a regular file"):
        read_local_range(str(fifo), 0, 10)  # refused at once, never waiting for a writer
