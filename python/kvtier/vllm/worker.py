"""The worker side: loads the blocks the scheduler planned into the engine's paged KV
before the forward pass, and queues the stores of the blocks (and Mamba states) that the
step made after it (kvtier.vllm.stores copies and commits them off the step), group by
group, each group through its own namespace.

A request with stores queued when it finishes is held: the scheduler returned True from
``request_finished`` for every request it planned a store for, and the worker reports it
in ``get_finished``'s finished-sending set once its copies are done (every worker reports
every such request, whether its rank stores or not). Before a step writes a block (one
vLLM handed out again, the target of a load) the worker waits for the copies that read
it; a Mamba state's copy ends before the next step starts.

Stores wait while a load is unsettled: from the step in which a request loads in the
step (a model of one KV cache group) until the scheduler has heard from every rank whether
that load landed (each worker reports its loads in the step's worker metadata, and vLLM
combines them), every store this worker is handed is held. A failed load leaves blocks
unwritten, and the KV of every token computed over them since — the request's own, and a
request's that shares such a block through vLLM's prefix cache — is wrong, on every rank
of a tensor- or context-parallel group, including ranks whose own load landed. The
scheduler's word (``settled``, ``recomputed``): held stores of the requests vLLM recomputes
are dropped (their blocks are stored again once recomputed), the others queued, a finished
request's among them (vLLM keeps its blocks until the worker reports it). Held stores
whose blocks vLLM hands out again meanwhile are dropped. An asynchronous load (several
groups) settles nothing: the request is not computed in its step, and vLLM combines every
rank's failures before it is. The scheduler's word comes in the next step's metadata (a
few steps later with a batch queue); a load it has not settled in ``SETTLE_STEPS`` steps
never will be (its worker metadata was lost), so the stores held for it are dropped (a
later miss, never KV computed over a failed load) and the finished requests among them are
reported, so vLLM frees their blocks. At most ``MAX_HELD_CHUNKS`` store chunks are held;
past that the oldest is dropped.

With ``layerwise_loads`` on, a one-group attention model's loads move layer by layer
while the model computes (kvtier.vllm.layers): ``start_load_kv`` only takes hold of the
blocks (one round trip a chunk), each attention layer waits for its own layer, and the
loads end after the forward pass, where a layer that failed to move fails every such load
of the step (reported, recomputed, and nothing computed over it stored, as above). Other
models, and asynchronous loads, load every layer in ``start_load_kv``.

The time the step spends in the connector's hooks (``blocking_s``) and the time from the
step's first hook to its last (``step_s``, ``steps``) are in the connector's stats."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional

import kvtier
from kvtier.kv import kv_args
from kvtier.vllm.layers import LayerLoads
from kvtier.vllm.layout import STATE, KvtierHandshake, fp8_meaning, group_layout
from kvtier.vllm.metadata import KvtierConnectorMetadata, KvtierConnectorStats, KvtierWorkerMetadata, LoadSpec
from kvtier.vllm.settings import Settings
from kvtier.vllm.stores import StoreQueue, side_stream

log = logging.getLogger("kvtier.vllm")

# Steps a same-step load may stay unsettled before the stores held for it are dropped.
SETTLE_STEPS = 64
# Store chunks (``Settings.chunk`` blocks each) held at most while loads are unsettled.
MAX_HELD_CHUNKS = 4096


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
        self._unsettled: dict = {}     # requests that loaded in a step, until the scheduler settles them: step
        self._waiting: list = []       # stores held meanwhile: [(loads it waits for, (store, part, tokens, state))]
        self._step_no = 0              # steps whose metadata this worker fenced
        self._loads: dict = {}         # this step's loads for the scheduler: {req: whether they landed here}
        self._recv_done: set = set()    # requests whose asynchronous load ran (ok or not)
        self._recv_failed: set = set()  # ... and failed
        self._stores: Optional[StoreQueue] = None
        self._held: set = set()       # requests the scheduler planned a store for (it holds them at finish)
        self._finishing: set = set()  # ... that finished: reported when their copies are done
        self._fenced = None           # the metadata whose block writes were fenced
        self._layered: Optional[LayerLoads] = None  # layer-wise loads (settings.layerwise_loads)
        self._layered_specs: list = []  # this step's layer-wise LoadSpecs, with their loaded counts
        self._step_start = 0.0        # when this step's first hook ran (0: between steps)
        self._scheduler_has_handshake = False  # a step's metadata said the scheduler knows the layouts

    def register_kv_caches(self, kv_caches: dict) -> None:
        cfg = self._kv_cache_config
        cache_dtype = getattr(self._vllm_config.cache_config, "cache_dtype", None)
        # fp8 caches: the platform's e4m3 encoding and the attention layers' K/V scales (loaded
        # with the weights, before the caches are registered) name what their bytes mean.
        forward_context = getattr(getattr(self._vllm_config, "compilation_config", None), "static_forward_context",
                                  None) or {}
        platform_fp8 = ""
        if str(cache_dtype or "").startswith("fp8"):
            from vllm.platforms import current_platform
            platform_fp8 = str(current_platform.fp8_dtype())
        layouts, tensors_by_group, device, layer_of = [], [], None, {}
        for plan, group in zip(self._s.plans, cfg.kv_cache_groups):
            seen, tensors = {}, []
            for name in group.layer_names:
                t = kv_caches.get(name)
                if t is None:
                    continue
                # Layers sharing another layer's cache (cross-layer KV sharing) own no storage.
                key = (t.data_ptr(), tuple(t.stride()))
                if key not in seen:
                    seen[key] = len(tensors)
                    tensors.append(t)
                layer_of[name] = seen[key]
            if not tensors:
                raise kvtier.InvalidArgumentError(f"KV cache group {plan.index} ({plan.kind}) has no KV tensors")
            scales = [(float(getattr(forward_context.get(n), "_k_scale_float", 1.0)),
                       float(getattr(forward_context.get(n), "_v_scale_float", 1.0))) for n in group.layer_names]
            layout, tensors = group_layout(plan, group.kv_cache_spec, tensors, int(cfg.num_blocks),
                                           model_id=self._s.model_id, ranks=self._s.ranks, cache_dtype=cache_dtype,
                                           groups=len(self._s.plans),
                                           fp8=fp8_meaning(cache_dtype, platform_fp8, scales))
            layouts.append(layout)
            tensors_by_group.append(tensors)
            if device is None:
                device = self._s.device or ("cuda" if getattr(tensors[0], "is_cuda", False) else "host-emulated")
        self.clients = self._s.connect(layouts, device, "worker")
        # Checked once here (a layout kvtier cannot copy fails the engine's start, by name);
        # every load and store then copies through these views.
        self._views = [kv_args(l.kvtier_layout(), device, t, l.kv_layout) for l, t in zip(layouts, tensors_by_group)]
        stream = side_stream(self._views[0])
        store_views = self._views if stream is None else [dataclasses.replace(v, stream=stream.cuda_stream)
                                                          for v in self._views]
        self._stores = StoreQueue(self._s.connect(layouts, device, "worker-store"), store_views, stream)
        if self._s.layerwise_loads and len(self._s.plans) == 1 and self._s.plans[0].role != STATE:
            self._layered = LayerLoads(layer_of, side_stream(self._views[0]),
                                       wait_s=max(1.0, self._s.timeout_ms / 1000.0))
        self.handshake = KvtierHandshake(tuple(layouts))
        for l in layouts:
            log.info("kvtier.vllm worker: group %d (%s), %d layers, %s, namespace model %s", l.group, l.kind,
                     l.layers, l.kv_layout, l.model)

    # ---- a step ----
    def begin_step(self) -> None:
        if not self._step_start:
            self._step_start = time.monotonic()

    def end_step(self) -> None:
        if self._step_start:
            self.stats.data["step_s"] += time.monotonic() - self._step_start
            self.stats.data["steps"] += 1
            self._step_start = 0.0

    def fence(self, meta: KvtierConnectorMetadata) -> None:
        """Before the step writes anything: no copy in flight reads a block it writes
        (blocks vLLM handed out this step, load targets) or a Mamba state."""
        if self._fenced is meta or self._stores is None:
            return
        self._fenced = meta
        self._step_no += 1
        self._scheduler_has_handshake = self._scheduler_has_handshake or meta.has_handshake
        self.settle(meta)
        waited = self._stores.wait_states()
        writes = set(meta.fresh_blocks)
        for load in meta.loads:
            writes.update(load.block_ids)
        if writes and self._stores.wait_blocks(writes):
            waited = True
        self.stats.data["store_fence_waits"] += waited

    def settle(self, meta: KvtierConnectorMetadata) -> None:
        """The scheduler's word on earlier steps' loads: held stores of the requests vLLM
        recomputes are dropped, those whose loads all settled are queued; a held store whose
        blocks vLLM hands out again in this step is dropped (a later miss)."""
        for req_id in meta.settled:
            self._unsettled.pop(req_id, None)
        # Loads the scheduler has not settled in SETTLE_STEPS steps never will be.
        lost = {r for r, step in self._unsettled.items() if self._step_no - step > SETTLE_STEPS}
        if lost:
            log.warning("the scheduler never settled the loads of %d requests (%s): dropping the stores held "
                        "for them", len(lost), ", ".join(sorted(lost)[:4]))
            for r in lost:
                del self._unsettled[r]
        fresh = set(meta.fresh_blocks)
        waiting, self._waiting = self._waiting, []
        for waits, chunk in waiting:
            store, part = chunk[0], chunk[1]
            if store.req_id in meta.recomputed or fresh.intersection(store.block_ids[part]):
                self.stats.data["stores_skipped_after_failed_load"] += len(store.hashes[part])
            elif waits & lost:
                self.stats.data["stores_dropped_unsettled"] += len(store.hashes[part])
            elif waits - meta.settled:
                self._waiting.append((waits - meta.settled, chunk))
            else:
                self._stores.submit(*chunk)

    def start_load_kv(self, meta: KvtierConnectorMetadata) -> None:
        self.fence(meta)
        self.end_layer_loads()
        held = []
        for load in meta.loads:
            layered = self._layered is not None and not load.is_async
            n = self._load(load, held if layered else None)
            if layered:
                self._layered_specs.append((load, n))
            self._landed(load, n)
        if held:
            self._layered.start(held)
            self.stats.data["layer_load_steps"] += 1

    def _landed(self, load: LoadSpec, n: int) -> None:
        """Counts and reports a load whose first `n` blocks landed."""
        self.stats.data["loaded_blocks"] += n
        if load.is_async:
            self._recv_done.add(load.req_id)
        else:
            self._unsettled.setdefault(load.req_id, self._step_no)
            self._loads[load.req_id] = self._loads.get(load.req_id, True) and n == len(load.block_ids)
        if n < len(load.block_ids):
            self.stats.data["load_failed_blocks"] += len(load.block_ids) - n
            if load.is_async and len(self._s.plans) > 1:
                # a hybrid model's failure is the request's (vLLM recomputes it whole: its
                # block ids do not name one group)
                self._recv_failed.add(load.req_id)
            else:  # vLLM recomputes from the first failed block
                self._load_errors.update(load.block_ids[n:])

    def _load(self, load: LoadSpec, held: Optional[list]) -> int:
        """Loads the chain's cached prefix chunk by chunk; with `held`, only takes hold of
        each chunk's blocks and appends its KvLoad there (the layers move later)."""
        client, view, chunk = self.clients[load.group], self._views[load.group], self._s.chunk
        n = 0
        for i in range(0, len(load.hashes), chunk):
            hashes, ids = load.hashes[i:i + chunk], load.block_ids[i:i + chunk]
            try:
                if held is None:
                    got = client.call(lambda c: c.load_kv(view, hashes, ids))
                else:
                    kv_load = client.call(lambda c: c.start_load(view, hashes, ids))
                    got = kv_load.loaded
                    if got:
                        held.append(kv_load)
                    else:
                        kv_load.finish()
            except kvtier.Error as e:
                log.warning("load of %d blocks of group %d for %s failed: %s", len(hashes), load.group, load.req_id, e)
                got = 0
            n += got
            if got < len(hashes):
                break
        return n

    @property
    def layer_loads_active(self) -> bool:
        """Whether this step has layer-wise loads moving."""
        return self._layered is not None and self._layered.active

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._layered is not None:
            self._layered.wait(layer_name)

    def end_layer_loads(self) -> None:
        """After the forward pass: the step's layer-wise loads have moved every layer, or
        every block of them is a failed load."""
        if self._layered is None or not self._layered_specs:
            return
        specs, self._layered_specs = self._layered_specs, []
        error = self._layered.finish()
        if error is None:
            return
        log.warning("layer-wise loads of %d requests failed: %s", len(specs), error)
        for load, n in specs:
            if n:
                self.stats.data["loaded_blocks"] -= n
                self.stats.data["load_failed_blocks"] += n
                self._loads[load.req_id] = False
                self._load_errors.update(load.block_ids[:n])

    def wait_for_save(self, meta: KvtierConnectorMetadata) -> None:
        self.end_layer_loads()
        for store in meta.stores:
            self._held.add(store.req_id)
            if not self.handshake.groups[store.group].stores:
                continue  # another rank stores this replicated group
            per_block = len(store.token_ids) // max(1, len(store.hashes))
            geometry = per_block == self.handshake.groups[store.group].tokens_per_block
            state = self._s.plans[store.group].role == STATE
            for i in range(0, len(store.hashes), self._s.chunk):
                part = slice(i, i + self._s.chunk)
                # an opaque run of other geometry: its events carry no tokens
                tokens = store.token_ids[i * per_block:part.stop * per_block] if geometry else []
                if self._unsettled:
                    self._hold((set(self._unsettled), (store, part, tokens, state)))
                else:
                    self._stores.submit(store, part, tokens, state)

    def _hold(self, entry: tuple) -> None:
        if len(self._waiting) >= MAX_HELD_CHUNKS:
            _, (store, part, _, _) = self._waiting.pop(0)
            self.stats.data["stores_dropped_unsettled"] += len(store.hashes[part])
        self._waiting.append(entry)

    def get_finished(self, finished_req_ids) -> tuple:
        """(requests finished sending: held ones whose copies are done, requests whose
        asynchronous load ran, those of them whose load failed)."""
        finished = self._held.intersection(finished_req_ids)
        self._held -= finished
        self._finishing |= finished
        waiting = {chunk[0].req_id for _, chunk in self._waiting}
        sent = {r for r in self._finishing
                if r not in waiting and (self._stores is None or not self._stores.in_flight(r))}
        self._finishing -= sent
        if self._stores is not None:
            for k, v in self._stores.take_counts().items():
                self.stats.data[k] += v
        done, failed = self._recv_done, self._recv_failed
        self._recv_done, self._recv_failed = set(), set()
        return sent, done, failed

    def take_worker_metadata(self) -> Optional[KvtierWorkerMetadata]:
        """The step's loads, and this rank's handshake while the scheduler may lack it
        (``scheduler_has_handshake``: the metadata of a step says so)."""
        self.end_layer_loads()
        handshakes = {}
        if self.handshake is not None and not self._scheduler_has_handshake:
            handshakes = {(self._s.ranks["pp"][0], self._s.ranks["tp"][0]): self.handshake}
        if not self._loads and not handshakes:
            return None
        out, self._loads = KvtierWorkerMetadata(self._loads, handshakes), {}
        return out

    def take_load_errors(self) -> set:
        self.end_layer_loads()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def close(self) -> None:
        self.end_layer_loads()
        if self._stores is not None:
            self._stores.close()
        for c in self.clients:
            c.close()
