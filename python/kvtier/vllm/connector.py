"""``KvtierConnector``: the class vLLM loads, one per role, delegating to the scheduler
side (kvtier.vllm.scheduler) or the worker side (kvtier.vllm.worker)."""

from __future__ import annotations

import contextlib
import time
from typing import Optional

from kvtier.vllm._base import KVConnectorBase_V1, KVConnectorRole, KVConnectorTransferResults, SupportsHMA
from kvtier.vllm.metadata import KvtierConnectorMetadata, KvtierConnectorStats
from kvtier.vllm.scheduler import Scheduler
from kvtier.vllm.settings import Settings
from kvtier.vllm.worker import Worker


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._settings = Settings.read(vllm_config, self._kv_transfer_config, kv_cache_config)
        self._stats = KvtierConnectorStats()
        self._scheduler: Optional[Scheduler] = None
        self._worker: Optional[Worker] = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = Scheduler(self._settings, self._stats)
        else:
            self._worker = Worker(self._settings, vllm_config, kv_cache_config, self._stats)

    @property
    def stats(self) -> dict:
        return self._stats.data

    @property
    def clients(self) -> list:
        """This side's clients, one per KV cache group (empty until the layouts are known)."""
        side = self._scheduler if self._scheduler is not None else self._worker
        return list(side.clients)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        """Layer-wise loads wait between attention layers, which a full CUDA graph would
        replay without: vLLM then captures piecewise graphs."""
        return Settings.layerwise(extra_config)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped store is a later miss

    # ==== worker side ====
    @contextlib.contextmanager
    def _hook(self):
        """A worker hook on the step's path: its time is the connector's blocking time."""
        self._worker.begin_step()
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._stats.data["blocking_s"] += time.monotonic() - t0

    def register_kv_caches(self, kv_caches: dict):
        self._worker.register_kv_caches(kv_caches)

    def get_handshake_metadata(self):
        return self._worker.handshake if self._worker is not None else None

    def handle_preemptions(self, kv_connector_metadata):
        """vLLM calls this before the step touches its blocks: copies still reading blocks
        the step writes are waited for here."""
        with self._hook():
            self._worker.fence(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs):
        with self._hook():
            self._worker.start_load_kv(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str):
        """With layerwise_loads: before the layer computes, its layer of the step's loads
        has moved (or, on CUDA, the engine's stream waits for it)."""
        if not self._worker.layer_loads_active:
            return  # every step calls it for every attention layer: nothing to time
        with self._hook():
            self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs):
        return  # all layers are stored together after the step (one gather a chunk)

    def wait_for_save(self):
        with self._hook():
            self._worker.wait_for_save(self._get_connector_metadata())

    def get_finished(self, finished_req_ids):
        if self._worker is None:
            return None, None
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids):
        """Held requests whose stores are done; asynchronous loads that ran, and those
        that failed (vLLM recomputes a hybrid model's request whole: its block ids do not
        name one group). Ends the step's timing."""
        if self._worker is None:
            return KVConnectorTransferResults()
        with self._hook():
            sent, done, failed = self._worker.get_finished(finished_req_ids)
        self._worker.end_step()
        return KVConnectorTransferResults(finished_sending=set(sent), finished_recving=set(done),
                                          failed_recving=set(failed))

    def build_connector_worker_meta(self):
        return self._worker.take_worker_metadata() if self._worker is not None else None

    def get_block_ids_with_load_errors(self) -> set:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def get_kv_connector_stats(self):
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, KvtierConnectorStats()
        for side in (self._scheduler, self._worker):
            if side is not None:
                side.stats = self._stats
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None):
        return KvtierConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        """The connector's counters on vLLM's /metrics (vllm:kvtier_<counter>_total per
        engine). vLLM's MultiConnector needs every member with stats to have them."""
        from kvtier.vllm.prom import KvtierPromMetrics

        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        for side in (self._scheduler, self._worker):
            if side is not None:
                side.close()

    # ==== scheduler side ====
    def set_xfer_handshake_metadata(self, metadata) -> None:
        self._scheduler.set_handshake(metadata)

    def set_xfer_handshake_metadata_pp_aware(self, metadata) -> None:
        self._scheduler.set_handshake(metadata)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int, *args):
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KvtierConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def has_pending_block_frees(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_block_frees()

    def update_connector_output(self, connector_output):
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self._scheduler.request_finished(request), None

    def request_finished_all_groups(self, request, block_ids):
        return self._scheduler.request_finished(request), None
