"""kvtier as a vLLM v1 KV connector: every vLLM instance on a host shares one tiered,
persistent cache of prefix blocks (GPU/host RAM/NVMe, owned by kvtierd).

Launch (vLLM's dynamic connector loading, ``kv_connector_module_path``)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

Interface followed: ``KVConnectorBase_V1`` of vLLM's main branch as of late 2025
(``vllm/distributed/kv_transfer/kv_connector/v1/base.py``: the constructor takes
``(vllm_config, role, kv_cache_config)``; scheduler side ``get_num_new_matched_tokens``,
``update_state_after_alloc``, ``build_connector_meta``, ``request_finished``; worker side
``register_kv_caches``, ``start_load_kv``, ``wait_for_layer_load``, ``save_kv_layer``,
``wait_for_save``, ``get_finished``, ``get_block_ids_with_load_errors``). vLLM is imported
lazily: without it this module still imports (with stand-ins for the base classes), so
the connector runs under the call-sequence harness in ``kvtier.vllm_harness``.

What it does. Scheduler side: a request's full prompt blocks are looked up in kvtierd by
vLLM's own block hashes (``request.block_hashes``, 32 bytes; set PYTHONHASHSEED equally
on every instance so they agree); the cached prefix beyond what vLLM computed locally is
reported as external tokens (never the block holding the prompt's last token: vLLM must
compute at least one). Worker side: those blocks are read into the engine's paged KV
(all layers of all blocks in one scatter) before the forward pass, and every block that
became full during the step is stored after it (one gather). Loads and stores are
synchronous within the step. Blocks that could not be loaded (the daemon went away, a
block was evicted between lookup and load) are reported through
``get_block_ids_with_load_errors`` so vLLM recomputes them; the connector reconnects to a
restarted kvtierd by itself (``kvtier.resilient``). A layout or dtype mismatch between
instances is a different namespace: a miss, never foreign bytes.

Extra config keys: ``socket`` (default $KVTIER_SOCKET or ./var/kvtierd.sock),
``timeout_ms`` (default 5000: a slow daemon costs at most that, then recompute),
``device`` (default: where the KV tensors are), ``model_id`` (default: the served model).
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import kvtier
from kvtier.resilient import ResilientClient

log = logging.getLogger("kvtier.vllm")

try:  # vLLM present: subclass the real interface.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - any import failure means "no vLLM here"
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Stand-in with vLLM's constructor and metadata plumbing, for running without it."""

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


_TORCH_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
                 "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e5m2", "torch.int8": "int8",
                 "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32",
                 "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _dtype_name(dtype) -> str:
    name = str(dtype)
    if name not in _TORCH_DTYPES:
        raise kvtier.InvalidArgumentError(f"KV dtype {name} is not one kvtier stores")
    return _TORCH_DTYPES[name]


def _hash_bytes(h) -> bytes:
    """A vLLM block hash as 32 bytes: bytes as they are (v1), an int or an object with
    hash_value (older vLLM) big-endian."""
    if isinstance(h, (bytes, bytearray)):
        b = bytes(h)
        return b if len(b) == 32 else __import__("hashlib").sha256(b).digest()
    v = getattr(h, "hash_value", h)
    return (int(v) & ((1 << 256) - 1)).to_bytes(32, "big")


def _tp_rank_size() -> tuple:
    try:
        from vllm.distributed.parallel_state import (  # type: ignore
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001 - no vLLM, or not initialized (the scheduler)
        return 0, 1


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


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)


@dataclass
class _RequestState:
    request: Any
    hashes: list                 # full-block hashes known so far
    block_ids: list = field(default_factory=list)
    stored: int = 0              # blocks [0, stored) are in kvtier or were computed before
    load: Optional[tuple] = None  # (first block, end block) to load


class KvtierConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._socket = self._extra("socket", os.environ.get("KVTIER_SOCKET", ""))
        self._timeout_ms = int(self._extra("timeout_ms", 5000))
        self._device = self._extra("device", None)
        self._model_id = self._extra("model_id", None) or str(getattr(vllm_config.model_config, "model", "model"))
        self._requests: dict = {}
        self._load_errors: set = set()
        self._layers: list = []
        self._kv_layout = None
        self.stats = {"lookups": 0, "hit_blocks": 0, "loaded_blocks": 0, "load_failed_blocks": 0,
                      "stored_blocks": 0, "store_failures": 0}
        self._client: Optional[ResilientClient] = None
        if self._role == KVConnectorRole.SCHEDULER:
            self._client = self._resilient(self._layout_from_config(vllm_config), device="host-emulated")

    # ---- configuration ----
    def _extra(self, key, default):
        cfg = self._kv_transfer_config
        if hasattr(cfg, "get_from_extra_config"):
            return cfg.get_from_extra_config(key, default)
        return (getattr(cfg, "kv_connector_extra_config", None) or {}).get(key, default)

    def _namespace_model(self, tp_rank: int, tp_size: int) -> str:
        # Each tensor-parallel rank holds its own heads: its blocks are its own namespace.
        return self._model_id if tp_size == 1 else f"{self._model_id}|tp{tp_rank}of{tp_size}"

    def _layout_from_config(self, vllm_config) -> "kvtier.Layout":
        mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
        cache_dtype = getattr(cc, "cache_dtype", "auto")
        dtype = _dtype_name(mc.dtype if cache_dtype in (None, "auto") else cache_dtype)
        tp_size = int(getattr(pc, "tensor_parallel_size", 1))
        # The scheduler looks up what rank 0 stored: every rank stores the same blocks.
        return kvtier.Layout(self._namespace_model(0, tp_size), layers=int(mc.get_num_layers(pc)),
                             kv_heads=int(mc.get_num_kv_heads(pc)), head_dim=int(mc.get_head_size()), dtype=dtype,
                             tokens_per_block=self._block_size)

    def _resilient(self, layout: "kvtier.Layout", device: str) -> ResilientClient:
        def connect():
            return kvtier.Client(layout, self._socket, name=f"vllm-{self._role.name.lower()}", hash_bytes=32,
                                 timeout_ms=self._timeout_ms, device=device)

        return ResilientClient(connect, name=f"kvtier.vllm {self._role.name.lower()}")

    # ==== scheduler side ====
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        prompt = list(getattr(request, "prompt_token_ids", None) or [])
        hashes = [_hash_bytes(h) for h in list(request.block_hashes)[: len(prompt) // self._block_size]]
        start = num_computed_tokens // self._block_size
        # vLLM computes at least the prompt's last token: never load the block holding it.
        usable = (len(prompt) - 1) // self._block_size
        if usable <= start or not hashes:
            return 0, False
        try:
            matched = self._client.call(lambda c: c.lookup(hashes[:usable]).matched)
        except kvtier.Error as e:
            log.debug("lookup failed (%s): a miss", e)
            return 0, False
        self.stats["lookups"] += 1
        self.stats["hit_blocks"] += matched
        if matched <= start:
            return 0, False
        self._requests[request.request_id] = _RequestState(request, hashes, load=(start, matched))
        return matched * self._block_size - num_computed_tokens, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestState(request, [])
        if num_external_tokens == 0:
            state.load = None
        elif state.load is not None:
            state.block_ids = list(blocks.get_block_ids()[0])

    def build_connector_meta(self, scheduler_output) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is None:
                continue  # never looked at (not ours to cache)
            state.block_ids = list(new.block_ids[0])
            # What the request starts with (vLLM's own prefix hits and our loads) is not
            # stored again.
            state.stored = new.num_computed_tokens // self._block_size
            if state.load is not None:
                first, end = state.load
                meta.loads.append(LoadSpec(new.req_id, state.hashes[first:end], state.block_ids[first:end]))
                state.load = None
            self._plan_store(meta, state, new.req_id, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(getattr(cached, "req_ids", [])):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                state.block_ids.extend(new_ids[0])
            self._plan_store(meta, state, req_id, cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        return meta

    def _plan_store(self, meta, state: _RequestState, req_id: str, tokens_after_step: int) -> None:
        hashes = [_hash_bytes(h) for h in state.request.block_hashes]
        end = min(tokens_after_step // self._block_size, len(hashes), len(state.block_ids))
        if end <= state.stored:
            return
        parents = [hashes[i - 1] if i > 0 else b"" for i in range(state.stored, end)]
        meta.stores.append(StoreSpec(req_id, hashes[state.stored:end], parents, state.block_ids[state.stored:end]))
        state.stored = end

    def request_finished(self, request, block_ids):
        self._requests.pop(request.request_id, None)
        return False, None  # stores are done within the step: the blocks may be freed now

    # vLLM calls get_num_new_matched_tokens for every request; this keeps state only for
    # those it will see scheduled.
    def update_connector_output(self, connector_output):
        return

    # ==== worker side ====
    def register_kv_caches(self, kv_caches: dict):
        self._layers = list(kv_caches.values())
        first = self._layers[0]
        shape = tuple(first.shape)
        if len(shape) != 5 or shape[0] != 2:
            raise kvtier.InvalidArgumentError(f"kvtier.vllm needs per-layer KV of [2, blocks, block_size, kv_heads, "
                                              f"head_dim] (flash-attn layout); got {shape}")
        tp_rank, tp_size = _tp_rank_size()
        layout = kvtier.Layout(self._namespace_model(tp_rank, tp_size), layers=len(self._layers), kv_heads=shape[3],
                               head_dim=shape[4], dtype=_dtype_name(first.dtype), tokens_per_block=shape[2])
        device = self._device or ("cuda" if getattr(first, "is_cuda", False) else "host-emulated")
        self._client = self._resilient(layout, device)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        for load in meta.loads:
            try:
                n = self._client.call(lambda c: c.load_kv(self._layers, load.hashes, load.block_ids))
            except kvtier.Error as e:
                log.warning("load of %d blocks for %s failed: %s", len(load.hashes), load.req_id, e)
                n = 0
            self.stats["loaded_blocks"] += n
            if n < len(load.block_ids):
                self.stats["load_failed_blocks"] += len(load.block_ids) - n
                self._load_errors.update(load.block_ids[n:])

    def wait_for_layer_load(self, layer_name: str):
        return  # every layer was loaded in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs):
        return  # all layers are stored together in wait_for_save (one gather)

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        for store in meta.stores:
            try:
                results = self._client.call(
                    lambda c: c.store_kv(self._layers, store.block_ids, store.hashes, store.parents))
                self.stats["stored_blocks"] += sum(1 for r in results if r.ok)
            except kvtier.Error as e:
                self.stats["store_failures"] += 1
                log.debug("store of %d blocks for %s failed: %s", len(store.hashes), store.req_id, e)

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        if self._client is not None:
            self._client.close()
