"""The worker side: loads the blocks the scheduler planned into the engine's paged KV
before the forward pass, and stores the blocks (and Mamba states) that the step made
after it, group by group, each group through its own namespace."""

from __future__ import annotations

import logging
from typing import Optional

import kvtier
from kvtier.kv import kv_args
from kvtier.vllm.layout import STATE, KvtierHandshake, group_layout
from kvtier.vllm.metadata import KvtierConnectorMetadata, KvtierConnectorStats, LoadSpec, StoreSpec
from kvtier.vllm.settings import Settings

log = logging.getLogger("kvtier.vllm")


class Worker:
    def __init__(self, settings: Settings, vllm_config, kv_cache_config, stats: KvtierConnectorStats):
        self._s = settings
        self._vllm_config = vllm_config
        self._kv_cache_config = kv_cache_config
        self.stats = stats
        self.handshake: Optional[KvtierHandshake] = None
        self.clients: list = []
        self._views: list = []
        self._load_errors: set = set()
        self._poisoned: set = set()  # requests whose load failed: never stored
        self._recv_done: set = set()    # requests whose asynchronous load ran (ok or not)
        self._recv_failed: set = set()  # ... and failed

    def register_kv_caches(self, kv_caches: dict) -> None:
        cfg = self._kv_cache_config
        cache_dtype = getattr(self._vllm_config.cache_config, "cache_dtype", None)
        layouts, tensors_by_group, device = [], [], None
        for plan, group in zip(self._s.plans, cfg.kv_cache_groups):
            seen, tensors = set(), []
            for name in group.layer_names:
                t = kv_caches.get(name)
                # Layers sharing another layer's cache (cross-layer KV sharing) own no storage.
                if t is None or (t.data_ptr(), tuple(t.stride())) in seen:
                    continue
                seen.add((t.data_ptr(), tuple(t.stride())))
                tensors.append(t)
            if not tensors:
                raise kvtier.InvalidArgumentError(f"KV cache group {plan.index} ({plan.kind}) has no KV tensors")
            layout, tensors = group_layout(plan, group.kv_cache_spec, tensors, int(cfg.num_blocks),
                                           model_id=self._s.model_id, ranks=self._s.ranks, cache_dtype=cache_dtype,
                                           groups=len(self._s.plans))
            layouts.append(layout)
            tensors_by_group.append(tensors)
            if device is None:
                device = self._s.device or ("cuda" if getattr(tensors[0], "is_cuda", False) else "host-emulated")
        self.clients = self._s.connect(layouts, device, "worker")
        # Checked once here (a layout kvtier cannot copy fails the engine's start, by name);
        # every load and store then copies through these views.
        self._views = [kv_args(l.kvtier_layout(), device, t, l.kv_layout) for l, t in zip(layouts, tensors_by_group)]
        self.handshake = KvtierHandshake(tuple(layouts))
        for l in layouts:
            log.info("kvtier.vllm worker: group %d (%s), %d layers, %s, namespace model %s", l.group, l.kind,
                     l.layers, l.kv_layout, l.model)

    def start_load_kv(self, meta: KvtierConnectorMetadata) -> None:
        for load in meta.loads:
            n = self._load(load)
            self.stats.data["loaded_blocks"] += n
            if load.is_async:
                self._recv_done.add(load.req_id)
            if n < len(load.block_ids):
                self.stats.data["load_failed_blocks"] += len(load.block_ids) - n
                self._poisoned.add(load.req_id)
                if load.is_async:  # a hybrid model's failure is the request's (vLLM recomputes it whole)
                    self._recv_failed.add(load.req_id)
                else:
                    self._load_errors.update(load.block_ids[n:])

    def _load(self, load: LoadSpec) -> int:
        client, view, chunk = self.clients[load.group], self._views[load.group], self._s.chunk
        n = 0
        for i in range(0, len(load.hashes), chunk):
            hashes, ids = load.hashes[i:i + chunk], load.block_ids[i:i + chunk]
            try:
                got = client.call(lambda c: c.load_kv(view, hashes, ids))
            except kvtier.Error as e:
                log.warning("load of %d blocks of group %d for %s failed: %s", len(hashes), load.group, load.req_id, e)
                got = 0
            n += got
            if got < len(hashes):
                break
        return n

    def wait_for_save(self, meta: KvtierConnectorMetadata) -> None:
        failed_step = bool(self._load_errors)
        for store in meta.stores:
            if failed_step or store.req_id in self._poisoned:
                # Tokens of this step may attend over blocks that were never loaded.
                self.stats.data["stores_skipped_after_failed_load"] += len(store.hashes)
                continue
            if not self.handshake.groups[store.group].stores:
                continue  # another rank stores this replicated group
            for i in range(0, len(store.hashes), self._s.chunk):
                self._store(store, slice(i, i + self._s.chunk))

    def _store(self, store: StoreSpec, part: slice) -> None:
        hashes = store.hashes[part]
        per_block = len(store.token_ids) // max(1, len(store.hashes))
        tokens = store.token_ids[part.start * per_block:part.stop * per_block]
        if per_block != self.handshake.groups[store.group].tokens_per_block:
            tokens = []  # an opaque run of other geometry: its events carry no tokens
        view = self._views[store.group]
        try:
            results = self.clients[store.group].call(
                lambda c: c.store_kv(view, store.block_ids[part], hashes, store.parents[part], token_ids=tokens))
        except kvtier.Error as e:
            self.stats.data["store_refused_blocks"] += len(hashes)
            log.warning("kvtierd refused a store of %d blocks of group %d for %s: %s", len(hashes), store.group,
                        store.req_id, e)
            return
        ok = sum(1 for r in results if r.ok)
        self.stats.data["stored_blocks"] += ok
        if self._s.plans[store.group].role == STATE:
            self.stats.data["states_stored"] += ok
        if ok < len(results):
            self.stats.data["store_refused_blocks"] += len(results) - ok
            log.warning("kvtierd stored %d of %d blocks of group %d for %s (%s)", ok, len(results), store.group,
                        store.req_id, next(r.status for r in results if not r.ok))

    def get_finished(self, finished_req_ids) -> tuple:
        """(requests finished sending: none, requests whose asynchronous load ran, those
        of them whose load failed)."""
        self._poisoned.difference_update(finished_req_ids)
        done, failed = self._recv_done, self._recv_failed
        self._recv_done, self._recv_failed = set(), set()
        return done, failed

    def take_load_errors(self) -> set:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def close(self) -> None:
        for c in self.clients:
            c.close()
