"""How fastload reads one whole object from its origin storage: one request, not two.

NOTE [one GET per object]: s3fs's ``cat_file(path)`` first asks for the object's size (a HEAD
request, unless its listing cache already holds it) to decide whether to download the object
in concurrent chunks. For the objects a data loader reads (images, small records) that round
trip doubles the requests and the latency for nothing. A read from offset 0 sends one GET
with ``Range: bytes=0-`` and returns the whole object on every fsspec filesystem (local
files seek to 0; HTTP servers without range support answer 200 with the whole body).
Objects known to be large (sharded archives) are read by :mod:`fastload.bench.throughput`
through a file object instead.
"""

from __future__ import annotations

from typing import Any


def read_whole(fs: Any, path: str) -> bytes:
    """The whole object at ``path`` of fsspec filesystem ``fs``, in one request.

    Example::

        >>> fs = fsspec.filesystem("s3")
        >>> data = read_whole(fs, "bucket/train/cat/0001.jpg")   # one GET, no HEAD
    """
    return fs.cat_file(path, start=0)
