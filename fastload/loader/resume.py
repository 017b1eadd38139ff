"""Exact mid-epoch resumption of a :class:`fastload.DataLoader`: its state and how it is restored.

``loader.state_dict()`` says where the loader is: the epoch in progress and how many batches of
it were handed to the training loop (not how many workers have fetched ahead).
``loader.load_state_dict(state)`` on a new loader over the same dataset continues at the next
unseen batch, in the same order, with the same augmentations::

    >>> state = loader.state_dict()            # save with the model, e.g. torch.save
    >>> loader = DataLoader(dataset, batch_size=64, shuffle=True)
    >>> loader.load_state_dict(state)
    >>> for batch in loader: ...               # the rest of the interrupted epoch, then on

NOTE [two ways to resume]
*Sharded*: when the loader owns its sampler (an :class:`~fastload.data.sampling.EpochSampler`,
chosen for declared datasets and under torch.distributed), the order is a pure function of
(seed, epoch), so the state is (seed, epoch, indices consumed per rank) and the new loader
starts at the next index without reading anything twice. Augmentations of declared datasets
follow (seed, epoch, index) (NOTE [per-sample seeds]) and come back exactly too. This is the
mode that survives a change of world size (see :func:`load_state_dict`).

*Replay*: any other loader (torch's own RandomSampler over an arbitrary dataset, a user
sampler or batch sampler, an IterableDataset) draws its order from torch's random generator
when an epoch starts. The state keeps that generator's state from the epoch start (the
loader's ``generator``, else torch's global generator); the new loader restores it just for
building the iterator, re-reads the batches already consumed and drops them, then hands the
user's global random state back. The order and worker seeds are exact; the cost is reading
those batches again. Random numbers a dataset draws from the *main* process's global
generator (``num_workers=0``) interleave with the training loop's own draws and cannot be
replayed.

NOTE [persistent workers]
torch draws the worker seed when it builds an iterator, and with ``persistent_workers=True``
it builds one only for the loader's first epoch, then resets it. A resumed loader therefore
first starts its workers with the random state of the saved loader's first epoch (kept in
the state), then begins the epoch by a reset, drawing exactly what the saved run drew. The
order is exact; the workers' own random streams restart, so random numbers a dataset draws
in persistent workers match only within the loader's first epoch.

NOTE [a changed order]
A sharded state says how far into the epoch's permutation the ranks are, not which samples
they read: resumed over a permutation that is not the saved one, the rest of the epoch
would repeat some samples and skip others, silently. The permutation is a function of
(seed, epoch) and the dataset's order, and that order can change under a checkpoint: another
``shuffle_window``, files added, a fastload whose order changed (``ParquetImages`` read its
files a window at a time from 2026-12-03 on). So the state also keeps a digest of the
epoch's whole permutation (``order``), and a load that would continue mid-epoch checks it and
raises :class:`~fastload.errors.ConfigError` on a mismatch, saying how to read the epoch
again from its start. A state of an epoch's start (nothing consumed) does not depend on the
order and loads as before; a state saved before the digest existed is not checked. The
digest costs a permutation and a hash at each save: 0.2 s for ImageNet's 1.28M samples.

Out-of-order delivery (``in_order=False`` with workers) has no "next batch": saving it raises.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from fastload import distributed
from fastload.data.sampling import EpochSampler
from fastload.errors import ConfigError
from fastload.loader.state import LoaderState, Progress, ReplayPlan

if TYPE_CHECKING:
    from fastload.loader import DataLoader

logger = logging.getLogger(__name__)

FORMAT = "fastload.DataLoader/1"

# State keys.
K_FORMAT = "format"
K_MODE = "mode"            # "sharded" or "replay" (NOTE [two ways to resume])
K_EPOCH = "epoch"          # the epoch to continue (0-based)
K_BATCHES = "batches"      # batches of that epoch already handed to the user (this rank)
K_SEED = "seed"
K_SHUFFLE = "shuffle"
K_DROP_LAST = "drop_last"  # the sampler's: pad or drop the tail that does not split evenly
K_SIZE = "dataset_len"
K_WORLD = "world_size"
K_RANK = "rank"
K_SPAN = "span"            # [start, stop] of the epoch's permutation being consumed
K_CONSUMED = "consumed"    # indices of this rank's shard of the span already consumed
K_LAYOUT = "layout"        # ranks the epoch's permutation was laid out for (a shard order's)
K_ORDER = "order"          # a digest of the epoch's permutation (NOTE [a changed order])
K_RNG = "rng_state"        # replay: the generator state at the start of the epoch
K_RNG_SOURCE = "rng_source"  # replay: "generator" (the loader's) or "global"
K_WARM = "first_rng_state"  # replay, persistent workers: the state when they were started

SHARDED, REPLAY = "sharded", "replay"


def mode_of(state: LoaderState) -> str:
    """How a loader with this state resumes (NOTE [two ways to resume])."""
    return SHARDED if state.owns_sampler else REPLAY


def start_epoch(loader: DataLoader, state: LoaderState) -> Progress:
    """Record what a later resume of epoch ``state.epoch`` needs, before the iterator draws anything."""
    epoch = state.epoch
    progress = Progress(epoch)
    if mode_of(state) == SHARDED:
        sampler: EpochSampler = loader.epoch_sampler  # type: ignore[assignment]
        start, stop, skip = sampler.span(epoch)
        progress.span, progress.skip, progress.shard_len = (start, stop), skip, sampler.shard_len(epoch)
    else:
        progress.rng_state, progress.rng_source = _rng_state(loader)
        progress.reused = _reuses_iterator(loader)
    return progress


def _rng_state(loader: DataLoader) -> tuple[torch.Tensor, str]:
    if loader.generator is not None:
        return loader.generator.get_state(), "generator"
    return torch.get_rng_state(), "global"


def _reuses_iterator(loader: DataLoader) -> bool:
    """Whether the next epoch continues the workers of the last (no new worker seed is drawn)."""
    return loader.engine.reuses_iterator


def state_dict(loader: DataLoader, state: LoaderState) -> dict[str, Any]:
    """The loader's position; see :meth:`fastload.DataLoader.state_dict`."""
    if state.loaded is not None:  # loaded but not iterated yet: still that state
        return dict(state.loaded)
    if not loader.in_order and loader.num_workers > 0:
        raise ConfigError(
            "DataLoader(in_order=False) hands batches over out of order, so there is no exact "
            "'next batch' to resume from; pass in_order=True to use state_dict()"
        )
    progress = state.progress
    if progress is None or progress.done:
        epoch, batches = state.epoch, 0
    else:
        epoch, batches = progress.epoch, progress.batches
    saved: dict[str, Any] = {K_FORMAT: FORMAT, K_MODE: mode_of(state), K_EPOCH: epoch, K_BATCHES: batches}
    if saved[K_MODE] == SHARDED:
        sampler: EpochSampler = loader.epoch_sampler  # type: ignore[assignment]
        if batches:
            assert progress is not None
            span, consumed = progress.span, progress.skip + _indices_in(loader, progress)
        else:
            start, stop, skip = sampler.span(epoch)
            span, consumed = (start, stop), skip
        saved.update({
            K_SEED: sampler.seed, K_SHUFFLE: sampler.shuffle, K_DROP_LAST: sampler.drop_last,
            K_SIZE: sampler.size, K_WORLD: sampler.num_replicas, K_RANK: sampler.rank,
            K_SPAN: list(span), K_CONSUMED: consumed, K_LAYOUT: sampler.layout(epoch),
            K_ORDER: sampler.order_digest(epoch),
        })
    else:
        in_epoch = progress is not None and not progress.done and progress.rng_state is not None
        if in_epoch:
            saved[K_RNG] = progress.rng_state.clone()  # type: ignore[union-attr]
        # NOTE [persistent workers]: an iterator that torch resets draws one number fewer
        # than a new one; the resumed loader first starts its workers from the same state.
        if (progress.reused if in_epoch else _reuses_iterator(loader)):  # type: ignore[union-attr]
            saved[K_WARM] = state.first_rng.clone()  # type: ignore[union-attr]
        saved[K_RNG_SOURCE] = _rng_state(loader)[1]
    return saved


