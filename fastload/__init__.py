"""fastload: a drop-in torch DataLoader that measures and removes GPU input starvation.

Example::

    from fastload import DataLoader, ImageFolder
    loader = DataLoader(ImageFolder("data/train", size=224, train=True),
                        batch_size=256, shuffle=True)
    print(loader.settings)
"""

from fastload.errors import (
    BackendUnavailable,
    CacheError,
    ConfigError,
    CorruptSampleError,
    DatasetError,
    EmptyDatasetError,
    FastloadError,
    ObjectNotFoundError,
    SampleError,
    StorageError,
)
from fastload.images import ImageFolder
from fastload.loader import DataLoader
from fastload.pipeline import (
    CenterCrop,
    HorizontalFlip,
    ImagePipeline,
    Normalize,
    RandomResizedCrop,
    Resize,
)
from fastload.sampling import EpochSampler
from fastload.settings import AUTO, LoaderSettings, Machine, Setting

__version__ = "0.1.0"

__all__ = [
    "AUTO",
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
    "Normalize",
    "ObjectNotFoundError",
    "RandomResizedCrop",
    "Resize",
    "SampleError",
    "Setting",
    "StorageError",
    "__version__",
]
