"""The threaded engine against the torch engine, and the facade's measured engine choice.

The contract suite (tests/contracts/test_engines.py) holds the threaded engine to the batch
plan, resume, errors and clean-up. Here: the same labels, crops and flips as the torch engine
with pixels within a stated bound, no worker processes, host-side Normalize, the decoder
chosen by measurement, and ``backend="auto"``'s probe.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
from PIL import Image

from fastload import BackendUnavailable, DataLoader, ImageFolder
from fastload.data import decoder_choice, decoders
from fastload.data.render import Renderer
from fastload.engines.probe import PROBE_BATCHES, ProbeEngine
from fastload.engines.threads import AHEAD
from fastload.engines.trial_torch import TRIAL_PREFETCH
from fastload.settings import MAX_WORKERS_WITHOUT_GPU
from fastload.testing.synthetic import make_jpeg_folder

NO_LATENCY = {"latency": {"latency": 0.0}}

MEAN_ABS_BOUND = 4.0
"""Mean |threads - torch| over all pixels (0-255), NOTE [pixels differ from the torch engine].

Measured here (docs/engines.md): 500x375 JPEGs at 224 train 0.01, eval 0.96; at 24 px (the
DCT-scaled path at 1/8) train 2.4, eval 3.3; 160x120 at 24 px about 1.0. The eval pipeline's
centre crop is a fractional box, which this engine rounds to whole pixels of the decoded scale.
"""


@pytest.fixture(scope="module")
def large_root(tmp_path_factory) -> Path:
    """Images large enough that a 24-px crop takes the DCT-scaled (1/2..1/8) path."""
    return make_jpeg_folder(tmp_path_factory.mktemp("large"), images=12, classes=3, size=(500, 375))


def both(root, **kwargs) -> tuple[list, list]:
    out = []
    for backend in ("torch", "threads"):
        ds = ImageFolder(root, seed=5, **kwargs)
        loader = DataLoader(ds, batch_size=6, shuffle=True, backend=backend, num_workers=0
                            if backend == "torch" else "auto")
        out.append(list(loader))
        loader.engine.close()
    return out[0], out[1]


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("which", ["small", "large"])
def test_same_labels_and_pixels_within_the_bound(jpeg_root, large_root, which, train):
    root = jpeg_root if which == "small" else large_root
    torch_batches, thread_batches = both(root, size=24, train=train)
    assert len(torch_batches) == len(thread_batches)
    for (a, la), (b, lb) in zip(torch_batches, thread_batches):
        assert la.tolist() == lb.tolist()
        assert a.dtype == b.dtype == torch.uint8 and a.shape == b.shape
        diff = (a.float() - b.float()).abs()
        assert diff.mean().item() < MEAN_ABS_BOUND, diff.mean().item()


def test_flips_follow_the_plan(jpeg_root):
    """A flipped plan gives the mirror of the unflipped one: same seed, p=1 vs p=0."""
    from fastload.data.pipeline import HorizontalFlip, ImagePipeline, RandomResizedCrop

    data = Path(sorted(Path(jpeg_root).glob("*/*.jpg"))[0]).read_bytes()
    decoder = decoders.DECODERS["pillow"]
    images = []
    for p in (0.0, 1.0):
        pipeline = ImagePipeline((RandomResizedCrop(32), HorizontalFlip(p)))
        out = torch.empty((3, 32, 32), dtype=torch.uint8)
        Renderer(pipeline, decoder).render(data, seed=3, out=out)
        images.append(out)
    assert torch.equal(images[0].flip(-1), images[1])


def test_normalize_on_the_host_matches_the_torch_engine(jpeg_root):
    torch_batches, thread_batches = both(jpeg_root, size=24, train=False, normalize=True)
    a, b = torch_batches[0][0], thread_batches[0][0]
    assert a.dtype == b.dtype == torch.float32
    # 3 levels of 255 in ImageNet's std units
    assert (a - b).abs().mean().item() < MEAN_ABS_BOUND / 255 / 0.224


def test_hwc_layout(jpeg_root):
    from fastload.data.pipeline import ImagePipeline

    ds = ImageFolder(jpeg_root, pipeline=ImagePipeline.standard(24, train=True, layout="HWC"), seed=1)
    images, _ = next(iter(DataLoader(ds, batch_size=4, backend="threads")))
    assert images.shape == (4, 24, 24, 3)
    ref = ImageFolder(jpeg_root, size=24, train=True, seed=1)
    chw, _ = next(iter(DataLoader(ref, batch_size=4, backend="threads")))
    assert torch.equal(images.permute(0, 3, 1, 2), chw)


def test_no_worker_processes_and_the_decoder_is_measured(jpeg_root):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    loader = DataLoader(ImageFolder(jpeg_root, size=24), batch_size=8, backend="threads")
    list(loader)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    engine = loader.engine
    names = [d.name for d in decoders.available()]
    assert engine.renderer.decoder.name in names
    if len(names) > 1:  # the reason carries a measured figure for every decoder
        assert all(name in engine.decoder_reason for name in names), engine.decoder_reason
        assert "ms" in engine.decoder_reason
    assert engine.decoder_reason in loader.backend_reason
    loader.engine.close()


def test_a_later_loader_over_jpegs_of_the_same_sizes_keeps_the_measured_decoder(jpeg_root, tmp_path):
    decoder_choice.forget()
    first = DataLoader(ImageFolder(jpeg_root, size=24), batch_size=8, backend="threads")
    list(first)
    assert not first.engine.decoder_reason.endswith("in this process)")
    again = DataLoader(ImageFolder(jpeg_root, size=24, seed=4), batch_size=8, backend="threads")
    list(again)  # the same figures, said to be an earlier loader's
    assert again.engine.decoder_reason == first.engine.decoder_reason + (
        " (measured by an earlier loader in this process)")
    assert again.engine.renderer.decoder.name == first.engine.renderer.decoder.name
    other = make_jpeg_folder(tmp_path / "other", images=8, classes=2, size=(61, 47))
    fresh = DataLoader(ImageFolder(other, size=24), batch_size=8, backend="threads")
    list(fresh)  # other sizes: measured afresh
    assert "ms/image" in fresh.engine.decoder_reason
    assert not fresh.engine.decoder_reason.endswith("in this process)")
    for loader in (first, again, fresh):
        loader.engine.close()


def test_png_and_grayscale_go_through(tmp_path):
    rng = random.Random(0)
    for i, mode in enumerate(["RGB", "L", "RGBA"]):
        (tmp_path / "c").mkdir(exist_ok=True)
        img = Image.new(mode, (60, 40), tuple(rng.randrange(256) for _ in mode) if mode != "L" else 99)
        img.save(tmp_path / "c" / f"{i}.png" if mode != "L" else tmp_path / "c" / f"{i}.jpg")
    images, labels = next(iter(DataLoader(ImageFolder(tmp_path, size=16), batch_size=3, backend="threads")))
    assert images.shape == (3, 3, 16, 16) and labels.tolist() == [0, 0, 0]
    gray = images[1]
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])


def test_backend_threads_refuses_what_it_cannot_run(jpeg_root):
    with pytest.raises(BackendUnavailable, match="not a declared fastload dataset"):
        DataLoader(torch.utils.data.TensorDataset(torch.zeros(4)), backend="threads")
    with pytest.raises(BackendUnavailable, match="collate_fn"):
        DataLoader(ImageFolder(jpeg_root, size=24), backend="threads", collate_fn=lambda b: b)


# -- the measured choice ---------------------------------------------------------------


def test_auto_measures_the_candidates_and_keeps_the_batches(tmp_path):
    # enough batches of one for every candidate's share with as many workers as fastload may
    # choose (torch: its queue and PROBE_BATCHES rounds of one batch per worker)
    images = AHEAD + 1 + PROBE_BATCHES + (TRIAL_PREFETCH + PROBE_BATCHES) * MAX_WORKERS_WITHOUT_GPU + 48
    jpeg_root = make_jpeg_folder(tmp_path / "data", images=images, classes=4, size=(40, 32))
    ds = ImageFolder(jpeg_root, size=24, train=True, seed=2)
    loader = DataLoader(ds, batch_size=1, shuffle=True)
    assert isinstance(loader.engine, ProbeEngine) and loader.backend == "auto"
    candidates = loader.engine.candidates
    assert candidates[:2] == ("threads", "torch")
    reference = DataLoader(ImageFolder(jpeg_root, size=24, train=True, seed=2), batch_size=1,
                           shuffle=True, backend="torch", num_workers=0)
    expected = [labels.tolist() for _, labels in reference]
    batches = list(loader)
    assert [labels.tolist() for _, labels in batches] == expected  # order kept, nothing lost
    assert len(batches) == len(ds) >= PROBE_BATCHES * len(candidates)
    assert loader.backend in candidates
    reason = loader.backend_reason
    assert reason.startswith(loader.backend + ": measured")
    measured = {m.name: m for m in loader.engine.measures}
    assert set(measured) == set(candidates)
    for name, m in measured.items():  # each figure in the reason is one the probe measured
        if m.error is None:
            assert m.rate > 0 and f"{m.rate:.0f} img/s" in reason
    loader.epoch = 0  # the next epoch runs on the chosen engine, the same plan
    again = [labels.tolist() for _, labels in loader]
    assert again == expected
    loader.engine.close()


def test_a_short_epoch_is_not_measured(jpeg_root):
    loader = DataLoader(ImageFolder(jpeg_root, size=24), batch_size=16)
    list(loader)
    assert loader.backend == "threads" and "too few to measure" in loader.backend_reason
    loader.engine.close()


def test_the_probe_can_be_turned_off_and_num_workers_means_torch(jpeg_root, monkeypatch):
    monkeypatch.setenv("FASTLOAD_ENGINE_PROBE", "0")
    loader = DataLoader(ImageFolder(jpeg_root, size=24), batch_size=1)
    assert loader.backend == "threads" and "probe is off" in loader.backend_reason
    monkeypatch.delenv("FASTLOAD_ENGINE_PROBE")
    loader = DataLoader(ImageFolder(jpeg_root, size=24), batch_size=1, num_workers=2)
    assert loader.backend == "torch" and "num_workers was set" in loader.backend_reason


# -- torch's contract: timeout= and Ctrl-C (NOTE [abandoned reads]) -----------------------


@pytest.mark.timeout(60)
def test_timeout_raises_as_torch_does_naming_the_file_it_waits_for(jpeg_root):
    """A store that stops answering: the timeout is the only way out of next()."""
    ds = ImageFolder(f"latency::{jpeg_root}", size=16, storage_options=NO_LATENCY)
    loader = DataLoader(ds, batch_size=4, backend="threads", timeout=1)
    ds.storage.fs.hold()
    try:
        with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds") as info:
            next(iter(loader))
    finally:
        ds.storage.fs.release()
        loader.engine.close()
    assert "still reading file://" in str(info.value) and str(jpeg_root) in str(info.value)


@pytest.mark.timeout(120)
def test_a_timeout_the_batches_meet_changes_nothing(jpeg_root):
    ds = ImageFolder(jpeg_root, size=16, seed=1)
    loader = DataLoader(ds, batch_size=6, shuffle=True, backend="threads", timeout=60)
    untimed = DataLoader(ImageFolder(jpeg_root, size=16, seed=1), batch_size=6, shuffle=True,
                         backend="threads")
    for (a, la), (b, lb) in zip(loader, untimed, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader.engine.close()
    untimed.engine.close()


_INTERRUPTED = textwrap.dedent("""
    import faulthandler, signal, sys, threading, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for it on a hang
    # Ctrl-C as at a terminal: a job started in the background by a non-interactive shell
    # (CI's, say) inherits SIGINT ignored, and Python then leaves it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from fastload import DataLoader, ImageFolder
    ds = ImageFolder(f"latency::{sys.argv[1]}", size=16,
                     storage_options={"latency": {"latency": 0.0}})
    fs = ds.storage.fs
    fs.hold()  # every read from now on blocks until a release that never comes
    fs.reset_counts()
    def tell_when_held():
        while fs.total_requests == 0:
            time.sleep(0.01)
        print("held", flush=True)
    threading.Thread(target=tell_when_held, daemon=True).start()
    next(iter(DataLoader(ds, batch_size=4, backend="threads")))
    print("a batch came through a held store", flush=True)
