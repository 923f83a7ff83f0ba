"""vLLM's call sequence around a KV connector, played without vLLM.

A unit-test harness for Debian's Python (which has no vLLM) and the reference engine; the
proof against real vLLM is tests/engines (vLLM's own Scheduler). Stand-ins
for the objects vLLM passes (VllmConfig's parts, Request, KVCacheBlocks, SchedulerOutput
with its new and cached request data) with the fields kvtier.vllm reads, and a loop that
calls the scheduler-side and worker-side connectors in vLLM v1's order:

  scheduler: get_num_new_matched_tokens -> (allocate blocks) -> update_state_after_alloc
             -> build_connector_meta
  worker:    handle_preemptions -> bind_connector_metadata -> start_load_kv -> per layer:
             wait_for_layer_load, (attention), save_kv_layer -> wait_for_save
             -> get_block_ids_with_load_errors -> get_finished -> clear_connector_metadata
  scheduler: request_finished when the request ends; a request it holds (stores still
             copying) keeps its blocks until the worker's get_finished names it (the
             engine keeps stepping, empty steps if need be).

Decode steps are scheduled as cached requests, with a new block id when a block fills.
The reference engine (kvtier_testing.torch_engine) and the tests drive real torch KV
tensors through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Optional

from kvtier.hashing import chain_hashes
from kvtier_testing import vllm_standin

vllm_standin.install()  # where vLLM is not installed: before kvtier.vllm imports its interface

from kvtier.vllm import KvtierConnector, KVConnectorRole  # noqa: E402


class KVTransferConfig:
    def __init__(self, extra: Optional[dict] = None):
        self.kv_connector = "KvtierConnector"
        self.kv_connector_module_path = "kvtier.vllm"
        self.kv_role = "kv_both"
        self.kv_connector_extra_config = dict(extra or {})

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


class ModelConfig:
    def __init__(self, model: str, layers: int, kv_heads: int, head_dim: int, dtype: str):
        self.model, self._layers, self._kv_heads, self._head_dim, self.dtype = model, layers, kv_heads, head_dim, dtype

    def get_num_layers(self, parallel_config):
        return self._layers

    def get_num_kv_heads(self, parallel_config):
        return self._kv_heads

    def get_head_size(self):
        return self._head_dim


def vllm_config(model: str, layers: int, kv_heads: int, head_dim: int, dtype: str, block_size: int,
                extra: Optional[dict] = None):
    """A stand-in VllmConfig with the fields a KV connector reads."""
    return SimpleNamespace(model_config=ModelConfig(model, layers, kv_heads, head_dim, dtype),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, rank=0),
                           cache_config=SimpleNamespace(block_size=block_size, cache_dtype="auto",
                                                        prefix_caching_hash_algo="sha256", enable_prefix_caching=True),
                           scheduler_config=SimpleNamespace(async_scheduling=False),
                           kv_transfer_config=KVTransferConfig(extra))


def kv_cache_config(config, layer_names: list, num_blocks: int):
    """A stand-in KVCacheConfig: one group of full-attention layers."""
    mc = config.model_config
    spec = SimpleNamespace(block_size=config.cache_config.block_size, num_kv_heads=mc.get_num_kv_heads(None),
                           head_size=mc.get_head_size())
    return SimpleNamespace(num_blocks=num_blocks,
                           kv_cache_groups=[SimpleNamespace(layer_names=list(layer_names), kv_cache_spec=spec)])


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list
    block_size: int
    output_token_ids: list = field(default_factory=list)

    @property
    def all_token_ids(self) -> list:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def block_hashes(self) -> list:
        # vLLM keeps the hashes of every full block of the request, prompt and output.
        return chain_hashes(self.all_token_ids, self.block_size)


class KVCacheBlocks:
    def __init__(self, block_ids: list):
        self._ids = list(block_ids)

    def get_block_ids(self):
        return (list(self._ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    block_ids: tuple
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict


@dataclass
class StepResult:
    external_tokens: int     # tokens the connector said it would load
    loaded_tokens: int       # tokens loaded for sure (the rest were load errors)
    computed_from: int       # the first token the engine had to compute


class Engine:
    """One engine's connectors and block allocator, driven in vLLM's order.

    `layers`: the per-layer KV tensors ([2, num_blocks, block_size, kv_heads, head_dim]).
    `compute(request, start, block_ids)`: the model's forward over tokens [start, end) of
    the request's tokens, writing their KV into the paged tensors; `layer_names` are the
    names passed to save_kv_layer / wait_for_layer_load.
    """

    def __init__(self, config, layers: list, *, layer_names: Optional[list] = None):
        self.config = config
        self.block_size = config.cache_config.block_size
        self.layer_names = layer_names or [f"model.layers.{i}.self_attn" for i in range(len(layers))]
        self.layers = layers
        num_blocks = layers[0].shape[1]
        kv_config = kv_cache_config(config, self.layer_names, num_blocks)
        self.scheduler = KvtierConnector(config, KVConnectorRole.SCHEDULER, kv_config)
        self.worker = KvtierConnector(config, KVConnectorRole.WORKER, kv_config)
        self.worker.register_kv_caches(dict(zip(self.layer_names, layers)))
        # What vLLM's engine core does once the workers registered their caches.
        self.scheduler.set_xfer_handshake_metadata_pp_aware({(0, 0): self.worker.get_handshake_metadata()})
        self.free = list(range(num_blocks - 1, 0, -1))  # block 0 is vLLM's null block

    def allocate(self, n: int) -> list:
        if n > len(self.free):
            raise RuntimeError(f"the engine's KV cache has {len(self.free)} free blocks, {n} wanted")
        return [self.free.pop() for _ in range(n)]

    def _run_worker(self, meta, compute: Callable[[int], None], start: int) -> int:
        w = self.worker
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(SimpleNamespace(attn_metadata=None, no_compile_layers={}))
        errors = w.get_block_ids_with_load_errors()
        first_bad = min((self._block_index[b] for b in errors), default=None) if errors else None
        computed_from = start if first_bad is None else min(start, first_bad * self.block_size)
        for name in self.layer_names:
            w.wait_for_layer_load(name)
        compute(computed_from)
        for name, kv in zip(self.layer_names, self.layers):
            w.save_kv_layer(name, kv, None)
        w.wait_for_save()
        w.get_finished(set())
        self._report(errors)
        w.clear_connector_metadata()
        return computed_from

    def _report(self, errors=()) -> None:
        """What vLLM hands the scheduler side after a step: the workers' metadata (which
        loads landed; the scheduler settles them in the next step's metadata)."""
        self.scheduler.update_connector_output(SimpleNamespace(
            kv_connector_worker_meta=self.worker.build_connector_worker_meta(), invalid_block_ids=set(errors),
            finished_sending=None))

    def _empty_step(self, finished: set) -> set:
        """A step that schedules nothing (vLLM steps so while it holds finished requests);
        the requests finished sending."""
        w = self.worker
        meta = self.scheduler.build_connector_meta(SchedulerOutput([], CachedRequestData(), {}))
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(SimpleNamespace(attn_metadata=None, no_compile_layers={}))
        w.wait_for_save()
        sent, _ = w.get_finished(finished)
        self._report()
        w.clear_connector_metadata()
        return sent or set()

    def prefill(self, request: Request, compute: Callable[[int, list], None],
                reserve_decode_tokens: int = 0) -> tuple:
        """Schedules the prompt: returns (StepResult, block_ids). compute(start, block_ids)
        runs the forward over the prompt from token `start`."""
        for _ in range(10000):  # the lookup runs on the connector's thread: ask until it answers
            ext, _ = self.scheduler.get_num_new_matched_tokens(request, 0)
            if ext is not None:
                break
        need = -(-(len(request.prompt_token_ids) + reserve_decode_tokens) // self.block_size)
        block_ids = self.allocate(need)
        self._block_index = {b: i for i, b in enumerate(block_ids)}
        self.scheduler.update_state_after_alloc(request, KVCacheBlocks(block_ids), ext)
        prompt_blocks = -(-len(request.prompt_token_ids) // self.block_size)
        out = SchedulerOutput([NewRequestData(request.request_id, request.prompt_token_ids,
                                              (block_ids[:prompt_blocks],), ext)],
                              CachedRequestData(), {request.request_id: len(request.prompt_token_ids) - ext})
        meta = self.scheduler.build_connector_meta(out)
        self._prompt_blocks = prompt_blocks
        computed_from = self._run_worker(meta, lambda start: compute(start, block_ids), ext)
        return StepResult(ext, computed_from, computed_from), block_ids

    def decode_step(self, request: Request, block_ids: list, compute: Callable[[], None]) -> None:
        """Schedules one decode token (the request's last output token is computed)."""
        num_computed = request.num_tokens - 1
        new_ids = None
        blocks_needed = num_computed // self.block_size + 1
        if blocks_needed > self._prompt_blocks:
            new_ids = ([block_ids[self._prompt_blocks]],)
            self._prompt_blocks += 1
        cached = CachedRequestData([request.request_id], set(), [new_ids], [num_computed])
        meta = self.scheduler.build_connector_meta(SchedulerOutput([], cached, {request.request_id: 1}))
        self._run_worker(meta, lambda start: compute(), num_computed)

    def flush(self) -> None:
        """Waits for the worker's queued stores (later steps of a running engine see them
        done) and collects their counts into the worker's stats."""
        self._empty_step(set())  # stores held for the settlement of a step's loads are queued
        self.worker._worker._stores.drain()
        self.worker.get_finished(set())

    def finish(self, request: Request, block_ids: list, timeout_s: float = 30.0) -> bool:
        """Ends the request; its blocks are freed once the worker's stores are done (empty
        steps until get_finished names it, as vLLM's engine loop steps). Returns whether
        the connector held it."""
        held, _ = self.scheduler.request_finished(request, block_ids)
        finished, deadline = {request.request_id}, time.monotonic() + timeout_s
        while held:
            sent = self._empty_step(finished)
            finished = set()
            if request.request_id in sent:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {request.request_id} held past {timeout_s} s")
            time.sleep(0.001)
        self.free.extend(reversed(block_ids))
        return held

    def close(self) -> None:
        self.scheduler.shutdown()
        self.worker.shutdown()
