"""A kvtier client that survives kvtierd going away: what the engine connectors use.

An engine must never hang or crash because its cache daemon restarted, was upgraded or
stopped answering. ``ResilientClient`` holds one ``kvtier.Client`` and, when a call fails
because the daemon is gone, slow past the timeout, or restarted (its page handles are of
another epoch), drops it and reconnects by itself on a later call, with exponential
back-off and jitter so a fleet of engines does not stampede a restarting daemon. While it
is down every call raises ``UnavailableError`` at once, which the connectors treat as a
miss: the engine recomputes. Thread-safe.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable, Optional

import kvtier

log = logging.getLogger("kvtier")

# Failures after which the session is not worth keeping: the daemon went away or stopped
# answering (UNAVAILABLE), or it restarted and our handles are stale (FAILED_PRECONDITION
# from a closed client or another epoch).
_RECONNECT_ON = (kvtier.UnavailableError, kvtier.FailedPreconditionError)


class ResilientClient:
    def __init__(self, connect: Callable[[], "kvtier.Client"], *, min_backoff_s: float = 0.1,
                 max_backoff_s: float = 5.0, name: str = "kvtier"):
        self._connect = connect
        self._min = min_backoff_s
        self._max = max_backoff_s
        self._name = name
        self._lock = threading.RLock()
        self._client: Optional[kvtier.Client] = None
        self._backoff = 0.0
        self._next_try = 0.0
        self.reconnects = 0          # sessions opened after the first
        self.failures = 0            # calls that failed for want of a daemon
        self._ever_connected = False

    def client(self) -> "kvtier.Client":
        """The live client, connecting if due; UnavailableError while the daemon is down."""
        with self._lock:
            if self._client is not None:
                return self._client
            now = time.monotonic()
            if now < self._next_try:
                raise kvtier.UnavailableError(f"{self._name}: kvtierd is unreachable; retrying in "
                                              f"{self._next_try - now:.1f} s")
            try:
                self._client = self._connect()
            except kvtier.Error as e:
                self._down(e)
                raise kvtier.UnavailableError(f"{self._name}: cannot reach kvtierd: {e}") from e
            if self._ever_connected:
                self.reconnects += 1
                log.warning("%s: reconnected to kvtierd (session %d)", self._name, self._client.session_id)
            self._ever_connected = True
            self._backoff = 0.0
            return self._client

    def call(self, fn: Callable[["kvtier.Client"], object]):
        """Runs fn(client). A failure that means the session is over drops it; when the
        connection was closed (a restart, an upgrade) one new session is tried at once and
        fn run again on it, so the first request after a restart is not a miss. A daemon
        that stopped answering (a timeout) is not retried at once: that would double the
        wait. What still fails is UnavailableError; other errors (ResourceExhausted, ...)
        pass through."""
        c = self.client()
        try:
            return fn(c)
        except _RECONNECT_ON as e:
            timed_out = isinstance(e, kvtier.DeadlineExceededError)
            with self._lock:
                if self._client is c:
                    self._drop()
                    if timed_out:
                        self._down(e)
            if timed_out:
                raise kvtier.UnavailableError(f"{self._name}: {e}") from e
            try:
                c = self.client()
            except kvtier.Error as again:
                raise kvtier.UnavailableError(f"{self._name}: {e}; reconnecting: {again}") from e
            try:
                return fn(c)
            except _RECONNECT_ON as e2:
                with self._lock:
                    if self._client is c:
                        self._drop()
                        self._down(e2)
                raise kvtier.UnavailableError(f"{self._name}: {e2}") from e2

    def available(self) -> bool:
        try:
            self.client()
            return True
        except kvtier.Error:
            return False

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except kvtier.Error:
                pass
            self._client = None

    def _down(self, why: Exception) -> None:
        self.failures += 1
        self._backoff = self._min if self._backoff == 0 else min(self._max, self._backoff * 2)
        self._next_try = time.monotonic() + self._backoff * random.uniform(0.5, 1.0)
        log.warning("%s: kvtierd unavailable (%s); next try in about %.1f s", self._name, why, self._backoff)
