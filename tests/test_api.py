"""The public surface: one __all__, every name resolves, the command answers."""

import subprocess
import sys

import pytest

import fastload


def test_every_public_name_resolves():
    for name in fastload.__all__:
        assert getattr(fastload, name) is not None, name


def test_dataloader_is_a_torch_dataloader():
    import torch.utils.data

    assert issubclass(fastload.DataLoader, torch.utils.data.DataLoader)


def test_errors_form_one_tree():
    errors = [getattr(fastload, n) for n in fastload.__all__ if n.endswith(("Error", "Unavailable"))]
    assert errors
    for err in errors:
        assert issubclass(err, fastload.FastloadError), err


def test_version_and_help_from_the_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "fastload", "--version"], capture_output=True, text=True, check=True
    )
    assert fastload.__version__ in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "fastload", "--help"], capture_output=True, text=True, check=True
    )
    assert "Usage" in out.stdout


def test_the_package_and_the_command_start_without_torch():
    """`import fastload` and the command's --version, --help and cache commands import no
    torch (it costs seconds); the first use of a name that needs it imports it."""
    code = (
        "import sys, fastload, fastload.cli, fastload.cache, fastload.bench\n"
        "print('torch' in sys.modules)\n"
        "fastload.DataLoader\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    import types

    public = {n for n in dir(fastload) if not n.startswith("_")}
    modules = {n for n in public if isinstance(getattr(fastload, n), types.ModuleType)}
    assert public - modules == set(fastload.__all__) - {"__version__"}  # nothing else is public


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        fastload.NoSuchThing  # noqa: B018
