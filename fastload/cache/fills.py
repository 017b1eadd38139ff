"""What a cache stores for the bytes of an object it read from the origin.

Two rules decide it, for the read path of :class:`~fastload.cache.tiered.TieredCache` and
for the batched fills of ``cache warm`` alike: bytes are stored only under the version they
are (NOTE [fetch-time version check]), and a deriving cache stores ``derive(bytes)`` under
the derived key (NOTE [derived entries]). :class:`FillRules` applies both and counts the
origin reads.

Example::

    >>> rules = FillRules(derive=None)
    >>> rules.prepare("s3://b/a.jpg", "3:etag", b"abc", read_version=None)
    Fill(key='s3://b/a.jpg#v=3:etag', value=b'abc', underivable=None)
    >>> rules.prepare("s3://b/a.jpg", "3:etag", b"abcd", read_version=None).key is None
    True
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from fastload.cache.forks import after_fork
from fastload.cache.keys import derived_key, make_key
from fastload.errors import CacheError
from fastload.io.versions import version_size

logger = logging.getLogger(__name__)

__all__ = ["Derivation", "Fill", "FillRules"]


class Derivation(Protocol):
    """A named bytes -> bytes function whose values a cache stores (NOTE [derived entries]).

    ``tag`` names the function and every parameter that changes its output (it goes into
    the key); calling it raises ``ValueError`` when the bytes cannot be derived. It must
    pickle (the cache travels into worker processes).
    Example: :class:`fastload.data.transcode.Transcode`.
    """

    @property
    def tag(self) -> str: ...

    def __call__(self, data: bytes) -> bytes: ...


# NOTE [derived entries]
# A cache made with `TieredCache.deriving(derive)` reads an object from the origin as usual
# (same version checks), stores `derive(bytes)` under the derived key (keys.derived_key:
# the object's key plus derive.tag) and serves that; the original bytes are not stored under
# their own key by such a read. Every other promise holds as for plain entries, because the
# derived key simply takes the plain key's place: per-key single flight across threads and
# processes, checksummed entries, budgets and policies, the prefetcher and `cache warm`
# filling exactly the entries readers look up. Bytes the derivation rejects (ValueError: a
# corrupt image) are served as they are and not stored at all, so the reader reports them
# as it would without the derivation (ImageFolder: CorruptSampleError); this process
# remembers them, so `ensure` (prefetch, warm) does not fetch them again and raises.


@dataclass(frozen=True, slots=True)
class Fill:
    """Bytes read from the origin, checked and ready to store (:meth:`TieredCache.prepare`).

    ``key`` is where to store ``value`` (the bytes, or their derived value), or None when it
    must be served but not stored (it changed since its listing: NOTE [fetch-time version
    check]); ``underivable`` says why the derivation rejected the bytes, if it did.
    """

    key: str | None
    value: bytes
    underivable: str | None = None


class FillRules:
    """The rules of one cache for bytes read from its origin, and its origin counters.

    Attributes:
        derive: the :class:`Derivation` whose values the cache stores, or None (the bytes).
        reads: objects this process read from the origin.
        bytes: bytes this process read from the origin.
    """

    def __init__(self, derive: Derivation | None) -> None:
        self.derive = derive
        self.reads = 0
        self.bytes = 0
        self._underivable: dict[str, str] = {}  # derived key -> why derive rejected its bytes
        self._warned: set[str] = set()  # URLs whose bytes changed since their listing
        self._mutex = threading.Lock()
        after_fork(self, FillRules._reset_after_fork)  # NOTE [locks across fork]

    def _reset_after_fork(self) -> None:
        self._mutex = threading.Lock()

    def key_of(self, url: str, version: str) -> str:
        """The key of ``url`` at ``version``: the object's, or its derived value's."""
        key = make_key(url, version)
        return key if self.derive is None else derived_key(key, self.derive.tag)

    def underivable(self, key: str) -> str | None:
        """Why the derivation rejected the bytes of ``key`` in this process, or None."""
        return self._underivable.get(key)

    def prepare(self, url: str, version: str, data: bytes, read_version: str | None) -> Fill:
        """What to store for ``data``, the bytes of ``url`` read from the origin at listed
        ``version`` (``read_version``: the bytes' own version where the read knew it)."""
        return Fill(*self.check(url, version, data, read_version))

    def check(
        self, url: str, version: str, data: bytes, read_version: str | None
    ) -> tuple[str | None, bytes, str | None]:
        """:meth:`prepare` as a tuple (key, value, underivable): the read path's, per object."""
        with self._mutex:
            self.reads += 1
            self.bytes += len(data)
        if read_version == version and self.derive is None:  # a local read, as stat'd
            return make_key(url, version), data, None
        # NOTE [fetch-time version check]: bytes are stored only under the version they are.
        keep: str | None = version
        if read_version is not None:
            if read_version != version:  # local: written since the read's stat (or listing)
                self._changed(url, version, f"it is now version {read_version}", local=True)
                keep = read_version
        elif version_size(version) not in (None, len(data)):
            self._changed(url, version, f"{len(data)} bytes were read")
            keep = None  # served, not stored: the bytes' own version is unknown
        if self.derive is not None:  # NOTE [derived entries]
            derived = self._derived(url, version, data)
            if derived is None:
                return None, data, self._underivable[self.key_of(url, version)]
            data = derived
        return None if keep is None else self.key_of(url, keep), data, None

    def error(self, url: str, why: str) -> CacheError:
        """The error ``ensure`` and ``prepare`` raise for bytes the derivation rejected."""
        assert self.derive is not None
        return CacheError(
            f"cannot cache {url} as {self.derive.tag}: {why}. Nothing is stored for it and a "
            "read serves its original bytes (ImageFolder reports a corrupt image as a corrupt "
            "sample); replace or remove the object"
        )

    def _derived(self, url: str, version: str, data: bytes) -> bytes | None:
        """``derive(data)``, or None (remembered) when the derivation rejects the bytes."""
        assert self.derive is not None
        key = self.key_of(url, version)
        if key in self._underivable:  # known to fail: spare the work
            return None
        try:
            return self.derive(data)
        except ValueError as exc:
            with self._mutex:
                first = key not in self._underivable
                self._underivable[key] = str(exc)
            if first:
                logger.info(
                    "%s: %s rejects its bytes (%s); serving them as they are, not cached",
                    url, self.derive.tag, exc,
                )
            return None

    def _changed(self, url: str, version: str, now: str, *, local: bool = False) -> None:
        with self._mutex:
            first = url not in self._warned
            self._warned.add(url)
        (logger.warning if first else logger.debug)(
            "%s changed since %s (version %s; %s): serving its current bytes, never cached "
            "under the %s version. %sto stop this, do not rewrite a dataset while it is read",
            url, "its version was read" if local else "it was listed", version, now,
            "older" if local else "listed",
            "" if local else "The loader revalidates at the next epoch (ImageFolder.revalidate()); ",
        )


# NOTE [fetch-time version check]
# A cache key says which version of an object its bytes are (NOTE [cache keys]); an object
# rewritten after it was listed must not have its new bytes stored under the old version's
# key, where they would be served for that version forever. For a local file the version of
# the bytes read is known exactly: fstat of the open file before and after the read (equal:
# nothing wrote in between), so they are stored under their own version, and the read is
# retried when a writer was active. Remote stores answer a GET without the version fastload
# can see, so only the size is checked: a size that differs from the listed one is served
# but not cached. A same-size rewrite between the listing and the fetch is not detected
# there (docs/reliability.md says what that means).
