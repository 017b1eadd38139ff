"""What the starvation meter costs per batch: meter on versus off, side by side, one run.

A loader over an in-memory TensorDataset delivers thousands of batches per second, so the
meter's fixed per-batch cost is as visible as it can be. Three loaders run interleaved
batch by batch (each ``next()`` timed, the order rotating), round after round, over the
same data:

* stock torch:       torch.utils.data.DataLoader
* fastload, off:     fastload.DataLoader(..., meter=False)
* fastload, on:      fastload.DataLoader(...)            (the default)
Each fastload kind runs as TWINS identical loaders (3): one loader can run a few
microseconds per batch slower than its twin for reasons of memory placement alone, so each
kind's figure is the mean over its twins, and the twins' spread (the noise floor) is printed
next to the overhead.

and, to isolate the meter from the loader, its hot path alone: ``measure()`` around a list
of ready batches against iterating the list. Each figure is the median over ``--rounds``
rounds; the overhead is (on - off) / off of the per-batch time. Target: <= 1%.

Two microbenchmarks of the loader's own iterator (what a fastload loader runs per batch in
the main process, NOTE [the meter inside the loader's iterator]), meter on vs off, over
ready batches so torch's fetch is not in the figure:

* warm: whole rounds of ``--iter-batches`` batches, the minimum and the median over
  ``--iter-rounds`` rounds of the per-batch difference;
* cold: the same iterators stepped alternately with ``--cold-mb`` MB of memory written
  between batches (as torch's collate and a training step evict the caches), each ``next()``
  timed; the median of the per-batch differences.

The meter's cost is a fixed time per batch, so its share falls as batches get bigger; the
run repeats at each ``--batch-sizes`` (default 8 and 128: about 8,000 and 3,000 batches/s on
a 2-core machine) and prints the cost in microseconds next to the share.

    python benchmarks/meter_overhead.py                  # 2000 batches x 9 rounds, b = 8, 128
    python benchmarks/meter_overhead.py --batches 500 --rounds 3 --batch-sizes 8 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.utils.data
from torch.utils.data import TensorDataset

import fastload
from fastload.meter import measure


def seconds_per_batch(iterable) -> float:
    start = time.perf_counter()
    n = 0
    for _ in iterable:
        n += 1
    return (time.perf_counter() - start) / n


def paired_round(loaders: dict[str, object]) -> dict[str, float]:
    """Seconds per batch of each loader, stepped in turn batch by batch (rotating order).

    Interleaving per batch puts every loader in the same moments of a busy machine, so a
    burst of load slows all of them alike instead of whichever ran during it.
    """
    names = list(loaders)
    its = {name: iter(loader) for name, loader in loaders.items()}
    spent = dict.fromkeys(names, 0.0)
    batches = 0
    perf = time.perf_counter
    while True:
        order = names[batches % len(names):] + names[: batches % len(names)]
        try:
            for name in order:
                it = its[name]
                t0 = perf()
                next(it)
                spent[name] += perf() - t0
        except StopIteration:
            break
        batches += 1
    return {name: spent[name] / batches for name in names}


TWINS = 3
"""Loaders of each kind (meter on, meter off), all interleaved. One loader of a kind can run a
few microseconds per batch slower than its identical twin for reasons of memory placement
alone, so each kind's figure is the mean over its twins and the spread is printed."""


def overhead_at(batch_size: int, batches: int, rounds: int, twins: int = TWINS) -> dict:
    """Median per-batch times of every loader at one batch size, and the derived shares."""
    n = batches * batch_size
    data = TensorDataset(torch.randn(n, 16), torch.arange(n))
    loaders: dict[str, object] = {
        "stock torch": torch.utils.data.DataLoader(data, batch_size=batch_size),
    }
    for k in range(twins):  # created alternately, so neither kind gets the first places
        loaders[f"off #{k}"] = fastload.DataLoader(
            data, batch_size=batch_size, num_workers=0, meter=False
        )
        loaders[f"on #{k}"] = fastload.DataLoader(data, batch_size=batch_size, num_workers=0)
    ready = [data[i : i + batch_size] for i in range(0, n, batch_size)]
    hot_path = {"list alone": ready, "measure(list)": measure(ready)}
    times: dict[str, list[float]] = {name: [] for name in [*loaders, *hot_path]}
    for _ in range(rounds):
        for name, seconds in paired_round(loaders).items():
            times[name].append(seconds)
        for name, iterable in hot_path.items():
            times[name].append(seconds_per_batch(iterable))

    med = {name: statistics.median(v) for name, v in times.items()}
    offs = [med[f"off #{k}"] for k in range(twins)]
    ons = [med[f"on #{k}"] for k in range(twins)]
    off, on = statistics.fmean(offs), statistics.fmean(ons)
    # Paired per round (same moments of a busy machine): the median of the differences.
    per_round = [
        statistics.fmean(times[f"on #{k}"][r] for k in range(twins))
        - statistics.fmean(times[f"off #{k}"][r] for k in range(twins))
        for r in range(rounds)
    ]
    shown = {
        "stock torch": med["stock torch"],
        "fastload, meter off": off,
        "fastload, meter on": on,
        "list alone": med["list alone"],
        "measure(list)": med["measure(list)"],
    }
    meter_cost = med["measure(list)"] - med["list alone"]
    return {
        "batch_size": batch_size,
        "twins": twins,
        "us_per_batch": {name: v * 1e6 for name, v in shown.items()},
        "batches_per_s": {name: 1 / v for name, v in shown.items()},
        "each_loader_us": {name: med[name] * 1e6 for name in loaders},
        "meter_cost_us": (on - off) * 1e6,
        "paired_meter_cost_us": statistics.median(per_round) * 1e6,
        "paired_overhead": statistics.median(per_round) / off,
        "overhead_on_vs_off": (on - off) / off,
        "spread_off_us": (max(offs) - min(offs)) * 1e6,
        "spread_on_us": (max(ons) - min(ons)) * 1e6,
        "fastload_off_vs_stock": (off - med["stock torch"]) / med["stock torch"],
        "meter_hot_path_us": meter_cost * 1e6,
        "meter_hot_path_share_of_batch": meter_cost / off,
    }


