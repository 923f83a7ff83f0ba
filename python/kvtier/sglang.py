"""kvtier as an SGLang HiCache storage backend: SGLang's host KV pages backed by kvtierd's
shared, tiered, persistent cache, so every SGLang (and vLLM) instance on a host reuses the
same prefixes.

Launch (SGLang's dynamic backend loading)::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
            "socket": "/run/kvtier/kvtierd.sock"}'

Interface followed: ``HiCacheStorage`` of SGLang's main branch as of late 2025
(``python/sglang/srt/mem_cache/hicache_storage.py``): constructed as
``cls(storage_config, kwargs)``; ``get``, ``batch_get``, ``set``, ``batch_set``,
``exists``, ``batch_exists`` (leading run of existing keys), and the zero-copy page
variants ``batch_get_v1`` / ``batch_set_v1`` over the registered host pool
(``register_mem_pool_host``, ``get_page_buffer_meta``). SGLang is imported lazily: without
it the module imports with a stand-in base class.

Keys are SGLang's page hashes (hex strings of SHA-256 chained over the prefix): 64 hex
digits become the 32-byte block hash, anything else is hashed to 32 bytes. Each page is one
kvtier block in a namespace of its own per model, tensor-parallel rank and page geometry,
so another deployment's pages are a miss. A page whose bytes do not verify on the NVMe
tier is a miss, never served; when kvtierd is gone or slow every call is a miss (or a
failed set) within ``timeout_ms`` and the backend reconnects by itself.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from typing import Any, List, Optional

import kvtier
from kvtier.resilient import ResilientClient

log = logging.getLogger("kvtier.sglang")

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # type: ignore

    HAVE_SGLANG = True
except Exception:  # noqa: BLE001 - any import failure means "no SGLang here"
    HAVE_SGLANG = False

    class HiCacheStorage:  # type: ignore[no-redef]
        """Stand-in with SGLang's registration hook, for running without it."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host


