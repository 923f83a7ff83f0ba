"""SGLang's generic storage calls (``get``/``set``/``exists`` and their batches): a page
through a staging tensor (SGLang's ``get_dummy_flat_data_page()`` targets and
``get_data_page(flat=True)`` values). A mix-in of KvtierHiCacheStorage (backend.py)."""

from __future__ import annotations

import logging
import time
from typing import Any, List

from kvtier.sglang.pools import tensor_segments
from kvtier.sglang.store import key_hash

log = logging.getLogger("kvtier.sglang")


class GenericCalls:
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None):
        """Each stored page into its target or, without one, a new uint8 tensor; None for a
        page not stored or a target of the wrong size."""
        import torch

        if not self._kv or not keys:
            return [None] * len(keys)
        start = time.perf_counter()
        page_bytes = self._page_bytes()
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        targets = [t if t is not None else torch.empty(page_bytes, dtype=torch.uint8) for t in targets]
        segs = [tensor_segments(t, page_bytes, self._split) for t in targets]
        for k, s in zip(keys, segs):
            if s is None:
                log.warning("batch_get: the target for %s is not a contiguous CPU page of %d bytes", k, page_bytes)
        ok = self._get_pages(keys, segs)
        self._stats.record("prefetch", sum(ok), sum(ok) * page_bytes, start)
        return [t if good else None for t, good in zip(targets, ok)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value if value is not None else target_location])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores each page. False, with nothing stored, when a value is not a page of this
        pool's size."""
        values = values if values is not None else target_locations
        if not self._kv or not keys or values is None or len(values) != len(keys):
            return False
        start = time.perf_counter()
        page_bytes = self._page_bytes()
        flats = [v.contiguous() if hasattr(v, "contiguous") else None for v in values]
        segs = [tensor_segments(v, page_bytes, self._split) for v in flats]
        if any(s is None for s in segs):
            log.warning("batch_set: a value is not a CPU page of %d bytes; nothing stored", page_bytes)
            return False
        ok = self._put_pages(keys, segs, None)
        self._stats.record("backup", sum(ok), sum(ok) * page_bytes, start)
        return all(ok)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many keys from the first are stored (SGLang's keys chain a prefix)."""
        if not self._kv or not keys:
            return 0
        hashes = [key_hash(k) for k in keys]
        return min(s.lookup(hashes) for s in self._kv)
