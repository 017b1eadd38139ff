"""The probe's rate of a candidate whose workers each make whole batches (NOTE [whole rounds]).

Arrival times are made up here, so the figures are exact: no clock is read.
"""

from __future__ import annotations

import pytest

from fastload.engines.probe import MIN_COUNTED, PROBE_BATCHES, Measure, quota


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
