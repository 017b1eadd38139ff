"""WebDataset tar shards read by their headers: members, DALI index files.

A WebDataset shard is a plain (ustar/pax/gnu) tar file whose members are grouped into
samples by *key*: the member's name up to the first dot of its last path part
(``train/n0144_10026.jpg`` and ``train/n0144_10026.cls`` are one sample, key
``train/n0144_10026``, extensions ``jpg`` and ``cls``). Only the 512-byte headers say where
each member's bytes are, so an index needs the headers, not the images: :func:`walk_members`
reads them with range reads of :data:`WALK_BLOCK` bytes (small members such as labels come in
the same read), and an index file next to the shard (DALI's ``wds2idx`` format, v1.2, which
``fastload pack`` writes) saves even that.

Example::

    >>> split_key("dir/a.b.jpg")
    ('dir/a', 'b.jpg')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "BLOCK",
    "DALI_INDEX_VERSION",
    "Member",
    "WALK_BLOCK",
    "index_url_of",
    "member_header",
    "parse_dali_index",
    "split_key",
    "walk_members",
    "write_dali_index",
]

BLOCK = 512
"""Bytes of a tar header (and the unit members are padded to)."""
WALK_BLOCK = 64 * 1024
"""Bytes of one range read while walking headers: a header, and small members after it."""

DALI_INDEX_VERSION = "v1.2"
_REGULAR = (b"0", b"\0", b"7")  # type flags of a regular file's header


ReadAt = Callable[[int, int], bytes]
"""``(offset, length) -> bytes`` of a shard (fewer bytes at its end)."""


@dataclass(frozen=True)
class Member:
    """One regular file of a tar: its name, where its bytes start and how many there are."""

    name: str
    offset: int
    size: int
    data: bytes | None = None  # its bytes, when the walk read them with the header (small ones)


def split_key(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name by webdataset's rule (first dot of the last part)."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1:]


def index_url_of(shard_url: str) -> str:
    """Where a shard's index file is looked for: ``x.tar`` -> ``x.idx`` (DALI's naming)."""
    return (shard_url[:-4] if shard_url.endswith(".tar") else shard_url) + ".idx"


def _number(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes past 8 GiB
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.rstrip(b"\0 ").strip()
    return int(text, 8) if text else 0


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, if it has one."""
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        record = data[space + 1: pos + length - 1]
        key, _, value = record.partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "surrogateescape")
        pos += length
    return None


def _checksum_ok(header: bytes) -> bool:
    return _number(header[148:156]) == sum(header[:148]) + 256 + sum(header[156:])


def _header_name(header: bytes) -> str:
    """A header's own name (ustar's prefix joined); a long name's first part only."""
    prefix = _text(header[345:500]) if header[257:262] == b"ustar" else ""
    return f"{prefix}/{_text(header[:100])}" if prefix else _text(header[:100])


def member_header(block: bytes) -> tuple[str, int] | None:
    """``(name, size)`` of the regular file whose header ``block`` (512 bytes) is, or None for
    a block that is not such a header. The name is the header's own: for a member with a long
    name (GNU or pax) only its first part."""
    if len(block) != BLOCK or not _checksum_ok(block) or block[156:157] not in _REGULAR:
        return None
    return _header_name(block), _number(block[124:136])


class _Blocks:
    """Range reads of a shard: :data:`WALK_BLOCK` bytes at a time, or ``through`` bytes
    while the headers lie dense enough that such a read holds four or more of them."""

    def __init__(self, read_at: ReadAt, size: int, through: int) -> None:
        self.read_at, self.size, self.through = read_at, size, through
        self.start, self.buf = 0, b""
        self.requests = 0
        self.headers = 0  # headers found since the last read

    def get(self, offset: int, length: int) -> bytes:
        end = offset + length
        if not (self.start <= offset and end <= self.start + len(self.buf)):
            window = WALK_BLOCK
            if self.headers and 4 * (offset - self.start) <= self.through * self.headers:
                window = max(window, self.through)
            want = min(max(length, window), max(0, self.size - offset))
            self.buf, self.start = self.read_at(offset, want), offset
            self.requests += 1
            self.headers = 0
        return self.buf[offset - self.start: end - self.start]


def walk_members(
    read_at: ReadAt, size: int, *, keep: Callable[[str], bool] = lambda name: False,
    where: str = "the tar file", through: int = WALK_BLOCK,
) -> Iterator[Member]:
    """The regular files of a tar of ``size`` bytes, in order, from their headers.

    ``keep(name)``: whether to read a member's bytes too (labels; they are usually in the
    same range read as the header). ``through``: the most bytes one read takes when samples
    are small enough that it holds several headers (NOTE [reading through small gaps] in
    :mod:`fastload.io.ranges`); at most :data:`WALK_BLOCK` (the default, or 0) reads
    :data:`WALK_BLOCK` at a time. Raises ValueError naming ``where`` for a header that is
    not a tar header (a checksum mismatch) or a member past the end of the file.
    """
    blocks = _Blocks(read_at, size, through)
    pos, long_name = 0, None
    while pos + BLOCK <= size:
        header = blocks.get(pos, BLOCK)
        if len(header) < BLOCK or header == bytes(BLOCK):
            return  # the end-of-archive blocks
        if not _checksum_ok(header):
            raise ValueError(f"{where}: the block at byte {pos} is not a tar header (checksum)")
        length, kind = _number(header[124:136]), header[156:157]
        data_at = pos + BLOCK
        if data_at + length > size:
            raise ValueError(
                f"{where}: the member at byte {pos} ends past the file's end ({size} bytes)")
        if kind in (b"L", b"x"):
            data = blocks.get(data_at, length)
            long_name = _text(data) if kind == b"L" else (_pax_path(data) or long_name)
        elif kind in _REGULAR:
            name = _header_name(header) if long_name is None else long_name
            data = blocks.get(data_at, length) if keep(name) else None
            blocks.headers += 1
            yield Member(name, data_at, length, data)
            long_name = None
        else:
            long_name = None if kind != b"g" else long_name  # directories, links, globals
        pos = data_at + (length + BLOCK - 1) // BLOCK * BLOCK


def parse_dali_index(text: str, where: str) -> list[list[tuple[str, int, int, str]]]:
    """The samples of a DALI ``wds2idx`` index (v1.1/v1.2): per sample, its members'
    ``(extension, data offset, size, name)`` (name "" in v1.1). Raises ValueError naming
    ``where`` for a text that is not one."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] not in ("v1.1", "v1.2"):
        raise ValueError(f"{where} is not a DALI webdataset index (first line {lines[:1]!r})")
    width = 4 if head[0] == "v1.2" else 3
    samples = []
    for line in lines[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) % width:
            raise ValueError(f"{where}: a line of {len(fields)} fields is not {width} per member")
        samples.append([
            (fields[i], int(fields[i + 1]), int(fields[i + 2]), fields[i + 3] if width == 4 else "")
            for i in range(0, len(fields), width)
        ])
    if len(samples) != int(head[1]):
        raise ValueError(f"{where} says {head[1]} samples but lists {len(samples)}")
    return samples


def write_dali_index(samples: list[list[tuple[str, int, int, str]]]) -> str:
    """The text of a DALI ``wds2idx`` v1.2 index of ``samples`` (see :func:`parse_dali_index`)."""
    lines = [f"{DALI_INDEX_VERSION} {len(samples)}"]
    lines += [" ".join(f"{e} {o} {s} {n}" for e, o, s, n in members) for members in samples]
    return "\n".join(lines) + "\n"
