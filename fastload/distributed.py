"""Which rank this process is, how many there are, and a seed every rank agrees on.

fastload shards a map-style dataset across ranks by itself when it runs under
``torch.distributed`` (an initialized process group) or under a launcher that sets ``RANK`` and
``WORLD_SIZE`` (torchrun, SLURM wrappers, ...). The process group wins over the environment.

NOTE [one seed for all ranks]
Every rank must compute the same permutation of an epoch, so every rank needs the same seed.
The seed is chosen like on one process (the dataset's ``seed``, else the loader's
``generator``, else ``torch.initial_seed()``), then, when a process group is initialized,
rank 0's value is broadcast to the others. Without a process group (only ``RANK`` and
``WORLD_SIZE`` set) nothing can be exchanged: the ranks agree only if each calls
``torch.manual_seed`` with the same value (or passes equally seeded generators), and fastload
says so in a warning. A resumed loader takes its seed from the checkpoint instead.

Example::

    >>> info = rank_info()
    >>> info.rank, info.world_size, info.source
    (0, 1, 'single process')
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from fastload.errors import ConfigError
from fastload.machine import local_world_size

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a job: ``rank`` of ``world_size``, and where that came from."""

    rank: int
    world_size: int
    local_world_size: int
    source: str  # "torch.distributed", "environment" or "single process"

    @property
    def distributed(self) -> bool:
        """True under a launcher or process group, even with one rank (it may grow later)."""
        return self.source != "single process"

    @property
    def connected(self) -> bool:
        """True when a process group can exchange values (seed broadcast, state checks)."""
        return self.source == "torch.distributed"


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={raw!r} is not an integer; set it to this process's "
            f"{'rank' if name == 'RANK' else 'number of ranks'} or unset it"
        ) from None


def rank_info() -> RankInfo:
    """Detect rank and world size: the process group if initialized, else RANK/WORLD_SIZE."""
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), local_world_size(), "torch.distributed")
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None or world is None:
        return RankInfo(0, 1, 1, "single process")
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(
            f"RANK={rank} and WORLD_SIZE={world} are inconsistent: expected 0 <= RANK < "
            "WORLD_SIZE; check the launcher's environment"
        )
    return RankInfo(rank, world, local_world_size(), "environment")


_warned_unconnected = False


def agree_seed(seed: int, info: RankInfo) -> int:
    """The seed all ranks use: rank 0's when a process group exists. See NOTE [one seed...]."""
    global _warned_unconnected
    if info.world_size == 1:
        return seed
    if info.connected:
        return int(broadcast_object(seed))
    if not _warned_unconnected:
        _warned_unconnected = True
        logger.warning(
            "fastload shards this loader by RANK=%d/WORLD_SIZE=%d from the environment, but no "
            "torch.distributed process group is initialized, so ranks cannot agree on a seed: "
            "call torch.distributed.init_process_group() before building the loader, or give "
            "every rank the same torch.manual_seed(...) or generator",
            info.rank, info.world_size,
        )
    return seed


def broadcast_object(value: Any, src: int = 0) -> Any:
    """``value`` as held by rank ``src`` (a collective: every rank must call it)."""
    box = [value]
    dist.broadcast_object_list(box, src=src)  # torch picks the backend's device (CUDA for NCCL)
    return box[0]


def gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value``, indexed by rank (a collective: every rank must call it)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out

