"""The bench report: the numbers, the limit they show, the verdict, as JSON.

Every number the verdict uses is in the report next to it: the best read rate (files/s), the
decode capacity (images/s per core x cores), the loader's feed rate and the emulated AU.

Example::

    >>> report = run_bench("/data/train", gpus=4)
    >>> report.verdict
    'this storage feeds 3 H100s training resnet50 at >= 90% AU (measured 93%); ...'
    >>> json.dumps(report.to_json())          # keys carry units: read_bytes_per_s, ...

The command line prints it as tables (:mod:`fastload.cli.render`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastload.version import __version__
from fastload.bench.accelerators import Emulation, largest_fed
from fastload.bench.decode import DecodeRate
from fastload.bench.inventory import Inventory
from fastload.bench.throughput import RangeReads, ReadPoint, best_point
from fastload.bench.workloads import Workload


@dataclass(frozen=True)
class Measurements:
    """Reads and emulation under one condition: "origin" (no cache), "cold" or "warm"."""

    label: str
    reads: tuple[ReadPoint, ...]
    range_reads: RangeReads
    probe: Emulation
    runs: tuple[Emulation, ...]

    @property
    def best_read(self) -> ReadPoint:
        return best_point(self.reads)

    @property
    def feed_samples_per_s(self) -> float:
        """What the loader delivered to one accelerator that never computes."""
        return self.probe.samples_per_s

    def run_with(self, accelerators: int) -> Emulation | None:
        return next((r for r in self.runs if r.accelerators == accelerators), None)

    def largest_fed(self, work: Workload) -> tuple[int, bool]:
        """The most accelerators kept at the AU bar, and whether an emulation run confirmed it.

        The prediction from the feed rate is an upper bound; when its own run misses the bar
        the answer is one fewer, unconfirmed.
        """
        predicted = largest_fed(self.feed_samples_per_s, work)
        run = self.run_with(max(1, predicted))
        if run is None:
            return predicted, False
        if run.au >= work.au_target:
            return predicted, True
        return max(0, predicted - 1), False


@dataclass(frozen=True)
class BenchReport:
    """Everything ``fastload bench`` measured at one URL; see ``verdict`` and ``to_json``."""

    url: str
    workload: Workload
    inventory: Inventory
    decode: tuple[DecodeRate, ...]
    measurements: tuple[Measurements, ...]
    cores: int
    cache: str | None = None
    gpus: int | None = None
    samples_per_file: float = 1.0  # images in a file read whole (NOTE [bench over shards])

    @property
    def loader_workers(self) -> int:
        return self.measurements[0].probe.loader_workers

    @property
    def decode_cores(self) -> int:
        """Cores the loader decodes on: its workers (the main process without workers)."""
        return max(1, min(self.loader_workers, self.cores))

    @property
    def decode_images_per_s(self) -> float | None:
        """Decode capacity of the loader's cores with Pillow, or None for non-image data."""
        pillow = next((d for d in self.decode if d.engine == "pillow" and d.images), None)
        return pillow.images_per_s_per_core * self.decode_cores if pillow else None

    def limit(self, m: Measurements) -> str:
        """What bounds the feed under ``m``: storage reads or decoding, with the numbers."""
        best = m.best_read
        samples = best.objects_per_s * self.samples_per_file
        held = f" = {samples:,.0f} images/s" if self.samples_per_file != 1.0 else ""
        storage = (
            f"storage reads ({best.objects_per_s:,.0f} files/s{held}, "
            f"{best.read_bytes_per_s / 1e6:,.0f} MB/s at concurrency {best.concurrency})"
        )
        decoding = self.decode_images_per_s
        if decoding is None or samples <= decoding:
            return storage
        return f"decoding on {self.decode_cores} cores ({decoding:,.0f} images/s)"

    @property
    def largest_accelerators(self) -> int:
        """The answer under the first condition (no cache, or a cold cache)."""
        return self.measurements[0].largest_fed(self.workload)[0]

    @property
    def verdict(self) -> str:
        """One sentence: how many accelerators this storage feeds, the limit, what would help."""
        w = self.workload
        acc = w.accelerator.upper()
        first = self.measurements[0]
        n, confirmed = first.largest_fed(w)
        bar = f">= {w.au_target:.0%} AU"
        where = "this storage" if self.cache is None else "this storage through a cold cache"
        if n == 0:
            run = first.run_with(1)
            reached = f" (one reaches {run.au:.0%})" if run else ""
            text = f"{where} cannot keep one {acc} training {w.model} at {bar}{reached}"
        else:
            plural = "s" if n != 1 else ""
            note = "" if confirmed else ", estimated from the feed rate"
            text = f"{where} feeds {n} {acc}{plural} training {w.model} at {bar}{note}"
        text += f"; the limit is {self.limit(first)}"
        if self.cache is not None and len(self.measurements) > 1:
            warm_n, _ = self.measurements[-1].largest_fed(w)
            verb = "lifts it to" if warm_n > n else "keeps it at"
            text += f"; --cache {self.cache} {verb} {warm_n} once warm"
        elif self.limit(first).startswith("storage") and self.decode_images_per_s is not None:
            ceiling = largest_fed(self.decode_images_per_s, w)
            if ceiling > n:
                text += (
                    f"; a warm --cache on fast local disk could lift it to at most {ceiling} "
                    "(the decode limit)"
                )
        if self.gpus is not None:
            run = self.measurements[-1].run_with(self.gpus)
            if run is not None:
                text += f"; {self.gpus} {acc}s would run at {run.au:.0%} AU"
        return text

    def to_json(self) -> dict[str, Any]:
        """One JSON-ready document; every key with a unit carries it (``read_bytes_per_s``)."""
        return {
            "fastload_version": __version__,
            "url": self.url,
            "verdict": self.verdict,
            "largest_accelerators": self.largest_accelerators,
            "gpus": self.gpus,
            "cache": self.cache,
            "cores": self.cores,
            "loader_workers": self.loader_workers,
            "workload": self.workload.to_json(),
            "inventory": self.inventory.to_json(),
            "decode": [d.to_json() for d in self.decode],
            "decode_images_per_s": self.decode_images_per_s,
            "samples_per_file": self.samples_per_file,
            "measurements": [self._measurements_json(m) for m in self.measurements],
        }

    def _measurements_json(self, m: Measurements) -> dict[str, Any]:
        n, confirmed = m.largest_fed(self.workload)
        return {
            "condition": m.label,
            "reads": [p.to_json() for p in m.reads],
            "best_read_bytes_per_s": m.best_read.read_bytes_per_s,
            "best_read_objects_per_s": m.best_read.objects_per_s,
            "range_reads": m.range_reads.to_json(),
            "feed_samples_per_s": m.feed_samples_per_s,
            "emulations": [r.to_json() for r in m.runs],
            "largest_accelerators": n,
            "largest_accelerators_confirmed": confirmed,
            "limit": self.limit(m),
        }
