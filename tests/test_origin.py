"""read_whole returns the whole object on every filesystem, also where ranges are unsupported."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import fsspec
import pytest

from fastload.io.origin import read_whole


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
