"""Does the meter name the bottleneck a loop was built with? Known bottlenecks, measured.

Each case is a synthetic loop whose bottleneck is known by construction:

* ``workers saturated``: samples burn CPU in ``__getitem__``; the loop is fast.
* ``main process (IPC)``: samples cost nothing to make but carry many small tensors, so
  the per-batch hand-over from the workers (one shared-memory handle per tensor, unpickling)
  is the cost; the workers sit idle.
* ``storage latency``: samples are files read through the ``latency::`` fsspec protocol
  (fastload.testing.latency), a fixed latency per request; the workers wait, not compute.
* ``decode-bound images``: a declared ``fastload.ImageFolder`` on torch workers
  (``backend="torch"``), decoding and resizing JPEGs.
* ``slow collate``: cheap samples, a collate_fn that burns CPU in the workers.
* ``compute-bound``: cheap samples, a long step.

For each it prints the true wait (the benchmark's own clock around ``next()``, steady state:
the first batch of the pass apart), the meter's wait, the worker busy share and the wait split
the meter measured, the verdict and the named bottleneck against the constructed ones, and
then the meter's overhead at about 2,000 batches/s (benchmarks/meter_overhead.py at the batch
size that runs closest to that rate). Exit status 1 when a verdict or bottleneck mismatches.

    python benchmarks/meter_truth.py                 # all cases, 40 batches each
    python benchmarks/meter_truth.py --batches 24 --no-overhead --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset
from torch.utils.data.dataloader import default_collate

import fastload
from fastload.meter import Verdict

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def burn(seconds: float) -> None:
    """Keep this process's CPU busy for ``seconds`` of its own CPU time."""
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        for _ in range(200):
            x += 1


class Spin(Dataset):
    """Each sample costs ``ms`` milliseconds of CPU."""

    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        burn(self.ms / 1e3)
        return torch.full((4,), float(i))


class ManyTensors(Dataset):
    """Cheap samples of ``fields`` small tensors each: the hand-over is the cost."""

    def __init__(self, n: int, fields: int) -> None:
        self.n, self.fields = n, fields

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {f"f{k}": torch.full((2,), float(i)) for k in range(self.fields)}


class RemoteFiles(Dataset):
    """Samples read through fsspec, one request each (``latency::file://...``)."""

    def __init__(self, url: str, names: list[str], latency_s: float) -> None:
        self.url, self.names, self.latency_s = url, names, latency_s
        self._fs = None

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._fs is None:  # one filesystem per worker process
            import fsspec

            self._fs, self._root = fsspec.core.url_to_fs(
                self.url, latency={"latency": self.latency_s}
            )
        data = self._fs.cat_file(f"{self._root}/{self.names[i]}")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)[:16].clone()


class BurningCollate:
    """default_collate after ``ms`` milliseconds of CPU, in the worker."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples: list) -> object:
        burn(self.ms / 1e3)
        return default_collate(samples)


BATCH = 4


@dataclass
class Case:
    name: str
    make: Callable[[Path, int], torch.utils.data.DataLoader]  # (scratch dir, samples)
    step_s: float
    verdicts: tuple[Verdict, ...]
    bottleneck: str


def cases() -> list[Case]:
    input_bound = (Verdict.HIGHLY,)
    return [
        Case("workers saturated", lambda d, n: fastload.DataLoader(
            Spin(n, ms=5), batch_size=4, num_workers=2), 0.002, input_bound, "workers"),
        Case("main process (IPC)", lambda d, n: fastload.DataLoader(
            ManyTensors(n, fields=32), batch_size=4, num_workers=2), 0.001, input_bound,
            "main process"),
        Case("storage latency", lambda d, n: fastload.DataLoader(
            RemoteFiles(f"latency::file://{d}/files", _files(d, n), latency_s=0.008),
            batch_size=4, num_workers=2), 0.002, input_bound, "storage fetch"),
        Case("decode-bound images", lambda d, n: fastload.DataLoader(
            fastload.ImageFolder(_jpegs(d, n), size=160, train=False), batch_size=4,
            num_workers=2, backend="torch"), 0.001, input_bound, "decode/transform"),
        Case("slow collate", lambda d, n: fastload.DataLoader(
            Spin(n, ms=0), batch_size=4, num_workers=2, collate_fn=BurningCollate(20)),
            0.002, input_bound, "collate"),
        Case("compute-bound", lambda d, n: fastload.DataLoader(
            Spin(n, ms=0), batch_size=4, num_workers=2), 0.060, (Verdict.NOT,), "none"),
    ]


def _files(root: Path, n: int) -> list[str]:
    folder = root / "files"
    if not folder.exists():
        folder.mkdir()
        for i in range(n):
            (folder / f"{i:04d}.bin").write_bytes(os.urandom(64))
    return sorted(p.name for p in folder.iterdir())


def _jpegs(root: Path, n: int) -> Path:
    from fastload.testing.synthetic import make_jpeg_folder

    folder = root / "jpegs"
    if not folder.exists():
        make_jpeg_folder(folder, images=n, classes=4, size=(640, 480))
    return folder


def run_case(case: Case, root: Path, batches: int) -> dict:
    """One full pass (``batches`` batches of 4), each ``next()`` on the benchmark's clock."""
    loader = case.make(root, batches * BATCH)
    waits = []
    it = iter(loader)
    perf = time.perf_counter
    while True:
        t0 = perf()
        try:
            next(it)
        except StopIteration:
            break
        waits.append(perf() - t0)
        time.sleep(case.step_s)
    s = loader.meter.summary()
    records = loader.meter.records()
    meter_waits = [r["wait_s"] for r in records[1:]]
    true_wait = statistics.fmean(waits[1:])
    meter_wait = statistics.fmean(meter_waits)
    ws = s.worker_stats
    ok = s.verdict in case.verdicts and s.diagnosis.bottleneck == case.bottleneck
    result = {
        "case": case.name,
        "true_wait_ms": true_wait * 1e3,
        "meter_wait_ms": meter_wait * 1e3,
        "wait_error": abs(meter_wait - true_wait) / true_wait if true_wait else 0.0,
        "busy_share": ws.busy_share if ws is not None else None,
        "cpu_share": ws.cpu_share if ws is not None else None,
        "wait_for_workers_ms": _ms(s.wait_for_workers_s),
        "receive_ms": _ms(s.receive_s),
        "verdict": s.verdict.value,
        "expected_verdict": " or ".join(v.value for v in case.verdicts),
        "bottleneck": s.diagnosis.bottleneck,
        "expected_bottleneck": case.bottleneck,
        "match": ok,
        "fix": s.diagnosis.fix,
        "report": str(s),
    }
    loader.engine.close()
    return result


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def overhead_near(rate: float, batches: int, rounds: int) -> dict:
    """meter_overhead.py's measurement at the candidate batch size whose meter-off loader
    ran nearest ``rate`` batches/s in its own interleaved rounds (all candidates returned)."""
    from meter_overhead import overhead_at

    runs = [overhead_at(b, batches, rounds) for b in OVERHEAD_BATCH_SIZES]
    best = min(runs, key=lambda r: abs(r["batches_per_s"]["fastload, meter off"] - rate))
    return {**best, "candidates": runs}


