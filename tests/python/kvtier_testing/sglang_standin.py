"""A stand-in for the part of SGLang's storage-backend interface kvtier.sglang subclasses,
for the Python tests that run where SGLang is not installed (Debian's Python in `make
test`): `install()` registers it as the modules SGLang defines them in, unless SGLang
itself imports. tests/engines/test_sglang_hicache.py runs the installed SGLang instead."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import List, Optional

STORAGE = "sglang.srt.mem_cache.hicache_storage"
METRICS = "sglang.srt.observability.metrics_collector"


class HiCacheStorage:
    """SGLang's registration hooks; the calls are the backend's."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict
    restorable_prefix_pages: Optional[List[int]] = None


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


def install() -> bool:
    """Registers the stand-in as SGLang's modules unless SGLang imports; True when it did."""
    try:
        __import__(STORAGE)
        return False
    except Exception:  # noqa: BLE001 - as kvtier.sglang._base: any failure means no SGLang
        pass
    for mod in (STORAGE, METRICS):
        parts = mod.split(".")
        for i in range(1, len(parts)):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    storage = types.ModuleType(STORAGE)
    storage.HiCacheStorage = HiCacheStorage
    storage.PoolTransferResult = PoolTransferResult
    metrics = types.ModuleType(METRICS)
    metrics.StorageMetrics = StorageMetrics
    sys.modules[STORAGE] = storage
    sys.modules[METRICS] = metrics
    return True
