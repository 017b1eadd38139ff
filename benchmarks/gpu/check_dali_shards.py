"""GPU check of DALI on local tar shards: its own webdataset reader against fastload's byte feed.

For a GPU machine (one command, about a minute including making and packing 2048 JPEGs):

    python benchmarks/gpu/check_dali_shards.py

It runs ``benchmarks/dali_shards_reader.py --gpu`` (NOTE [DALI's reader, exactly] in
fastload/engines/dali_reader.py): the same ``TarShards`` loader's epochs in storage order with
"mixed" (nvJPEG) decoding on GPU 0, once through DALI's ``fn.readers.webdataset`` and once
through the byte feed, and prints the images/s of each, their ratio and whether the batches
were identical, three rounds. That path has run only in CPU mode where it was written (4-18%
faster than the byte feed there). Exits 1 when a round's batches differ; on a machine without
CUDA (or without nvidia-dali) it prints that it skipped and exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/

from check_dali import cannot_run  # noqa: E402  (benchmarks/gpu/, this script's folder)


def main() -> int:
    if why := cannot_run():
        print(f"check_dali_shards: skipped ({why})")
        return 0
    from dali_shards_reader import main as compare

    identical = compare(["--gpu", "--images", "2048", "--batch-size", "128", "--repeats", "3"])
    print(f"check_dali_shards: {'ok' if identical else 'FAILED: the batches differ'}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