OVERHEAD_BATCH_SIZES = (64,)
"""Batch sizes of meter_overhead.py's in-memory loader near 2,000 batches/s on 2 cores."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=40, help="batches per case")
    parser.add_argument("--only", nargs="+", help="case names (substrings) to run")
    parser.add_argument("--no-overhead", action="store_true", help="skip the overhead table")
    parser.add_argument("--overhead-batches", type=int, default=2000)
    parser.add_argument("--overhead-rounds", type=int, default=9)
    parser.add_argument("--reports", action="store_true", help="print each case's summary")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)

    chosen = [c for c in cases() if not args.only or any(o in c.name for o in args.only)]
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_case(case, Path(tmp), args.batches) for case in chosen]
    overhead = (
        None if args.no_overhead
        else overhead_near(2000, args.overhead_batches, args.overhead_rounds)
    )
    failed = [r for r in results if not r["match"]]
    if args.json:
        json.dump({"cases": results, "overhead": overhead}, sys.stdout, indent=1)
        print()
        return 1 if failed else 0

    def pct(v: float | None) -> str:
        return "   -" if v is None else f"{v:4.0%}"

    def ms(v: float | None) -> str:
        return "    -" if v is None else f"{v:5.1f}"

    print(f"meter truth: {args.batches} batches per case, steady state (first batch apart)")
    print(f"{'case':<21} {'true wait':>9} {'meter':>7} {'err':>5} {'busy':>5} {'cpu':>5} "
          f"{'w-wait':>6} {'recv':>6}  {'verdict (expected)':<44} bottleneck (expected)")
    for r in results:
        verdict = r["verdict"] + ("" if r["verdict"] in r["expected_verdict"]
                                  else f" ({r['expected_verdict']})")
        bottleneck = r["bottleneck"] + ("" if r["bottleneck"] == r["expected_bottleneck"]
                                        else f" (expected {r['expected_bottleneck']})")
        print(f"{r['case']:<21} {r['true_wait_ms']:6.2f} ms {r['meter_wait_ms']:7.2f} "
              f"{r['wait_error']:5.1%} {pct(r['busy_share'])} {pct(r['cpu_share'])} "
              f"{ms(r['wait_for_workers_ms'])} {ms(r['receive_ms'])}   "
              f"{'ok ' if r['match'] else 'BAD'} {verdict:<40} {bottleneck}")
        if args.reports or not r["match"]:
            print("    " + r["report"].replace("\n", "\n    "))
    if overhead is not None:
        o = overhead
        print(f"\nmeter overhead at {o['batches_per_s']['fastload, meter off']:.0f} batches/s "
              f"(batch size {o['batch_size']}, {args.overhead_batches} batches x "
              f"{args.overhead_rounds} interleaved rounds, medians; meter on and off as "
              f"{o['twins']} identical loaders each)")
        for name, v in o["us_per_batch"].items():
            print(f"  {name:<22} {v:8.2f} us/batch   {1e6 / v:8.0f} batches/s")
        print(f"  meter on vs off        {o['meter_cost_us']:+.2f} us = "
              f"{o['overhead_on_vs_off']:+.2%} of per-batch time (target <= 1%); paired per "
              f"round {o['paired_meter_cost_us']:+.2f} us")
        print(f"  noise floor            twins spread {o['spread_off_us']:.2f} us (off), "
              f"{o['spread_on_us']:.2f} us (on)")
        print(f"  meter hot path alone   {o['meter_hot_path_us']:.2f} us/batch = "
              f"{o['meter_hot_path_share_of_batch']:.2%} (measure() around ready batches)")
    if failed:
        print(f"\n{len(failed)} case(s) mismatch: " + ", ".join(r["case"] for r in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
