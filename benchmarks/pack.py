"""``fastload pack`` rates: copy-through vs ``--transcode`` on the same JPEGs, local disk.

The synthetic ImageNet-like JPEG set (500x375, made once under .fastload-data) is packed into
shards of --shard-size by ``fastload.data.pack.pack``, once copying the bytes through and
once per --transcode value (the transcoded tier's re-encoding baked in). Beside them, the
storage's own write bandwidth, measured in the same run just before and just after
copy-through: as many bytes as copy-through wrote, written to the same directory as one
file in 4 MiB writes and fsynced (pack fsyncs each shard before renaming it: the same
durability). Issue 23 asks copy-through for at least that bandwidth; the last column is
pack's written MB/s over it (the mean of the two measurements).
Rows: images/s, MB/s read from the source, MB/s written, output bytes per image, ratio.

    python benchmarks/pack.py                              # 256 images, --transcode 256
    python benchmarks/pack.py --images 2000 --transcode 256 160
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastload.data.pack import pack  # noqa: E402
from fastload.data.transcode import Transcode  # noqa: E402
from fastload.testing.synthetic import make_jpeg_folder  # noqa: E402


def write_bandwidth(where: Path, nbytes: int, name: str) -> float:
    """MB/s of one file of ``nbytes`` written (and fsynced) in 4 MiB writes into ``where``.

    The file stays until the end of the run: this disk is mounted with ``discard``, and a
    deleted file's discards slow the next fsync down (1,096 MB/s before a pack, 214 after
    it once its shards were deleted first)."""
    block = os.urandom(4 << 20)
    path = where / name
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.writelines(block[: min(len(block), nbytes - offset)]
                     for offset in range(0, nbytes, len(block)))
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    return nbytes / seconds / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--shard-size", type=float, default=16e6, help="bytes")
    parser.add_argument("--transcode", type=int, nargs="*", default=[256], metavar="MAX_SIDE")
    args = parser.parse_args()
    src = make_jpeg_folder(ROOT / ".fastload-data" / f"pack-bench-{args.images}",
                           images=args.images, classes=10, size=(500, 375))
    source_bytes = sum(p.stat().st_size for p in src.rglob("*.jpg"))
    work = Path(tempfile.mkdtemp(prefix="fastload-pack-bench-"))
    try:
        print(f"fastload pack of {args.images} JPEGs (500x375, {source_bytes / 1e6:.1f} MB), "
              f"shards of {args.shard_size / 1e6:g} MB, local disk ({os.cpu_count()} CPUs)")
        # Before copy-through: about its bytes (each sample adds two headers, a label block
        # and padding, ~1.5 KB), after a first write that is thrown away (a process's first
        # large write ran at a third of the next ones' rate here); after it: its bytes.
        write_bandwidth(work, source_bytes + 1536 * args.images, "first.bin")
        before = write_bandwidth(work, source_bytes + 1536 * args.images, "before.bin")
        for max_side in [None, *args.transcode]:
            dst = work / f"out-{max_side}"
            transcode = Transcode(max_side) if max_side else None
            start = time.perf_counter()
            report = pack(str(src), str(dst), shard_size=args.shard_size, transcode=transcode)
            seconds = time.perf_counter() - start
            written = report.bytes / seconds / 1e6
            if max_side is None:
                after = write_bandwidth(work, report.bytes, "after.bin")
                bandwidth = (before + after) / 2
                print(f"  {'storage write':16s} {'':17s} {'':18s} wrote {bandwidth:7.1f} MB/s  "
                      f"(one fsynced file of {report.bytes / 1e6:.1f} MB; before {before:.0f}, "
                      f"after {after:.0f})")
            name = "copy-through" if max_side is None else f"--transcode {max_side}"
            ratio = f"{written / bandwidth:5.2f}x the storage" if max_side is None else ""
            print(f"  {name:16s} {report.samples / seconds:8.1f} images/s  "
                  f"read {source_bytes / seconds / 1e6:7.1f} MB/s  "
                  f"wrote {written:7.1f} MB/s  "
                  f"{report.bytes / report.samples / 1e3:6.1f} KB/image  "
                  f"{ratio}  ({report.transcoded} re-encoded)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
