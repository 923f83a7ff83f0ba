"""KvtierHiCacheStorage, the class SGLang's ``StorageBackendFactory`` loads: its config,
the namespaces of the KV pool (one, or one per head slice under heterogeneous TP) and the
side pools, and the page moves every interface generation shares. The calls themselves are
in generic.py, page.py and side_pools.py; the package's docstring says what a page is."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import kvtier
from kvtier.kv import namespace_part
from kvtier.sglang._base import HiCacheStorage
from kvtier.sglang.generic import GenericCalls
from kvtier.sglang.page import PageCalls
from kvtier.sglang.pools import flat_page_bytes
from kvtier.sglang.side_pools import KV_POOL, SidePoolCalls
from kvtier.sglang.stats import TransferStats
from kvtier.sglang.store import PageStore, Segments, key_hash


def _cfg(storage_config, name, default=None):
    v = getattr(storage_config, name, default) if storage_config is not None else default
    return default if v is None else v


class KvtierHiCacheStorage(GenericCalls, PageCalls, SidePoolCalls, HiCacheStorage):
    def __init__(self, storage_config=None, kwargs: Optional[dict] = None):
        extra = dict(_cfg(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        self._socket = str(extra.get("socket", os.environ.get("KVTIER_SOCKET", "")))
        self._timeout_ms = int(extra.get("timeout_ms", 5000))
        self._routable_id = str(extra.get("routable_id", os.environ.get("KVTIER_ROUTABLE_ID", "")))
        self._model = str(_cfg(storage_config, "model_name", "") or extra.get("model_name") or "sglang-model")
        self._mla = bool(_cfg(storage_config, "is_mla_model", False))
        self._tp = (int(_cfg(storage_config, "tp_rank", 0)), int(_cfg(storage_config, "tp_size", 1)))
        self._pp = (int(_cfg(storage_config, "pp_rank", 0)), int(_cfg(storage_config, "pp_size", 1)))
        self._cp = (int(_cfg(storage_config, "attn_cp_rank", 0)), int(_cfg(storage_config, "attn_cp_size", 1)))
        self._dcp = (int(_cfg(storage_config, "dcp_rank", 0)), int(_cfg(storage_config, "dcp_size", 1)))
        split = bool(_cfg(storage_config, "should_split_heads", False))
        lcm = int(_cfg(storage_config, "tp_lcm_size", 0) or 0)
        # Heterogeneous TP: this rank's heads are those of `split` ranks of a TP size of lcm.
        self._split = lcm // self._tp[1] if split and lcm > self._tp[1] else 1
        # Announce from the first rank of each parallel group: every rank stores the same
        # pages (its slice of them), and a router needs each page once.
        self._announce = self._tp[0] == 0 and self._pp[0] == 0 and self._cp[0] == 0
        self.mem_pool_host = None
        self.registered_pools: Dict[str, Any] = {}
        self._kv: List[PageStore] = []
        self._sidecars: Dict[str, PageStore] = {}
        self._stats = TransferStats()

    # ---- namespaces ----
    def _model_id(self, pool_name: str, pool, tp: Optional[Tuple[int, int]]) -> str:
        parts = [namespace_part(self._model), "sglang", str(getattr(pool, "layout", "")),
                 str(getattr(pool, "dtype", "")).replace("torch.", ""), pool_name]
        if tp is not None:
            parts.append(f"tp{tp[0]}of{tp[1]}")
        parts.append(f"pp{self._pp[0]}of{self._pp[1]}")
        if self._cp[1] > 1:
            parts.append(f"cp{self._cp[0]}of{self._cp[1]}")
        if self._dcp[1] > 1:
            parts.append(f"dcp{self._dcp[0]}of{self._dcp[1]}")
        return "|".join(parts)

    def _store(self, model_id: str, page_bytes: int, page_tokens: int, announce: bool) -> PageStore:
        return PageStore(model_id, page_bytes, page_tokens, self._socket, self._timeout_ms, self._routable_id,
                         announce)

    def register_mem_pool_host(self, mem_pool_host):
        """The KV pool: its page size fixes the KV namespaces (one, or one per head slice)."""
        self.mem_pool_host = mem_pool_host
        page_tokens = int(getattr(mem_pool_host, "page_size", 1) or 1)
        page_bytes = flat_page_bytes(mem_pool_host)
        if page_bytes % self._split:
            raise kvtier.InvalidArgumentError(f"a page of {page_bytes} bytes does not split into {self._split}")
        if self._mla:
            ranks = [None]
        else:
            base, size = self._tp[0] * self._split, self._tp[1] * self._split
            ranks = [(base + i, size) for i in range(self._split)]
        self._kv = [self._store(self._model_id(KV_POOL, mem_pool_host, tp), page_bytes // self._split, page_tokens,
                                self._announce and i == 0)
                    for i, tp in enumerate(ranks)]

    # ---- the KV pool's pages, for every interface generation ----
    def _page_bytes(self) -> int:
        return sum(s.page_bytes for s in self._kv)

    def _parents(self, hashes: List[bytes], extra_info) -> List[bytes]:
        # A page's parent is the key before it, across SGLang's batches.
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        first = key_hash(prefix[-1]) if prefix else b""
        return [first] + hashes[:-1]

    def _get_pages(self, keys: List[str], per_page: List[Optional[List[Segments]]]) -> List[bool]:
        hashes = [key_hash(k) for k in keys]
        ok = [d is not None for d in per_page]
        for i, store in enumerate(self._kv):
            got = store.get(hashes, [d[i] if d is not None else None for d in per_page])
            ok = [a and b for a, b in zip(ok, got)]
        return ok

    def _put_pages(self, keys: List[str], per_page: List[List[Segments]], extra_info) -> List[bool]:
        hashes = [key_hash(k) for k in keys]
        parents = self._parents(hashes, extra_info)
        ok = [True] * len(keys)
        for i, store in enumerate(self._kv):
            got = store.put(hashes, parents, [d[i] for d in per_page])
            ok = [a and b for a, b in zip(ok, got)]
        return ok

    def clear(self) -> None:
        # The cache is shared by every engine of the host: dropping it is an operator's
        # decision (kvctl evict), not one engine's.
        return

    def get_stats(self):
        """SGLang's StorageMetrics since the last call: pages and GB/s per get and set."""
        return self._stats.take()

    def close(self) -> None:
        for s in self._kv + list(self._sidecars.values()):
            s.close()
