"""kvtier as an SGLang HiCache storage backend: SGLang's host KV pages backed by kvtierd's
shared, tiered, persistent cache, so every SGLang (and vLLM) instance on a host reuses the
same prefixes.

Launch (SGLang's dynamic backend loading)::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1, "socket": "/run/kvtier/kvtierd.sock"}'

``interface_v1`` makes SGLang's cache controller call the page interface
(``batch_get_v1``/``batch_set_v1``: one copy between the host pool and kvtier's page);
without it SGLang uses the generic one (``batch_get``/``batch_set``), which adds a copy
through a staging tensor. Both store the same bytes: a page written by one is read by the
other. Other keys: ``timeout_ms`` (default 5000), ``routable_id`` ("IP:port" of the
server, for kvtierd's KV event topics; default $KVTIER_ROUTABLE_ID).

Interface followed: ``HiCacheStorage`` of the installed SGLang (0.5.23,
``sglang/srt/mem_cache/hicache_storage.py``): constructed as ``cls(storage_config,
kwargs)`` by ``StorageBackendFactory``, then ``register_mem_pool_host(kv_pool)``; the
generic calls; the page calls over the pool's ``get_page_buffer_meta``; the v2 calls
(``register_mem_host_pool_v2``, ``batch_exists_v2``/``batch_get_v2``/``batch_set_v2``)
for the side pools of hybrid models (Mamba and SWA states, the draft model's KV, indexer
pools); ``get_stats`` returning SGLang's ``StorageMetrics``. SGLang is imported lazily:
without it the module imports with stand-ins.

What a page is in kvtier:

- Keys are SGLang's page hashes (hex SHA-256 chained over the prefix): 64 hex digits become
  the 32-byte block hash, anything else is hashed to 32 bytes. A page's parent is the key
  before it, across SGLang's 128-page batches (``extra_info.prefix_keys``).
- Each page is one kvtier block whose bytes are SGLang's flat data page
  (``get_data_page(flat=True)``) of the pool's layout: the page path copies the pool's
  buffers in that order (for ``layer_first`` MHA pools the K of every layer, then the V).
- Namespaces: one per pool and rank slice, named
  ``{model}|sglang|{layout}|{dtype}|{pool}|tp{r}of{n}|pp{r}of{n}[|cp{r}of{n}][|dcp{r}of{n}]``
  (MLA KV, the same on every TP rank, has no tp part). With heterogeneous TP
  (``tp_lcm_size``, ``page_head`` layout) a rank's page is split into the head slices of
  the ``tp_lcm_size`` ranks it stands for, each stored in that rank's namespace, so a
  deployment at the other TP size reads them. Another geometry's pages are a miss.
- KV events: the KV pool's blocks are announced with SGLang's own ids (the first 16 hex
  digits as a signed integer) and its page's token count, by the first rank of each
  parallel group only; side pools are not announced. SGLang's storage calls carry no
  token ids, so these events have none.

A page whose bytes do not verify on the NVMe tier is a miss, never served; when kvtierd
is gone or slow every call is a miss (or a failed set) within ``timeout_ms`` and the
backend reconnects by itself. A call with a value or target of the wrong size fails
(False or None) and holds nothing afterwards.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import kvtier
from kvtier.kv import namespace_part
from kvtier.resilient import ResilientClient

log = logging.getLogger("kvtier.sglang")

try:
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        PoolTransferResult,
    )

    HAVE_SGLANG = True
except Exception:  # noqa: BLE001 - any import failure means "no SGLang here"
    HAVE_SGLANG = False

    class HiCacheStorage:  # type: ignore[no-redef]
        """Stand-in with SGLang's registration hooks, for running without it."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name):
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        kv_hit_pages: int
        extra_pool_hit_pages: dict
        restorable_prefix_pages: Optional[List[int]] = None

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics  # type: ignore
except Exception:  # noqa: BLE001

    @dataclass
    class StorageMetrics:  # type: ignore[no-redef]
        """SGLang's StorageMetrics, for running without it."""

        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)


KV_POOL = "kv"
# Most per-call figures kept for get_stats between two scheduler reads.
_MAX_METRIC_SAMPLES = 4096


