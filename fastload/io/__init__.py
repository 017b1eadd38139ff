"""Storage I/O below the cache: fsspec access and the one place backend errors are converted."""