def _indices_in(loader: DataLoader, progress: Progress) -> int:
    """Sampler indices behind ``progress.batches`` batches of this rank's shard."""
    left = progress.shard_len - progress.skip
    per_batch = loader.batch_size if loader.batch_size is not None else 1
    return min(progress.batches * per_batch, left)


def load_state_dict(loader: DataLoader, state: LoaderState, saved: dict[str, Any]) -> LoaderState:
    """The loader's state, updated so its next iteration continues from ``saved``.

    Under torch.distributed every rank must call it (it checks that the ranks agree). A state
    saved with another world size is re-split: the samples of the epoch that no rank had
    consumed are divided over the new ranks, each exactly once (padded or dropped to an even
    split as the sampler's ``drop_last`` says). That needs every old rank to have stopped at
    the same batch, as DDP training does; when the new ranks find otherwise, it raises
    ConfigError.
    """
    if not isinstance(saved, dict) or saved.get(K_FORMAT) != FORMAT:
        got = saved.get(K_FORMAT) if isinstance(saved, dict) else type(saved).__name__
        raise ConfigError(
            f"load_state_dict() got {got!r}, not a state from fastload.DataLoader.state_dict() "
            f"({FORMAT!r}); pass the dict that state_dict() returned"
        )
    mode = mode_of(state)
    if saved[K_MODE] != mode:
        raise ConfigError(
            f"the state was saved by a loader resuming by {saved[K_MODE]!r} but this loader "
            f"resumes by {mode!r} (NOTE [two ways to resume] in fastload.loader.resume): build "
            "it the same way (same dataset type, sampler, distributed or not)"
        )
    epoch, batches = int(saved[K_EPOCH]), int(saved[K_BATCHES])
    state.replay = None
    if mode == SHARDED:
        _restore_sharded(loader, saved, epoch)
    elif K_RNG in saved or K_WARM in saved:
        state.replay = ReplayPlan(batches, saved.get(K_RNG), saved[K_RNG_SOURCE], saved.get(K_WARM))
    state.epoch = epoch
    state.progress = None
    state.loaded = dict(saved)
    return state


