"""A seeded corpus of damaged JPEGs: what a decoder meets in a real dataset, and worse.

Each mutation takes one well-formed JPEG and breaks it the way disks, downloads, buggy
encoders and hostile files do: cut short, bytes or bits flipped, segments duplicated,
zeroed, dropped or given a wrong length, junk before a marker, a marker inside the scan,
and the tables and headers the decoder trusts (SOF, DHT, DQT, SOS) broken field by field.
The same ``seed`` gives the same corpus, so a failure names a mutation that can be made again.

Example::

    >>> from fastload.testing.jpeg_mutations import base_jpegs, corpus
    >>> bases = base_jpegs()                       # name -> bytes: baseline, progressive, ...
    >>> items = corpus(bases, 300, seed=0)
    >>> items[0].name, items[0].detail
    ('420/truncate#0', 'cut at 588 of 5689 bytes (in the DHT segment)')
    >>> items[8].name, items[8].detail
    ('420/broken_sof#8', 'SOF0 at 158: sampling -> 19')

tests/test_jpeg_corpus.py runs it through both engines' decode paths and checks that they
agree on which files are corrupt (docs/reliability.md, "The threaded engine's failure model").
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
from PIL import Image

SOI, EOI, SOS = 0xD8, 0xD9, 0xDA
SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2})
DHT, DQT, DRI = 0xC4, 0xDB, 0xDD
_STANDALONE = frozenset({0x01, SOI, EOI, *range(0xD0, 0xD8)})  # no length field


@dataclass(frozen=True)
class Segment:
    """One marker segment: ``data[start:end]``, from its 0xFF to its end (a scan: its
    entropy-coded data included, up to the next marker that is not a restart marker).
    ``header_end``: the end of the marker's own fields (for a scan, where its data starts)."""

    marker: int
    start: int
    end: int
    header_end: int

    @property
    def payload(self) -> int:
        """Offset of the first byte after the marker and its length field."""
        return self.start + (2 if self.marker in _STANDALONE else 4)

    @property
    def length(self) -> int:
        """The length field's value (0 for a marker without one)."""
        return 0 if self.marker in _STANDALONE else self.header_end - self.start - 2


def segments(data: bytes) -> list[Segment]:
    """The marker segments of a JPEG after its SOI, in file order, up to and with EOI.

    Parsing stops (without an error) where the structure ends: at EOI, at a byte that is no
    marker, or at the end of the data.
    """
    out: list[Segment] = []
    pos = 2
    while pos + 1 < len(data) and data[pos] == 0xFF:
        while pos + 1 < len(data) and data[pos + 1] == 0xFF:  # fill bytes
            pos += 1
        if pos + 1 >= len(data):
            break
        marker = data[pos + 1]
        if marker in _STANDALONE:
            end = header_end = pos + 2
        else:
            if pos + 4 > len(data):
                break
            header_end = pos + 2 + int.from_bytes(data[pos + 2: pos + 4], "big")
            end = min(len(data), header_end)
        if marker == SOS:
            end = _scan_end(data, end)
        out.append(Segment(marker, pos, end, min(header_end, len(data))))
        if marker == EOI:
            break
        pos = end
    return out


def _scan_end(data: bytes, pos: int) -> int:
    """The offset of the first marker after entropy-coded data (restart markers belong to it)."""
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= len(data):
            return len(data)
        following = data[pos + 1]
        if following == 0 or 0xD0 <= following <= 0xD7 or following == 0xFF:
            pos += 1
            continue
        return pos


@dataclass(frozen=True)
class Mutation:
    """One damaged JPEG: ``name`` (base/kind#n) says how to make it again, ``detail`` what
    was done, ``data`` the bytes."""

    name: str
    detail: str
    data: bytes


Mutator = Callable[[random.Random, bytes, list[Segment]], tuple[str, bytes]]


def _pick(
    rng: random.Random, segs: list[Segment], markers: Collection[int] | None = None
) -> Segment | None:
    found = [s for s in segs if markers is None or s.marker in markers]
    return rng.choice(found) if found else None


def _where(segs: list[Segment], offset: int) -> str:
    for s in segs:
        if s.start <= offset < s.end:
            if s.marker == SOS and offset >= s.header_end:
                return "in the scan"
            return f"in the {_name(s.marker)} segment"
    return "after the last segment"


