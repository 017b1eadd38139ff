"""The read-through cache over fsspec storage: tiers, policies, prefetch."""
