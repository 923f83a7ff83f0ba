"""What the scheduler-side connector sends its workers each step, and the counters the
workers send back (vLLM sums them across workers and logs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kvtier.vllm._base import KVConnectorMetadata, KVConnectorStats, KVConnectorWorkerMetadata


@dataclass
class LoadSpec:
    req_id: str
    group: int
    hashes: list     # the blocks to load, in chain order
    block_ids: list  # the engine blocks (of this group) they go to
    is_async: bool = False  # the request waits for it (WAITING_FOR_REMOTE_KVS), is not computed in this step


@dataclass
class StoreSpec:
    req_id: str
    group: int
    hashes: list
    parents: list
    block_ids: list
    token_ids: list  # the tokens of each block (kvtierd announces them with its KV events)
    indices: list = field(default_factory=list)  # each block's index in the request's table of the group
    # What else vLLM hashed each block from, in its events' form (BlockStored.extra_keys:
    # a tuple or None per block), or None; and the request's LoRA adapter (name, id).
    extra_keys: Optional[list] = None
    lora: tuple = ("", 0)


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)
    # Block ids vLLM handed to requests this step (written by this step; vLLM's block pool
    # is one for every group): no store may still be copying from them.
    fresh_blocks: list = field(default_factory=list)
    # Requests whose same-step loads every worker reported since the last step, and those
    # of them (or of the requests sharing a failed block) vLLM recomputes: the workers drop
    # their held stores and queue the others'.
    settled: set = field(default_factory=set)
    recomputed: set = field(default_factory=set)
    # The scheduler knows the workers' layouts (they need not send their handshake again).
    has_handshake: bool = False


@dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """What the workers tell the scheduler after a step: the requests that loaded in the
    step (same-step loads), {request: whether every load of it landed} (vLLM's aggregator
    combines every rank's: a load landed only where it landed on all); and each rank's
    handshake, {(pp rank, tp rank): KvtierHandshake}, until the scheduler has one (vLLM's
    MultiConnector hands the scheduler only its first member's handshake metadata)."""

    loads: dict = field(default_factory=dict)
    handshakes: dict = field(default_factory=dict)

    def aggregate(self, other: "KvtierWorkerMetadata") -> "KvtierWorkerMetadata":
        for req, ok in getattr(other, "loads", {}).items():
            self.loads[req] = self.loads.get(req, True) and ok
        self.handshakes.update(getattr(other, "handshakes", {}))
        return self


COUNTERS = ("lookups", "hit_blocks", "lookups_not_ready", "loaded_blocks", "load_failed_blocks", "stored_blocks",
            "store_refused_blocks", "stores_skipped_after_failed_load", "states_stored",
            "store_fence_waits", "layer_load_steps", "blocking_s", "step_s", "steps", "session_hints",
            "session_hints_dropped", "stores_dropped_unsettled")

# vLLM's /metrics names of the counters (vllm:kvtier_<name>_total), with their help.
PROM_HELP = {
    "lookups": "Lookups of a request's prefix in kvtierd.",
    "hit_blocks": "Blocks the lookups found.",
    "lookups_not_ready": "Times the scheduler was told 'not yet' while a lookup was in flight.",
    "loaded_blocks": "Blocks loaded from kvtierd into the engine's KV cache.",
    "load_failed_blocks": "Blocks whose load failed (vLLM recomputes them).",
    "stored_blocks": "Blocks stored into kvtierd.",
    "store_refused_blocks": "Blocks kvtierd refused to store.",
    "stores_skipped_after_failed_load": "Stores dropped because a load they were computed over failed.",
    "states_stored": "Mamba states stored.",
    "store_fence_waits": "Steps that waited for a store copy still reading a block they write.",
    "layer_load_steps": "Steps whose loads moved layer by layer.",
    "blocking_s": "Seconds the steps spent in the connector's hooks.",
    "step_s": "Seconds from each step's first connector hook to its last.",
    "steps": "Steps the connector saw.",
    "session_hints": "Agentic sessions' hints sent to kvtierd (kv_transfer_params.kvtier, vLLM's session id).",
    "session_hints_dropped": "Session hints dropped: malformed (logged once per kind) or refused by kvtierd.",
    "stores_dropped_unsettled": "Blocks of held stores dropped because the scheduler never settled the loads they "
                                "waited for (within kvtier.vllm.worker.SETTLE_STEPS steps), or past the bound on "
                                "held stores.",
}


@dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Counters since the last report."""

    def __post_init__(self):
        for k in COUNTERS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = {k: 0 for k in COUNTERS}

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict:
        """The counters, and the share of the steps' time spent in the connector's hooks."""
        out = dict(self.data)
        if out.get("step_s"):
            out["blocking_share"] = round(out.get("blocking_s", 0.0) / out["step_s"], 4)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())
