"""Run PyTorch's own DataLoader tests against stock torch and against fastload, and compare.

The drop-in promise of ``fastload.DataLoader`` is judged by PyTorch's ``test/test_dataloader.py``:
every test that passes with stock torch must pass with ``torch.utils.data.DataLoader``
replaced by ``fastload.DataLoader`` (``sitecustomize.py`` next to this file does the
replacement in every process, spawned workers and ``python -c`` children included), with
fastload's defaults in force. This script runs the given file twice with pytest, serially,
with a per-test timeout, reads the per-test outcomes from JUnit XML, and prints the counts
and the tests that pass with torch but not with fastload. It downloads nothing: pass the
path of a ``test_dataloader.py`` you fetched (see docs/torch_compat.md).

Example::

    .venv/bin/python benchmarks/torch_compat/run.py /tmp/torch_compat/test_dataloader.py
    .venv/bin/python benchmarks/torch_compat/run.py /tmp/torch_compat/test_dataloader.py \\
        --only fastload -k "TestDataLoader and worker"     # re-run one half, reuse the other

Exit status: 0 when nothing regresses, 1 when some test passes with torch only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("torch", "fastload")
# Worst first: a test id that appears twice (call failed, teardown errored) keeps the worst.
SEVERITY = {"error": 3, "failed": 2, "skipped": 1, "passed": 0}


def mode_env(mode: str) -> dict[str, str]:
    """The environment of one run: fastload's adds this directory (sitecustomize) to PYTHONPATH."""
    env = dict(os.environ)
    parts = [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != HERE
    ]
    if mode == "fastload":
        parts.insert(0, str(HERE))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def check_substitution(python: str, mode: str) -> None:
    """Fail early unless a fresh interpreter sees the DataLoader this mode promises."""
    probe = "import torch.utils.data as d; print(d.DataLoader.__module__)"
    out = subprocess.run(
        [python, "-c", probe], env=mode_env(mode), capture_output=True, text=True, check=True
    ).stdout.strip()
    expected = "fastload.loader.dataloader" if mode == "fastload" else "torch.utils.data.dataloader"
    if out != expected:
        raise SystemExit(
            f"{mode} run: a fresh `python -c` sees DataLoader from {out!r}, expected {expected!r}; "
            f"check PYTHONPATH and that fastload imports in {python}"
        )


def run_mode(
    python: str, mode: str, test_file: Path, xml_path: Path, timeout: int, select: str | None
) -> float:
    """Run pytest on ``test_file`` for one mode; return the wall seconds it took."""
    check_substitution(python, mode)
    cmd = [
        python, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
        f"--timeout={timeout}", f"--junitxml={xml_path}", f"--rootdir={test_file.parent}",
        "-o", "addopts=", "-o", "junit_family=xunit1",
        "-W", "ignore::pytest.PytestCollectionWarning",
    ]
    if select:
        cmd += ["-k", select]
    print(f"[{mode}] {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    # pytest's exit status is 1 when tests fail, which is what we are here to count.
    subprocess.run(cmd, env=mode_env(mode), cwd=test_file.parent, check=False)
    return time.monotonic() - start


def read_outcomes(xml_path: Path) -> dict[str, str]:
    """Per-test outcome (passed/failed/error/skipped) from a pytest JUnit XML file."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            tag = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if tag and SEVERITY[tag] > SEVERITY[outcome]:
                outcome = tag
        if SEVERITY[outcome] >= SEVERITY.get(outcomes.get(test_id, "passed"), 0):
            outcomes[test_id] = outcome
    return outcomes


def counts(outcomes: dict[str, str]) -> dict[str, int]:
    kinds = ("passed", "failed", "error", "skipped")
    return {k: sum(1 for v in outcomes.values() if v == k) for k in kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="path of PyTorch's test_dataloader.py")
    parser.add_argument("--timeout", type=int, default=180, help="per-test limit, seconds (180)")
    parser.add_argument("--only", choices=MODES, help="run one half; the other is read from --out")
    parser.add_argument("-k", dest="select", help="pytest -k expression to run a subset")
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.gettempdir()) / "fastload-torch-compat",
        help="where the JUnit XML of each run is kept (default: $TMPDIR/fastload-torch-compat)",
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch+fastload")
    args = parser.parse_args(argv)

    test_file = args.test_file.resolve()
    if not test_file.is_file():
        parser.error(f"test file {test_file} does not exist; fetch test/test_dataloader.py first")
    args.out.mkdir(parents=True, exist_ok=True)

    results: dict[str, dict[str, str]] = {}
    for mode in MODES:
        xml_path = args.out / f"{mode}.xml"
        if args.only in (None, mode):
            seconds = run_mode(args.python, mode, test_file, xml_path, args.timeout, args.select)
            print(f"[{mode}] finished in {seconds:.0f} s", flush=True)
        elif not xml_path.is_file():
            parser.error(f"--only {args.only} needs an earlier {mode} run in {xml_path}")
        results[mode] = read_outcomes(xml_path)

    torch_res, fast_res = results["torch"], results["fastload"]
    if args.select:  # compare like with like when only a subset ran
        ran = set(torch_res) & set(fast_res)
        torch_res = {t: o for t, o in torch_res.items() if t in ran}
        fast_res = {t: o for t, o in fast_res.items() if t in ran}

    print(f"\n{'':10}{'passed':>8}{'failed':>8}{'errors':>8}{'skipped':>9}{'total':>7}")
    for mode, res in (("torch", torch_res), ("fastload", fast_res)):
        c = counts(res)
        row = f"{c['passed']:>8}{c['failed']:>8}{c['error']:>8}{c['skipped']:>9}{len(res):>7}"
        print(f"{mode:10}{row}")

    regressed = sorted(t for t, o in torch_res.items() if o == "passed" != fast_res.get(t))
    gained = sorted(t for t, o in fast_res.items() if o == "passed" != torch_res.get(t))
    print(f"\npass with torch, not with fastload: {len(regressed)}")
    for t in regressed:
        print(f"  {t}  [{fast_res.get(t, 'not run')}]")
    if gained:
        print(f"pass with fastload, not with torch: {len(gained)}")
        for t in gained:
            print(f"  {t}  [torch: {torch_res.get(t, 'not run')}]")
    print(f"\nJUnit XML: {args.out}/torch.xml, {args.out}/fastload.xml")
    return 1 if regressed else 0


if __name__ == "__main__":
    sys.exit(main())
