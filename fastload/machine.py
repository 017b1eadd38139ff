"""The machine loader settings are resolved from: usable CPU cores, CUDA GPUs, ranks per node.

Cores count what this process may really use: its CPU affinity mask, capped by a cgroup CPU
quota (a container limited to 4 CPUs on a 64-core host has 4). Probing reads the machine
when called, never at import::

    >>> Machine.probe()
    Machine(cpu_cores=15, gpus=8, local_world_size=8)
    >>> Machine(cpu_cores=64, gpus=8, local_world_size=8).cores_per_rank
    8
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

__all__ = ["Machine", "local_world_size", "usable_cpu_cores"]


@dataclass(frozen=True)
class Machine:
    """What the settings are resolved from: cores this process may use, GPUs, ranks per node.

    ``Machine.probe()`` reads the running machine; tests and capacity planning build one by
    hand: ``Machine(cpu_cores=64, gpus=8, local_world_size=8)``.
    """

    cpu_cores: int
    gpus: int
    local_world_size: int = 1

    @classmethod
    def probe(cls) -> Machine:
        return cls(
            cpu_cores=usable_cpu_cores(),
            gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0,
            local_world_size=local_world_size(),
        )

    @property
    def cores_per_rank(self) -> int:
        return max(1, self.cpu_cores // max(1, self.local_world_size))


def usable_cpu_cores() -> int:
    """CPU cores this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def _cgroup_cpu_quota() -> float | None:
    """The container's CPU limit in cores (cgroup v2 ``cpu.max`` or v1 cfs quota), if any."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass  # no cgroup v2 limit file: try cgroup v1 below
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def local_world_size() -> int:
    """Ranks sharing this node.

    torchrun (and Accelerate) set ``LOCAL_WORLD_SIZE``. Lightning's launcher does not: it
    sets ``WORLD_SIZE`` and ``NODE_RANK``, with ``MASTER_ADDR`` on the loopback when all
    ranks run on this machine, so there every rank is local. Anything else: 1.
    """
    env = os.environ
    for raw in (env.get("LOCAL_WORLD_SIZE"),) + _single_node_world(env):
        try:
            if raw is not None:
                return max(1, int(raw))
        except ValueError:
            continue
    return 1


def _single_node_world(env: os._Environ[str] | dict[str, str]) -> tuple[str | None, ...]:
    """WORLD_SIZE where the job provably runs on this node alone (its master on loopback)."""
    one_node = env.get("NODE_RANK", "0") == "0" and env.get("MASTER_ADDR", "").strip() in LOOPBACK_HOSTS
    return (env.get("WORLD_SIZE"),) if one_node else ()
