"""The stored listing: a dataset's index kept in its cache, so a restart lists nothing.

NOTE [the stored listing]
Listing a root is slow at scale (1.28M keys are ~1,300 LIST requests on S3; a local walk of
a million files takes seconds) and every rank of every node used to do it at each start.
``ImageFolder(root, cache=...)`` keeps its :class:`~fastload.data.index.DatasetIndex` (paths,
sizes, versions, labels, classes) as one entry in the cache's *shared* tiers (disk, Redis),
under a key made of the root's URL, the folder rules it was listed by (extensions,
``allow_empty``, a subclass's ``class_to_idx``: NOTE [torchvision's folder rules]), a digest
of the storage options and the index format (:func:`listing_key`). A later build within ``listing_max_age`` seconds of that
listing loads it and sends no listing request: a restart finds it on the node's disk tier,
other nodes in a shared Redis tier. Builds that start together list once: each takes the
key lock of the widest tier that has one (:class:`~fastload.cache.tier.KeyLocking`: the disk
tier's file lock), looks again, and only the first lists and stores.

What may be reused (docs/reliability.md, "Consistency model"):
* only a complete listing is stored (one that left no folder out under ``on_error="skip"``),
  and none made with ``is_valid_file``: a function's answers cannot be part of a key, so such
  a dataset lists its root at every build;
* only while what it was listed from is unchanged: each listing keeps a stamp of the root's
  folders, and each reuse checks it first (NOTE [listing freshness] in :mod:`.listing_stamp`:
  a stat per local folder, one ``ls`` of a remote root); what changed is said at INFO and
  the root is listed again. What a check cannot see (files within a remote class folder)
  is said in a WARNING at every reuse, with the listing's age;
* an entry that fails validation (checksum, bounds, labels; :mod:`.index_format`), was made
  for another URL or other rules, or is of another format version is ignored with a DEBUG
  line and replaced by a fresh listing; one with a path that does not lie below the root
  (``../secret.txt``: a damaged or forged entry) is ignored with a WARNING, never read;
* ``listed_at`` is when the sample set was listed; a revalidation refreshes the versions in
  the entry (``ImageFolder.revalidate`` rewrites it when something changed) but not its age,
  so a reused sample set is never older than ``listing_max_age``.
Tiers keep immutable values under a key (a put of a present key keeps the old value), so a
rewrite deletes the entry, then puts the new one; a reader in between lists again.

Example::

    >>> index, stored = index_of_root(storage, cache, rules=FolderRules(), on_error="raise",
    ...                               max_age=3600, storage_options={})
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from fastload.cache.keys import digest
from fastload.cache.tier import KeyLocking, Tier
from fastload.cache.tiered import TieredCache
from fastload.data.folder_rules import FolderRules
from fastload.data import listing_stamp
from fastload.data.index import DatasetIndex, IndexFormatError
from fastload.data.index_format import FORMAT
from fastload.data.listing import prefix_of, scan
from fastload.io.storage import OnListError, Storage

logger = logging.getLogger(__name__)

DEFAULT_MAX_AGE_S = 3600.0
"""Seconds a stored listing is reused (see ``ImageFolder(listing_max_age=)`` for why)."""

_CLOCK_SKEW_S = 300.0  # a listing "from the future" by more than this is not trusted

LISTING_LOCK_TIMEOUT_S = 900.0
"""Seconds a start waits for another process's listing (at least the cache's lock_timeout).