def iterator_cost(batch_size: int, batches: int, rounds: int, cold_mb: int) -> dict:
    """Microseconds per batch the meter adds to the loader's own iterator (warm and cold)."""
    import numpy as np

    from fastload.loader.iterator import epoch_iterator
    from fastload.loader.state import Progress

    n = batches * batch_size
    data = TensorDataset(torch.randn(n, 16), torch.arange(n))
    ready = [data[i : i + batch_size] for i in range(0, n, batch_size)]
    on = fastload.DataLoader(data, batch_size=batch_size, num_workers=0)
    off = fastload.DataLoader(data, batch_size=batch_size, num_workers=0, meter=False)
    perf = time.perf_counter
    warm: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for name, loader in ((("on", on), ("off", off)) if r % 2 else (("off", off), ("on", on))):
            if loader.meter is not None:
                loader.meter.reset()
            it = epoch_iterator(loader, iter(ready), Progress(0))
            t0 = perf()
            for _ in it:
                pass
            warm[name].append((perf() - t0) / batches)
    diffs = [a - b for a, b in zip(warm["on"], warm["off"])]
    big = np.ones(cold_mb << 18, dtype=np.float32)
    cold: list[float] = []
    for r in range(max(2, rounds // 50)):
        on.meter.reset()
        a = epoch_iterator(on, iter(ready), Progress(0))
        b = epoch_iterator(off, iter(ready), Progress(0))
        first, second = (a, b) if r % 2 else (b, a)
        for _ in range(batches):
            big += 1.0
            t0 = perf()
            next(first)
            t1 = perf()
            big += 1.0
            t2 = perf()
            next(second)
            t3 = perf()
            cold.append((t1 - t0) - (t3 - t2) if first is a else (t3 - t2) - (t1 - t0))
    return {
        "warm_min_us": (min(warm["on"]) - min(warm["off"])) * 1e6,
        "warm_median_us": statistics.median(diffs) * 1e6,
        "cold_median_us": statistics.median(cold) * 1e6,
        "cold_mb": cold_mb,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=2000, help="batches per round")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[8, 128],
        help="one measurement per batch size: small batches give the highest batch rate",
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iter-batches", type=int, default=500,
                        help="batches per round of the iterator microbenchmarks")
    parser.add_argument("--iter-rounds", type=int, default=301)
    parser.add_argument("--cold-mb", type=int, default=8,
                        help="MB written between batches in the cold microbenchmark")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)

    results = [overhead_at(b, args.batches, args.rounds) for b in args.batch_sizes]
    for result in results:
        result["loader_iterator"] = iterator_cost(
            result["batch_size"], args.iter_batches, args.iter_rounds, args.cold_mb
        )
    if args.json:
        json.dump({"batches_per_round": args.batches, "rounds": args.rounds, "runs": results},
                  sys.stdout, indent=1)
        print()
        return 0
    for result in results:
        print(
            f"meter overhead: {args.batches} batches of {result['batch_size']} per round, "
            f"median of {args.rounds} interleaved rounds"
        )
        for name, v in result["us_per_batch"].items():
            print(f"  {name:<22} {v:8.2f} us/batch   {1e6 / v:10.0f} batches/s")
        print(
            f"  meter on vs off        {result['meter_cost_us']:+.2f} us = "
            f"{result['overhead_on_vs_off']:+.2%} of per-batch time (means of "
            f"{result['twins']} twins each; paired per round {result['paired_meter_cost_us']:+.2f} us)"
        )
        print(
            f"  noise floor            twins spread {result['spread_off_us']:.2f} us (off), "
            f"{result['spread_on_us']:.2f} us (on)"
        )
        print(
            f"  meter hot path alone   {result['meter_hot_path_us']:.2f} us/batch = "
            f"{result['meter_hot_path_share_of_batch']:.2%} of the loader's per-batch time"
        )
        print(f"  fastload (off) vs stock torch {result['fastload_off_vs_stock']:+.2%}")
        it = result["loader_iterator"]
        print(
            f"  loader iterator, ready batches: meter adds {it['warm_min_us']:.2f} us/batch "
            f"(min of rounds; median {it['warm_median_us']:.2f}), {it['cold_median_us']:.2f} us "
            f"with {it['cold_mb']} MB written between batches (median)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
