"""A fastload loader re-created from its public attributes is a whole fastload loader again.

Lightning and Accelerate rebuild a DataLoader as ``type(dl)(**attributes read off dl)``
(NOTE [what a rebuild copies] in fastload/engines/base.py). These tests drive the real
libraries' rebuild functions in-process; tests/test_lightning.py and tests/test_accelerate.py
run the frameworks end to end.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, SequentialSampler
from torch.utils.data.dataloader import default_collate

from fastload import DataLoader, ImageFolder
from fastload.data.batchinfo import Envelope
from fastload.data.sampling import EpochSampler
from fastload.engines import WorkerParts

pl_data = pytest.importorskip("pytorch_lightning.utilities.data")
pytestmark = pytest.mark.timeout(120)


def ids_of(batches) -> list[list[int]]:
    return [batch[1].tolist() for batch in batches]


@pytest.fixture
def folder(jpeg_root) -> ImageFolder:
    return ImageFolder(jpeg_root, size=16, train=True, seed=5)


def test_public_attributes_are_the_users_own(folder):
    def init(worker_id: int) -> None:  # the user's
        pass

    loader = DataLoader(folder, batch_size=4, shuffle=True, worker_init_fn=init)
    assert loader.collate_fn is default_collate and loader.worker_init_fn is init
    assert loader.dataset is folder
    assert isinstance(loader.sampler, EpochSampler)
    assert isinstance(loader.sampler, torch.utils.data.distributed.DistributedSampler)
    assert isinstance(loader.worker_parts, WorkerParts)
    assert loader.worker_parts.collate_fn is not default_collate  # fastload's, kept apart
    for batch in loader:
        assert not isinstance(batch, Envelope)


def test_lightning_rebuild_is_a_fastload_loader_with_the_same_batches(folder):
    loader = DataLoader(folder, batch_size=4, shuffle=True)
    rebuilt = pl_data._update_dataloader(loader, loader.sampler)
    assert type(rebuilt) is DataLoader and rebuilt is not loader
    assert rebuilt.backend == loader.backend and rebuilt.backend != "torch", rebuilt.backend_reason
    assert rebuilt.settings.num_workers.source == "auto"  # NOTE [a rebuilt loader stays auto]
    assert rebuilt.meter is not None and rebuilt.engine is not loader.engine
    assert rebuilt.state.owns_sampler  # the public order is adopted, not taken as a user's
    assert ids_of(rebuilt) == ids_of(loader)  # epoch 0 of both: the same order and samples
    # the rebuild got the loader's meter back (``meter`` is a public attribute): the meter the
    # user holds records the rebuilt loader's epoch too
    assert rebuilt.meter is loader.meter and loader.meter.summary().batches == 2 * len(rebuilt)


def test_lightning_rebuild_inside_its_patched_init_copies_no_machinery(folder):
    from lightning_fabric.utilities.data import _replace_dunder_methods

    with _replace_dunder_methods(torch.utils.data.DataLoader, "dataset"):
        loader = DataLoader(folder, batch_size=4, shuffle=True)
    recorded = [args[0] for args, _ in getattr(loader, "__pl_attrs_record", [])]
    assert not {"_engine", "state", "settings", "meter", "_parts"} & set(recorded)
    rebuilt = pl_data._update_dataloader(loader, loader.sampler)
    assert type(rebuilt) is DataLoader and rebuilt.engine is not loader.engine
    assert ids_of(rebuilt) == ids_of(loader)


def test_accelerate_prepare_yields_plain_batches_of_the_same_order(folder):
    from accelerate.data_loader import prepare_data_loader

    loader = DataLoader(folder, batch_size=4, shuffle=True)
    prepared = prepare_data_loader(loader, num_processes=1, process_index=0, put_on_device=False)
    got = list(prepared)
    assert all(isinstance(b, list) and isinstance(b[0], torch.Tensor) for b in got)
    assert ids_of(got) == ids_of(loader)
    assert "another DataLoader iterated this loader's sampler" in loader.backend_reason


def test_len_is_the_whole_epoch_after_a_mid_epoch_load(folder):
    loader = DataLoader(folder, batch_size=4, shuffle=True)
    whole = len(loader)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    resumed = DataLoader(folder, batch_size=4, shuffle=True)
    resumed.load_state_dict(state)
    assert len(resumed) == whole  # the epoch's length, as torchdata's StatefulDataLoader says
    assert len(list(resumed)) == whole - 3  # the iteration yields what is left
    assert len(list(resumed)) == whole  # and the next epoch is whole


class Squares(Dataset):
    fastload_worker_safe = True

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        return i * i


def test_a_chosen_worker_count_read_back_stays_auto():
    loader = DataLoader(Squares(), batch_size=3)
    assert loader.settings.num_workers.source == "auto"
    again = DataLoader(Squares(), batch_size=3, num_workers=loader.num_workers)
    assert again.settings.num_workers.source == "auto"
    explicit = DataLoader(Squares(), batch_size=3, num_workers=int(loader.num_workers))
    assert explicit.settings.num_workers.source == "argument"


def test_a_users_batch_sampler_is_left_alone(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    plan = BatchSampler(SequentialSampler(range(12)), 3, False)
    loader = DataLoader(Squares(), batch_sampler=plan, num_workers=0)
    assert loader.epoch_sampler is None and loader.batch_sampler is plan
    assert [b.tolist() for b in loader] == [[i * i for i in range(j, j + 3)] for j in range(0, 12, 3)]