def _name(marker: int) -> str:
    names = {SOI: "SOI", EOI: "EOI", SOS: "SOS", DHT: "DHT", DQT: "DQT", DRI: "DRI",
             0xC0: "SOF0", 0xC1: "SOF1", 0xC2: "SOF2"}
    if 0xD0 <= marker <= 0xD7:
        return f"RST{marker - 0xD0}"
    if 0xE0 <= marker <= 0xEF:
        return f"APP{marker - 0xE0}"
    return names.get(marker, f"0x{marker:02X}")


def _scan_range(segs: list[Segment]) -> tuple[int, int]:
    scans = [s for s in segs if s.marker == SOS]
    scan = scans[0] if scans else segs[-1]
    return scan.header_end, max(scan.header_end + 1, scan.end)


def truncate(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    where = rng.choice(["anywhere", "late", "late", "before EOI", "header"])
    lo, hi = _scan_range(segs)
    if where == "late":  # the last tenth of the file: below most crops
        cut = rng.randrange(max(2, len(data) * 9 // 10), len(data))
    elif where == "before EOI":
        cut = len(data) - rng.choice([1, 2, 3])
    elif where == "header":
        cut = rng.randrange(2, lo)
    else:
        cut = rng.randrange(2, len(data))
    return f"cut at {cut} of {len(data)} bytes ({_where(segs, cut)})", data[:cut]


def flip_bytes(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    lo, hi = _scan_range(segs)
    span = (2, lo) if rng.random() < 0.4 else (lo, hi)
    out = bytearray(data)
    where = []
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(*span) if span[1] > span[0] else rng.randrange(2, len(data))
        out[at] ^= rng.randint(1, 255)
        where.append(at)
    return f"bytes {where} flipped ({_where(segs, where[0])})", bytes(out)


def flip_bit(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    at = rng.randrange(2, len(data))
    bit = rng.randrange(8)
    out = bytearray(data)
    out[at] ^= 1 << bit
    return f"bit {bit} of byte {at} flipped ({_where(segs, at)})", bytes(out)


def duplicate_segment(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    seg = _pick(rng, [s for s in segs if s.marker != EOI]) or segs[0]
    copy = data[seg.start: seg.end]
    return (f"{_name(seg.marker)} at {seg.start} duplicated",
            data[: seg.end] + copy + data[seg.end:])


def zero_segment(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    out = bytearray(data)
    seg = _pick(rng, [s for s in segs if s.marker not in _STANDALONE])
    if seg is None or (seg.marker == SOS and rng.random() < 0.5):
        lo, hi = _scan_range(segs)  # a run of the entropy-coded data, as a bad sector leaves
        start = rng.randrange(lo, hi)
        end = min(hi, start + rng.choice([16, 64, 512]))
        out[start:end] = bytes(end - start)
        return f"scan bytes {start}..{end} zeroed", bytes(out)
    end = seg.header_end
    out[seg.payload: end] = bytes(end - seg.payload)
    return f"{_name(seg.marker)} at {seg.start} zeroed (length kept)", bytes(out)


def drop_segment(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    seg = rng.choice(segs)
    return f"{_name(seg.marker)} at {seg.start} dropped", data[: seg.start] + data[seg.end:]


def junk_before_marker(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    seg = _pick(rng, segs) or segs[0]
    junk = bytes(rng.choice([0x00, 0x20, 0x7F, 0xAB]) for _ in range(rng.randint(1, 3)))
    return (f"{len(junk)} junk bytes before {_name(seg.marker)} at {seg.start}",
            data[: seg.start] + junk + data[seg.start:])


def bad_length(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    seg = _pick(rng, [s for s in segs if s.marker not in _STANDALONE])
    if seg is None:
        return truncate(rng, data, segs)
    length = seg.length
    new = rng.choice([0, 1, 2, 3, length - 1, length + 1, length + 7, 0xFFFF])
    new = max(0, min(0xFFFF, new))
    out = bytearray(data)
    out[seg.start + 2: seg.start + 4] = new.to_bytes(2, "big")
    return f"{_name(seg.marker)} at {seg.start}: length {length} -> {new}", bytes(out)


def _set(out: bytearray, at: int, value: int, width: int = 1) -> None:
    if at + width <= len(out):
        out[at: at + width] = value.to_bytes(width, "big")


def _fields_of(markers: Collection[int]) -> Callable[[Callable[..., str]], Mutator]:
    """A mutator from ``edit(rng, segment, out) -> what it did``, which changes fields of a
    random segment of ``markers`` in ``out`` (a copy of the file); bytes are flipped in a
    file without such a segment."""

    def wrap(edit: Callable[[random.Random, Segment, bytearray], str]) -> Mutator:
        def mutator(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
            seg = _pick(rng, segs, markers)
            if seg is None:
                return flip_bytes(rng, data, segs)
            out = bytearray(data)
            did = edit(rng, seg, out)
            return f"{_name(seg.marker)} at {seg.start}: {did}", bytes(out)

        mutator.__doc__ = edit.__doc__
        return mutator

    return wrap


@_fields_of(SOF_MARKERS)
def broken_sof(rng: random.Random, seg: Segment, out: bytearray) -> str:
    """Precision, height, width, component count, or a component's id, sampling or table."""
    p = seg.payload  # precision, height(2), width(2), components, then 3 bytes each
    field = rng.choice(["precision", "height", "width", "components", "sampling", "table", "id"])
    if field == "precision":
        value = rng.choice([0, 1, 12, 16, 255])
        _set(out, p, value)
    elif field in ("height", "width"):
        value = rng.choice([0, 1, 7, 17, 255, 1000, 1500, 4000, 65535])
        _set(out, p + (1 if field == "height" else 3), value, 2)
    elif field == "components":
        value = rng.choice([0, 2, 4, 5, 255])
        _set(out, p + 5, value)
    else:
        component = rng.randrange(max(1, out[p + 5] if p + 5 < len(out) else 1))
        offset = p + 6 + 3 * component + {"id": 0, "sampling": 1, "table": 2}[field]
        value = {"id": rng.choice([0, 2, 9, 255]),
                 "sampling": rng.choice([0x00, 0x13, 0x44, 0x51, 0xFF]),
                 "table": rng.choice([1, 3, 4, 255])}[field]
        _set(out, offset, value)
    return f"{field} -> {value}"


@_fields_of({DHT})
def broken_dht(rng: random.Random, seg: Segment, out: bytearray) -> str:
    """The table's class/id, a code count (too many codes), or a symbol."""
    p = seg.payload  # class/id, then 16 code counts, then the symbols
    field = rng.choice(["class", "count", "count", "symbol"])
    if field == "class":
        value = rng.choice([0x02, 0x04, 0x20, 0x13, 0xFF])
        _set(out, p, value)
        return f"class/id -> 0x{value:02X}"
    if field == "count":
        k = rng.randrange(16)
        value = rng.choice([0, 1, 17, 200, 255])
        _set(out, p + 1 + k, value)
        return f"count of {k + 1}-bit codes -> {value}"
    at = rng.randrange(p + 17, max(p + 18, seg.end))
    value = rng.randrange(256)
    _set(out, at, value)
    return f"symbol at {at} -> {value}"


@_fields_of({DQT})
def broken_dqt(rng: random.Random, seg: Segment, out: bytearray) -> str:
    """The table's precision/id, or a zero quantizer."""
    p = seg.payload  # precision/id, then 64 values
    if rng.random() < 0.5:
        value = rng.choice([0x04, 0x10, 0x1F, 0xF0])
        _set(out, p, value)
        return f"precision/id -> 0x{value:02X}"
    at = rng.randrange(p + 1, max(p + 2, seg.end))
    _set(out, at, 0)
    return f"value at {at} -> 0"


@_fields_of({SOS})
def broken_sos(rng: random.Random, seg: Segment, out: bytearray) -> str:
    """The component count, a selector, the table ids, or the spectral/approximation bytes."""
    p = seg.payload  # components, then 2 bytes each, then Ss, Se, Ah/Al
    n = out[p] if p < len(out) else 0
    field = rng.choice(["components", "selector", "tables", "Ss", "Se", "AhAl"])
    at = {"components": p, "selector": p + 1, "tables": p + 2, "Ss": p + 1 + 2 * n,
          "Se": p + 2 + 2 * n, "AhAl": p + 3 + 2 * n}[field]
    value = rng.choice([0, 1, 4, 5, 0x11, 0x3F, 0x40, 0xFF])
    _set(out, at, value)
    return f"{field} -> 0x{value:02X}"


def marker_in_scan(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    lo, hi = _scan_range(segs)
    at = rng.randrange(lo, hi)
    marker = rng.choice([0xD0, 0xD3, 0xD9, 0xDA, 0xC4, 0xDB, 0xC0, 0xE1, 0xFE])
    return (f"marker 0x{marker:02X} inserted at {at} ({_where(segs, at)})",
            data[:at] + bytes([0xFF, marker]) + data[at:])


def swap_segments(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    body = [s for s in segs if s.marker != EOI]
    if len(body) < 2:
        return truncate(rng, data, segs)
    i = rng.randrange(len(body) - 1)
    a, b = body[i], body[i + 1]
    return (f"{_name(a.marker)} at {a.start} and {_name(b.marker)} swapped",
            data[: a.start] + data[b.start: b.end] + data[a.start: a.end] + data[b.end:])


def after_eoi(rng: random.Random, data: bytes, segs: list[Segment]) -> tuple[str, bytes]:
    tail = rng.choice([b"\x00" * 16, b"junk after the image", data[2:200]])
    return f"{len(tail)} bytes after EOI", data + tail


MUTATORS: dict[str, Mutator] = {
    "truncate": truncate, "flip_bytes": flip_bytes, "flip_bit": flip_bit,
    "duplicate_segment": duplicate_segment, "zero_segment": zero_segment,
    "drop_segment": drop_segment, "junk_before_marker": junk_before_marker,
    "bad_length": bad_length, "broken_sof": broken_sof, "broken_dht": broken_dht,
    "broken_dqt": broken_dqt, "broken_sos": broken_sos, "marker_in_scan": marker_in_scan,
    "swap_segments": swap_segments, "after_eoi": after_eoi,
}
"""Each kind of damage by name; every one is applied in turn by :func:`corpus`."""


def mutate(data: bytes, kind: str, rng: random.Random) -> tuple[str, bytes]:
    """Apply the mutation ``kind`` of :data:`MUTATORS` to ``data``: (what was done, new bytes)."""
    return MUTATORS[kind](rng, data, segments(data))


def corpus(bases: dict[str, bytes], count: int, *, seed: int = 0) -> list[Mutation]:
    """``count`` mutations of the ``bases`` (name -> JPEG), every kind and base in turn.

    Mutation ``i`` depends only on ``(seed, i)`` and the bases, so any one of them can be
    made again alone.
    """
    kinds = list(MUTATORS)
    names = list(bases)
    out = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        base = names[(i // len(kinds)) % len(names)]
        rng = random.Random(f"{seed}:{i}")
        detail, data = mutate(bases[base], kind, rng)
        out.append(Mutation(f"{base}/{kind}#{i}", detail, data))
    return out


def base_jpegs(width: int = 128, height: int = 96) -> dict[str, bytes]:
    """Small well-formed JPEGs in the shapes a decoder takes different paths for.

    4:2:0 (Pillow's default), 4:4:4 with a restart marker every MCU row, progressive,
    grayscale, and Huffman-optimized 4:2:2; smooth gradients with noise, as photographs.
    """
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(xx * 0.09), 128 + 100 * np.cos(yy * 0.07),
                     128 + 100 * np.sin((xx + yy) * 0.05)], axis=-1)
    image = Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))
    options: dict[str, tuple[Image.Image, dict]] = {
        "420": (image, {"quality": 90}),
        "444-restart": (image, {"quality": 90, "subsampling": 0, "restart_marker_rows": 1}),
        "progressive": (image, {"quality": 85, "progressive": True}),
        "gray": (image.convert("L"), {"quality": 90}),
        "422-optimized": (image, {"quality": 80, "subsampling": 1, "optimize": True}),
    }
    out = {}
    for name, (img, kwargs) in options.items():
        buf = io.BytesIO()
        img.save(buf, "JPEG", **kwargs)
        out[name] = buf.getvalue()
    return out
