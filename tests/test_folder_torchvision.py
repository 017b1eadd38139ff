"""fastload.ImageFolder against torchvision's own, argument for argument (NOTE [torchvision's
folder rules]): the same classes, labels and sample order on random trees, cached or not,
local or remote; empty class folders; transform, target_transform, loader, is_valid_file,
extensions, allow_empty; find_classes / make_dataset / __getitem__ of a subclass, and which
engines run each (``loader.backend_reason``).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image
from torchvision.datasets import folder as tv_folder

from fastload import BackendUnavailable, DataLoader, EmptyClassError, ImageFolder
from fastload.cache import open_cache
from fastload.data.folder_rules import default_loader
from fastload.data.stored_listing import is_listing_key
from fastload.errors import ConfigError, CorruptSampleError
from fastload.testing.synthetic import make_jpeg_folder

HAS_DALI = importlib.util.find_spec("nvidia.dali") is not None
NO_LATENCY = {"latency": {"latency": 0.0}}

_NAMES = ["cat", "Dog", ".hidden", "a-b", "a", "a b", "zeta", "b_1", "Ärger", "a.jpg"]
_FILES = ["x", "Y", ".dot", "img 1", "a-b", "a", "z_9", "Ä"]
_ENDINGS = [".jpg", ".JPG", ".jpeg", ".Png", ".webp", ".TIFF", ".txt", "", ".json", ".jpg.bak"]


def _file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not decoded: only names matter here")


def random_tree(root: Path, seed: int, *, empty: bool) -> Path:
    """Class folders (hidden, odd names) with images at any depth, mixed-case endings,
    non-images, hidden files, files in the root itself; ``empty``: one class without an
    image (only a non-image file and an empty subfolder)."""
    rng = random.Random(seed)
    classes = rng.sample(_NAMES, rng.randint(2, 5))
    for name in classes:
        folder = root / name
        for _ in range(rng.randint(1, 6)):
            depth = rng.choice([0, 0, 1, 2])
            sub = [rng.choice(["sub", "sub-x", "q", "Z", ".h"]) for _ in range(depth)]
            _file(folder.joinpath(*sub, rng.choice(_FILES) + rng.choice(_ENDINGS)))
        _file(folder / (rng.choice(_FILES) + rng.choice([".jpg", ".PNG"])))  # one image at least
    for _ in range(rng.randint(0, 2)):
        _file(root / ("r" + rng.choice(_FILES) + rng.choice(_ENDINGS)))  # no class: ignored
    if empty:
        hollow = root / rng.choice(["zz-empty", "0empty", "m"])
        _file(hollow / "notes.txt")
        (hollow / "nothing").mkdir()
    return root


def same_as_torchvision(ours: ImageFolder, theirs: torchvision.datasets.ImageFolder) -> None:
    assert ours.classes == theirs.classes
    assert ours.class_to_idx == theirs.class_to_idx
    assert list(ours.samples) == theirs.samples  # paths, labels and order
    assert list(ours.targets) == theirs.targets
    assert ours.imgs == getattr(theirs, "imgs", theirs.samples)  # DatasetFolder has none


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("empty", [False, True])
def test_random_trees_give_torchvision_s_classes_labels_and_order(tmp_path, seed, empty):
    root = random_tree(tmp_path / "root", seed, empty=empty)
    if empty:
        with pytest.raises(FileNotFoundError) as theirs:
            torchvision.datasets.ImageFolder(str(root))
        with pytest.raises(EmptyClassError) as ours:
            ImageFolder(root, size=8)
        assert str(ours.value).startswith(str(theirs.value).split(". ")[0])  # "Found no valid file for the classes X"
    theirs = torchvision.datasets.ImageFolder(str(root), allow_empty=empty)
    for kwargs in ({}, {"cache": tmp_path / "cache"}, {"cache": tmp_path / "cache"}):  # listed, stored, reused
        same_as_torchvision(ImageFolder(root, size=8, allow_empty=empty, **kwargs), theirs)
    # a remote store: classes come from the objects below them (no request for folders)
    remote = ImageFolder(f"latency::{root}", size=8, allow_empty=empty, storage_options=NO_LATENCY)
    same_as_torchvision(remote, theirs)


@pytest.mark.timeout(60)
def test_an_empty_class_folder_raises_or_keeps_its_label(tmp_path):
    root = make_jpeg_folder(tmp_path / "data", images=6, classes=3, size=(32, 24))
    (root / "class_01b").mkdir()  # sorts between class_01 and class_02: shifts class_02
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes class_01b"):
        torchvision.datasets.ImageFolder(str(root))
    with pytest.raises(EmptyClassError, match="Found no valid file for the classes class_01b") as err:
        ImageFolder(root, size=8)
    assert isinstance(err.value, FileNotFoundError) and "allow_empty=True" in str(err.value)
    ds = ImageFolder(root, size=8, allow_empty=True)
    assert ds.class_to_idx == {"class_00": 0, "class_01": 1, "class_01b": 2, "class_02": 3}
    assert sorted(set(ds.targets)) == [0, 1, 3]  # class_02 keeps 3: no renumbering
    same_as_torchvision(ds, torchvision.datasets.ImageFolder(str(root), allow_empty=True))
    labels = torch.cat([y for _, y in DataLoader(ds, batch_size=4, backend="threads")])
    assert labels.tolist() == list(ds.targets)


@pytest.mark.timeout(30)
def test_a_root_without_class_folders_raises_file_not_found(tmp_path):
    _file(tmp_path / "a.jpg")
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        torchvision.datasets.ImageFolder(str(tmp_path))
    with pytest.raises(EmptyClassError, match=f"Couldn't find any class folder in {tmp_path}"):
        ImageFolder(tmp_path)


@pytest.mark.timeout(60)
def test_positional_arguments_in_torchvision_s_order(jpeg_root):
    transform = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])
    keyword = ImageFolder(jpeg_root, transform=transform)
    positional = ImageFolder(jpeg_root, transform, lambda t: t + 100, default_loader, None, True)
    assert torch.equal(keyword[5][0], positional[5][0]) and positional[5][0].shape == (3, 32, 32)
    assert positional[5][1] == keyword[5][1] + 100
    assert positional.transform is transform and positional.loader is default_loader
    assert positional.extensions == tuple(tv_folder.IMG_EXTENSIONS)
    path = positional.samples[0][0]
    assert positional.loader(path).tobytes() == tv_folder.default_loader(path).tobytes()
    # torchvision's own default loader is the default: the declared decode, every engine
    tv_loader = ImageFolder(jpeg_root, transform, loader=tv_folder.default_loader)
    assert tv_loader.torch_only_reason() is None and tv_loader.fastload_worker_safe is True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target_transform", [
    lambda t: 10 * t + 1,
    lambda t: torch.nn.functional.one_hot(torch.tensor(t), 4).float(),
], ids=["int", "one-hot"])
def test_target_transform_is_applied_the_same_on_every_engine(jpeg_root, target_transform):
    ds = ImageFolder(jpeg_root, size=16, target_transform=target_transform)
    expected = torch.stack([torch.as_tensor(target_transform(t)) for t in ds.targets])
    backends = ["torch", "threads"] + (["dali"] if HAS_DALI else [])
    for backend in backends:
        workers = {"num_workers": 0} if backend == "torch" else {}
        loader = DataLoader(ds, batch_size=8, backend=backend, **workers)
        assert loader.backend == backend, loader.backend_reason
        labels = torch.cat([y for _, y in loader])
        assert torch.equal(labels, expected), backend
    assert torch.equal(torch.as_tensor(ds[3][1]), expected[3])


def gray_loader(path: str) -> Image.Image:
    """A user's loader: grayscale, which fastload's decode would not give."""
    with open(path, "rb") as f:
        return Image.open(f).convert("L")


@pytest.mark.timeout(120)
def test_a_custom_loader_runs_on_torch_workers_and_says_so(jpeg_root):
    transform = T.Compose([T.Resize((16, 16)), T.PILToTensor()])
    ds = ImageFolder(jpeg_root, transform, loader=gray_loader)
    theirs = torchvision.datasets.ImageFolder(str(jpeg_root), transform, loader=gray_loader)
    for i in (0, 17, 47):
        assert torch.equal(ds[i][0], theirs[i][0]) and ds[i][1] == theirs[i][1]
    assert ds[0][0].shape == (1, 16, 16) and ds.fastload_worker_safe is None  # probed, not declared
    loader = DataLoader(ds, batch_size=8, num_workers=2)
    assert loader.backend == "torch"
    assert "ImageFolder(loader=gray_loader) reads and decodes each file itself" in loader.backend_reason
    batches = list(loader)
    assert torch.cat([x for x, _ in batches]).shape == (48, 1, 16, 16)
    assert torch.cat([y for _, y in batches]).tolist() == theirs.targets
    auto = DataLoader(ds, batch_size=8)
    assert auto.backend == "torch" and "loader=gray_loader" in auto.backend_reason
    with pytest.raises(BackendUnavailable, match="loader=gray_loader"):
        DataLoader(ds, batch_size=8, backend="threads")


@pytest.mark.timeout(30)
def test_a_custom_loader_refuses_the_declared_decode_s_arguments(jpeg_root, tmp_path):
    for kwargs in ({"size": 64}, {"train": True}, {"cache": tmp_path / "c"}):
        with pytest.raises(ConfigError, match="a custom loader reads and decodes each file itself"):
            ImageFolder(jpeg_root, loader=gray_loader, **kwargs)


@pytest.mark.timeout(30)
def test_extensions_and_is_valid_file_are_exclusive_as_in_torchvision(jpeg_root):
    with pytest.raises(ValueError, match="Both extensions and is_valid_file cannot be None or not None"):
        torchvision.datasets.DatasetFolder(str(jpeg_root), tv_folder.default_loader, (".jpg",),
                                           is_valid_file=lambda p: True)
    with pytest.raises(ValueError, match="both extensions and is_valid_file cannot be None or not None"):
        ImageFolder(jpeg_root, extensions=(".jpg",), is_valid_file=lambda p: True)
    with pytest.raises(ValueError, match="class_to_idx parameter cannot be None"):
        ImageFolder.make_dataset(str(jpeg_root), None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both extensions and is_valid_file cannot be None"):
        ImageFolder.make_dataset(str(jpeg_root), {"class_00": 0})


@pytest.mark.timeout(60)
def test_is_valid_file_and_extensions_choose_the_samples_like_torchvision(tmp_path):
    root = random_tree(tmp_path / "root", 3, empty=False)
    is_valid = lambda p: "a" in Path(p).name  # noqa: E731
    theirs = torchvision.datasets.ImageFolder(str(root), is_valid_file=is_valid, allow_empty=True)
    ours = ImageFolder(root, is_valid_file=is_valid, allow_empty=True, size=8)
    same_as_torchvision(ours, theirs)
    assert ours.extensions is None and theirs.extensions is None
    pngs = torchvision.datasets.DatasetFolder(str(root), tv_folder.default_loader, (".png",), allow_empty=True)
    same_as_torchvision(ImageFolder(root, extensions=[".PNG"], allow_empty=True, size=8), pngs)
    assert tv_folder.make_dataset(str(root), theirs.class_to_idx, extensions=(".jpg",), allow_empty=True) == \
        ImageFolder.make_dataset(str(root), theirs.class_to_idx, extensions=(".jpg",), allow_empty=True)
    assert ours.find_classes(str(root)) == tv_folder.find_classes(str(root))


class OnlyTwo(ImageFolder):
    def find_classes(self, directory):
        return ["class_01", "class_03"], {"class_01": 5, "class_03": 2}


class TorchvisionOnlyTwo(torchvision.datasets.ImageFolder):
    def find_classes(self, directory):
        return ["class_01", "class_03"], {"class_01": 5, "class_03": 2}


@pytest.mark.timeout(120)
def test_a_subclass_s_find_classes_is_honoured_and_keeps_the_fast_engines(jpeg_root, tmp_path):
    theirs = TorchvisionOnlyTwo(str(jpeg_root))
    ours = OnlyTwo(jpeg_root, size=16)
    same_as_torchvision(ours, theirs)
    assert ours.torch_only_reason() is None
    loader = DataLoader(ours, batch_size=8, backend="threads")
    assert torch.cat([y for _, y in loader]).tolist() == theirs.targets
    assert DataLoader(ours, batch_size=8).backend == "auto"  # measured, not forced to torch
    # the stored listing is keyed by its class_to_idx: a plain build does not reuse it
    cache = tmp_path / "cache"
    same_as_torchvision(OnlyTwo(jpeg_root, size=16, cache=cache), theirs)
    plain = ImageFolder(jpeg_root, size=16, cache=cache)
    same_as_torchvision(plain, torchvision.datasets.ImageFolder(str(jpeg_root)))
    same_as_torchvision(OnlyTwo(jpeg_root, size=16, cache=cache), theirs)
    assert len(_listing_keys(cache)) == 2


def _first_of_each(directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
    samples = tv_folder.make_dataset(directory, class_to_idx, extensions, is_valid_file, allow_empty)
    return [s for s in samples if s[0].endswith("_000000.jpg") or s[0].endswith("_000001.jpg")]


class FirstOfEach(ImageFolder):
    make_dataset = staticmethod(_first_of_each)


class TorchvisionFirstOfEach(torchvision.datasets.ImageFolder):
    make_dataset = staticmethod(_first_of_each)


@pytest.mark.timeout(60)
def test_a_subclass_s_make_dataset_is_honoured(jpeg_root, tmp_path):
    theirs = TorchvisionFirstOfEach(str(jpeg_root))
    ours = FirstOfEach(jpeg_root, size=16, cache=tmp_path / "cache")
    same_as_torchvision(ours, theirs)
    assert 0 < len(ours) < 48
    images, labels = next(iter(DataLoader(ours, batch_size=len(ours), backend="threads")))
    assert images.shape[0] == len(ours) and labels.tolist() == theirs.targets
    assert _listing_keys(tmp_path / "cache") == []  # its samples are its own: nothing stored


class WithPath(ImageFolder):
    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return image, label, Path(self.samples[index][0]).name


@pytest.mark.timeout(120)
def test_a_subclass_s_getitem_runs_on_torch_workers_with_on_error(tmp_path):
    root = make_jpeg_folder(tmp_path / "data", images=12, classes=2, size=(32, 24))
    bad = sorted((root / "class_01").glob("*.jpg"))[1]
    bad.write_bytes(b"not a jpeg")
    ds = WithPath(root, size=16, on_error="skip")
    loader = DataLoader(ds, batch_size=4, num_workers=1)
    assert loader.backend == "torch"
    assert "WithPath overrides ImageFolder.__getitem__" in loader.backend_reason
    names = [n for _, _, batch in loader for n in batch]
    assert len(names) == 11 and bad.name not in names
    assert [s.path for s in loader.skipped] == [str(bad)]
    with pytest.raises(BackendUnavailable, match="WithPath overrides ImageFolder.__getitem__"):
        DataLoader(ds, batch_size=4, backend="threads")
    raising = DataLoader(WithPath(root, size=16), batch_size=4, num_workers=1)
    with pytest.raises(CorruptSampleError, match=bad.name):
        list(raising)


def _listing_keys(cache_dir: Path) -> list[str]:
    return [k for k in open_cache(cache_dir).tiers[0].keys() if is_listing_key(k)]  # noqa: SIM118


@pytest.mark.timeout(60)
def test_a_stored_listing_is_reused_only_by_the_rules_it_was_made_by(tmp_path):
    root = make_jpeg_folder(tmp_path / "data", images=6, classes=2, size=(32, 24))
    (root / "class_00b").mkdir()
    cache = tmp_path / "cache"
    kept = ImageFolder(root, size=8, cache=cache, allow_empty=True)
    assert kept.class_to_idx == {"class_00": 0, "class_00b": 1, "class_01": 2}
    with pytest.raises(EmptyClassError):  # not the listing made with allow_empty=True
        ImageFolder(root, size=8, cache=cache)
    jpgs = len(ImageFolder(root, size=8, cache=cache, allow_empty=True, extensions=(".jpg",)))
    chosen = ImageFolder(root, size=8, cache=cache, allow_empty=True, is_valid_file=lambda p: p.endswith("1.jpg"))
    assert 0 < len(chosen) < jpgs == len(kept)
    assert len(_listing_keys(cache)) == 2  # allow_empty with and without extensions; none for is_valid_file


class Obfuscated(ImageFolder):
    """A subclass whose files are stored XOR-ed with 0x5A: its read_bytes undoes it."""

    def read_bytes(self, index: int) -> bytes:
        return bytes(b ^ 0x5A for b in super().read_bytes(index))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend,workers", [("torch", 0), ("torch", 2), ("threads", 2)])
def test_a_subclass_s_read_bytes_runs_on_every_engine_with_a_cache(jpeg_root, tmp_path, backend, workers):
    """The torch engine reads a batch's bytes at once through the cache (read_batch): a subclass
    that overrides only read_bytes gets its own read_bytes called there too, as on threads."""
    root = tmp_path / "xor"
    for path in sorted(Path(jpeg_root).rglob("*.jpg"))[:12]:
        out = root / path.parent.name / path.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(bytes(b ^ 0x5A for b in path.read_bytes()))
    plain = ImageFolder(jpeg_root, size=32, seed=5)
    wanted = {p.name: plain.read_bytes(i) for i, p in enumerate(Path(s) for s, _ in plain.samples)}
    ds = Obfuscated(root, size=32, seed=5, cache=str(tmp_path / "cache"))
    assert all(ds.read_bytes(i) == wanted[Path(s).name] for i, (s, _) in enumerate(ds.samples))
    loader = DataLoader(ds, batch_size=4, backend=backend, num_workers=workers)
    images = torch.cat([x for x, _ in loader])  # undecodable bytes would raise CorruptSampleError
    assert images.shape == (12, 3, 32, 32)
