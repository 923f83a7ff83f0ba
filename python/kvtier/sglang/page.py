"""SGLang's page calls (``batch_get_v1``/``batch_set_v1``, with ``interface_v1`` in the
extra config): one copy each way between the host pool's page buffers
(``get_page_buffer_meta``) and a kvtier page. A mix-in of KvtierHiCacheStorage
(backend.py)."""

from __future__ import annotations

import logging
import time
from typing import Any, List

from kvtier.sglang.pools import pool_segments

log = logging.getLogger("kvtier.sglang")


def leading(ok: List[bool]) -> List[bool]:
    """Only a leading run is usable: a page after a miss has no prefix to attach to."""
    run = ok.index(False) if False in ok else len(ok)
    return ok[:run] + [False] * (len(ok) - run)


class PageCalls:
    def _pool_pages(self, call: str, keys: List[str], host_indices):
        segs = pool_segments(self.mem_pool_host, host_indices, self._split, self._mla)
        if len(segs) != len(keys):
            log.warning("%s: %d keys for %d pages", call, len(keys), len(segs))
            return None
        return segs

    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        if not self._kv or not keys:
            return [False] * len(keys)
        start = time.perf_counter()
        segs = self._pool_pages("batch_get_v1", keys, host_indices)
        if segs is None:
            return [False] * len(keys)
        ok = leading(self._get_pages(keys, segs))
        self._stats.record("prefetch", sum(ok), sum(ok) * self._page_bytes(), start)
        return ok

    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        if not self._kv or not keys:
            return [False] * len(keys)
        start = time.perf_counter()
        segs = self._pool_pages("batch_set_v1", keys, host_indices)
        if segs is None:
            return [False] * len(keys)
        ok = self._put_pages(keys, segs, extra_info)
        self._stats.record("backup", sum(ok), sum(ok) * self._page_bytes(), start)
        return ok
