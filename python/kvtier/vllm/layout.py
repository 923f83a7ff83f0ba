"""What a vLLM engine's KV cache is, group by group, as kvtier must name it.

vLLM hands a connector one ``KVCacheConfig`` with one or more KV cache groups (one per
kind of layer: full attention, sliding window, chunked local attention, MLA, Mamba /
linear-attention states), every group with its own block table. Each group is stored in
a kvtier namespace of its own (the group's index, spec kind, window, element type, block
size and physical order are in the namespace's model string), so groups never alias and
two engines share a group's blocks only when every fact that changes its bytes is equal.

| spec kind (vLLM)          | role here | a hit at token P needs                          |
|---------------------------|-----------|-------------------------------------------------|
| full / sink / MLA         | prefix    | every block before P                            |
| sliding window (+ MLA)    | window    | the ``window_blocks`` blocks before P           |
| chunked local attention   | window    | the blocks of P's attention chunk (at most)     |
| Mamba / GDN (align mode)  | state     | the state saved at P (the block ending at P)    |
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import kvtier
from kvtier.kv import contiguous, dense_run, namespace_part
from kvtier.vllm._base import KVConnectorHandshakeMetadata

_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
           "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e5m2", "torch.int8": "int8",
           "torch.uint8": "int8"}

# vLLM spec classes, most specific first: (class name, kind as vLLM's events name it, role).
_SPEC_KINDS = (
    ("SlidingWindowMLASpec", "sliding_window_mla", "window"),
    ("SlidingWindowSpec", "sliding_window", "window"),
    ("ChunkedLocalAttentionSpec", "chunked_local_attention", "window"),
    ("MLAAttentionSpec", "mla_attention", "prefix"),
    ("SinkFullAttentionSpec", "sink_full_attention", "prefix"),
    ("MambaSpec", "mamba", "state"),
    ("FullAttentionSpec", "full_attention", "prefix"),
)
PREFIX, WINDOW, STATE = "prefix", "window", "state"


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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def spec_kind(spec) -> tuple:
    """(kind, role) of a KV cache spec. A spec of no vLLM class (a test's stand-in with
    block_size, num_kv_heads and head_size) is full attention."""
    names = [c.__name__ for c in type(spec).__mro__]
    if "UniformTypeKVCacheSpecs" in names:
        raise kvtier.InvalidArgumentError("kvtier.vllm does not serve a KV cache group whose layers have "
                                          "different specs (UniformTypeKVCacheSpecs)")
    for cls, kind, role in _SPEC_KINDS:
        if cls in names:
            return kind, role
    if "KVCacheSpec" in names:
        raise kvtier.InvalidArgumentError(f"kvtier.vllm does not know the KV cache spec {type(spec).__name__}")
    return "full_attention", PREFIX


@dataclass(frozen=True)
class GroupPlan:
    """How the connector treats one KV cache group (both roles compute it from the
    KVCacheConfig vLLM hands them)."""

    index: int
    kind: str               # vLLM's KVCacheSpecKind value
    role: str               # PREFIX, WINDOW or STATE
    block_size: int         # tokens per block of this group
    hashes_per_block: int   # vLLM block hashes per block of this group
    window_blocks: int = 0  # WINDOW: blocks before a hit position that the hit needs
    sliding_window: int = 0  # tokens (sliding window or attention chunk), for events
    # Ranks a block's tokens are spread over: decode context parallelism's size for the
    # attention groups vLLM shards (each rank holds block_size / shards of its tokens in
    # its block of the same id), else 1.
    shards: int = 1

    @property
    def rank_block_size(self) -> int:
        """Tokens of a block one rank holds."""
        return self.block_size // self.shards

    def block_key_index(self, block: int) -> int:
        """The index in request.block_hashes of the hash naming block `block` (the hash
        of the prefix ending with the block)."""
        return (block + 1) * self.hashes_per_block - 1


def group_plans(kv_cache_config, hash_block_size: int, dcp: int = 1) -> tuple:
    """The plan of every group. Under decode context parallelism (`dcp` > 1) a group
    whose spec vLLM shards (``dcp_sharded``: attention) has blocks of dcp x its spec's
    block size, as vLLM's scheduler counts and hashes them."""
    if kv_cache_config is None or not kv_cache_config.kv_cache_groups:
        raise kvtier.InvalidArgumentError("kvtier.vllm needs vLLM's KV cache config with at least one group")
    plans = []
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        kind, role = spec_kind(spec)
        shards = dcp if getattr(spec, "dcp_sharded", False) else 1
        bs = int(spec.block_size) * shards
        if bs % hash_block_size:
            raise kvtier.InvalidArgumentError(f"KV cache group {i} has blocks of {bs} tokens, not a multiple of "
                                              f"vLLM's hash block size {hash_block_size}")
        window, blocks = 0, 0
        if kind in ("sliding_window", "sliding_window_mla"):
            window = int(spec.sliding_window)
            blocks = _cdiv(window - 1 + int(getattr(spec, "extra_retained_tokens", 0) or 0), bs)
        elif kind == "chunked_local_attention":
            window = int(spec.attention_chunk_size)
            blocks = _cdiv(window, bs)
        plans.append(GroupPlan(i, kind, role, bs, bs // hash_block_size, max(blocks, 1 if role == WINDOW else 0),
                               window, shards))
    return tuple(plans)


