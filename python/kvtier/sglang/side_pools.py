"""SGLang's v2 calls (``register_mem_host_pool_v2``, ``batch_exists_v2``/``batch_get_v2``/
``batch_set_v2``): the side pools of hybrid models (Mamba and SWA states, the draft
model's KV, indexer pools), each in a namespace of its own with its own page size, through
the pool's ``get_data_page``/``set_from_flat_data_page``. A mix-in of KvtierHiCacheStorage
(backend.py)."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

from kvtier.sglang._base import PoolTransferResult
from kvtier.sglang.pools import flat_page_bytes
from kvtier.sglang.store import key_hash

log = logging.getLogger("kvtier.sglang")

KV_POOL = "kv"


def _name(x) -> str:
    return str(getattr(x, "value", x))


class SidePoolCalls:
    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        name = _name(host_pool_name)
        self.registered_pools[name] = host_pool
        if name == KV_POOL:
            return
        page_tokens = int(getattr(host_pool, "page_size", 1) or 1)
        # Side pools are sharded by TP rank even for MLA models.
        self._sidecars[name] = self._store(self._model_id(name, host_pool, self._tp), flat_page_bytes(host_pool),
                                           page_tokens, False)

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[Sequence[Any]] = None,
                        extra_info: Any = None) -> "PoolTransferResult":
        """The KV prefix, cut to what every ALL_PAGES pool holds and to the prefix lengths
        whose trailing pages every TRAILING_PAGES pool holds (BLOCK_GROUPS pools get no
        verdict: they never gate the KV hit)."""
        kv_pages = self.batch_exists(keys, extra_info)
        hits: Dict[str, int] = {KV_POOL: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        hashes = [key_hash(k) for k in keys[:kv_pages]]
        for t in pool_transfers or []:
            if not restorable:
                break
            name = _name(t.name)
            store = self._sidecars.get(name)
            policy = _name(t.hit_policy)
            if policy == "block_groups":
                continue
            if store is None:
                log.warning("batch_exists_v2: pool %s was never registered", name)
                restorable = set()
                break
            if policy == "trailing_pages":
                trailing = max(1, len(t.keys) if t.keys else 1)
                have = store.present(hashes)
                mine = {n for n in range(1, kv_pages + 1) if all(have[max(0, n - trailing):n])}
            else:
                mine = set(range(1, store.lookup(hashes) + 1))
            if mine:
                hits[name] = max(mine)
            restorable &= mine
        order = sorted(restorable)
        return PoolTransferResult(order[-1] if order else 0, hits, order)

    def _side_io(self, transfers, extra_info, write: bool) -> Dict[str, List[bool]]:
        results: Dict[str, List[bool]] = {}
        for t in transfers:
            name = _name(t.name)
            keys = list(t.keys or [])
            pool, store = self.registered_pools.get(name), self._sidecars.get(name)
            page = int(getattr(pool, "page_size", 1) or 1) if pool is not None else 1
            idx = t.host_indices
            if store is None or idx is None or idx.numel() != len(keys) * page:
                log.warning("batch_%s_v2: pool %s: %s", "set" if write else "get", name,
                            "not registered" if store is None else "indices do not match its keys")
                results[name] = [False] * len(keys)
                continue
            starts = [int(idx[i * page].item()) for i in range(len(keys))]
            hashes = [key_hash(k) for k in keys]
            if write:
                flats = [pool.get_data_page(s, flat=True).contiguous() for s in starts]
                segs = [[(f.data_ptr(), f.numel() * f.element_size())] for f in flats]
                if any(seg[0][1] != store.page_bytes for seg in segs):
                    results[name] = [False] * len(keys)
                    continue
                results[name] = store.put(hashes, self._parents(hashes, extra_info), segs)
            else:
                bufs = [pool.get_dummy_flat_data_page() for _ in starts]
                segs = [[(b.data_ptr(), b.numel() * b.element_size())] for b in bufs]
                ok = store.get(hashes, segs)
                for s, b, good in zip(starts, bufs, ok):
                    if good:
                        pool.set_from_flat_data_page(s, b)
                results[name] = ok
        return results

    def batch_get_v2(self, transfers, extra_info: Any = None) -> Dict[str, List[bool]]:
        return self._side_io(transfers, extra_info, write=False)

    def batch_set_v2(self, transfers, extra_info: Any = None) -> Dict[str, List[bool]]:
        return self._side_io(transfers, extra_info, write=True)