""")


@pytest.mark.timeout(120)
def test_ctrl_c_ends_an_epoch_whose_reads_never_return(jpeg_root):
    """SIGINT while the first batch's reads block forever: the process ends with
    KeyboardInterrupt. The bound is a hang check (exit takes about a second here)."""
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, str(jpeg_root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:  # a hang: show where it was (faulthandler's dump below)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no exit 20 s after SIGINT; its stderr:\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, (proc.returncode, err)
    assert "came through" not in out
    assert "fastload/engines/threads.py" in err  # it came while the loop waited for the batch


_BREAKS = textwrap.dedent("""
    import sys
    from fastload import DataLoader, ImageFolder
    loader = DataLoader(ImageFolder(sys.argv[1], size=224, train=True), batch_size=8,
                        shuffle=True, backend="threads")
    for images, labels in loader:
        break  # the batches after it are still being made as the script returns
    print("left the loop", flush=True)
""")


@pytest.mark.timeout(300)
def test_a_script_that_breaks_out_of_its_loop_exits_cleanly(tmp_path):
    """NOTE [threads at exit]: pixel threads still in a torch call as the interpreter
    finalized were ended by a forced unwind: SIGABRT (exit code 134), "terminate called
    without an active exception", in most runs of this script before the exit hook."""
    root = make_jpeg_folder(tmp_path / "big", images=48, classes=2, size=(1600, 1200))
    for run in range(3):
        done = subprocess.run([sys.executable, "-c", _BREAKS, str(root)], capture_output=True, check=False,
                              text=True, timeout=120)
        assert "left the loop" in done.stdout
        assert done.returncode == 0 and "terminate called" not in done.stderr, (run, done.returncode,
                                                                             done.stderr[-2000:])