@dataclass(frozen=True)
class KvtierLayout(KVConnectorHandshakeMetadata):
    """One KV cache group's namespace and copy geometry, as the daemon and the scheduler
    must see it (picklable)."""

    model: str          # the namespace's model string: model id, group, physical order, ranks
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tokens_per_block: int
    kv_layout: str      # kvtier.kv layout name: paged, kv_first, block_first
    group: int = 0
    kind: str = "full_attention"
    stores: bool = True  # whether this rank stores the group (MLA: the first DCP group of each TP group only)

    def kvtier_layout(self) -> "kvtier.Layout":
        return kvtier.Layout(self.model, layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim,
                             dtype=self.dtype, tokens_per_block=self.tokens_per_block)


@dataclass(frozen=True)
class KvtierHandshake(KVConnectorHandshakeMetadata):
    """What a worker sends the scheduler after register_kv_caches: one layout per group."""

    groups: tuple


def describe_kv_caches(tensors: list, spec, num_blocks: int) -> tuple:
    """(kv_layout, physical order tag, kernel blocks per block) of one group's caches.

    vLLM >= 0.32: each layer is a 4D view [B, H, N, C] (RFC #42082: blocks, head slots,
    tokens or states, content) with the backend's stride order, B a multiple of the blocks
    when kernel blocks split a block; the order of H, N, C inside a block comes from the
    strides. Older vLLM: 5D [2, B, N, H, D] or [B, 2, N, H, D], contiguous (token-major;
    a head-major 5D cache is refused).
    """
    t = tensors[0]
    shape, strides = tuple(t.shape), tuple(t.stride())
    if len(shape) == 5 and hasattr(spec, "num_kv_heads") and contiguous(shape, strides):
        bs, heads, dim = int(spec.block_size), int(spec.num_kv_heads), int(spec.head_size)
        if shape[2:] == (bs, heads, dim) and shape[:2] == (2, num_blocks):
            return "kv_first", "kvNHD", 1
        if shape[2:] == (bs, heads, dim) and shape[:2] == (num_blocks, 2):
            return "block_first", "kvNHD", 1
    if len(shape) == 4 and shape[0] % num_blocks == 0:
        ratio = shape[0] // num_blocks
        if not dense_run(shape[1:], strides[1:]):
            raise kvtier.InvalidArgumentError(f"KV cache {shape} strides {strides}: a block is not one dense run")
        if ratio > 1 and strides[0] != shape[1] * shape[2] * shape[3]:
            raise kvtier.InvalidArgumentError("kernel blocks that are not dense pages cannot be grouped per block")
        inner = sorted(range(1, 4), key=lambda d: -strides[d])
        return "paged", "".join("?HNC"[d] for d in inner), ratio
    raise kvtier.InvalidArgumentError(
        f"kvtier.vllm does not know the KV cache layout {shape} (strides {strides}, {num_blocks} blocks, "
        f"block_size {spec.block_size})")


