"""The dataset probe: what worker processes would change about a dataset, and what it costs.

    >>> probe = probe_dataset(MyDataset(), context="fork")
    >>> probe.usable, probe.wall_s, probe.summary()
    (True, 0.0104, 'probe: 8 samples in 0.09 s; pickles (1.2 KB), no main-process RNG, ...')

NOTE [the dataset probe]
A map-style dataset that declares nothing is probed once, when the loader is built (by
``fastload.settings.resolve_settings``), and only there. The rules:

* Never on the user's object. The probe fetches from a *copy*: a pickle round trip, which is
  exactly what a spawn/forkserver worker gets. Under "fork" a dataset need not pickle (the
  worker inherits it), so one that does not is copied with ``copy.deepcopy``; one that can
  be neither pickled nor deep-copied is not fetched at all and stays in-process. Class
  attributes (shared by the copy) that a fetch rebinds are put back, and reported as
  mutation; module globals a fetch changes are not seen.
* Bounded: the first ``MAX_SAMPLES`` indices (0, 1, ...), stopping once ``BUDGET_S`` is
  spent (one sample always: a fetch is not interrupted). A dataset holding more than
  ``MAX_COPY_BYTES`` of arrays is not copied (and stays in-process): in-memory data rarely
  gains from workers, and the copy would cost as much as the data.
* The main process's random streams are untouched: the states of torch's, numpy's legacy
  and Python's ``random`` generators are compared before and after the fetches (that is how
  "draws from the global RNG" is seen) and restored. CUDA's generator is not read (doing so
  would initialise CUDA); a fetch that initialises CUDA is itself a reason to stay in-process.
* What is recorded: per-sample CPU time (``time.thread_time``, this thread only) and wall
  time, medians over the samples after the first (the first pays lazy imports and cold
  caches); each sample's pickled size (what a worker sends); the dataset's pickled size;
  a bounded fingerprint of the copy's state before and after (values of plain attributes,
  lengths of containers, a tensor's data pointer and version counter, an array's digest, a
  generator's state: a few levels deep, the first items of each container; see
  :mod:`fastload.tuning.state`), and under fork the attributes that forked workers would
  share unsafely (open sqlite3 connections, sockets, files, running threads, h5py and lmdb
  handles, recognised by their type's module without importing those modules).
* Anything raised by a fetch, a sample that does not pickle, a sample holding a non-CPU
  tensor, a ``__getitem__`` that reads its worker's identity (``get_worker_info``,
  ``initial_seed``: workers would change what it returns) make the probe unusable, with the
  reason. The warnings its fetches raise are recorded, not shown (the user's first real
  fetch shows them, as without the probe).
* The samples themselves are kept, pickled, and served once in the first epoch instead of
  fetched again, when the verdict says they are exactly what the real dataset gives for
  those indices (NOTE [probe samples reused] in :mod:`fastload.tuning.reuse`); otherwise
  they are dropped, and ``summary()`` says why they are fetched again.
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from fastload.tuning.reuse import MAX_KEPT_BYTES, KeptSamples
from fastload.tuning.state import (
    IDENTITY_CALLS,
    array_bytes,
    class_state,
    difference,
    fingerprint,
    fork_hazard,
    human_bytes,
    memory_of,
    reads_identity,
    restore_classes,
    shares_memory,
    short,
    walk,
)

MAX_SAMPLES = 8
"""Indices fetched at most (0 .. MAX_SAMPLES-1)."""

BUDGET_S = 0.25
"""Wall seconds after which no further sample is fetched."""

MAX_COPY_BYTES = 64 << 20
"""A dataset holding more array bytes than this is not copied to be probed."""

WAIT_RATIO = 2.0
"""A sample whose wall time is at least this many times its CPU time mostly waits (I/O, sleep)."""



@dataclass(frozen=True)
class DatasetProbe:
    """What the probe saw. ``usable``: workers cannot change the samples (as far as it can see)."""

    context: str
    length: int | None = None
    samples: int = 0
    cpu_s: float | None = None
    wall_s: float | None = None
    sample_bytes: int | None = None
    dataset_bytes: int | None = None
    copied: str = "not copied"
    rng: tuple[str, ...] = ()
    mutation: str | None = None
    hazard: str | None = None
    problem: str | None = None
    set_epoch: bool = False
    seconds: float = 0.0
    kept: KeptSamples | None = field(default=None, repr=False, compare=False)
    """The samples kept to be served in the first epoch (NOTE [probe samples reused])."""
    refetch: str | None = None
    """Why the samples are not kept but fetched again (None: kept, or none fetched)."""

    @property
    def usable(self) -> bool:
        return self.samples > 0 and self.blocker is None

    @property
    def blocker(self) -> str | None:
        """Why the samples must stay in the main process, or None."""
        if self.problem:
            return self.problem
        if self.hazard:
            return f"{self.hazard} (forked workers would share it; use multiprocessing_context="\
                   "'spawn' with num_workers=N if it reopens per worker)"
        if self.mutation:
            return f"a fetch mutates the dataset ({self.mutation}): workers would each change their own copy"
        return None

    @property
    def waits(self) -> bool:
        """Samples mostly wait (wall >> CPU), so more workers than cores pay."""
        return bool(self.wall_s and self.cpu_s is not None and self.wall_s >= WAIT_RATIO * max(self.cpu_s, 1e-6))

    def summary(self) -> str:
        head = f"probe: {self.samples} sample{'s' if self.samples != 1 else ''} in {self.seconds:.2f} s"
        if self.samples == 0:
            return f"{head} (none fetched)"
        copied = self.copied
        if self.dataset_bytes is not None:
            copied += f" ({human_bytes(self.dataset_bytes)})"
        rng = f"draws from the main process's {'/'.join(self.rng)} RNG" if self.rng else "no main-process RNG"
        mutation = "mutates itself" if self.mutation else "no self-mutation"
        if self.kept is not None:
            reuse = self.kept.note
        else:
            reuse = f"samples fetched again: {self.refetch or 'not kept'}"
        return f"{head}; {copied}, {rng}, {mutation}; {reuse}"


def start_method(context: Any) -> str:
    """The start method workers would use: the loader's ``multiprocessing_context`` or the default.

    Reading the default does not fix it (``get_all_start_methods()[0]`` is the default).
    """
    if context is None:
        return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if isinstance(context, str):
        return context
    method = getattr(context, "get_start_method", None)
    return method() if callable(method) else str(context)


def probe_dataset(
    dataset: Any, *, context: str = "fork", max_samples: int = MAX_SAMPLES, budget_s: float = BUDGET_S
) -> DatasetProbe:
    """Probe ``dataset`` (map-style) as NOTE [the dataset probe] says; never raises for the dataset's faults."""
    start = time.perf_counter()
    facts: dict[str, Any] = {"context": context}

    def result(**more: Any) -> DatasetProbe:
        facts.update(more)
        return DatasetProbe(**facts, seconds=time.perf_counter() - start)

    try:
        length = len(dataset)
    except Exception as e:  # noqa: BLE001 - no __len__, or a broken one
        return result(problem=f"len() raised {type(e).__name__}: torch needs a length or a sampler to index it")
    facts["length"] = length
    if length <= 0:
        return result(problem="it is empty")
    try:
        facts["set_epoch"] = callable(getattr(dataset, "set_epoch", None))
    except Exception:  # noqa: BLE001 - a __getattr__ that raises
        facts["set_epoch"] = True

    nodes = list(walk(dataset))
    identity = reads_identity(nodes)
    if identity:
        return result(problem=f"{identity} calls {'/'.join(sorted(IDENTITY_CALLS))}: workers would change what it returns")
    held = sum(array_bytes(o) for _, o in nodes)
    if held > MAX_COPY_BYTES:
        return result(problem=f"it holds {human_bytes(held)} of arrays: not copied to be probed "
                              "(in-memory data rarely gains from workers)")
    if context == "fork":
        hazard = fork_hazard(nodes)
        if hazard:
            return result(hazard=hazard)

    try:
        blob = pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
        probe_copy = pickle.loads(blob)
        facts.update(copied="pickles", dataset_bytes=len(blob))
        del blob
    except Exception as e:  # noqa: BLE001 - the dataset's own code may raise anything
        why = f"{type(e).__name__}: {short(e)}"
        if context != "fork":
            return result(problem=f"it does not pickle ({why}), which {context} workers need")
        try:
            probe_copy = copy.deepcopy(dataset)
        except Exception as e2:  # noqa: BLE001 - the dataset's own code may raise anything
            return result(problem=f"it neither pickles ({why}) nor deep-copies ({type(e2).__name__}): not probed")
        facts["copied"] = "does not pickle, probed on a deep copy (fork shares it)"

    classes = class_state(probe_copy)
    before = fingerprint(probe_copy)
    fetched = _Fetched(memory_of(list(walk(probe_copy))))
    rng_before = _rng_states()
    cuda_before = _cuda_initialized()
    try:
        with warnings.catch_warnings(record=True) as caught:
            # The dataset's warnings are the user's first fetch's to show, not the probe's
            # ("always" leaves no mark in the registry of the module that warns).
            warnings.simplefilter("always")
            problem = _fetch(probe_copy, min(max_samples, length), start, budget_s, fetched)
        drew = _drawn(rng_before)
    finally:
        _restore_rng(rng_before)
        rebound = restore_classes(classes)
    after = fingerprint(probe_copy)
    if problem is None and not cuda_before and _cuda_initialized():
        problem = "a fetch initialised CUDA: forked workers cannot use it, and its samples may be CUDA tensors"
    mutation = rebound or difference(before, after)
    cpu, wall, sizes = fetched.cpu, fetched.wall, fetched.sizes
    timed = slice(1, None) if len(wall) >= 3 else slice(-1, None)
    facts.update(
        samples=len(wall), problem=problem, mutation=mutation, rng=drew,
        cpu_s=statistics.median(cpu[timed]) if cpu else None,
        wall_s=statistics.median(wall[timed]) if wall else None,
        sample_bytes=int(statistics.median(sizes)) if sizes else None,
    )
    refetch = _refetch_reason(dataset, facts, fetched, warned=len(caught))
    if refetch is None:
        kept = KeptSamples(fetched.blobs, fingerprint(dataset), capped=fetched.capped,
                           fetch_s=sum(fetched.wall[i] for i in fetched.blobs))
        return result(kept=kept)
    return result(refetch=refetch)


