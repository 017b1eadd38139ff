"""DALI and tar shards, in CPU mode (device_id=None; the GPU path runs the same graph with a
"mixed" decoder and is not run here): DALI's own webdataset reader reads the shards and index
files ``fastload pack`` writes (copy-through and --transcode), and the DALI engine's reader path
(NOTE [DALI's reader, exactly]) gives the byte feed's batches exactly: order, labels, pixels,
a short last batch, exact resume; where it would not be exact it keeps the byte feed."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("nvidia.dali", reason="nvidia-dali is not installed (pip install 'fastload[dali]')")

from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from fastload import CorruptSampleError, DataLoader, TarShards  # noqa: E402
from fastload.data.pack import pack  # noqa: E402
from fastload.data.transcode import Transcode  # noqa: E402
from fastload.testing.synthetic import make_jpeg_folder  # noqa: E402
from tests.contracts.resume import interrupted, same_batches  # noqa: E402
from tests.fixtures.launch import torchrun_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return make_jpeg_folder(tmp_path_factory.mktemp("photos"), images=40, classes=4, size=(200, 150))


@pytest.fixture(scope="module")
def packed(photos, tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("packed")
    return [u.removeprefix("file://") for u in pack(str(photos), str(out), shard_size=60_000).urls]


def dali_read(tars: list[str]) -> list[tuple[int, np.ndarray]]:
    """Every sample through DALI's own reader with pack's .idx files, decoded on the CPU."""

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def reader():
        jpg, cls = fn.readers.webdataset(paths=tars, index_paths=[t[:-4] + ".idx" for t in tars],
                                         ext=["jpg", "cls"], random_shuffle=False, name="r",
                                         missing_component_behavior="error")
        return fn.decoders.image(jpg, device="cpu", output_type=types.RGB), cls

    pipe = reader()
    pipe.build()
    out = []
    for _ in range(pipe.epoch_size("r")):
        image, cls = pipe.run()
        out.append((int(bytes(np.array(cls[0])).decode()), np.array(image[0])))
    return out


@pytest.mark.parametrize("max_side", [None, 96])
def test_dalis_own_reader_reads_packed_shards_and_their_index(photos, tmp_path, max_side):
    transcode = Transcode(max_side) if max_side else None
    report = pack(str(photos), str(tmp_path / "out"), shard_size=60_000, transcode=transcode)
    tars = [u.removeprefix("file://") for u in report.urls]
    ds = TarShards(tars, size=32)
    read = dali_read(tars)
    assert [label for label, _ in read] == ds.index.labels.tolist()
    for i, (_, image) in enumerate(read):
        with Image.open(io.BytesIO(ds.read_bytes(i))) as img:
            pillow = np.asarray(img.convert("RGB"))
        assert image.shape == pillow.shape == ((150, 200, 3) if max_side is None else (72, 96, 3))
        assert np.abs(image.astype(int) - pillow.astype(int)).mean() < 2  # both libjpeg-turbo


def loaders(ds: TarShards, **kwargs) -> tuple[DataLoader, DataLoader]:
    reader = DataLoader(ds, backend="dali", meter=False, **kwargs)
    feed = DataLoader(ds, backend="dali", meter=False, **kwargs)
    feed.engine.shard_reader = False
    return reader, feed


@pytest.mark.parametrize("window", [None, 1])
def test_the_reader_path_gives_the_byte_feeds_batches_exactly(packed, window):
    shuffle = window is not None
    ds = TarShards(packed, size=48, train=True, seed=4, shuffle_window=window or 4)
    reader, feed = loaders(ds, batch_size=12, shuffle=shuffle)  # 40 = 3 x 12 + 4
    for _ in range(2):  # two epochs: another order when shuffled
        a, b = list(reader), list(feed)
        assert reader.engine.reads.startswith("DALI's webdataset reader")
        assert feed.engine.reads == "byte feed"
        assert same_batches(a, b) and [len(y) for _, y in a] == [12, 12, 12, 4]
    torch_engine = DataLoader(ds, batch_size=12, shuffle=shuffle, backend="torch", num_workers=0)
    torch_engine.epoch = 1  # the same epoch as the second above: the same order and labels
    assert torch.equal(torch.cat([y for _, y in a]), torch.cat([y for _, y in torch_engine]))


def test_the_reader_path_resumes_exactly(packed):
    made = []

    def make() -> DataLoader:
        made.append(DataLoader(TarShards(packed, size=32, train=True, seed=9), batch_size=8,
                               shuffle=False, backend="dali", meter=False))
        return made[-1]

    full, resumed, _ = interrupted(make, k=2)
    assert same_batches(full, resumed) and len(full) == 5
    reads = [m.engine.reads for m in made]  # the whole epoch, cut, and the resumed rest
    assert reads[0] == f"DALI's webdataset reader: {len(packed)} runs over local shards"
    assert reads[2].startswith("DALI's webdataset reader") and reads[2] != reads[0]


def test_a_shuffled_window_a_skip_or_remote_shards_keep_the_byte_feed(packed):
    ds = TarShards(packed, size=32, train=True, seed=1)  # the default window of 4
    loader = DataLoader(ds, batch_size=8, shuffle=True, backend="dali", meter=False)
    assert sum(len(y) for _, y in loader) == 40
    assert loader.engine.reads == "byte feed: the order changes shards too often"
    skipping = TarShards(packed, size=32, on_error="skip")
    loader = DataLoader(skipping, batch_size=8, backend="dali", meter=False)
    list(loader)
    assert loader.engine.reads == "byte feed: on_error='skip' would leave the reader's sequence"


def test_a_corrupt_member_read_by_dalis_reader_is_named(photos, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(photos, src)
    victim = sorted(src.rglob("*.jpg"))[13]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2:] = b"\x00" * (len(data) - len(data) // 2)  # a good header, bad scans
    victim.write_bytes(bytes(data))
    tars = [u.removeprefix("file://") for u in
            pack(str(src), str(tmp_path / "out"), shard_size=60_000).urls]
    loader = DataLoader(TarShards(tars, size=32), batch_size=8, backend="dali", meter=False)
    key = f"{victim.parent.name}/{victim.stem}"
    with pytest.raises(CorruptSampleError, match=key):
        list(loader)
    assert loader.engine.reads.startswith("DALI's webdataset reader")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_torchrun_ranks_read_their_share_through_dalis_reader_exactly(packed, tmp_path):
    script = Path(__file__).parent / "dist_scripts" / "dali_shards_ranks.py"
    ranks = torchrun_ranks(script, tmp_path, *packed)
    for epoch in range(2):
        parts = [r["epochs"][epoch] for r in ranks]
        assert not set(parts[0]["keys"]) & set(parts[1]["keys"])
        assert len(set(parts[0]["keys"]) | set(parts[1]["keys"])) == 40
        for part in parts:
            assert part["reads"].startswith("DALI's webdataset reader")
            assert part["same"] and part["labels"] == part["expected"]
