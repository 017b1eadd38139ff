"""The facade: ``fastload.DataLoader`` and what it owns.

:mod:`~fastload.loader.dataloader` (the DataLoader), :mod:`~fastload.loader.iterator` (an
epoch's stages: envelopes, prefetch, device, meter), :mod:`~fastload.loader.state` (where the
loader is), :mod:`~fastload.loader.resume` (state_dict / load_state_dict) and
:mod:`~fastload.loader.prefetch` (the upcoming objects of an epoch, for the cache).
"""

from fastload.loader.dataloader import DataLoader

__all__ = ["DataLoader"]