def _refetch_reason(dataset: Any, facts: dict[str, Any], fetched: _Fetched, *, warned: int) -> str | None:
    """Why the probe's samples must be fetched again (NOTE [probe samples reused]), or None."""
    if facts.get("problem"):
        return "the probe could not use them"
    if facts.get("rng"):
        return "it draws from the global RNG"
    if facts.get("mutation"):
        return "it mutates itself"
    if warned:
        return "its fetches warn, and the real fetches show that"
    if facts.get("set_epoch"):
        return "it has set_epoch, and its samples may follow the epoch"
    if fetched.shared:
        return fetched.shared
    if not _per_index(dataset):
        return "it fetches batches with __getitems__"
    if not fetched.blobs:
        return f"the first is over the {MAX_KEPT_BYTES >> 20} MB kept at most"
    return None


def _per_index(dataset: Any) -> bool:
    """Whether torch's fetcher reads ``dataset`` index by index (no ``__getitems__`` of its own)."""
    try:
        if isinstance(dataset, torch.utils.data.Subset):
            return _per_index(dataset.dataset)
        return not callable(getattr(dataset, "__getitems__", None))
    except Exception:  # noqa: BLE001 - a __getattr__ that raises: not known to be per index
        return False


# -- the fetches, and what a sample may not be --------------------------------------------