def _restore_sharded(loader: DataLoader, state: dict[str, Any], epoch: int) -> None:
    sampler: EpochSampler = loader.epoch_sampler  # type: ignore[assignment]
    for key, mine in ((K_SIZE, sampler.size), (K_SHUFFLE, sampler.shuffle), (K_DROP_LAST, sampler.drop_last)):
        if state[key] != mine:
            raise ConfigError(
                f"the saved loader had {key}={state[key]!r} but this one has {key}={mine!r}; "
                "resume over the same dataset with the same shuffle and drop_last"
            )
    start, stop = (int(v) for v in state[K_SPAN])
    consumed, old_world = int(state[K_CONSUMED]), int(state[K_WORLD])
    info = distributed.rank_info()
    if info.connected and info.world_size > 1:
        peers = distributed.gather_objects((epoch, start, stop, consumed, old_world, state[K_RANK]))
        _check_peers(peers, old_world, sampler.num_replicas)
    layout = int(state.get(K_LAYOUT, old_world))  # NOTE [shard-aware order]: the saved layout
    seed, sampler.seed = sampler.seed, int(state[K_SEED])  # NOTE [one seed for all ranks]
    try:
        _check_order(sampler, state, epoch, layout, midway=start > 0 or consumed > 0,
                     what=repr(loader.dataset))
    except ConfigError:
        sampler.seed = seed  # the loader as it was
        raise
    if old_world == sampler.num_replicas:
        sampler.resume(epoch, start=start, stop=stop, skip=consumed, layout=layout)
        return
    # Elastic: positions [start, start + consumed * old_world) of the span are consumed.
    old = EpochSampler(stop - start, drop_last=sampler.drop_last, num_replicas=old_world)
    real = min(stop - start, old.shard_len() * old_world)  # without padding, after dropping
    new_start = start + min(consumed * old_world, real)
    sampler.resume(epoch, start=new_start, stop=start + real, layout=layout)
    logger.info(
        "resuming epoch %d on %d ranks (saved on %d): %d samples left, split over the new ranks",
        epoch, sampler.num_replicas, old_world, start + real - new_start,
    )


