"""The measured choice: the first epoch runs each candidate engine on a few batches.

``backend="auto"`` on a declared ImageFolder builds a :class:`ProbeEngine` over the engines
that can run it (threads, torch workers, DALI where it imports). The first epoch hands
consecutive batches of its plan to each candidate in turn (``PROBE_BATCHES`` plus the
engine's queue), times how fast each delivers them, and runs the rest of the epoch, and
every later one, on the fastest, or on a lighter one within ``TIE`` of it.
The probe's batches are the epoch's own: they are yielded to the loop in plan order, never
thrown away, so the epoch has exactly the batches, order and augmentations of any engine.

NOTE [timing a candidate]
An engine asks for batches ahead of the loop (``Engine.ahead``: torch's
``prefetch_factor`` per worker, the threaded engine's ``AHEAD``, DALI's queues). A candidate
gets ``PROBE_BATCHES`` plus that many, and is timed from its first batch (its start-up, a
worker fork or a pipeline build, is left out: persistent engines pay it once) to the batch
the loop received when the candidate asked for more than its share. Later batches were
already made while the candidate was still fed, so counting them would flatter deep queues.

NOTE [whole rounds]
torch's workers each make a whole batch, side by side (``Engine.producers``), so their
batches arrive in rounds: with 2 workers, batches 1 and 2 after one batch time, 3 and 4
after two. Timed from the first batch, the second arrives "free", and a window that ends in
mid-round flatters them: the torch candidate measured 461-534 img/s on a recipe it ran at
~400 a whole epoch, and the probe kept it over threads that ran ~500-590 (issue 22's timm
row). So a candidate with W producers is timed from the end of its first round to the end of
its last whole one, counting the samples in between, which is its rate whether its workers
run in step or drift apart; and it gets ``PROBE_BATCHES`` rounds, not batches.

NOTE [a second of each]
Six rounds were the whole window, and on small images that is 5 batch intervals, 0.3-0.4 s:
one slow interval (the first rows of a Parquet window, a page fault, the machine's other work)
moved a candidate's rate by a fifth. Over six loaders in six processes on the same local
Parquet files the threads candidate measured 656-1,056 img/s where the same engine ran
1,062-1,172 a whole epoch, and DALI's CPU pipeline 511-611; once, in a benchmark, DALI was
kept (832 img/s a whole epoch where threads ran 1,302). So a candidate is fed past its six
rounds until its timed window spans ``PROBE_SECONDS``, as long as the probe as a whole takes at
most ``PROBE_SHARE`` of the epoch (beyond the candidates' minimum shares, which it always
takes); an epoch of ImageNet spends ~1 s a candidate, a short one what its share allows.
Precision matters only near the verdict: a candidate whose six rounds measured below
``CLEAR`` of the best rate before it has lost whatever its next rounds show (six rounds were
off by a fifth at most), so it is not fed past them.

NOTE [ties go to the lighter engine]
The candidates are listed lightest first: threads (no processes, no pipeline), torch's
workers (a process each, their memory and IPC), DALI (its own threads and queues, GPU memory
and GPU time beside the model's). When the loop itself is the bound (a model slower than
any engine) they all deliver at the loop's pace, and the fastest is then whichever noise
favoured. So the kept engine is the first of the list within ``TIE`` of the fastest: a
heavier one must win by more than the probe can mistake.

Example::

    >>> loader = DataLoader(ImageFolder("data/train", size=224, train=True), batch_size=64)
    >>> for batch in loader: ...                    # epoch 1 measures, then keeps the fastest
    >>> loader.backend, loader.backend_reason
    ('threads', 'threads: measured 841 img/s vs torch 596 img/s (batches 1-16 of epoch 1) ...')
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastload.data import batchinfo
from fastload.engines.base import Engine, EngineContext
from fastload.engines.registry import Choice, engine_class
from fastload.engines.trial_torch import TrialTorch, epoch_of_trial_torch

logger = logging.getLogger(__name__)

PROBE_BATCHES = 6
"""Rounds of batches of the first epoch each candidate is timed on, beyond its queue (NOTE
[timing a candidate], NOTE [whole rounds]); it gets ``quota(engine)`` batches."""

MIN_COUNTED = 3
"""Rounds a candidate must deliver while still fed for its rate to count."""

PROBE_SECONDS = 1.0
"""A candidate is fed past ``quota`` until its timed window spans this long (NOTE [a second
of each]), within ``PROBE_SHARE``."""

PROBE_SHARE = 0.5
"""The most of an epoch's batches the probe gives its candidates beyond their quotas."""

CLEAR = 0.7
"""A candidate below this fraction of an earlier one's rate after its quota is not fed past
it (NOTE [a second of each])."""