class _Fetched:
    """What the fetches gave: per-sample CPU and wall seconds, pickled sizes, kept samples."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner  # the copy's objects and memory (state.memory_of)
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self.sizes: list[int] = []
        self.blobs: dict[int, bytes] = {}
        self.kept_bytes = 0
        self.capped = 0
        self.shared: str | None = None


def _fetch(dataset: Any, count: int, start: float, budget_s: float, out: _Fetched) -> str | None:
    """Fetch indices 0, 1, ... into ``out``; the first problem (or None)."""
    for i in range(count):
        if i and time.perf_counter() - start > budget_s:
            break
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            sample = dataset[i]
        except Exception as e:  # noqa: BLE001 - the dataset's own code may raise anything
            return f"fetching sample {i} raised {type(e).__name__}: {short(e)}"
        out.wall.append(time.perf_counter() - w0)
        out.cpu.append(time.thread_time() - c0)
        problem = _sample_problem(sample, i, out)
        if problem:
            return problem
    return None


def _sample_problem(sample: Any, i: int, out: _Fetched) -> str | None:
    nodes = list(walk(sample))
    for _, o in nodes:
        if isinstance(o, torch.Tensor) and o.device.type != "cpu":
            return f"sample {i} holds a {o.device.type} tensor: worker processes cannot return it"
    try:
        blob = pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - the dataset's own code may raise anything
        return f"sample {i} does not pickle ({type(e).__name__}: {short(e)}): workers send samples pickled"
    out.sizes.append(len(blob))
    if out.shared is None:
        shared = shares_memory(nodes, out.owner)
        if shared:
            out.shared = f"sample {i} {shared}, which a kept copy would not be"
    if out.kept_bytes + len(blob) <= MAX_KEPT_BYTES and not out.capped:
        out.blobs[i] = blob
        out.kept_bytes += len(blob)
    else:
        out.capped += 1
    return None


def _cuda_initialized() -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a build without CUDA
        return False


# -- the main process's random streams ----------------------------------------------------

def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        states["numpy"] = np.random.get_state()
    return states


def _drawn(before: dict[str, Any]) -> tuple[str, ...]:
    now = _rng_states()
    drew = []
    if not torch.equal(before["torch"], now["torch"]):
        drew.append("torch")
    if "numpy" in before:
        a, b = before["numpy"], now["numpy"]
        if a[0] != b[0] or a[2:] != b[2:] or not (a[1] == b[1]).all():
            drew.append("numpy")
    if before["random"] != now["random"]:
        drew.append("random")
    return tuple(drew)


def _restore_rng(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["random"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])
