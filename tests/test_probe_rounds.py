"""The probe's rate of a candidate whose workers each make whole batches (NOTE [whole rounds]),
how long a candidate is fed (NOTE [a second of each]) and which one is kept (NOTE [ties go to
the lighter engine]).

Arrival times are made up here, so the figures are exact: no clock decides a result.
"""

from __future__ import annotations

import time

import pytest

from fastload.engines.probe import (
    CLEAR,
    MIN_COUNTED,
    PROBE_BATCHES,
    PROBE_SECONDS,
    TIE,
    Gate,
    Measure,
    kept,
    quota,
)


def arrivals(times: list[float], samples: int = 64) -> list[tuple[float, int]]:
    return [(t, samples) for t in times]


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
@pytest.mark.parametrize("fed", [6, 7, 12, 13, 25])
def test_workers_in_step_are_timed_at_their_rate(workers, fed):
    # each worker makes a batch in 1 s; all start together, so batch k arrives at ceil(k / W)
    times = [float(-(-k // workers)) for k in range(1, fed + 1)]
    measure = Measure("torch", workers, arrivals(times))
    if measure.rounds < 1:
        assert measure.rate == 0.0
        return
    assert measure.rate == pytest.approx(64 * workers)  # W batches of 64 a second


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_out_of_step_are_timed_at_their_rate(workers):
    # the same workers once drifted apart: one batch every 1/W s, first after a start-up
    times = [0.3 + k / workers for k in range(1, 20)]
    assert Measure("torch", workers, arrivals(times)).rate == pytest.approx(64 * workers)


def test_counting_from_the_first_batch_flattered_two_workers():
    # what the probe did before: batches 2..6 over t6 - t1 = 2 s; 5 batches where 4 were made
    times = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    naive = 64 * (len(times) - 1) / (times[-1] - times[0])
    assert naive == pytest.approx(1.25 * 128)
    assert Measure("torch", 2, arrivals(times)).rate == pytest.approx(128)


def test_one_producer_is_timed_from_its_first_batch():
    times = [0.5, 1.0, 1.5, 2.0]
    measure = Measure("threads", 1, arrivals(times, samples=32))
    assert (measure.samples, measure.seconds, measure.rounds) == (96, pytest.approx(1.5), 3)
    assert measure.rate == pytest.approx(64)


def test_a_failed_candidate_has_no_rate():
    measure = Measure("torch", 2, arrivals([1.0, 1.0, 2.0, 2.0]), error="it raised")
    assert measure.rate == 0.0


class FakeEngineSizes:
    """Only what ``quota`` reads: the queue and the producers."""

    def __init__(self, ahead: int, producers: int) -> None:
        self.ahead, self.producers = ahead, producers


@pytest.mark.parametrize("ahead, producers", [(3, 1), (4, 2), (32, 16)])
def test_quota_leaves_every_candidate_enough_whole_rounds(ahead, producers):
    given = quota(FakeEngineSizes(ahead, producers))  # type: ignore[arg-type]
    # the loop receives at least given - ahead batches while the candidate is fed
    fed = given - ahead
    assert fed // producers - 1 >= max(MIN_COUNTED - 1, PROBE_BATCHES - 1)


def at_rate(name: str, images_per_s: float, producers: int = 1) -> Measure:
    """A candidate that delivered batches of 64 at this rate, ten rounds."""
    step = 64 * producers / images_per_s
    times = [k * step for k in range(1, 11) for _ in range(producers)]
    measure = Measure(name, producers, arrivals(times))
    assert measure.rate == pytest.approx(images_per_s)
    return measure


def test_a_heavier_engine_within_the_tie_leaves_the_lighter_one_kept():
    threads, torch_, dali = at_rate("threads", 1000), at_rate("torch", 1050, 2), at_rate("dali", 1080)
    assert 1080 < 1000 / (1 - TIE)  # all within the tie of the fastest
    assert kept([threads, torch_, dali]) is threads


def test_a_heavier_engine_past_the_tie_is_kept():
    threads, torch_, dali = at_rate("threads", 1000), at_rate("torch", 900, 2), at_rate("dali", 1500)
    assert kept([threads, torch_, dali]) is dali
    # the tie is against the fastest: torch within it of dali is kept over it, threads is not
    assert kept([at_rate("threads", 500), at_rate("torch", 1400, 2), dali]).name == "torch"


def test_failed_candidates_leave_the_first_kept():
    failed = [Measure(n, 1, arrivals([1.0, 2.0, 3.0, 4.0]), error="it raised") for n in ("threads", "dali")]
    assert kept(failed).name == "threads"
    assert kept([failed[0], at_rate("torch", 10, 2)]).name == "torch"


def drain(gate: Gate) -> int:
    return sum(1 for _ in gate)


def test_a_gate_feeds_past_its_quota_until_the_window_spans_probe_seconds():
    plan = iter([[k] for k in range(100)])
    young = Measure("threads", 1, arrivals([time.perf_counter() + 1e6]))  # a window that never ends
    gate = Gate(plan, 9, 100, cap=30, measure=young)
    assert drain(gate) == 30 and gate.refused_at is not None  # fed up to its cap, then refused
    old = Measure("dali", 1, arrivals([time.perf_counter() - 10 * PROBE_SECONDS]))
    gate = Gate(plan, 9, 70, cap=30, measure=old)
    assert drain(gate) == 9  # its window is long enough: its quota only
    assert next(plan) == [39]  # the two gates took consecutive batches of one plan


def test_a_gate_without_a_measure_or_cap_gives_its_quota_and_the_rest_gives_all():
    plan = iter([[k] for k in range(20)])
    assert drain(Gate(plan, 5, 20)) == 5
    rest = Gate(plan, None, 15)
    assert len(rest) == 15 and drain(rest) == 15 and rest.refused_at is None


def test_a_candidate_that_has_clearly_lost_is_not_fed_past_its_quota():
    # a window that never ends (arrivals in the future), so only the rate can stop the gate
    future = time.perf_counter() + 1e6
    slow = Measure("dali", 1, arrivals([future + k * 0.1 for k in range(7)]))  # 640 img/s
    assert slow.rate == pytest.approx(640)
    plan = iter([[k] for k in range(100)])
    assert drain(Gate(plan, 9, 100, cap=40, measure=slow, lead=640 / (CLEAR * 0.99))) == 9
    close = Measure("torch", 1, arrivals([future + k * 0.1 for k in range(7)]))
    assert drain(Gate(plan, 9, 91, cap=40, measure=close, lead=640 / (CLEAR * 1.01))) == 40