def rank_facts(vllm_config) -> dict:
    """This worker's tensor-, pipeline- and decode-context-parallel ranks and sizes, the
    tokens a DCP rank takes in turn (``interleave``) and the prefill-context-parallel
    size. Ranks are 0 where vLLM's groups are not initialized (its scheduler's process,
    tests)."""
    pc = vllm_config.parallel_config
    facts = {"tp": (0, int(getattr(pc, "tensor_parallel_size", 1))),
             "pp": (0, int(getattr(pc, "pipeline_parallel_size", 1))),
             "dcp": (0, int(getattr(pc, "decode_context_parallel_size", 1) or 1)),
             "interleave": int(getattr(pc, "cp_kv_cache_interleave_size", 1) or 1),
             "pcp": int(getattr(pc, "prefill_context_parallel_size", 1) or 1)}
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group  # type: ignore

        facts["tp"] = (get_tp_group().rank_in_group, facts["tp"][1])
        facts["pp"] = (get_pp_group().rank_in_group, facts["pp"][1])
    except Exception:  # noqa: BLE001 - not initialized
        pass
    if facts["dcp"][1] > 1:
        try:
            from vllm.distributed.parallel_state import get_dcp_group  # type: ignore

            facts["dcp"] = (get_dcp_group().rank_in_group, facts["dcp"][1])
        except Exception:  # noqa: BLE001 - not initialized
            pass
    return facts


_MAX_HEAD_DIM, _MAX_HEADS = 16384, 4096  # protocol/base/layout.cc