def key_hash(key: str) -> bytes:
    """SGLang's key as a kvtier block hash (32 bytes)."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def _cfg(storage_config, name, default=None):
    return getattr(storage_config, name, default) if storage_config is not None else default


class KvtierHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config=None, kwargs: Optional[dict] = None):
        extra = dict(_cfg(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        self._socket = extra.get("socket", os.environ.get("KVTIER_SOCKET", ""))
        self._timeout_ms = int(extra.get("timeout_ms", 5000))
        model = _cfg(storage_config, "model_name", None) or extra.get("model_name") or "sglang-model"
        tp_rank, tp_size = _cfg(storage_config, "tp_rank", 0), _cfg(storage_config, "tp_size", 1)
        mla = _cfg(storage_config, "is_mla_model", False)
        # MLA pages are the same on every TP rank; MHA pages hold this rank's heads.
        self._model = f"sglang:{model}" + ("" if mla else f":tp{tp_rank}of{tp_size}")
        self._page_bytes: Optional[int] = None
        self._configured_page_bytes = int(extra["page_bytes"]) if "page_bytes" in extra else None
        self._client: Optional[ResilientClient] = None
        self.mem_pool_host = None
        self.stats = {"hits": 0, "misses": 0, "sets": 0, "set_failures": 0}

    # ---- the session, sized by the first page seen ----
    def _open(self, page_bytes: int) -> ResilientClient:
        if self._client is not None:
            if page_bytes != self._page_bytes:
                raise kvtier.InvalidArgumentError(f"page of {page_bytes} bytes; this backend stores {self._page_bytes}")
            return self._client
        if page_bytes % 2:
            raise kvtier.InvalidArgumentError("kvtier stores pages of an even number of bytes")
        self._page_bytes = page_bytes
        geometry = ""
        if self.mem_pool_host is not None:
            h = self.mem_pool_host
            geometry = f":{getattr(h, 'layout', '')}:{getattr(h, 'dtype', '')}:{getattr(h, 'page_size', '')}"
        # A page is opaque bytes to kvtier.
        layout = kvtier.Layout.opaque(self._model + geometry, page_bytes)
        self._client = ResilientClient(
            lambda: kvtier.Client(layout, self._socket, name="sglang-hicache", hash_bytes=32,
                                  timeout_ms=self._timeout_ms, device="host-emulated"),
            name="kvtier.sglang")
        return self._client

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def _session(self) -> Optional[ResilientClient]:
        """The session, opened as soon as the page size is known: from the first page
        stored, the registered host pool, or extra_config's page_bytes."""
        if self._client is None:
            size = self._configured_page_bytes
            if size is None and self.mem_pool_host is not None:
                size = sum(n for _, n in self._host_page_buffers(list(range(int(self.mem_pool_host.page_size))))[0])
            if size is not None:
                try:
                    self._open(size)
                except kvtier.Error as e:
                    log.warning("cannot open a kvtier session: %s", e)
        return self._client

    def _host_page_buffers(self, host_indices) -> list:
        """Per page, its [(address, bytes)] in the host pool."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        page_size = int(getattr(self.mem_pool_host, "page_size", 1))
        pages = max(1, len(host_indices) // page_size)
        per = len(ptrs) // pages
        return [[(int(ptrs[i * per + j]), int(sizes[i * per + j])) for j in range(per)] for i in range(pages)]

    # ---- whole-tensor interface ----
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None):
        if self._session() is None:
            return [None] * len(keys)
        hashes = [key_hash(k) for k in keys]
        try:
            got = self._client.call(lambda c: c.acquire(hashes))
        except kvtier.Error as e:
            log.debug("batch_get: %s", e)
            self.stats["misses"] += len(keys)
            return [None] * len(keys)
        out, held = [], []
        import torch

        c = self._client.client()
        for i, r in enumerate(got):
            if not r.ok:
                out.append(None)
                self.stats["misses"] += 1
                continue
            held.append(hashes[i])
            page = memoryview(c.page(r.page, r.tier))[: self._page_bytes]
            if target_locations is not None and target_locations[i] is not None:
                dst = target_locations[i]
                dst.view(-1).view(torch.uint8).copy_(torch.frombuffer(page, dtype=torch.uint8))
                out.append(dst)
            else:
                out.append(torch.frombuffer(bytearray(page), dtype=torch.uint8))
            self.stats["hits"] += 1
        try:
            self._client.call(lambda c: c.release(hashes=held))
        except kvtier.Error:
            pass
        return out

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value if value is not None else target_location])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        import torch

        values = values if values is not None else target_locations
        flats = [v.contiguous().view(-1).view(torch.uint8) for v in values]
        try:
            client = self._open(int(flats[0].numel()))
            ok = self._client.call(lambda c: self._store(c, [key_hash(k) for k in keys],
                                                         [lambda dst, f=f: dst.copy_(f) for f in flats]))
        except kvtier.Error as e:
            log.debug("batch_set: %s", e)
            ok = [False] * len(keys)
        return all(ok)

    def _store(self, c, hashes: list, fills: list) -> list:
        """Leases a page per hash, fills each (fill(tensor of the page's bytes)), commits.
        Each hash's parent is the one before it (SGLang's keys are a chain)."""
        import torch

        pages = c.allocate(len(hashes))
        for p, fill in zip(pages, fills):
            fill(torch.frombuffer(memoryview(c.page(p))[: self._page_bytes], dtype=torch.uint8))
        parents = [b""] + hashes[:-1]
        results = c.commit(pages, hashes, parents)
        ok = [r.ok for r in results]
        self.stats["sets"] += sum(ok)
        self.stats["set_failures"] += len(ok) - sum(ok)
        return ok

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many keys from the first on exist (SGLang's keys chain a prefix)."""
        if not keys or self._session() is None:
            return 0
        try:
            return self._client.call(lambda c: c.lookup([key_hash(k) for k in keys]).matched)
        except kvtier.Error:
            return 0

    # ---- zero-copy page interface (host pool <-> kvtier pages, one copy each way) ----
    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        buffers = self._host_page_buffers(host_indices)
        try:
            self._open(sum(n for _, n in buffers[0]))
        except kvtier.Error:
            return [False] * len(keys)
        hashes = [key_hash(k) for k in keys]
        try:
            got = self._client.call(lambda c: c.acquire(hashes))
            c = self._client.client()
        except kvtier.Error:
            return [False] * len(keys)
        ok, held = [], []
        for i, r in enumerate(got):
            if not r.ok:
                ok.append(False)
                continue
            held.append(hashes[i])
            src = c.page_address(r.page, r.tier)
            off = 0
            for addr, n in buffers[i]:
                ctypes.memmove(addr, src + off, n)
                off += n
            ok.append(True)
        try:
            self._client.call(lambda c: c.release(hashes=held))
        except kvtier.Error:
            pass
        # Only a leading run is usable: a page after a miss has no prefix to attach to.
        run = ok.index(False) if False in ok else len(ok)
        return ok[:run] + [False] * (len(ok) - run)

    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        buffers = self._host_page_buffers(host_indices)
        try:
            self._open(sum(n for _, n in buffers[0]))

            def fill_from(bufs):
                def fill(dst):
                    off, base = 0, dst.data_ptr()
                    for addr, n in bufs:
                        ctypes.memmove(base + off, addr, n)
                        off += n

                return fill

            return self._client.call(lambda c: self._store(c, [key_hash(k) for k in keys],
                                                           [fill_from(b) for b in buffers]))
        except kvtier.Error as e:
            log.debug("batch_set_v1: %s", e)
            return [False] * len(keys)

    def clear(self) -> None:
        # The cache is shared by every engine of the host: dropping it is an operator's
        # decision (kvctl evict), not one engine's.
        return

    def get_stats(self):
        return dict(self.stats)
