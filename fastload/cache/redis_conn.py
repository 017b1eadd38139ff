"""The Redis tier's connection: one client per process, faults turned into misses, no secret shown.

:class:`RedisConnection` runs each command of :class:`~fastload.cache.redis_tier.RedisTier`
through :meth:`RedisConnection.call`: a fault (connection refused, timeout, a server error)
becomes the caller's fallback answer, one warning, and a rest of ``retry_after`` seconds;
a refused write for the budget is a declined put; a command the user may not run (NOPERM)
loses only what needs it (NOTE [denied commands]). Every line it logs names the server by
its redacted URL (:func:`~fastload.cache.config.redact_url`), and error texts are scrubbed of
the password.

Example::

    >>> conn = RedisConnection("redis://:secret@cache-host:6379/0", socket_timeout=1.0,
    ...                        retry_after=30.0)
    >>> conn.call("get", lambda r: r.get("k"), None)    # None also when Redis is down
    >>> conn.shown_url
    'redis://:***@cache-host:6379/0'
"""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoPermissionError
from redis.retry import Retry

from fastload.cache.config import redact_url

logger = logging.getLogger(__name__)

T = TypeVar("T")

_FAULTS = (redis.ConnectionError, redis.TimeoutError, OSError)
_DENIED_WARNED: set[tuple[str, str]] = set()  # (url, command) said in this process: a user's
# rights do not change between the tiers a process makes (one per ImageFolder, per worker)


class RedisConnection:
    """The client of one Redis URL in this process, and what a failure of it does.

    Args:
        url: the server's URL, as redis-py's ``Redis.from_url`` reads it (kept to connect;
            shown only as :attr:`shown_url`).
        socket_timeout: seconds before a connect or a command counts as a failure.
        retry_after: seconds the connection rests after a failure before trying again.
    """

    def __init__(self, url: str, *, socket_timeout: float, retry_after: float) -> None:
        self.url = url
        self.shown_url = redact_url(url)
        self.socket_timeout = socket_timeout
        self.retry_after = retry_after
        self._client: redis.Redis | None = None
        self._pid = -1
        self._down_until = 0.0
        self._warned: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Sockets must not cross a fork or a pickle: each process connects on first use.
        state = self.__dict__.copy()
        state.update(_client=None, _pid=-1)
        return state

    def __repr__(self) -> str:
        return f"RedisConnection({self.shown_url!r})"

    @property
    def client(self) -> redis.Redis:
        if self._client is None or self._pid != os.getpid():
            timeouts = {"socket_timeout": self.socket_timeout,
                        "socket_connect_timeout": self.socket_timeout}
            client = redis.Redis.from_url(
                self.url, retry=Retry(NoBackoff(), 0), **timeouts  # a failure is final here
            )
            # NOTE [one URL for a server or a cluster]: the URL of any node of a Redis Cluster
            # works; the node says it is clustered and a cluster client (which routes every key
            # to its slot's node) replaces the plain one. All keys of one entry share a hash
            # tag ({digest}), so an entry's manifest and chunks live on one node.
            if self._clustered(client):
                client.close()
                client = RedisCluster.from_url(
                    self.url, retry=Retry(NoBackoff(), 0), **timeouts
                )
            self._client = client
            self._pid = os.getpid()
        return self._client

    def _clustered(self, client: redis.Redis) -> bool:
        """Whether the server is a Redis Cluster node (``INFO cluster``); an ACL user denied
        INFO uses it as one server, with one warning (NOTE [denied commands])."""
        try:
            return client.info("cluster").get("cluster_enabled") == 1
        except NoPermissionError as exc:
            self._warn_denied_once(
                "info",
                "Redis cache %s: this user may not run INFO (%s), so fastload cannot tell "
                "whether the server is a Redis Cluster and uses it as a single server. The "
                "tier stays on; if it is a cluster, grant +info (ACL SETUSER <user> +info)",
                self.shown_url, self.scrub(exc),
            )
            return False

    @property
    def available(self) -> bool:
        """False while the connection rests after a failure (``retry_after`` seconds)."""
        return time.monotonic() >= self._down_until

    def call(self, what: str, op: Callable[[redis.Redis], T], fallback: T) -> T:
        """Run ``op`` on the server; a fault becomes ``fallback`` and rests the connection."""
        if not self.available:
            return fallback
        try:
            result = op(self.client)
        except redis.OutOfMemoryError:
            self.full()
            return fallback
        except NoPermissionError as exc:
            self.denied(what, exc)
            return fallback
        except (*_FAULTS, redis.RedisError) as exc:
            self.failed(what, exc)
            return fallback
        if "down" in self._warned and "up" not in self._warned:
            self._warned.add("up")
            logger.info("Redis cache %s answers again", self.shown_url)
        return result

    def full(self) -> None:
        """A write refused for the budget (maxmemory with noeviction): a declined put."""
        self.warn_once(
            "oom",
            "Redis cache %s reached its maxmemory with an eviction policy that refuses "
            "writes; new objects are not shared from now on (raise maxmemory or set "
            "maxmemory-policy allkeys-lru)", self.shown_url,
        )

    def failed(self, what: str, exc: BaseException) -> None:
        """A fault: rest for ``retry_after`` seconds, say so once."""
        self._down_until = time.monotonic() + self.retry_after
        self._client = None
        self.warn_once(
            "down",
            "Redis cache %s failed during %s (%s: %s); reading from the next tier or the "
            "origin instead, retrying Redis every %.0f s. Training goes on.",
            self.shown_url, what, type(exc).__name__, self.scrub(exc), self.retry_after,
        )

    # NOTE [denied commands]
    # An ACL user may lack commands fastload uses beside GET/SET: INFO (is it a cluster?),
    # CONFIG (maxmemory), SCAN (keys). A denied command (NOPERM) is no outage: the tier is
    # not rested, only what needs the command is lost (the answer is the fallback: a miss,
    # no budget, no keys), with one warning per command and process. A user denied SET makes a
    # read-only shared tier, which is a legitimate setup.

    def denied(self, what: str, exc: BaseException) -> None:
        """A command this user may not run (NOPERM): one warning, no rest."""
        self._warn_denied_once(
            what,
            "Redis cache %s: this user may not run what %s needs (%s); %s answers as if "
            "nothing were there, the tier stays on. Grant the command to the user (ACL "
            "SETUSER) to use it", self.shown_url, what, self.scrub(exc), what,
        )

    def scrub(self, exc: BaseException) -> str:
        """An error's text with the URL's password masked, should a library have quoted it."""
        text = str(exc)
        password = urllib.parse.urlsplit(self.url).password
        return text.replace(password, "***") if password else text

    def _warn_denied_once(self, what: str, message: str, *args: Any) -> None:
        if (self.url, what) in _DENIED_WARNED:
            logger.debug(message, *args)
            return
        _DENIED_WARNED.add((self.url, what))
        logger.warning(message, *args)

    def warn_once(self, kind: str, message: str, *args: Any) -> None:
        """Log ``message`` as a warning the first time ``kind`` happens, later at DEBUG."""
        if kind in self._warned:
            logger.debug(message, *args)
            return
        self._warned.add(kind)
        logger.warning(message, *args)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None
