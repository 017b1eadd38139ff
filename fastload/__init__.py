"""fastload: a drop-in torch DataLoader that measures and removes GPU input starvation.

Example::

    from fastload import DataLoader, ImageFolder
    loader = DataLoader(ImageFolder("data/train", size=224, train=True),
                        batch_size=256, shuffle=True)
    print(loader.settings)
"""

from fastload.errors import (
    BackendError,
    BackendUnavailable,
    CacheError,
    ConfigError,
    CorruptSampleError,
    DatasetError,
    EmptyClassError,
    EmptyDatasetError,
    FastloadError,
    MissingDependencyError,
    MissingSampleError,
    ObjectNotFoundError,
    OriginUnavailableError,
    SampleError,
    StorageError,
    UnreadableSampleError,
)
from fastload.lazy import attach as _attach

# Everything that imports torch is imported on first use (fastload.lazy).
_LAZY = {
    "AUTO": "fastload.settings",
    "CenterCrop": "fastload.data.pipeline",
    "DataLoader": "fastload.loader",
    "EpochSampler": "fastload.data.sampling",
    "HorizontalFlip": "fastload.data.pipeline",
    "ImageFolder": "fastload.data.images",
    "ImagePipeline": "fastload.data.pipeline",
    "LoaderSettings": "fastload.settings",
    "Machine": "fastload.machine",
    "Normalize": "fastload.data.pipeline",
    "ParquetImages": "fastload.data.parquet",
    "RandomResizedCrop": "fastload.data.pipeline",
    "Resize": "fastload.data.pipeline",
    "ResizeKeepRatio": "fastload.data.pipeline",
    "Setting": "fastload.settings",
    "StarvationMeter": "fastload.meter",
    "TarShards": "fastload.data.shards",
    "gopen_urls": "fastload.io.wds",
    "measure": "fastload.meter",
    "register_gopen": "fastload.io.wds",
}
__getattr__, __dir__ = _attach(__name__, _LAZY, globals())
from fastload.version import __version__

__all__ = [
    "AUTO",
    "BackendError",
    "BackendUnavailable",
    "CacheError",
    "CenterCrop",
    "ConfigError",
    "CorruptSampleError",
    "DataLoader",
    "DatasetError",
    "EmptyClassError",
    "EmptyDatasetError",
    "EpochSampler",
    "FastloadError",
    "HorizontalFlip",
    "ImageFolder",
    "ImagePipeline",
    "LoaderSettings",
    "Machine",
    "MissingDependencyError",
    "MissingSampleError",
    "Normalize",
    "ObjectNotFoundError",
    "OriginUnavailableError",
    "ParquetImages",
    "RandomResizedCrop",
    "Resize",
    "ResizeKeepRatio",
    "SampleError",
    "Setting",
    "StarvationMeter",
    "TarShards",
    "StorageError",
    "UnreadableSampleError",
    "__version__",
    "gopen_urls",
    "measure",
    "register_gopen",
]
