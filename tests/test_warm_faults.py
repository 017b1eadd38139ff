"""`fastload cache warm` (the installed console script) against an S3 server that dies or
stops answering mid-warm: it gives up in bounded time with one message and exit status 1.

The server is moto's, as a subprocess, so it can be SIGKILLed or SIGSTOPped for real.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fastload.cache import DiskTier
from fastload.cache.warm import warm
from fastload.errors import FastloadError, OriginUnavailableError, StorageError
from tests.fixtures.s3 import DUMMY_ENV, S3Server, upload_folder

BIN = Path(sys.executable).parent
FILES = 240
GIVE_UP_BOUND_S = 60  # a generous upper bound: proves "gives up", not a timing target


@dataclass
class MotoProcess:
    proc: subprocess.Popen
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _moto_process() -> Iterator[MotoProcess]:
    """moto's S3 server as a subprocess on 127.0.0.1, always resumed and killed at the end."""
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **DUMMY_ENV},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"moto_server did not start on port {port}") from None
                time.sleep(0.1)
        yield MotoProcess(proc, port)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)


@pytest.fixture
def moto() -> Iterator[MotoProcess]:
    with _moto_process() as server:
        yield server


def _upload(moto: MotoProcess, bucket: str) -> str:
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=moto.endpoint,
                           skip_instance_cache=True)
    fs.mkdir(bucket)
    fs.pipe({f"{bucket}/data/{i:04d}.bin": bytes([i % 256]) * 2000 for i in range(FILES)})
    return f"s3://{bucket}/data"


def _warm_cmd(url: str, cache: Path, moto: MotoProcess, jobs: int) -> list[str]:
    return [str(BIN / "fastload"), "cache", "warm", url, "--cache", str(cache), "--jobs", str(jobs),
            "-o", f"endpoint_url={moto.endpoint}", "-o", "use_listings_cache=false"]


def _entries(cache: Path) -> int:
    try:
        return sum(1 for _ in DiskTier(cache, create=False).entries())
    except (FastloadError, OSError):  # not created yet
        return 0


@dataclass
class FaultedWarm:
    """A ``fastload cache warm`` whose server got a signal mid-warm (see :func:`_fault_mid_warm`)."""

    url: str
    cache: Path
    jobs: int
    sig: int
    proc: subprocess.Popen
    faulted: float

    def outcome(self) -> tuple[int, str, str]:
        """Wait for the warm to give up: (exit status, stdout, stderr)."""
        try:
            # A warm that does not give up within the bound is a hang: TimeoutExpired fails the test.
            out, err = self.proc.communicate(timeout=GIVE_UP_BOUND_S)
            took = time.monotonic() - self.faulted
        finally:
            self.stop()
        print(f"\njobs={self.jobs} signal={signal.Signals(self.sig).name}: gave up {took:.1f} s "
              f"after the fault, exit {self.proc.returncode}\nstderr: {err.strip()[-600:]}")
        return self.proc.returncode, out, err

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def _fault_mid_warm(moto: MotoProcess, tmp_path: Path, jobs: int, sig: int,
                    options: tuple[str, ...] = ()) -> FaultedWarm:
    """Start a warm (with more command-line ``options``), send ``sig`` to the server once 30
    objects are cached."""
    url = _upload(moto, f"faults-{jobs}-{int(sig)}")
    cache = tmp_path / "cache"
    warm = subprocess.Popen([*_warm_cmd(url, cache, moto, jobs), *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **DUMMY_ENV})
    try:
        while _entries(cache) < 30:
            assert warm.poll() is None, warm.communicate()
            time.sleep(0.05)
        os.kill(moto.proc.pid, sig)
    except BaseException:
        if warm.poll() is None:
            warm.kill()
            warm.communicate()
        raise
    return FaultedWarm(url, cache, jobs, sig, warm, time.monotonic())


def _assert_gave_up(url: str, code: int, out: str, err: str) -> None:
    assert code == 1, (out, err)
    assert f"gave up warming {url}" in err and "run the same command again to resume" in err.lower()
    assert f"/{FILES} objects done" in err and "last error:" in err
    assert err.count("gave up warming") == 1 and out.count("FAILED") <= 5


@pytest.mark.timeout(150)
@pytest.mark.parametrize("jobs", [2, 16])
def test_warm_gives_up_when_the_server_is_killed(moto, tmp_path, jobs):
    warm = _fault_mid_warm(moto, tmp_path, jobs, signal.SIGKILL)
    _assert_gave_up(warm.url, *warm.outcome())


@pytest.mark.timeout(250)
def test_warm_gives_up_on_a_stalled_server_and_a_rerun_resumes(tmp_path):
    # A stall is found only by the read deadline (--read-timeout, READ_DEADLINE_S by default),
    # so each warm waits it out in full: the warms with 2 and 16 jobs, each against its own
    # stalled server, wait together, 10 s rather than the default 30; two reads failing in a
    # row are enough to give up (the 2-job warm has no more in flight).
    with _moto_process() as moto2, _moto_process() as moto16:
        servers = {2: moto2, 16: moto16}
        warms: list[FaultedWarm] = []
        try:
            for jobs, moto in servers.items():
                (tmp_path / f"jobs{jobs}").mkdir()
                warms.append(_fault_mid_warm(moto, tmp_path / f"jobs{jobs}", jobs, signal.SIGSTOP,
                                             ("--read-timeout", "10", "--max-failures", "2")))
            outcomes = [warm.outcome() for warm in warms]
        finally:
            for warm in warms:
                warm.stop()
        for warm, (code, out, err) in zip(warms, outcomes):
            _assert_gave_up(warm.url, code, out, err)
            assert "no complete answer within 10 s" in err  # the read deadline, not a hang

        for warm in warms:
            moto = servers[warm.jobs]
            os.kill(moto.proc.pid, signal.SIGCONT)
            cached = _entries(warm.cache)
            rerun = subprocess.run(_warm_cmd(warm.url, warm.cache, moto, warm.jobs) + ["--json"],
                                   check=False, capture_output=True, text=True, timeout=120,
                                   env={**os.environ, **DUMMY_ENV})
            assert rerun.returncode == 0, rerun.stderr
            report = json.loads(rerun.stdout)
            assert report["skipped"] == cached and report["fetched"] == FILES - cached
            assert "warm: " in rerun.stderr  # plain progress lines when stderr is no terminal


@pytest.mark.timeout(60)
def test_library_warm_raises_origin_unavailable_with_the_counts(s3_server, tmp_path):
    server = S3Server().start()  # its own in-process server: this test stops it
    opts = server.storage_options()
    local = tmp_path / "local"
    local.mkdir()
    for i in range(20):
        (local / f"{i:02d}.bin").write_bytes(bytes([i]) * 500)
    url = upload_folder(opts, local, "s3://breaker/train")
    seen = []

    def on_file(_url, _nbytes, outcome):
        seen.append(outcome)
        if len(seen) == 5:
            server.stop()  # the origin goes down mid-warm

    try:
        with pytest.raises(OriginUnavailableError) as caught:
            warm(url, tmp_path / "cache", jobs=1, storage_options=opts, max_failures=3,
                 on_file=on_file)
    finally:
        server.stop()
    exc = caught.value
    assert isinstance(exc, StorageError) and exc.url == url and exc.files == 20
    assert (exc.done, exc.cached, exc.failed) == (8, 5, 3) and seen.count("failed") == 3
    assert f"{url}/" in exc.last_error and "3 objects in a row failed" in str(exc)
    assert exc.report.fetched == 5 and len(exc.report.failed) == 3
    assert DiskTier(tmp_path / "cache").verify().checked == 5
