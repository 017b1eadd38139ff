"""A shard's labels in a small file beside it (``x.tar`` -> ``x.labels``), written by
``fastload pack``.

NOTE [the labels file]
A label is a member of its own in a WebDataset shard (``<key>.cls``: a few bytes after every
image), so indexing a shard reads them where they lie. Merged across the gaps between them
(NOTE [reading through small gaps]) that is few requests, but on shards of small images it
is most of the shard's bytes: a dataset's worth of reading to build its index once. So
``fastload pack`` writes, beside each shard and its DALI index, the same labels as one text
file::

    fastload-labels v1 <shard bytes> <samples>
    <label of sample 0>
    <label of sample 1>
    ...

in the order of the shard's samples (its index file's rows), and :func:`parse_labels` reads
it back. It is used only beside an index file and only where it matches what it describes:
the shard's size and the index file's sample count; one that does not (a shard rewritten by
another tool, a file cut short) is named in a warning and the label members are read from
the shard instead. Tools that do not know the file ignore it: webdataset, wids and DALI read
the shard and its index only.

Example::

    >>> write_labels(1_048_576, [3, 0, 7])
    'fastload-labels v1 1048576 3\\n3\\n0\\n7\\n'
    >>> parse_labels(_, shard_bytes=1_048_576, samples=3, where="s3://b/x.labels")
    [3, 0, 7]
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["labels_url_of", "parse_labels", "write_labels"]

MAGIC = "fastload-labels"
VERSION = "v1"


def labels_url_of(shard_url: str) -> str:
    """Where a shard's labels file is: ``x.tar`` -> ``x.labels``."""
    return (shard_url[:-4] if shard_url.endswith(".tar") else shard_url) + ".labels"


def write_labels(shard_bytes: int, labels: Sequence[int]) -> str:
    """The labels file of a shard of ``shard_bytes`` bytes whose samples have ``labels``."""
    return "".join([f"{MAGIC} {VERSION} {shard_bytes} {len(labels)}\n",
                    *(f"{int(label)}\n" for label in labels)])


def parse_labels(text: str, *, shard_bytes: int, samples: int, where: str) -> list[int]:
    """The labels in ``text`` (the file at ``where``). Raises ValueError saying why when it
    is not a labels file or describes another shard than one of ``shard_bytes`` bytes and
    ``samples`` samples."""
    lines = text.split("\n")
    head = lines[0].split()
    if len(head) != 4 or head[:2] != [MAGIC, VERSION]:
        raise ValueError(f"{where} is not a fastload labels file (first line {lines[0][:80]!r})")
    try:
        size, count = int(head[2]), int(head[3])
        labels = [int(line) for line in lines[1:count + 1]]
    except ValueError as exc:
        raise ValueError(f"{where} is damaged: {exc}") from None
    if (size, count) != (shard_bytes, samples):
        raise ValueError(f"{where} describes a shard of {size} bytes and {count} samples; the "
                         f"shard has {shard_bytes} bytes and its index {samples} samples")
    if len(labels) != count or any(line for line in lines[count + 1:]):
        raise ValueError(f"{where} holds {len(labels)} labels, not the {count} it announces")
    return labels