Waiting costs no more than listing itself (1.28M S3 keys take minutes), and a holder that
dies releases its file lock at once, so the wait is long; past it, this process lists too."""


KEY_PREFIX = "fastload-listing:"
"""What the key of every stored listing starts with (no object's key does: those are URLs)."""


def is_listing_key(key: str) -> bool:
    """Whether a cache key is a stored listing's, not an object's (``fastload cache`` tools)."""
    return key.startswith(KEY_PREFIX)


def listing_key(url: str, rules: FolderRules, storage_options: dict[str, Any] | None) -> str:
    """The cache key of the stored listing of ``url`` by ``rules`` with these options.

    The options (endpoint, credentials...) go in as a digest: the same URL on another
    endpoint is another dataset, and no secret is written into a key. So do the rules
    (extensions, ``allow_empty``, a subclass's ``class_to_idx``): a listing made by other
    rules has other samples or labels.

    Example::

        >>> listing_key("s3://bucket/train", FolderRules(extensions=(".jpg",)), {})
        'fastload-listing:v1:s3://bucket/train#rules=...#opts=...'
    """
    options = json.dumps(storage_options or {}, sort_keys=True, default=lambda o: type(o).__qualname__)
    made_by = json.dumps(rules.describe(), sort_keys=True)
    return f"{KEY_PREFIX}v{FORMAT}:{url}#rules={digest(made_by)[:16]}#opts={digest(options)[:16]}"


class StoredListing:
    """The index of one dataset in ``cache``'s shared tiers, under ``key``.

    Args:
        cache: the dataset's cache; only its shared tiers (disk, Redis) are used.
        key: from :func:`listing_key`.
        url: the root's URL, checked against what the entry says it lists.
        rules: the folder rules it was listed by, checked the same way.
        prefix: what the root's paths start with (``listing.prefix_of``), checked too.

    Example::

        >>> stored = StoredListing.of(cache, Storage("/data/train"), FolderRules(), {})
    """

    def __init__(
        self, cache: TieredCache, key: str, *, url: str, rules: FolderRules, prefix: str
    ) -> None:
        self.key = key
        self.url = url
        self.prefix = prefix
        self.rules = rules.describe()
        self.tiers: list[Tier] = [t for t in cache.tiers if t.shared]
        lockers = [t for t in self.tiers if isinstance(t, KeyLocking)]
        self._locker: KeyLocking | None = lockers[-1] if lockers else None
        self.lock_timeout = max(cache.config.lock_timeout, LISTING_LOCK_TIMEOUT_S)
        self.note: str | None = None  # what a reused listing may leave out (index_of_root)

    @classmethod
    def of(
        cls, cache: TieredCache, storage: Storage, rules: FolderRules, storage_options: dict[str, Any]
    ) -> StoredListing:
        """The stored listing of ``storage``'s root by ``rules``, under its :func:`listing_key`."""
        return cls(
            cache, listing_key(storage.url, rules, storage_options), url=storage.url,
            rules=rules, prefix=prefix_of(storage),
        )

    @property
    def available(self) -> bool:
        """Whether the cache has a shared tier to keep the listing in."""
        return bool(self.tiers)

    def extra(self) -> dict[str, Any]:
        """What an index made for this entry records about itself (checked by :meth:`load`)."""
        return {"key": self.key, "url": self.url, "rules": self.rules}

    def load(
        self, max_age: float, changes: Callable[[DatasetIndex], list[str]] | None = None
    ) -> DatasetIndex | None:
        """The stored index if one is valid and listed at most ``max_age`` seconds ago, and
        ``changes(index)`` (what changed since it was listed, in words) finds nothing."""
        for level, tier in enumerate(self.tiers):
            # contains() first: a start that finds no listing counts no miss in the tier's
            # stats, which count the dataset's objects
            blob = tier.get(self.key) if tier.contains(self.key) else None
            if blob is None:
                continue
            index = self._valid(tier, blob, max_age, changes)
            if index is not None:
                for upper in self.tiers[:level]:  # a node's disk keeps what Redis had
                    self._replace(upper, blob)
                return index
        return None

    def _valid(
        self, tier: Tier, blob: bytes, max_age: float,
        changes: Callable[[DatasetIndex], list[str]] | None,
    ) -> DatasetIndex | None:
        try:
            index = DatasetIndex.from_bytes(blob)
        except IndexFormatError as exc:
            logger.debug("ignoring the stored listing %s in the %s tier: %s; listing again", self.key, tier.name, exc)
            return None
        made_for = {k: index.extra.get(k) for k in self.extra()}  # not its stamp: long
        if made_for != self.extra() or index.prefix != self.prefix:
            logger.debug(
                "ignoring the stored listing %s in the %s tier: it is of %r below %r; listing "
                "again", self.key, tier.name, made_for, index.prefix,
            )
            return None
        escaping = index.escaping_path()
        if escaping is not None:  # never read a file outside the root
            logger.warning(
                "ignoring the listing of %s stored in the cache's %s tier: its path %r does "
                "not lie below the dataset root (a damaged or forged entry); listing the root "
                "again. If other hosts can write to that tier, set redis_hmac_key "
                "(docs/reliability.md, 'Shared tiers')", self.url, tier.name, escaping,
            )
            return None
        age = time.time() - index.listed_at
        if age > max_age or age < -_CLOCK_SKEW_S:
            logger.debug(
                "the stored listing of %s in the %s tier is %.0f s old (listing_max_age=%g s); "
                "listing again", self.url, tier.name, age, max_age,
            )
            return None
        changed = changes(index) if changes is not None else []
        if changed:
            logger.info(
                "%s: the listing stored in the cache's %s tier %.0f s ago is out of date (%s); "
                "listing again", self.url, tier.name, age, "; ".join(changed),
            )
            return None
        return index

    def save(self, index: DatasetIndex) -> bool:
        """Store ``index`` in every shared tier, replacing what was there; True if one took it."""
        blob = index.to_bytes()
        stored = [self._replace(tier, blob) for tier in self.tiers]
        if not any(stored):
            logger.info(
                "could not store the listing of %s (%d bytes) in the cache (full?); the next "
                "start lists again", self.url, len(blob),
            )
        return any(stored)

    def drop(self) -> None:
        """Delete the entry from every shared tier: the next start lists the root."""
        for tier in self.tiers:
            tier.delete(self.key)

    def _replace(self, tier: Tier, blob: bytes) -> bool:
        tier.delete(self.key)
        return tier.put(self.key, blob)

    @contextlib.contextmanager
    def lock(self) -> Iterator[bool]:
        """Hold the entry's cross-process lock (True), or go on without one (False).

        Without a tier that locks, or when the lock is not had within
        :data:`LISTING_LOCK_TIMEOUT_S` seconds (a listing that slow), it yields False.
        """
        if self._locker is None:
            yield False
            return
        with self._locker.lock(self.key, self.lock_timeout) as got:
            if not got:
                logger.info(
                    "waited %.0f s for another process listing %s; listing here too",
                    self.lock_timeout, self.url,
                )
            yield got


def index_of_root(
    storage: Storage,
    cache: TieredCache | None,
    *,
    rules: FolderRules,
    on_error: OnListError,
    max_age: float,
    storage_options: dict[str, Any],
) -> tuple[DatasetIndex, StoredListing | None]:
    """The index of ``storage``'s root by ``rules``: the stored listing if fresh, else one listing.

    Returns the index and where it is stored (None: not stored, so not to be rewritten:
    no shared tier, rules with ``is_valid_file``, or a listing that left folders out). See
    NOTE [the stored listing].
    """
    stored = None
    if cache is not None and rules.storable:
        stored = StoredListing.of(cache, storage, rules, storage_options)
    elif cache is not None:
        logger.debug("%s: is_valid_file decides the samples; the listing is not stored", storage.url)
    if stored is None or not stored.available:  # no cache: versions are not needed
        return scan(storage, rules, on_error, details=cache is not None).index, None
    reuse = max_age > 0

    def changes(index: DatasetIndex) -> list[str]:  # NOTE [listing freshness]
        return listing_stamp.changes(storage, index.extra.get("stamp"))

    index = stored.load(max_age, changes) if reuse else None
    if index is None:
        with stored.lock():  # processes starting together list once
            index = stored.load(max_age, changes) if reuse else None
            if index is None:
                stamp = listing_stamp.take(storage)  # before the listing: never newer than it
                extra = {**stored.extra(), "stamp": stamp}
                found = scan(storage, rules, on_error, extra=extra)
                if not found.complete:  # a listing that left folders out is not reused
                    return found.index, None
                stored.save(found.index)
                return found.index, stored
    stored.note = _reused(storage.url, index, max_age)
    return index, stored


_SNAPSHOT_WARNED: set[str] = set()  # roots whose reused snapshot was warned about


def _reused(url: str, index: DatasetIndex, max_age: float) -> str | None:
    """Say that ``index`` is a reused listing; returns what its check could not see (for
    ``loader.settings``), said once per process and root as a WARNING, or None."""
    age = time.time() - index.listed_at
    blind = listing_stamp.unchecked(index.extra.get("stamp"))
    what = f"{len(index)} images, {len(index.classes)} classes"
    if blind is None:
        logger.info(
            "%s: reusing the listing stored in the cache %.0f s ago (%s): its folders are "
            "unchanged since, so no listing request", url, age, what,
        )
        return None
    note = (
        f"{url}: the sample set is the listing stored in the cache {age:.0f} s ago ({what}); "
        f"{blind} until it is {max_age:g} s old (listing_max_age); pass listing_max_age=0 "
        "to list now"
    )
    if url not in _SNAPSHOT_WARNED:
        _SNAPSHOT_WARNED.add(url)
        logger.warning("%s", note)
    else:
        logger.info("%s", note)
    return note


def store_versions(stored: StoredListing, index: DatasetIndex) -> None:
    """Rewrite the stored listing with ``index``'s new versions, unless another listing
    (a newer sample set) replaced it meanwhile. An index with deleted samples is not stored
    again but dropped, so the next ``ImageFolder`` lists the root anew (without them), as
    the revalidation's warning says it will."""
    with stored.lock():
        there = stored.load(float("inf"))
        if there is not None and there.listed_at != index.listed_at:
            logger.debug("%s: the stored listing is another listing's now; not rewriting it", stored.url)
            return
        if index.unversioned():
            if there is not None:
                stored.drop()
            return
        if there is not None and there.same_versions(index):
            return  # another rank's revalidation stored the same versions already
        stored.save(index)
