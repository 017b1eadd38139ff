"""A shard's labels in a small file beside it (``x.tar`` -> ``x.labels``), written by
``fastload pack``.

NOTE [the labels file]
A label is a member of its own in a WebDataset shard (``<key>.cls``: a few bytes after every
image), so indexing a shard reads them where they lie. Merged across the gaps between them
(NOTE [reading through small gaps]) that is few requests, but on shards of small images it
is most of the shard's bytes: a dataset's worth of reading to build its index once. So
``fastload pack`` writes, beside each shard and its DALI index, the same labels as one text
file::

    fastload-labels v2 <shard bytes> <samples> <xxh3-64 of the index file>
    <label of sample 0>
    <label of sample 1>
    ...

in the order of the shard's samples (its index file's rows), and :func:`parse_labels` reads
it back. It is used only beside an index file and only where it matches what it describes:
the shard's size, the index file's sample count and (v2) the index file's own bytes. One
that does not (a shard rewritten by another tool, a file cut short) is named in a warning
and the label members are read from the shard instead. Size and count alone miss a shard
written again with the same samples in another order (the same bytes in all, the same
count) whose index file the other tool wrote anew: the stale labels would be served in the
old order, every one silently wrong; its index file's digest tells. A v1 file (size and
count only, written before) is still read. Tools that do not know the file ignore it:
webdataset, wids and DALI read the shard and its index only.

Example::

    >>> write_labels(1_048_576, [3, 0, 7], index_text)
    'fastload-labels v2 1048576 3 9f0c...\\n3\\n0\\n7\\n'
    >>> parse_labels(_, shard_bytes=1_048_576, samples=3, index_text=index_text,
    ...              where="s3://b/x.labels")
    [3, 0, 7]
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

__all__ = ["index_digest", "labels_url_of", "parse_labels", "write_labels"]

MAGIC = "fastload-labels"
VERSION = "v2"


def labels_url_of(shard_url: str) -> str:
    """Where a shard's labels file is: ``x.tar`` -> ``x.labels``."""
    return (shard_url[:-4] if shard_url.endswith(".tar") else shard_url) + ".labels"


def index_digest(index_text: str) -> str:
    """The digest of a shard's index file that its labels file records."""
    return xxhash.xxh3_64_hexdigest(index_text.encode())


def write_labels(shard_bytes: int, labels: Sequence[int], index_text: str) -> str:
    """The labels file of a shard of ``shard_bytes`` bytes whose samples have ``labels``,
    described by the index file ``index_text``."""
    return "".join([f"{MAGIC} {VERSION} {shard_bytes} {len(labels)} {index_digest(index_text)}\n",
                    *(f"{int(label)}\n" for label in labels)])


def parse_labels(text: str, *, shard_bytes: int, samples: int, index_text: str,
                 where: str) -> list[int]:
    """The labels in ``text`` (the file at ``where``). Raises ValueError saying why when it
    is not a labels file or describes another shard than one of ``shard_bytes`` bytes and
    ``samples`` samples with the index file ``index_text``."""
    lines = text.split("\n")
    head = lines[0].split()
    fields = {"v1": 4, VERSION: 5}.get(head[1] if len(head) > 1 else "")  # v1: no digest
    if head[:1] != [MAGIC] or fields is None or len(head) != fields:
        raise ValueError(f"{where} is not a fastload labels file (first line {lines[0][:80]!r})")
    try:
        size, count = int(head[2]), int(head[3])
        labels = [int(line) for line in lines[1:count + 1]]
    except ValueError as exc:
        raise ValueError(f"{where} is damaged: {exc}") from None
    if (size, count) != (shard_bytes, samples):
        raise ValueError(f"{where} describes a shard of {size} bytes and {count} samples; the "
                         f"shard has {shard_bytes} bytes and its index {samples} samples")
    if fields == 5 and head[4] != index_digest(index_text):
        raise ValueError(f"{where} was written for another index file than the shard's (the "
                         "shard and its index were written again since)")
    if len(labels) != count or any(line for line in lines[count + 1:]):
        raise ValueError(f"{where} holds {len(labels)} labels, not the {count} it announces")
    return labels
