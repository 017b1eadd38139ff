"""Device placement: nested batches, on-device normalization, CUDA side-stream prefetch."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

import fastload
from fastload.device import DeviceFeeder, map_tensors, resolve_device
from fastload.data.pipeline import Normalize

Pair = namedtuple("Pair", "a b")


def test_map_tensors_keeps_containers():
    batch = {"x": [torch.ones(2), (torch.zeros(1), "tag")], "p": Pair(torch.ones(1), 3)}
    out = map_tensors(lambda t: t * 2, batch)
    assert torch.equal(out["x"][0], torch.full((2,), 2.0))
    assert isinstance(out["x"][1], tuple) and out["x"][1][1] == "tag"
    assert isinstance(out["p"], Pair) and out["p"].b == 3


def test_cpu_feeder_normalizes_the_image_tensor_only():
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(4)
    norm = Normalize()
    (out_images, out_labels), = list(DeviceFeeder(torch.device("cpu"), norm)(iter([[images, labels]])))
    assert out_images.dtype == torch.float32
    expected = (images.float() / 255 - torch.tensor(norm.mean).view(1, 3, 1, 1)) / torch.tensor(
        norm.std
    ).view(1, 3, 1, 1)
    assert torch.allclose(out_images, expected, atol=1e-5)
    assert torch.equal(out_labels, labels)


def test_hwc_batches_normalize_the_last_axis():
    images = torch.randint(0, 256, (2, 5, 5, 3), dtype=torch.uint8)
    (out,) = list(DeviceFeeder(torch.device("cpu"), Normalize(), channel_dim=2)(iter([[images]])))
    assert torch.allclose(out[0][..., 0], (images[..., 0].float() / 255 - 0.485) / 0.229, atol=1e-5)


@pytest.mark.parametrize("bad", ["tpu", "not a device", 3.5])
def test_unsupported_devices_are_config_errors(bad):
    with pytest.raises(fastload.ConfigError, match="device="):
        resolve_device(bad)


def test_cuda_index_beyond_the_machine_is_rejected():
    with pytest.raises(fastload.ConfigError, match="cuda"):
        resolve_device("cuda:64")


@pytest.mark.gpu
def test_cuda_feeder_copies_ahead_and_keeps_values():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    host = [[torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8), torch.arange(8)] for _ in range(5)]
    out = list(DeviceFeeder(resolve_device("cuda"), Normalize())(iter(host)))
    torch.cuda.synchronize()
    for (hi, hl), (di, dl) in zip(host, out):
        assert di.is_cuda and dl.is_cuda
        ref = Normalize().apply(hi, 1)
        assert torch.allclose(di.cpu(), ref, atol=1e-5) and torch.equal(dl.cpu(), hl)