TIE = 0.10
"""A candidate within this fraction of the fastest's rate ties with it; the lighter (earlier)
one is kept (NOTE [ties go to the lighter engine])."""


def quota(engine: Engine) -> int:
    """The first epoch's batches a candidate gets: its queue and ``PROBE_BATCHES`` rounds."""
    return engine.ahead + PROBE_BATCHES * max(1, engine.producers)


class Gate:
    """A share of one epoch's batch plan: hands out at least ``quota`` batches, then stops
    once ``measure``'s timed window spans ``PROBE_SECONDS``, ``cap`` batches are out, or its
    rate is below ``CLEAR`` of ``lead`` (the best rate of the candidates before it).

    Every candidate iterates the same plan through its own gate, so together they cover the
    epoch once, in order. ``refused_at`` is when the candidate first asked past its share.
    ``quota=None``: the rest of the plan.
    """

    def __init__(self, plan: Iterator[list[int]], quota: int | None, total: int,
                 cap: int | None = None, measure: Measure | None = None, lead: float = 0.0) -> None:
        self._plan = plan
        self.quota = quota
        self.total = total
        self.cap = quota if cap is None or quota is None else max(cap, quota)
        self.measure = measure
        self.lead = lead
        self.given = 0
        self.refused_at: float | None = None

    def __len__(self) -> int:
        return self.total if self.cap is None else min(self.cap, self.total)

    def _open(self) -> bool:
        if self.quota is None or self.given < self.quota:
            return True
        if self.measure is None or self.cap is None or self.given >= self.cap:
            return False
        if self.measure.rate < CLEAR * self.lead:
            return False  # it has lost: no need to know by how much
        return self.measure.elapsed() < PROBE_SECONDS

    def __iter__(self) -> Iterator[list[int]]:
        while self._open():
            try:
                batch = next(self._plan)
            except StopIteration:
                return
            self.given += 1
            yield batch
        self.refused_at = time.perf_counter()


