"""kvtier as an SGLang HiCache storage backend: SGLang's host KV pages backed by kvtierd's
shared, tiered, persistent cache, so every SGLang (and vLLM) instance on a host reuses the
same prefixes.

Launch (SGLang's dynamic backend loading)::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1, "socket": "/run/kvtier/kvtierd.sock"}'

``interface_v1`` makes SGLang's cache controller call the page interface
(``batch_get_v1``/``batch_set_v1``: one copy between the host pool and kvtier's page);
without it SGLang uses the generic one (``batch_get``/``batch_set``), which adds a copy
through a staging tensor. Both store the same bytes: a page written by one is read by the
other. Other keys: ``timeout_ms`` (default 5000), ``routable_id`` ("IP:port" of the
server, for kvtierd's KV event topics; default $KVTIER_ROUTABLE_ID).

Interface followed: ``HiCacheStorage`` of the installed SGLang (0.5.23,
``sglang/srt/mem_cache/hicache_storage.py``): constructed as ``cls(storage_config,
kwargs)`` by ``StorageBackendFactory``, then ``register_mem_pool_host(kv_pool)``; the
generic calls; the page calls over the pool's ``get_page_buffer_meta``; the v2 calls
(``register_mem_host_pool_v2``, ``batch_exists_v2``/``batch_get_v2``/``batch_set_v2``)
for the side pools of hybrid models (Mamba and SWA states, the draft model's KV, indexer
pools); ``get_stats`` returning SGLang's ``StorageMetrics``. Without SGLang the package imports
(a deployment check, a config naming the class) and the class refuses to be made, saying
why.

Layout, one module per interface generation as SGLang added them: ``backend`` (the class
SGLang loads: config, namespaces, the KV pool), ``generic`` (``get``/``set``/``exists``),
``page`` (``batch_get_v1``/``batch_set_v1``), ``side_pools`` (the v2 calls), ``store``
(a namespace's session, keys as hashes), ``pools`` (where a page's bytes are),
``stats`` (the ``StorageMetrics`` every call records into).

What a page is in kvtier:

- Keys are SGLang's page hashes (hex SHA-256 chained over the prefix): 64 hex digits become
  the 32-byte block hash, anything else is hashed to 32 bytes. A page's parent is the key
  before it, across SGLang's 128-page batches (``extra_info.prefix_keys``).
- Each page is one kvtier block whose bytes are SGLang's flat data page
  (``get_data_page(flat=True)``) of the pool's layout: the page path copies the pool's
  buffers in that order (for ``layer_first`` MHA pools the K of every layer, then the V).
- Namespaces: one per pool and rank slice, named
  ``{model}|sglang|{layout}|{dtype}|{pool}|tp{r}of{n}|pp{r}of{n}[|cp{r}of{n}][|dcp{r}of{n}]``
  (MLA KV, the same on every TP rank, has no tp part). With heterogeneous TP
  (``tp_lcm_size``, ``page_head`` layout) a rank's page is split into the head slices of
  the ``tp_lcm_size`` ranks it stands for, each stored in that rank's namespace, so a
  deployment at the other TP size reads them. Another geometry's pages are a miss.
- KV events: the KV pool's blocks are announced with SGLang's own ids (the first 16 hex
  digits as a signed integer) and its page's token count, by the first rank of each
  parallel group only; side pools are not announced. SGLang's storage calls carry no
  token ids, so these events have none.

A page whose bytes do not verify on the NVMe tier is a miss, never served; when kvtierd
is gone or slow every call is a miss (or a failed set) within ``timeout_ms`` and the
backend reconnects by itself. A call with a value or target of the wrong size fails
(False or None) and holds nothing afterwards.
"""

try:
    from kvtier.sglang._base import HiCacheStorage  # noqa: F401
except ImportError as _no_sglang:
    _why = str(_no_sglang)

    class KvtierHiCacheStorage:  # type: ignore[no-redef]
        """kvtier's SGLang storage backend; this Python has no SGLang, so it cannot be made."""

        def __init__(self, *args, **kwargs):
            raise ImportError(_why)
else:
    from kvtier.sglang.backend import KvtierHiCacheStorage  # noqa: F401

from kvtier.sglang.store import key_hash  # noqa: F401

__all__ = ["KvtierHiCacheStorage", "key_hash"]
