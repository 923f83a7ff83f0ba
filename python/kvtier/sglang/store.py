"""One kvtier namespace of SGLang pages and its session: SGLang's keys as block hashes,
pages copied between a process's memory segments and kvtier's pages. Needs no SGLang."""

from __future__ import annotations

import ctypes
import hashlib
import logging
from typing import List, Optional, Tuple

import kvtier
from kvtier.resilient import ResilientClient

log = logging.getLogger("kvtier.sglang")

# A page's bytes in a process: (address, length) segments, in the page's byte order.
Segments = List[Tuple[int, int]]


def key_hash(key: str) -> bytes:
    """SGLang's key as a kvtier block hash (32 bytes): 64 hex digits are the hash itself,
    anything else is hashed."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def _gather(dst: int, segs: Segments) -> None:
    off = 0
    for addr, n in segs:
        ctypes.memmove(dst + off, addr, n)
        off += n


def _scatter(src: int, segs: Segments) -> None:
    off = 0
    for addr, n in segs:
        ctypes.memmove(addr, src + off, n)
        off += n


class PageStore:
    """A namespace (a pool's pages, or one head slice of them) and its resilient session.
    Every call is a miss (or a failed put) when kvtierd is unreachable, never an error."""

    def __init__(self, model_id: str, page_bytes: int, page_tokens: int, socket: str, timeout_ms: int,
                 routable_id: str, announce: bool):
        self.model_id = model_id
        self.page_bytes = page_bytes
        layout = kvtier.Layout.opaque(model_id, page_bytes, page_tokens)
        self.client = ResilientClient(
            lambda: kvtier.Client(layout, socket, name="sglang-hicache", hash_bytes=32, timeout_ms=timeout_ms,
                                  device="host-emulated", routable_id=routable_id,
                                  event_hashes="sglang" if announce else "none"),
            name="kvtier.sglang")

    def lookup(self, hashes: List[bytes]) -> int:
        """How many hashes from the first are stored."""
        if not hashes:
            return 0
        try:
            return self.client.call(lambda c: c.lookup(hashes).matched)
        except kvtier.Error as e:
            log.debug("lookup: %s", e)
            return 0

    def present(self, hashes: List[bytes]) -> List[bool]:
        """Whether each hash is stored, each on its own (one pipelined round trip)."""
        if not hashes:
            return []

        def each(c):
            tickets = [c.start_lookup([h]) for h in hashes]
            return [c.wait_lookup(t).matched == 1 for t in tickets]

        try:
            return self.client.call(each)
        except kvtier.Error as e:
            log.debug("present: %s", e)
            return [False] * len(hashes)

    def get(self, hashes: List[bytes], dsts: List[Optional[Segments]]) -> List[bool]:
        """Copies each stored page into its segments (None: skipped). Per page whether it
        was copied; nothing stays referenced."""
        want = [i for i, d in enumerate(dsts) if d is not None]
        ok = [False] * len(hashes)
        if not want:
            return ok

        def copy(c):
            got = c.acquire([hashes[i] for i in want])
            held = [hashes[i] for i, r in zip(want, got) if r.ok]
            try:
                for i, r in zip(want, got):
                    if r.ok:
                        _scatter(c.page_address(r.page, r.tier), dsts[i])
                        ok[i] = True
            finally:
                if held:
                    c.release(hashes=held)
            return ok

        try:
            return self.client.call(copy)
        except kvtier.Error as e:
            log.debug("get: %s", e)
            return [False] * len(hashes)

    def put(self, hashes: List[bytes], parents: List[bytes], srcs: List[Segments]) -> List[bool]:
        """Stores each page from its segments; per page whether it is stored. Pages leased
        for a call that fails are given back."""
        if not hashes:
            return []

        def store(c):
            pages = c.allocate(len(hashes))
            try:
                for p, segs in zip(pages, srcs):
                    _gather(c.page_address(p), segs)
                results = c.commit(pages, hashes, parents)
            except BaseException:
                c.release(pages=pages)
                raise
            failed = [p for p, r in zip(pages, results) if not r.ok]
            if failed:
                c.release(pages=failed)
            return [r.ok for r in results]

        try:
            return self.client.call(store)
        except kvtier.Error as e:
            log.debug("put: %s", e)
            return [False] * len(hashes)

    def close(self) -> None:
        try:
            self.client.call(lambda c: c.close())
        except kvtier.Error:
            pass
