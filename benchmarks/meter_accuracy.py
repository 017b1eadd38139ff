"""Does the starvation meter report the true wait? Known-cost loaders against known-cost loops.

Each case builds a loader whose batches take a known time to produce (a sleep in the collate
function, once per batch) and a loop whose step takes a known time (a sleep), so the true
steady-state wait per batch follows from the construction:

* ``workers == 0``: the batch is made inside ``next()``: wait = produce. The true value is
  the producer's own clock (perf_counter around the sleep and collate), so sleep overshoot
  on a busy machine is counted on both sides.
* ``workers == W``: W batches are made in parallel, one every produce / W seconds on
  average, while the loop needs one per step: wait = max(0, produce / W - step). On a busy
  machine sleeps overshoot and moving a batch from a worker (IPC, unpickling) is real
  waiting the formula does not count, so the truth here is the loop's own stopwatch around
  ``next()``, kept outside the meter; the formula's value is printed as "nominal".

The expected verdict is the band of the nominal share.

It prints, per case, the true and measured mean wait per batch (steady state: the first
batch of the pass is worker start-up and left out), the error, whether it is within the
issue's tolerance (10% or 1 ms), and the expected versus reported verdict.

    python benchmarks/meter_accuracy.py                # 40 batches per case
    python benchmarks/meter_accuracy.py --batches 20 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from torch.utils.data.dataloader import default_collate

import fastload
from fastload.meter import verdict_for


class Indices(Dataset):
    """Samples that cost nothing; the cost lives in :class:`SlowCollate`.

    ``__getitems__`` (torch calls it with a batch's indices) starts the producer's clock,
    which :class:`SlowCollate` stops, so it spans the whole making of a batch.
    """

    fastload_worker_safe = True

    def __init__(self, n: int) -> None:
        self.n = n
        self.began = 0.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        self.began = time.perf_counter()
        return [self[i] for i in indices]


class SlowCollate:
    """Collate that takes ``seconds`` per batch, wherever it runs (main process or worker)."""

    def __init__(self, dataset: Indices, seconds: float) -> None:
        self.dataset = dataset
        self.seconds = seconds
        self.took: list[float] = []  # actual seconds per batch (main process only)

    def __call__(self, samples: list) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        batch = default_collate(samples)
        self.took.append(time.perf_counter() - self.dataset.began)
        return batch


@dataclass
class Case:
    name: str
    produce_ms: float
    step_ms: float
    workers: int

    @property
    def true_wait_ms(self) -> float:
        if self.workers == 0:
            return self.produce_ms
        return max(0.0, self.produce_ms / self.workers - self.step_ms)

    @property
    def true_share(self) -> float:
        per_batch = self.produce_ms if self.workers == 0 else max(
            self.step_ms, self.produce_ms / self.workers
        )
        step = per_batch + self.step_ms if self.workers == 0 else per_batch
        return self.true_wait_ms / step


CASES = [
    Case("input-bound, main process", produce_ms=30, step_ms=5, workers=0),
    Case("input-bound, 2 workers", produce_ms=40, step_ms=10, workers=2),
    Case("moderately, main process", produce_ms=10, step_ms=90, workers=0),
    Case("compute-bound, main process", produce_ms=0, step_ms=20, workers=0),
    Case("compute-bound, 2 workers", produce_ms=5, step_ms=60, workers=2),
]


def run_case(case: Case, batches: int) -> dict:
    dataset = Indices(batches * 4)
    collate = SlowCollate(dataset, case.produce_ms / 1000)
    loader = fastload.DataLoader(
        dataset,
        batch_size=4,
        num_workers=case.workers,
        collate_fn=collate,
        persistent_workers=False,
    )
    # The loop's own stopwatch around next(), outside the meter: the truth for worker cases.
    stopwatch: list[float] = []
    it = iter(loader)
    while True:
        start = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        stopwatch.append(time.perf_counter() - start)
        time.sleep(case.step_ms / 1000)
    summary = loader.meter.summary()
    steady = [r for r in loader.meter.records()[1:] if r["step_s"] is not None]
    measured_ms = sum(r["wait_s"] for r in steady) / len(steady) * 1e3
    # In the main process the producer's own clock gives the true wait, sleep overshoot
    # included; with workers only the construction does (IPC to the main process is extra).
    true_ms = (
        sum(collate.took[1:]) / len(collate.took[1:]) * 1e3
        if case.workers == 0
        else sum(stopwatch[1:]) / len(stopwatch[1:]) * 1e3
    )
    error_ms = measured_ms - true_ms
    tolerance_ms = max(0.1 * true_ms, 1.0)
    expected = verdict_for(case.true_share)
    return {
        "case": case.name,
        "produce_ms": case.produce_ms,
        "step_ms": case.step_ms,
        "workers": case.workers,
        "nominal_wait_ms": case.true_wait_ms,
        "true_wait_ms": true_ms,
        "true_from": "producer clock" if case.workers == 0 else "loop stopwatch",
        "measured_wait_ms": measured_ms,
        "measured_wait_p50_ms": summary.wait_p50_s * 1e3,
        "error_ms": error_ms,
        "within_tolerance": abs(error_ms) <= tolerance_ms,
        "true_share": case.true_share,
        "measured_share": summary.wait_share,
        "expected_verdict": expected.value,
        "verdict": summary.verdict.value,
        "verdict_matches": summary.verdict is expected,
        "fix": summary.diagnosis.fix,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=40, help="batches per case")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    results = [run_case(case, args.batches) for case in CASES]
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    print(f"meter accuracy: {args.batches} batches per case, steady-state mean wait per batch")
    header = (
        f"  {'case':<28}{'nominal':>9}{'true':>9}{'measured':>10}{'error':>9}  ok   "
        f"{'true share':>10}{'measured':>10}  verdict (expected)"
    )
    print(header)
    for r in results:
        ok = "yes" if r["within_tolerance"] else "NO "
        verdict = r["verdict"] + ("" if r["verdict_matches"] else f" (expected {r['expected_verdict']})")
        print(
            f"  {r['case']:<28}{r['nominal_wait_ms']:7.2f}ms{r['true_wait_ms']:7.2f}ms"
            f"{r['measured_wait_ms']:8.2f}ms"
            f"{r['error_ms']:+7.2f}ms  {ok}  {r['true_share']:10.1%}{r['measured_share']:10.1%}"
            f"  {verdict}"
        )
    for r in results:
        print(f"  fix for {r['case']}: {r['fix']}")
    bad = [r for r in results if not (r["within_tolerance"] and r["verdict_matches"])]
    print(f"  {len(results) - len(bad)} of {len(results)} cases within 10% (or 1 ms) with the right verdict")
    print("  true = producer clock (main process) or loop stopwatch (workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
