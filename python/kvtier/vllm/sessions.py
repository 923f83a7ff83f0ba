"""Agentic sessions' hints from vLLM's requests (docs/integrations.md, "Session hints").

A request names its session and hints in ``kv_transfer_params`` (the OpenAI-compatible
server passes a request's ``kv_transfer_params`` to the connector)::

    {"kvtier": {"session": "agent-42", "ttl_s": 300, "end": false}}

``session`` defaults to vLLM's own session id of the request (``Request.session_id``: the
request's ``session_id`` field, the ``X-Session-ID`` header or ``vllm_xargs.session_id``),
so a client that already sends one adds only ``ttl_s`` and ``end``. A request with a
session id and no ``kvtier`` key is its session's request without a new TTL.

The scheduler sends the hint when the request's stores have landed (its blocks are then
kvtierd's), over the whole chain of every prefix group: the pause the TTL covers starts
when the request ends. A malformed hint is dropped with one log line per kind and a
counter, and the request is served as any other.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

import kvtier

log = logging.getLogger("kvtier.vllm")

HINT_KEYS = frozenset(("session", "ttl_s", "end"))
MAX_SESSION_ID_BYTES = 256  # kvtierd's bound (SessionHint)
MAX_TTL_S = 365 * 86400.0   # kvtierd clamps far lower (sessions.max_ttl); this keeps the ms in int64


@dataclass(frozen=True)
class Hint:
    session: str
    ttl_s: Optional[float]  # None: the session's last TTL stands
    end: bool


class BadHint(ValueError):
    """A malformed hint; ``kind`` names what is wrong (one log line per kind)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def request_hint(request) -> Optional[Hint]:
    """The request's session hint, None where it names no session; BadHint where the
    ``kvtier`` entry of its ``kv_transfer_params`` is malformed."""
    params = getattr(request, "kv_transfer_params", None)
    raw = params.get("kvtier") if isinstance(params, dict) else None
    own = getattr(request, "session_id", None)
    own = own if isinstance(own, str) and own else None
    if raw is None:
        return Hint(own, None, False) if own is not None else None
    if not isinstance(raw, dict):
        raise BadHint("not_an_object", f"kv_transfer_params.kvtier must be an object, not {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in HINT_KEYS)
    if unknown:
        raise BadHint("unknown_key", f"kv_transfer_params.kvtier has unknown keys {unknown} "
                                     f"(known: {sorted(HINT_KEYS)})")
    session = raw.get("session", own)
    if not isinstance(session, str) or not session:
        raise BadHint("session", "kv_transfer_params.kvtier.session must be a non-empty string, "
                                 f"not {session!r:.40}")
    if len(session.encode()) > MAX_SESSION_ID_BYTES:
        raise BadHint("session_length", f"a session id of {len(session.encode())} bytes "
                                        f"(at most {MAX_SESSION_ID_BYTES})")
    ttl = raw.get("ttl_s")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl)
                            or ttl < 0):
        raise BadHint("ttl_s", f"kv_transfer_params.kvtier.ttl_s must be a number of seconds >= 0, not {ttl!r:.40}")
    end = raw.get("end", False)
    if not isinstance(end, bool):
        raise BadHint("end", f"kv_transfer_params.kvtier.end must be true or false, not {end!r:.40}")
    return Hint(session, None if ttl is None else min(float(ttl), MAX_TTL_S), end)


class Hints:
    """The scheduler's hints: parsed when a request finishes, sent (on the scheduler's
    background thread) when its stores have landed."""

    def __init__(self, stats):
        self._stats = stats  # () -> the scheduler's KvtierConnectorStats now
        self._warned: set = set()
        self._waiting: dict = {}  # request id -> (Hint, [(group, chain)]) until its stores land

    def _drop(self, kind: str, message: str) -> None:
        self._stats().data["session_hints_dropped"] += 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("kvtier.vllm: a session hint dropped (%s); the request is served without it "
                        "(logged once per kind; counted in session_hints_dropped)", message)

    def finished(self, request, chains: list, hit_tokens: int) -> Optional[tuple]:
        """What to send for a finished request: (its hint, its chains [(group, keys)], the
        tokens it loaded from kvtierd), or None."""
        try:
            hint = request_hint(request)
        except BadHint as e:
            self._drop(e.kind, str(e))
            return None
        return (hint, chains, hit_tokens) if hint is not None and chains else None

    def wait(self, req_id: str, pending: tuple) -> None:
        self._waiting[req_id] = pending

    def landed(self, req_ids) -> list:
        """The waiting hints of the requests whose stores landed."""
        return [self._waiting.pop(r) for r in req_ids if r in self._waiting]

    def send(self, clients: list, pending: tuple) -> None:
        hint, chains, hit_tokens = pending
        for i, (group, keys) in enumerate(chains):
            hits = hit_tokens if i == 0 else 0  # the request's, counted once
            try:
                clients[group].call(lambda c: c.hint(hint.session, keys, ttl_s=hint.ttl_s, end=hint.end, hit_tokens=hits))
            except kvtier.Error as e:  # refused (too many sessions) or no daemon: a miss of a hint
                self._drop(type(e).__name__, f"kvtierd: {e}")
                return
        self._stats().data["session_hints"] += 1
