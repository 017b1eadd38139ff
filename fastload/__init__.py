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
from fastload.data.images import ImageFolder
from fastload.loader import DataLoader
from fastload.meter import StarvationMeter, measure
from fastload.data.pipeline import (
    CenterCrop,
    HorizontalFlip,
    ImagePipeline,
    Normalize,
    RandomResizedCrop,
    Resize,
)
from fastload.data.sampling import EpochSampler
from fastload.settings import AUTO, LoaderSettings, Machine, Setting

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
    "RandomResizedCrop",
    "Resize",
    "SampleError",
    "Setting",
    "StarvationMeter",
    "StorageError",
    "UnreadableSampleError",
    "__version__",
    "measure",
]
