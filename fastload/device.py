"""Getting batches onto the device: pinned memory, a side-stream copy one batch ahead.

NOTE [side-stream prefetch]
On CUDA, :class:`DeviceFeeder` copies batch ``i+1`` from pinned host memory on its own
stream while the training step runs batch ``i`` on the current stream. Before a batch is
handed out, the current stream waits on the copy stream (``wait_stream``), and every tensor
of the batch is marked with ``record_stream(current)`` so the caching allocator does not
reuse its memory while the step may still read it. No host synchronize is ever issued.
Normalization (uint8 -> float32) runs after the copy on the device, so 4x fewer bytes cross
the bus.

Example::

    >>> feeder = DeviceFeeder("cuda")
    >>> for images, labels in feeder(iter(loader)):   # already on the GPU
    ...     ...
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fastload.errors import ConfigError

if TYPE_CHECKING:  # only a type here: fastload.data itself uses map_tensors below
    from fastload.data.pipeline import Normalize


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    """Apply ``fn`` to every tensor inside nested tuples, lists and dicts; keep container types."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(fn, v) for v in obj)
    if isinstance(obj, collections.abc.Mapping):
        try:
            return type(obj)({k: map_tensors(fn, v) for k, v in obj.items()})
        except TypeError:
            return {k: map_tensors(fn, v) for k, v in obj.items()}
    return obj


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """Validate ``device=``; "cuda" without a usable CUDA device is a clear error."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device: {exc}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={device!r} but torch finds no CUDA device (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}); pass device='cpu' or device=None"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={device!r} but only {torch.cuda.device_count()} CUDA devices exist"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type not in ("cpu",):
        raise ConfigError(f"device={device!r}: fastload places batches on 'cpu' or 'cuda' only")
    return dev


class DeviceFeeder:
    """Moves each batch to ``device`` (and normalizes images there), one batch ahead on CUDA.

    Args:
        device: the target device.
        normalize: a Normalize step to apply to the image tensor of each batch, if any.
        image_index: position of the images in a (images, labels, ...) batch.
        channel_dim: channel axis of one image (0 for CHW, 2 for HWC).
    """

    def __init__(
        self,
        device: torch.device,
        normalize: Normalize | None = None,
        image_index: int = 0,
        channel_dim: int = 0,
    ) -> None:
        self.device = device
        self.normalize = normalize
        self.image_index = image_index
        self.channel_dim = channel_dim

    def _finish(self, batch: Any) -> Any:
        if self.normalize is None or not isinstance(batch, (list, tuple)):
            return batch
        items = list(batch)
        items[self.image_index] = self.normalize.apply(items[self.image_index], self.channel_dim + 1)
        return type(batch)(items) if not hasattr(batch, "_fields") else type(batch)(*items)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._cuda(batches)
        return (self._finish(map_tensors(lambda t: t.to(self.device), b)) for b in batches)

    def _cuda(self, batches: Iterator[Any]) -> Iterator[Any]:
        stream = torch.cuda.Stream(self.device)

        def copy(batch: Any) -> Any:
            with torch.cuda.stream(stream):
                moved = map_tensors(
                    lambda t: (t if t.is_cuda or t.is_pinned() else t.pin_memory()).to(
                        self.device, non_blocking=True
                    ),
                    batch,
                )
                return self._finish(moved)

        pending = None
        for batch in batches:
            ready = copy(batch)
            if pending is not None:
                yield self._hand_over(pending, stream)
            pending = ready
        if pending is not None:
            yield self._hand_over(pending, stream)

    @staticmethod
    def _hand_over(batch: Any, stream: torch.cuda.Stream) -> Any:
        current = torch.cuda.current_stream(stream.device)
        current.wait_stream(stream)

        def mark(t: torch.Tensor) -> torch.Tensor:
            if t.is_cuda:
                t.record_stream(current)
            return t

        return map_tensors(mark, batch)
