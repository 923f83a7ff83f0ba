"""The backend's transfer figures, as SGLang's StorageMetrics: pages and GB/s of each get
("prefetch") and set ("backup") since SGLang's scheduler last read them. The one owner of
those figures; every interface generation records into it."""

from __future__ import annotations

import threading
import time

from kvtier.sglang._base import StorageMetrics

# Most per-call figures kept between two reads.
MAX_SAMPLES = 4096


class TransferStats:
    def __init__(self):
        self._lock = threading.Lock()
        self._metrics = StorageMetrics()

    def record(self, kind: str, pages: int, nbytes: int, start: float) -> None:
        """One call of `kind` ("prefetch" or "backup") that moved `pages` pages of `nbytes`
        bytes, begun at perf_counter() `start`."""
        if pages == 0:
            return
        seconds = max(time.perf_counter() - start, 1e-9)
        with self._lock:
            counts = getattr(self._metrics, f"{kind}_pgs")
            if len(counts) < MAX_SAMPLES:
                counts.append(pages)
                getattr(self._metrics, f"{kind}_bandwidth").append(nbytes / seconds / 1e9)

    def take(self) -> StorageMetrics:
        """The figures since the last take."""
        with self._lock:
            m, self._metrics = self._metrics, StorageMetrics()
        return m
