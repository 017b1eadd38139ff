"""Helpers for tests and benchmarks: synthetic datasets and an emulated remote store.

:mod:`~fastload.testing.synthetic` makes JPEG folders on the spot; :mod:`~fastload.testing.latency`
is the ``latency::`` fsspec protocol, which adds a fixed delay to every request of the
filesystem below it (registered through the package's ``fsspec.specs`` entry point).
"""
