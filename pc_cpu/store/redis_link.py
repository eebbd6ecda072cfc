"""The connection to a shared Redis (or Valkey) server: opening it from a URL, naming it without its password, and riding out its outages.

pc_cpu talks to Redis through redis-py (with hiredis parsing replies), never its own protocol code.
A server that fails a command (refused, reset, timed out) is "down" for a while (`Link`): every
tier call in that while returns at once as a miss or a skipped write, so a Redis lost in the middle
of serving costs each request nothing but the shared tier, and the first call after the pause
tries again (redis-py reconnects by itself).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Mapping, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pc_cpu.errors import ConfigError, StoreUnavailableError

log = logging.getLogger(__name__)

REMOTE_STORE_ENV = "PC_CPU_REMOTE_STORE"
SCHEMES = ("redis", "rediss", "unix")  # plain TCP, TLS, a local socket; valkey:// servers speak the same
# A command on a LAN answers in well under a millisecond; one that takes a second means the server or
# the network is failing. The connect timeout is shorter: a host that does not answer should not hold a
# request longer than a small prefill takes.
COMMAND_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0
# After a failure, the pause before the next try doubles from the first to the last: a server restarting
# is back within seconds, and one that is gone costs one connect attempt per pause, not per request.
RETRY_PAUSES_S = (1.0, 2.0, 4.0, 8.0, 15.0)

T = TypeVar("T")


def shown_url(url: str) -> str:
    """Returns `url` as messages may show it: the password replaced by '***'."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}{port}", parts.path, parts.query, parts.fragment))


def check_url(url: str) -> str:
    """Returns `url` when redis-py can open it; raises ConfigError naming the accepted forms."""
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"remote store {shown_url(url)!r} is not a Redis URL; give redis://host:6379/0, "
                          "rediss://host:6380/0 (TLS), redis://user:password@host:6379/0 (AUTH) or "
                          f"unix:///path/to/redis.sock (--remote-store, ${REMOTE_STORE_ENV})")
    return url


def remote_url(remote_store: str | bool | None, environ: Mapping[str, str] | None = None) -> str | None:
    """Returns the URL of the shared store to use: `remote_store`; None: $PC_CPU_REMOTE_STORE if set; False: none."""
    if remote_store is False:
        return None
    if remote_store is None or remote_store is True:
        value = (os.environ if environ is None else environ).get(REMOTE_STORE_ENV, "")
        if not value and remote_store is True:
            raise ConfigError(f"remote_store=True but ${REMOTE_STORE_ENV} is not set; give the URL, "
                              "e.g. remote_store='redis://host:6379/0'")
        return check_url(value) if value else None
    return check_url(str(remote_store))


def connect(url: str):
    """Returns a redis-py client for `url` (not yet connected: the first command connects)."""
    import redis  # loaded only by a cache given a remote store

    return redis.Redis.from_url(check_url(url), socket_timeout=COMMAND_TIMEOUT_S,
                                socket_connect_timeout=CONNECT_TIMEOUT_S, health_check_interval=30)


def link_errors() -> tuple[type[Exception], ...]:
    """Returns the exceptions that mean the server could not be reached or did not answer in time."""
    import redis

    return (redis.ConnectionError, redis.TimeoutError, OSError)


def redis_errors() -> type[Exception]:
    """Returns redis-py's base error: what a server that answered with a refusal raises (after `link_errors`)."""
    import redis

    return redis.RedisError


class Link:
    """Whether the shared server is worth trying now: down for a pause after each failure, up again after a success."""

    def __init__(self, url: str):
        self.shown = shown_url(url)
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0  # time.monotonic() before which calls are not tried

    @property
    def down(self) -> bool:
        """Returns whether a failure was seen and its pause is not over yet."""
        return time.monotonic() < self._retry_at

    def call(self, what: str, command: Callable[[], T], default: T) -> T:
        """Returns `command()`, or `default` when the server is down or fails it (then down for a pause, logged once)."""
        if self.down:
            return default
        try:
            value = command()
        except link_errors() as exc:
            self.failed(what, exc)
            return default
        self.succeeded()
        return value

    def require(self, what: str, command: Callable[[], T]) -> T:
        """Returns `command()`; raises StoreUnavailableError naming the server when it is down or fails it."""
        if self.down:
            raise self.unavailable(what, "it failed moments ago")
        try:
            value = command()
        except link_errors() as exc:
            self.failed(what, exc)
            raise self.unavailable(what, str(exc)) from None
        self.succeeded()
        return value

    def unavailable(self, what: str, why: str) -> StoreUnavailableError:
        return StoreUnavailableError(f"the shared store {self.shown} cannot be reached ({why}), so {what} "
                                     "cannot be done now; retry once it is back (pc_cpu reconnects by itself)")

    def failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            pause = RETRY_PAUSES_S[min(self._failures, len(RETRY_PAUSES_S) - 1)]
            self._failures += 1
            self._retry_at = time.monotonic() + pause
            first = self._failures == 1
        if first:  # one warning an outage; each retry that fails again is only debug
            log.warning("shared store %s failed (%s: %s); serving from the local tiers, trying it again in %.0f s",
                        self.shown, what, exc, pause)
        else:
            log.debug("shared store %s still failing (%s: %s); next try in %.0f s", self.shown, what, exc, pause)

    def succeeded(self) -> None:
        if not self._failures:
            return
        with self._lock:
            was_down, self._failures, self._retry_at = self._failures, 0, 0.0
        if was_down:
            log.warning("shared store %s is back", self.shown)