def _heads_and_dim(n: int) -> tuple:
    """Factors an opaque run of 2 x n bytes a token into kvtier's (heads, head_dim)."""
    for heads in range(-(-n // _MAX_HEAD_DIM), _MAX_HEADS + 1):
        if n % heads == 0:
            return heads, n // heads
    raise kvtier.InvalidArgumentError(f"a KV block run of {2 * n} bytes a token cannot be named as kvtier heads "
                                      f"(at most {_MAX_HEADS}) x head size (at most {_MAX_HEAD_DIM})")


def _digest(*facts) -> str:
    return hashlib.sha256(repr(facts).encode()).hexdigest()[:12]


def fp8_meaning(cache_dtype: Optional[str], platform_fp8: str, kv_scales: list) -> str:
    """What an fp8 cache's bytes mean beyond their element type, as a suffix of the
    namespace's model string: the platform's e4m3 encoding where it is not the OCP one
    (ROCm's e4m3fnuz: the same bits are half the value), and the layers' K and V scales
    [(k, v)] where any is not 1.0 (the bytes are the values divided by them). '' for other
    caches and for e4m3fn at unit scales, whose namespaces stay as they were."""
    cd = str(cache_dtype or "auto")
    if not cd.startswith("fp8"):
        return ""
    out = ""
    if "e5m2" not in cd and "fnuz" in platform_fp8:
        out += "|fp8e4m3fnuz"
    if any(k != 1.0 or v != 1.0 for k, v in kv_scales):
        out += f"|kvscales{_digest(tuple(kv_scales))}"
    return out


def group_layout(plan: GroupPlan, spec, tensors: list, num_blocks: int, *, model_id: str, ranks: dict,
                 cache_dtype: Optional[str], groups: int, fp8: str = "") -> tuple:
    """(KvtierLayout, the per-layer tensors to copy through) of one group's caches.

    Attention groups with separate K and V keep kvtier's structured layout (heads, head
    size, element type); MLA latents and Mamba states are moved as opaque byte runs
    (int8 layout of the same bytes per block), their element types named in the
    namespace. `fp8`: fp8_meaning's suffix of the model string."""
    model_id = namespace_part(model_id)
    kind, order, ratio = describe_kv_caches(tensors, spec, num_blocks)
    if ratio > 1:  # kernel blocks: view each vLLM block as one
        tensors = [t.unflatten(0, (num_blocks, ratio)) for t in tensors]
    first = tensors[0]
    (tp, tps), (pp, pps) = ranks["tp"], ranks["pp"]
    bs = plan.rank_block_size
    kv_pairs = (plan.kind not in ("mla_attention", "sliding_window_mla") and plan.role != STATE
                and hasattr(spec, "num_kv_heads") and (kind != "paged" or first.shape[-1] == 2 * int(spec.head_size)))
    replicated = plan.kind in ("mla_attention", "sliding_window_mla")  # every TP rank holds the same latent
    tp_part = "tp*" if replicated else f"tp{tp}of{tps}"
    if plan.shards > 1:  # each rank of a DCP group holds its own tokens of every block
        dcp, dcps = ranks["dcp"]
        tp_part += f"|dcp{dcp}of{dcps}i{ranks['interleave']}"
    if kv_pairs:
        dtype = kv_dtype_name(first.dtype, cache_dtype)
        if groups == 1 and plan.kind == "full_attention":
            model = f"{model_id}|{order}|{tp_part}|pp{pp}of{pps}{fp8}"  # a dense model's namespace
        else:
            model = (f"{model_id}|g{plan.index}of{groups}:{plan.kind}:w{plan.sliding_window}|{order}|{tp_part}|"
                     f"pp{pp}of{pps}{fp8}")
        return KvtierLayout(model, layers=len(tensors), kv_heads=int(spec.num_kv_heads),
                            head_dim=int(spec.head_size), dtype=dtype, tokens_per_block=bs, kv_layout=kind,
                            group=plan.index, kind=plan.kind), tensors
    if kind != "paged":
        raise kvtier.InvalidArgumentError(f"KV cache group {plan.index} ({plan.kind}) is not in vLLM's paged layout")
    import torch  # vLLM's caches are torch tensors

    raw = [t.view(torch.uint8) for t in tensors]
    run = 1
    for n in raw[0].shape[1:]:
        run *= int(n)
    if run % 2:
        raise kvtier.InvalidArgumentError(f"KV cache group {plan.index} ({plan.kind}) has blocks of {run} bytes "
                                          "a layer: kvtier moves runs of an even size")
    tokens = bs if run % (2 * bs) == 0 else 1
    heads, dim = _heads_and_dim(run // (2 * tokens))
    if plan.role == STATE:
        facts = _digest(tuple(map(tuple, getattr(spec, "shapes", ()))), tuple(map(str, getattr(spec, "dtypes", ()))),
                        str(getattr(spec, "mamba_type", "")))
        elem = f"state{facts}"
    else:
        elem = kv_dtype_name(first.dtype, cache_dtype)
        if str(cache_dtype or "").startswith("fp8") and cache_dtype not in ("fp8", "fp8_e4m3", "fp8_e5m2"):
            elem += f":{cache_dtype}"  # a packed format (fp8_ds_mla: latents with their scales) is its own
    model = (f"{model_id}|g{plan.index}of{groups}:{plan.kind}:w{plan.sliding_window}|{elem}|bs{bs}|{order}|"
             f"{tp_part}|pp{pp}of{pps}{fp8}")
    return KvtierLayout(model, layers=len(raw), kv_heads=heads, head_dim=dim, dtype="int8",
                        tokens_per_block=tokens, kv_layout="paged", group=plan.index, kind=plan.kind,
                        stores=not replicated or tp < plan.shards), raw
