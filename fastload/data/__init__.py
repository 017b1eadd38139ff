"""Declared datasets: what fastload knows about the data it loads.

:mod:`~fastload.data.images` (``ImageFolder``), :mod:`~fastload.data.pipeline` (the declared
image steps), :mod:`~fastload.data.sampling` (epoch-seeded order and per-sample seeds) and
:mod:`~fastload.data.batchinfo` (what travels with a batch from a worker).
"""
