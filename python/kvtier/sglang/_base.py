"""SGLang's storage-backend interface, which kvtier.sglang's backend subclasses: imported
from the installed SGLang (the tests that run without one install a stand-in first:
tests/python/kvtier_testing/sglang_standin.py)."""

from __future__ import annotations

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult  # type: ignore
    from sglang.srt.observability.metrics_collector import StorageMetrics  # type: ignore
except Exception as e:  # noqa: BLE001 - SGLang's imports can fail in other ways than ImportError
    raise ImportError(f"kvtier.sglang is SGLang's HiCache storage backend and needs SGLang installed ({e})") from e

__all__ = ["HiCacheStorage", "PoolTransferResult", "StorageMetrics"]
