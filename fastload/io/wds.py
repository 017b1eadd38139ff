"""webdataset interop: ``fastload::`` URLs in webdataset's ``gopen``, and what a webdataset
pipeline tells a loader about its workers.

webdataset opens shards by URL scheme through its own table (``webdataset.gopen_schemes``);
it has no entry for ``fastload`` (nor for ``s3``), so a ``fastload::s3://...`` shard fails
with "no gopen handler defined". :func:`register_gopen` adds one that opens the URL through
fsspec, the ``fastload::`` protocol included, so shards are read through fastload's cache::

    >>> import webdataset as wds
    >>> import fastload
    >>> fastload.register_gopen(cache="/nvme/fastload", storage_options={"s3": {"anon": False}})
    >>> urls = fastload.gopen_urls("fastload::s3://bucket/train-{000000..000146}.tar")
    >>> ds = wds.WebDataset(urls, shardshuffle=100).decode("pil")

NOTE [registering with webdataset]
Registration is explicit (or done by :class:`fastload.DataLoader` when it is handed a
webdataset pipeline), never a side effect of ``import fastload``: importing fastload must stay
cheap and must not change another library's global table behind the user's back. An entry
already in the table is left alone (a user's own handler wins) unless ``replace=True``.
Worker processes started by fork inherit the table; spawned (or forkserver) ones start with
webdataset's own, so ``fastload.DataLoader`` gives its workers the main process's fastload
handlers (:class:`GopenInWorkers`, around the user's ``worker_init_fn``). Under torch's own
DataLoader or ``wds.WebLoader`` with spawned workers, call :func:`register_gopen` at the top
level of the main module (not under ``if __name__ == "__main__"``): spawn re-imports it.

webdataset splits a *string* of URLs on ``::`` (its way to join shard lists), so
``wds.WebDataset("fastload::s3://b/t-{0..3}.tar")`` reaches gopen as ``"fastload"`` and
``"s3://b/t-0.tar"``...: pass a list (:func:`gopen_urls` expands the braces), or register
the storage's own scheme with ``protocols=("s3",)`` and keep the plain string.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import fsspec

from fastload.errors import ConfigError, MissingDependencyError
from fastload.io.errors import raise_storage_error

logger = logging.getLogger(__name__)

FASTLOAD_SCHEME = "fastload"


@dataclass(frozen=True)
class ShardOpener:
    """webdataset's gopen handler that :func:`register_gopen` installs: a URL opened for
    reading through fsspec's ``fastload::`` protocol (a URL without the prefix is read as if
    it had one), with the cache and storage options it was registered with."""

    cache: Any = None
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
        if mode != "rb":
            raise ConfigError(
                f"cannot open {url} with mode {mode!r}: fastload's gopen handler reads only; "
                "write shards to the storage's own URL, without fastload::"
            )
        full = url if url.startswith(f"{FASTLOAD_SCHEME}::") else f"{FASTLOAD_SCHEME}::{url}"
        options = {key: dict(value) for key, value in self.storage_options.items()}
        if self.cache is not None:
            options.setdefault(FASTLOAD_SCHEME, {})["cache"] = self.cache
        try:
            return fsspec.open(full, "rb", **options).open()
        except Exception as exc:  # NOTE [storage errors] in fastload.io.errors
            raise_storage_error(exc, "open", url)


def _gopen_schemes() -> dict[str, Any]:
    try:
        # the module, not the package's ``webdataset.gopen`` function of the same name
        module = importlib.import_module("webdataset.gopen")
    except ImportError as exc:
        raise MissingDependencyError(
            "register_gopen needs webdataset; install it with: pip install webdataset"
        ) from exc
    return module.gopen_schemes


def register_gopen(
    cache: Any = None,
    storage_options: dict[str, Any] | None = None,
    *,
    protocols: Sequence[str] = (),
    replace: bool = False,
) -> None:
    """Let webdataset open ``fastload::<url>`` shards through fastload's cache.

    Args:
        cache: the cache of the ``fastload::`` protocol (a directory, or a spec as
            :func:`fastload.cache.open_cache` takes); None: ``~/.cache/fastload``.
        storage_options: fsspec options per protocol, e.g. ``{"s3": {"endpoint_url": ...}}``.
        protocols: storage schemes to read through the cache as well, so that plain
            ``s3://...`` shard URLs are cached: ``("s3",)``.
        replace: replace a handler that is not fastload's, already registered for these
            schemes (fastload's own is always replaced).

    Example::

        >>> fastload.register_gopen("/nvme/fastload", protocols=("s3",))
        >>> ds = wds.WebDataset("s3://bucket/train-{000000..000146}.tar", shardshuffle=100)
    """
    table = _gopen_schemes()
    opener = ShardOpener(cache, dict(storage_options or {}))
    for scheme in (FASTLOAD_SCHEME, *protocols):
        if scheme in table and not isinstance(table[scheme], ShardOpener) and not replace:
            logger.info("webdataset already opens %s:// URLs with %r; left as it is "
                        "(register_gopen(..., replace=True) replaces it)", scheme, table[scheme])
            continue
        table[scheme] = opener


def ensure_gopen() -> None:
    """Register a :class:`ShardOpener` with the default cache for ``fastload::`` URLs unless
    webdataset opens them already (what :class:`fastload.DataLoader` does with a webdataset
    pipeline)."""
    _gopen_schemes().setdefault(FASTLOAD_SCHEME, ShardOpener())


def gopen_urls(pattern: str | Sequence[str]) -> list[str]:
    """Shard URLs as a list for webdataset, braces expanded, ``::`` chains kept whole.

    Example::

        >>> gopen_urls("fastload::s3://b/t-{0..1}.tar")
        ['fastload::s3://b/t-0.tar', 'fastload::s3://b/t-1.tar']
    """
    try:
        from braceexpand import braceexpand  # webdataset's own dependency: its expansion
    except ImportError as exc:
        raise MissingDependencyError(
            "gopen_urls needs braceexpand (webdataset's): pip install webdataset"
        ) from exc

    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    return [url for p in patterns for url in braceexpand(p)]


PIPELINE_STATE = (
    "a webdataset pipeline carries state from one epoch to the next in its stages "
    "(with_epoch's open stream, detshuffle's epoch), which persistent workers would continue "
    "and fresh workers restart; pass persistent_workers=True to continue them"
)

# NOTE [a webdataset pipeline's settings]
# A webdataset pipeline is an IterableDataset: no indices, so no sampler, no probe (a probe
# cannot see duplicated streams). What fastload.DataLoader can know is whether it splits its
# shards between workers (a split_by_worker stage, or shards resampled per worker): then
# workers cannot duplicate samples, and it gets workers from the machine (the per-core /
# per-GPU rule) and pinned memory where a GPU is; the batches are exactly those of torch's
# DataLoader with the same settings (workers' batches interleaved, as webdataset's own
# WebLoader gives them). Without a splitter it keeps torch's single process, with the reason.
# Persistent workers stay off (PIPELINE_STATE), as torch's default.


@dataclass(frozen=True)
class PipelineWorkers:
    """How a webdataset pipeline shares its stream between DataLoader workers."""

    splits: bool
    """Each worker yields its own part (``split_by_worker``, or shards resampled per worker)."""
    reason: str


def pipeline_workers(dataset: Any) -> PipelineWorkers | None:
    """For a webdataset ``DataPipeline`` (``WebDataset``, ``DataPipeline``, ``FluidWrapper``):
    whether it splits by worker and why; None for any other object.

    Example::

        >>> pipeline_workers(wds.WebDataset(urls, shardshuffle=False)).splits
        True
    """
    module = sys.modules.get("webdataset")
    if module is None or not isinstance(dataset, module.DataPipeline):
        return None
    from torch.utils.data import DataLoader  # imported already: webdataset imports torch

    name = type(dataset).__name__
    for stage in _stages(dataset, module):
        if stage is module.split_by_worker:
            return PipelineWorkers(True, f"webdataset {name} splits its shards between workers "
                                   "(split_by_worker)")
        if isinstance(stage, module.ResampledShards):
            return PipelineWorkers(True, f"webdataset {name} resamples shards in each worker "
                                   "(ResampledShards)")
        if isinstance(stage, DataLoader):
            return PipelineWorkers(False, f"webdataset {name} wraps a DataLoader (WebLoader): "
                                   "its workers are that loader's")
    return PipelineWorkers(False, f"webdataset {name} has no split_by_worker stage: each "
                           "worker would yield every sample; add wds.split_by_worker after the "
                           "shard list")


def _stages(dataset: Any, module: Any) -> list[Any]:
    stages: list[Any] = []
    for stage in getattr(dataset, "pipeline", []):
        if isinstance(stage, module.DataPipeline):
            stages.extend(_stages(stage, module))
        else:
            stages.append(stage)
    return stages



@dataclass(frozen=True)
class GopenInWorkers:
    """A ``worker_init_fn`` that gives each worker the main process's fastload handlers
    (a spawned or forkserver worker starts with webdataset's own table), then runs the
    user's ``worker_init_fn``. The handlers pickle with it (their cache spec and options)."""

    openers: dict[str, ShardOpener]
    user_fn: Callable[[int], None] | None = None

    def __call__(self, worker_id: int) -> None:
        table = _gopen_schemes()
        for scheme, opener in self.openers.items():
            table.setdefault(scheme, opener)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def prepare_loader(
    dataset: Any, *, shuffle: bool | None, sampler: Any, worker_init_fn: Callable[[int], None] | None,
) -> Callable[[int], None] | None:
    """What :class:`fastload.DataLoader` does first with a webdataset pipeline: make sure
    its ``fastload::`` URLs open, in this process (:func:`ensure_gopen`) and in its workers,
    and refuse ``shuffle``/``sampler`` with the pipeline's own way to shuffle (torch refuses
    both for any IterableDataset). Returns the ``worker_init_fn`` for the workers:
    ``worker_init_fn`` itself for any other dataset, else a :class:`GopenInWorkers` around it.
    """
    if pipeline_workers(dataset) is None:
        return worker_init_fn
    ensure_gopen()
    name = type(dataset).__name__
    if shuffle or sampler is not None:
        given = "shuffle=True" if shuffle else "sampler=..."
        raise ConfigError(
            f"DataLoader({given}) over a webdataset {name}: a webdataset pipeline is an "
            "IterableDataset that orders its samples itself (torch refuses a sampler or "
            "shuffle for it); drop the argument and shuffle in the pipeline: "
            "wds.WebDataset(urls, shardshuffle=100).shuffle(1000)"
        )
    ours = {k: v for k, v in _gopen_schemes().items() if isinstance(v, ShardOpener)}
    return GopenInWorkers(ours, worker_init_fn)