def _check_order(sampler: EpochSampler, state: dict[str, Any], epoch: int, layout: int, *,
                 midway: bool, what: str) -> None:
    """Raise where a state saved mid-epoch would continue another permutation (NOTE [a
    changed order]); ``what`` names the dataset."""
    saved = state.get(K_ORDER)
    if saved is None or not midway:
        return
    mine = sampler.order_digest(epoch, layout)
    if mine != saved:
        raise ConfigError(
            f"the saved state is {state[K_CONSUMED]} samples a rank into epoch {epoch}, but "
            f"this loader's order for that epoch is not the saved one (digest {mine}, saved "
            f"{saved}) over {what}: the dataset's samples or order changed since (another "
            "shuffle_window, "
            "other files, a fastload whose order changed), and the rest of the epoch would "
            "repeat some samples and skip others. Load a state saved between epochs, or read "
            f"epoch {epoch} again from its start: state['span'] = [0, "
            f"{state[K_SIZE]}]; state['consumed'] = 0"
        )


def _check_peers(peers: list[tuple], old_world: int, new_world: int) -> None:
    epochs = {p[0] for p in peers}
    if len(epochs) > 1:
        raise ConfigError(
            f"the ranks loaded states of different epochs {sorted(epochs)}; load the states "
            "saved at one step of the same run"
        )
    if old_world == new_world:
        return
    positions = {p[1:4] for p in peers}
    if len(positions) > 1:
        raise ConfigError(
            f"cannot resume a {old_world}-rank run on {new_world} ranks: the loaded states stop "
            f"at different positions {sorted(positions)} (span start, stop, consumed per rank), "
            "so fastload cannot tell which samples the missing ranks consumed. Save every rank "
            "at the same step (as DDP training does), or resume with the same world size"
        )


def begin(
    loader: DataLoader, state: LoaderState, make_inner: Any, plan: ReplayPlan
) -> tuple[Iterator[Any], list[Any]]:
    """Build the inner iterator like the saved run did, and drop the batches it had consumed.

    Returns the iterator and the first unseen item (in a list, empty at the epoch's end),
    both pulled while the saved random state is in force (NOTE [two ways to resume]).
    """
    if plan.warm is not None:  # NOTE [persistent workers]
        with _random_state(loader, plan.warm, plan.rng_source):
            make_inner()
        state.first_rng = plan.warm
    if plan.rng_state is None:
        return make_inner(), []
    with _random_state(loader, plan.rng_state, plan.rng_source):
        return _pull(make_inner(), plan.batches)


@contextlib.contextmanager
def _random_state(loader: DataLoader, state: torch.Tensor, source: str) -> Iterator[None]:
    """The loader's generator set to ``state``, or torch's global one just inside the block."""
    if source == "generator":
        if loader.generator is None:
            raise ConfigError(
                "the state was saved by a loader with a generator= but this one has none; "
                "pass a torch.Generator like the saved run did"
            )
        loader.generator.set_state(state)
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        yield


def _pull(inner: Iterator[Any], batches: int) -> tuple[Iterator[Any], list[Any]]:
    for done in range(batches):
        if next(inner, _END) is _END:
            raise ConfigError(
                f"the state says {batches} batches of this epoch were consumed but the loader "
                f"has only {done}; resume over the same dataset with the same batch_size"
            )
    first = next(inner, _END)
    return inner, ([] if first is _END else [first])


_END = object()