@dataclass
class Measure:
    """One candidate's share of the first epoch: when each batch arrived while it was fed
    (``arrivals``: seconds, samples), in rounds of ``producers`` batches."""

    name: str
    producers: int = 1
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    batches: int = 0
    error: str | None = None

    @property
    def rounds(self) -> int:
        """Whole rounds after the first (NOTE [whole rounds])."""
        return max(0, len(self.arrivals) // self.producers - 1)

    @property
    def samples(self) -> int:
        """Samples of the timed rounds: after the first round, up to the last whole one."""
        w = self.producers
        return sum(n for _, n in self.arrivals[w: w * (self.rounds + 1)])

    @property
    def seconds(self) -> float:
        """From the end of the first round to the end of the last whole one."""
        if self.rounds < 1:
            return 0.0
        w = self.producers
        return self.arrivals[w * (self.rounds + 1) - 1][0] - self.arrivals[w - 1][0]

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.error is None and self.seconds > 0 else 0.0

    def elapsed(self) -> float:
        """Seconds since the first batch arrived (0 before it): what the gate waits on."""
        arrivals = self.arrivals
        return time.perf_counter() - arrivals[0][0] if arrivals else 0.0


def kept(measures: list[Measure]) -> Measure:
    """The first of ``measures`` (lightest first) within ``TIE`` of the fastest's rate
    (NOTE [ties go to the lighter engine])."""
    fastest = max(m.rate for m in measures)
    return next(m for m in measures if m.rate >= (1.0 - TIE) * fastest)


class ProbeEngine(Engine):
    """Measures ``choice.candidates`` on the first epoch, then runs on the fastest (a lighter
    one within ``TIE`` of it)."""

    name = "probe"

    @classmethod
    def build(cls, context: EngineContext, choice: Choice | None = None) -> ProbeEngine:  # type: ignore[override]
        if choice is None or not choice.candidates:
            raise ValueError("ProbeEngine needs a Choice with candidates")
        return cls(context, choice.candidates)

    def __init__(self, context: EngineContext, candidates: tuple[str, ...]) -> None:
        self._context = context
        self.candidates = candidates
        self.chosen: Engine | None = None
        self.chosen_name: str | None = None
        self.reason: str | None = None
        self.measures: list[Measure] = []
        self._trial: list[Engine] = []
        self._probing: weakref.ref[Iterator[Any]] | None = None

    @property
    def reuses_iterator(self) -> bool:
        return self.chosen is not None and self.chosen.reuses_iterator

    def epoch(self) -> Iterator[Any]:
        if self.chosen is not None:
            return self.chosen.epoch()
        first = self._first_epoch()
        self._probing = weakref.ref(first)
        return first

    def abandon(self, epoch: Iterator[Any]) -> None:
        """A later epoch: the chosen engine's to stop. The first one: end its generator and
        close the candidates and the engine chosen in it (the next epoch starts its own)."""
        probing = self._probing() if self._probing is not None else None
        if epoch is not probing:
            if self.chosen is not None:
                self.chosen.abandon(epoch)
            return
        probing.close()  # type: ignore[attr-defined]
        self.close()

    def _first_epoch(self) -> Iterator[Any]:
        context = self._context
        total = len(context.batch_sampler)
        plan = iter(context.batch_sampler)
        trials = [self._trial_engine(name) for name in self.candidates]
        quotas = [quota(engine) for engine in trials]
        if total < sum(quotas):
            self.close()
            name = self.candidates[0]
            self._keep(name, engine_class(name).build(context),
                       f"{name}: the epoch's {total} batches are too few to measure "
                       f"{', '.join(self.candidates)} ({sum(quotas)} needed); the in-process "
                       "engine starts no workers")
            yield from self.chosen.epoch()  # type: ignore[union-attr]
            return
        done = 0
        extra = max(0, int(total * PROBE_SHARE) - sum(quotas)) // len(trials)
        for name, engine, share in zip(self.candidates, trials, quotas):
            measure = Measure(name, max(1, engine.producers))
            lead = max((m.rate for m in self.measures), default=0.0)
            gate = Gate(plan, share, total - done, cap=share + extra, measure=measure, lead=lead)
            _retarget(engine, gate)
            self.measures.append(measure)
            try:
                for item in _timed(engine.epoch(), gate, measure):
                    yield item
            finally:
                done += gate.given
        best = kept(self.measures)
        rest = Gate(plan, None, total - done)
        engine = trials[self.candidates.index(best.name)]
        self._keep(best.name, self._promote(best.name, engine), self._describe(best, done))
        if best.name == "torch":  # the trial loader finishes this epoch; the loader's own next
            yield from epoch_of_trial_torch(self._context, rest)
        else:
            _retarget(engine, rest)
            try:
                yield from engine.epoch()
            finally:  # later epochs run the loader's whole plan
                _retarget(engine, context.batch_sampler)
        for other in self._trial:
            if other is not self.chosen:
                other.close()
        self._trial.clear()

    def _trial_engine(self, name: str) -> Engine:
        if name == "torch":
            engine: Engine = TrialTorch(self._context)
        else:
            engine = engine_class(name).build(self._context)
        self._trial.append(engine)
        return engine

    def _promote(self, name: str, trial: Engine) -> Engine:
        """The engine later epochs run on: the trial one, or torch over the loader itself."""
        if name == "torch":
            return engine_class("torch").build(self._context)
        return trial

    def _keep(self, name: str, engine: Engine, reason: str) -> None:
        self.chosen, self.chosen_name, self.reason = engine, name, reason
        logger.info("engine: %s", reason)

    def _describe(self, best: Measure, probed: int) -> str:
        others = [m for m in self.measures if m is not best]
        figures = ", ".join(
            f"{m.name} {m.rate:.0f} img/s" if m.error is None else f"{m.name} failed ({m.error})"
            for m in others
        )
        fastest = max(self.measures, key=lambda m: m.rate)
        tie = (f"; within {TIE:.0%} of {fastest.name}'s, so the lighter engine is kept"
               if fastest is not best else "")
        return (
            f"{best.name}: measured {best.rate:.0f} img/s vs {figures} on batches 1-{probed} of "
            f"the first epoch (start-up and queued batches excluded){tie}; kept for this "
            "dataset and machine"
        )

    def restart(self) -> None:
        if self.chosen is not None:
            self.chosen.restart()

    def close(self) -> None:
        for engine in self._trial:
            engine.close()
        self._trial.clear()
        if self.chosen is not None:
            self.chosen.close()


def _timed(items: Iterator[Any], gate: Gate, measure: Measure) -> Iterator[Any]:
    """Yield a candidate's items, noting those that arrived while it was still fed."""
    for item in items:
        now = time.perf_counter()
        measure.batches += 1
        if gate.refused_at is None or now <= gate.refused_at:
            measure.arrivals.append((now, _samples(item)))
        yield item
    if measure.rounds < MIN_COUNTED - 1:
        measure.error = (f"only {len(measure.arrivals)} batches from {measure.producers} "
                         "producers arrived before it was stopped")


def _samples(item: Any) -> int:
    if isinstance(item, batchinfo.Envelope):
        return item.info.samples
    try:
        return len(item[0])
    except (TypeError, IndexError):
        return 1


def _retarget(engine: Engine, batches: Iterable[list[int]]) -> None:
    engine.batch_sampler = batches  # type: ignore[attr-defined]