def key_hash(key: str) -> bytes:
    """SGLang's key as a kvtier block hash (32 bytes)."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def _cfg(storage_config, name, default=None):
    v = getattr(storage_config, name, default) if storage_config is not None else default
    return default if v is None else v


# A page's bytes in a process: (address, length) segments, in the page's byte order.
Segments = List[Tuple[int, int]]


class _Store:
    """One kvtier namespace (a pool's pages, or one head slice of them) and its session."""

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
        """How many hashes from the first are stored (0 when kvtierd is unreachable)."""
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
                    if not r.ok:
                        continue
                    src = c.page_address(r.page, r.tier)
                    off = 0
                    for addr, n in dsts[i]:
                        ctypes.memmove(addr, src + off, n)
                        off += n
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
                    dst = c.page_address(p)
                    off = 0
                    for addr, n in segs:
                        ctypes.memmove(dst + off, addr, n)
                        off += n
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


class KvtierHiCacheStorage(HiCacheStorage):
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
        self._kv: List[_Store] = []
        self._sidecars: Dict[str, _Store] = {}
        self._lock = threading.Lock()
        self._metrics = StorageMetrics()

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

    def _store(self, model_id: str, page_bytes: int, page_tokens: int, announce: bool) -> _Store:
        return _Store(model_id, page_bytes, page_tokens, self._socket, self._timeout_ms, self._routable_id, announce)

    def register_mem_pool_host(self, mem_pool_host):
        """The KV pool: its page size fixes the KV namespaces (one, or one per head slice)."""
        self.mem_pool_host = mem_pool_host
        page_tokens = int(getattr(mem_pool_host, "page_size", 1) or 1)
        page_bytes = _flat_page_bytes(mem_pool_host)
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

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        name = str(getattr(host_pool_name, "value", host_pool_name))
        self.registered_pools[name] = host_pool
        if name == KV_POOL:
            return
        page_tokens = int(getattr(host_pool, "page_size", 1) or 1)
        # Side pools (Mamba/SWA states, the draft model's KV) are sharded by TP rank even
        # for MLA models.
        self._sidecars[name] = self._store(self._model_id(name, host_pool, self._tp), _flat_page_bytes(host_pool),
                                           page_tokens, False)

    # ---- the KV pool: segments of each page ----
    def _page_bytes(self) -> int:
        return sum(s.page_bytes for s in self._kv)

    def _pool_segments(self, host_indices) -> List[List[Segments]]:
        """Per page of `host_indices`, per KV store, its segments in the host pool."""
        import torch

        pool = self.mem_pool_host
        page = int(getattr(pool, "page_size", 1) or 1)
        if not isinstance(host_indices, torch.Tensor):
            host_indices = torch.as_tensor(host_indices, dtype=torch.int64)
        if self._split > 1:
            ptrs, sizes = pool.get_split_heads_page_buffer_meta(host_indices, self._split)
        else:
            ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        pages = len(host_indices) // page
        per = len(ptrs) // max(pages, 1)
        out = []
        for p in range(pages):
            entries = [(int(ptrs[p * per + j]), int(sizes[p * per + j])) for j in range(per)]
            if self._split > 1:
                # [k, v] of each head slice in turn: one slice per store.
                out.append([entries[2 * i:2 * i + 2] for i in range(self._split)])
                continue
            if not self._mla and getattr(pool, "layout", "") == "layer_first" and hasattr(pool, "head_num"):
                # (k, v) per layer; the flat page is every layer's K, then every layer's V.
                entries = entries[0::2] + entries[1::2]
            out.append([entries])
        return out

    def _tensor_segments(self, t) -> Optional[List[Segments]]:
        """A whole flat page held by a CPU tensor, per KV store; None if it is not one."""
        if t is None or getattr(t, "device", None) is None or t.device.type != "cpu" or not t.is_contiguous():
            return None
        n = t.numel() * t.element_size()
        if n != self._page_bytes():
            return None
        base = t.data_ptr()
        if self._split == 1:
            return [[(base, n)]]
        # page_head's flat page is (k, v) x heads: slice i is its heads' K and V.
        half, share = n // 2, n // 2 // self._split
        return [[(base + i * share, share), (base + half + i * share, share)] for i in range(self._split)]

    def _parents(self, hashes: List[bytes], extra_info) -> List[bytes]:
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

    def _record(self, kind: str, pages: int, nbytes: int, start: float) -> None:
        if pages == 0:
            return
        seconds = max(time.perf_counter() - start, 1e-9)
        with self._lock:
            counts = getattr(self._metrics, f"{kind}_pgs")
            if len(counts) < _MAX_METRIC_SAMPLES:
                counts.append(pages)
                getattr(self._metrics, f"{kind}_bandwidth").append(nbytes / seconds / 1e9)

    @staticmethod
    def _leading(ok: List[bool]) -> List[bool]:
        # Only a leading run is usable: a page after a miss has no prefix to attach to.
        run = ok.index(False) if False in ok else len(ok)
        return ok[:run] + [False] * (len(ok) - run)

    # ---- generic interface (a staging tensor per page) ----
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None):
        """Each stored page into its target (SGLang passes ``get_dummy_flat_data_page()``
        tensors) or, without one, a new uint8 tensor; None for a page not stored or a
        target of the wrong size."""
        import torch

        if not self._kv or not keys:
            return [None] * len(keys)
        start = time.perf_counter()
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        targets = [t if t is not None else torch.empty(self._page_bytes(), dtype=torch.uint8) for t in targets]
        segs = [self._tensor_segments(t) for t in targets]
        for k, s in zip(keys, segs):
            if s is None:
                log.warning("batch_get: the target for %s is not a contiguous CPU page of %d bytes", k,
                            self._page_bytes())
        ok = self._get_pages(keys, segs)
        self._record("prefetch", sum(ok), sum(ok) * self._page_bytes(), start)
        return [t if good else None for t, good in zip(targets, ok)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value if value is not None else target_location])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores each page (SGLang passes ``get_data_page(flat=True)`` views). False, with
        nothing stored, when a value is not a page of this pool's size."""
        values = values if values is not None else target_locations
        if not self._kv or not keys or values is None or len(values) != len(keys):
            return False
        start = time.perf_counter()
        flats = [v.contiguous() if hasattr(v, "contiguous") else None for v in values]
        segs = [self._tensor_segments(v) for v in flats]
        if any(s is None for s in segs):
            log.warning("batch_set: a value is not a CPU page of %d bytes; nothing stored", self._page_bytes())
            return False
        ok = self._put_pages(keys, segs, None)
        self._record("backup", sum(ok), sum(ok) * self._page_bytes(), start)
        return all(ok)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many keys from the first are stored (SGLang's keys chain a prefix)."""
        if not self._kv or not keys:
            return 0
        hashes = [key_hash(k) for k in keys]
        return min(s.lookup(hashes) for s in self._kv)

    # ---- page interface (host pool <-> kvtier page, one copy each way) ----
    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        if not self._kv or not keys:
            return [False] * len(keys)
        start = time.perf_counter()
        segs = self._pool_segments(host_indices)
        if len(segs) != len(keys):
            log.warning("batch_get_v1: %d keys for %d pages", len(keys), len(segs))
            return [False] * len(keys)
        ok = self._leading(self._get_pages(keys, segs))
        self._record("prefetch", sum(ok), sum(ok) * self._page_bytes(), start)
        return ok

    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        if not self._kv or not keys:
            return [False] * len(keys)
        start = time.perf_counter()
        segs = self._pool_segments(host_indices)
        if len(segs) != len(keys):
            log.warning("batch_set_v1: %d keys for %d pages", len(keys), len(segs))
            return [False] * len(keys)
        ok = self._put_pages(keys, segs, extra_info)
        self._record("backup", sum(ok), sum(ok) * self._page_bytes(), start)
        return ok

    # ---- v2: side pools of hybrid models, each in its own namespace ----
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
            name = str(getattr(t.name, "value", t.name))
            store = self._sidecars.get(name)
            policy = str(getattr(t.hit_policy, "value", t.hit_policy))
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

    def _sidecar_io(self, transfers, extra_info, write: bool) -> Dict[str, List[bool]]:
        results: Dict[str, List[bool]] = {}
        for t in transfers:
            name = str(getattr(t.name, "value", t.name))
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
        return self._sidecar_io(transfers, extra_info, write=False)

    def batch_set_v2(self, transfers, extra_info: Any = None) -> Dict[str, List[bool]]:
        return self._sidecar_io(transfers, extra_info, write=True)

    def clear(self) -> None:
        # The cache is shared by every engine of the host: dropping it is an operator's
        # decision (kvctl evict), not one engine's.
        return

    def get_stats(self):
        """SGLang's StorageMetrics since the last call: pages and GB/s per get and set."""
        with self._lock:
            m, self._metrics = self._metrics, StorageMetrics()
        return m

    def close(self) -> None:
        for s in self._kv + list(self._sidecars.values()):
            try:
                s.client.call(lambda c: c.close())
            except kvtier.Error:
                pass


def _flat_page_bytes(pool) -> int:
    """Bytes of one flat data page of an SGLang host pool."""
    page = pool.get_data_page(0, flat=True)
    return int(page.numel() * page.element_size())
