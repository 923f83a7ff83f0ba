"""Paged KV caches as kvtier's store/load helpers take them: per-layer tensors (torch or
numpy) checked against the client's layout and described as a ``KvView`` (layer
pointers, blocks, how blocks sit in memory) for the native copy.

Three engine layouts, named by ``kv_layout``:

- ``"kv_first"``: [2, num_blocks, block_tokens, kv_heads, head_dim], contiguous.
- ``"block_first"``: [num_blocks, 2, block_tokens, kv_heads, head_dim], contiguous.
- ``"paged"``: [num_blocks, ...] of any rank whose block of one layer is one dense run of
  2 x block_tokens x kv_heads x head_dim elements, blocks at one fixed stride (which may
  exceed the run: layers interleaved per block). vLLM >= 0.32 hands its caches this way
  ([blocks, heads, tokens, 2 x head_dim] in head- or token-major order). The bytes of a
  run are moved as they are; the order inside it is the engine's (the vLLM connector
  puts it in the namespace).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# Element types a torch tensor may have for a layout's dtype (vLLM allocates fp8 caches
# as uint8).
_TORCH_DTYPES = {
    "fp16": ("torch.float16",), "float16": ("torch.float16",), "half": ("torch.float16",),
    "bf16": ("torch.bfloat16",), "bfloat16": ("torch.bfloat16",),
    "fp32": ("torch.float32",), "float32": ("torch.float32",),
    "fp8": ("torch.float8_e4m3fn", "torch.uint8"), "fp8_e4m3": ("torch.float8_e4m3fn", "torch.uint8"),
    "fp8_e5m2": ("torch.float8_e5m2", "torch.uint8"), "int8": ("torch.int8", "torch.uint8"),
}

KINDS = {"kv_first": 0, "block_first": 1, "paged": 1}


def namespace_part(text: str) -> str:
    """`text` as one field of a namespace's '|'-joined model string: '|' (and '%', the
    escape) escaped, so a model id that contains '|' cannot name another's fields."""
    return text.replace("%", "%25").replace("|", "%7C")


@dataclass(frozen=True)
class KvView:
    pointers: list      # each layer's address
    num_blocks: int
    kind: int           # 0: kv_first; 1: block-first (dense runs at block_stride)
    block_stride: int   # bytes between blocks (0: dense)
    stream: int         # the CUDA stream to copy on (0: none / default)
    writable: bool      # every layer may be written (a load's target)


def _tensor_facts(t):
    """(shape, strides in elements, element size, data pointer, is_cuda, device, dtype name)."""
    if hasattr(t, "data_ptr"):  # torch
        return (tuple(t.shape), tuple(t.stride()), t.element_size(), t.data_ptr(), t.is_cuda,
                getattr(t, "device", None), str(t.dtype))
    iface = getattr(t, "__array_interface__", None)
    if iface is None:
        raise TypeError(f"a KV layer must be a torch tensor or a numpy array, not {type(t).__name__}")
    strides = tuple(s // t.itemsize for s in t.strides)
    return tuple(t.shape), strides, t.itemsize, iface["data"][0], False, None, None


def dense_run(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether dims `shape` with `strides` (elements) cover one dense run, in any order."""
    dims = sorted((s, n) for s, n in zip(strides, shape) if n != 1)
    expect = 1
    for stride, n in dims:
        if stride != expect:
            return False
        expect *= n
    return True


def contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major and dense (dims of size 1 may have any stride; an empty tensor is)."""
    if 0 in shape:
        return True
    expect = 1
    for n, stride in reversed(list(zip(shape, strides))):
        if n != 1 and stride != expect:
            return False
        expect *= n
    return True


def _writable_spans() -> list:
    """This process's writable mappings as [(start, end, anonymous)], adjacent ones merged
    (/proc/self/maps); anonymous: every mapping merged in is private and names no file
    (the heap, torch's and numpy's allocations), which nothing of ours reprotects."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            addrs, perms = fields[0], fields[1]
            if perms[1] != "w":
                continue
            path = fields[5].strip() if len(fields) > 5 else ""
            anonymous = perms[3] == "p" and (not path or path.startswith("["))
            lo, hi = (int(x, 16) for x in addrs.split("-"))
            if spans and spans[-1][1] == lo:
                spans[-1] = (spans[-1][0], hi, spans[-1][2] and anonymous)
            else:
                spans.append((lo, hi, anonymous))
    return spans


# What /proc/self/maps said of a CPU torch tensor's bytes in anonymous memory, by
# id(tensor): (a weak reference to it, its extent, writable). A live tensor keeps its
# storage, and nothing reprotects anonymous memory under it, so while the reference still
# names it with the same extent the answer holds: store_kv/load_kv given the same tensors
# again skip the scan (thousands of lines in a process that has torch loaded). Tensors over
# shared or file mappings (kvtier's own pages, whose protection follows their lease) are
# asked every time. Dead entries are swept when the table grows.
_WRITABLE_SEEN: dict = {}
_WRITABLE_SEEN_MAX = 4096


def _writable_tensor(t, extent: tuple, spans_of) -> bool:
    import weakref

    seen = _WRITABLE_SEEN.get(id(t))
    if seen is not None and seen[0]() is t and seen[1] == extent:
        return seen[2]
    lo, hi = extent
    span = next((sp for sp in spans_of() if sp[0] <= lo and hi <= sp[1]), None)
    writable = lo == hi or span is not None
    if span is None or not span[2]:
        return writable
    try:
        ref = weakref.ref(t)
    except TypeError:  # a tensor type without weak references: asked every time
        return writable
    if len(_WRITABLE_SEEN) >= _WRITABLE_SEEN_MAX:
        for k in [k for k, v in _WRITABLE_SEEN.items() if v[0]() is None]:
            del _WRITABLE_SEEN[k]
        if len(_WRITABLE_SEEN) >= _WRITABLE_SEEN_MAX:
            _WRITABLE_SEEN.clear()
    _WRITABLE_SEEN[id(t)] = (ref, extent, writable)
    return writable


def _extent(ptr: int, shape: Sequence[int], strides: Sequence[int], elem: int) -> tuple:
    """The bytes [lo, hi) a strided tensor spans (empty: (ptr, ptr))."""
    if 0 in shape:
        return ptr, ptr
    lo = ptr + elem * sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = ptr + elem * (1 + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0))
    return lo, hi


# The views kv_args made of CPU torch tensors in anonymous memory, for those tensors passed
# again: (layout facts, backend, kv_layout, each tensor's facts) -> (weak references to the
# tensors, the view). A hit needs the very same live tensors with the same shape, strides,
# dtype and data pointer, so the view (and its writability, as _WRITABLE_SEEN's) still
# holds: a caller passing the same layers on every store and load (rather than a kv_view)
# checks them once; 32 layers cost ~0.2 ms a call to check. CUDA tensors (the view carries
# the current stream), numpy arrays (whose WRITEABLE flag may change) and tensors over
# shared or file mappings (kvtier's pages) are checked every time.
_VIEWS_SEEN: dict = {}
_VIEWS_SEEN_MAX = 16


def kv_args(layout, backend: str, kv_caches: Sequence, kv_layout: str) -> KvView:
    """Validates per-layer KV tensors against a ``kvtier.Layout`` and the client's device
    backend ("cuda" or "host-emulated"), raising InvalidArgumentError naming what is
    wrong, and describes them for the native copy. Needs no daemon."""
    facts = tuple(_tensor_facts(t) for t in kv_caches)
    key = ((layout.layers, layout.dtype, layout.tokens_per_block, layout.kv_heads, layout.head_dim), backend,
           kv_layout, facts)
    seen = _VIEWS_SEEN.get(key)
    if seen is not None and len(seen[0]) == len(kv_caches) and all(r() is t for r, t in zip(seen[0], kv_caches)):
        return seen[1]
    view = _check_kv(layout, backend, kv_caches, kv_layout, facts)
    # Kept only where every layer is a CPU torch tensor found writable in anonymous memory
    # (_WRITABLE_SEEN's): over kvtier's own pages, protection follows a lease.
    if view.writable and all(f[5] is not None and not f[4] for f in facts) and all(
            (e := _WRITABLE_SEEN.get(id(t))) is not None and e[0]() is t and e[2] for t in kv_caches):
        import weakref

        if len(_VIEWS_SEEN) >= _VIEWS_SEEN_MAX:
            _VIEWS_SEEN.clear()
        _VIEWS_SEEN[key] = (tuple(weakref.ref(t) for t in kv_caches), view)
    return view


def _check_kv(layout, backend: str, kv_caches: Sequence, kv_layout: str, facts: tuple) -> KvView:
    from kvtier import DTYPE_BYTES, InvalidArgumentError  # late: kvtier imports this module

    if kv_layout not in KINDS:
        raise InvalidArgumentError(f"kv_layout '{kv_layout}' is not one of {sorted(KINDS)}")
    if len(kv_caches) != layout.layers:
        raise InvalidArgumentError(f"{len(kv_caches)} KV tensors for a layout of {layout.layers} layers")
    elem_want = DTYPE_BYTES.get(layout.dtype)
    run_elems = 2 * layout.tokens_per_block * layout.kv_heads * layout.head_dim
    ptrs, num_blocks, stride, stream, on_cuda, writable = [], None, 0, 0, None, True
    spans = None  # writable mappings, read once when a CPU torch tensor needs them

    def spans_of():
        nonlocal spans
        if spans is None:
            spans = _writable_spans()
        return spans

    for i, t in enumerate(kv_caches):
        shape, strides, elem, ptr, is_cuda, device, dtype = facts[i]
        if hasattr(t, "flags"):  # numpy says
            writable = writable and bool(t.flags["WRITEABLE"])
        elif not is_cuda and writable:
            # torch keeps no such flag: a tensor over a read-only mapping (a file mapped
            # read-only, an acquired kvtier page) faults when written, so ask the kernel
            # (once per tensor: _writable_tensor).
            writable = _writable_tensor(t, _extent(ptr, shape, strides, elem), spans_of)
        if elem != elem_want:
            raise InvalidArgumentError(f"KV layer {i} has {elem}-byte elements; the layout's dtype {layout.dtype} "
                                       f"has {elem_want}")
        if dtype is not None and dtype not in _TORCH_DTYPES.get(layout.dtype, ()):
            raise InvalidArgumentError(f"KV layer {i} is {dtype}; the layout's dtype {layout.dtype} wants "
                                       + " or ".join(_TORCH_DTYPES.get(layout.dtype, ("?",))))
        if kv_layout == "paged":
            if len(shape) < 2 or not dense_run(shape[1:], strides[1:]) or _prod(shape[1:]) != run_elems:
                raise InvalidArgumentError(
                    f"KV layer {i} has shape {shape} and strides {strides}; 'paged' wants [blocks, ...] whose block "
                    f"is one dense run of {run_elems} elements (2 x {layout.tokens_per_block} x {layout.kv_heads} "
                    f"x {layout.head_dim})")
            n, layer_stride = shape[0], strides[0] * elem
            if layer_stride < run_elems * elem:
                raise InvalidArgumentError(f"KV layer {i}: blocks {layer_stride} bytes apart overlap")
            if stride and layer_stride != stride:
                raise InvalidArgumentError("every KV layer must have the same block stride")
            stride = layer_stride
        else:
            if len(shape) != 5:
                raise InvalidArgumentError(f"KV layer {i} has shape {shape}; want 5 dimensions")
            n = shape[1] if kv_layout == "kv_first" else shape[0]
            two = shape[0] if kv_layout == "kv_first" else shape[1]
            want = (two == 2, shape[2] == layout.tokens_per_block, shape[3] == layout.kv_heads,
                    shape[4] == layout.head_dim)
            if not all(want):
                raise InvalidArgumentError(
                    f"KV layer {i} has shape {shape}; the layout wants "
                    + ("[2, blocks, " if kv_layout == "kv_first" else "[blocks, 2, ")
                    + f"{layout.tokens_per_block}, {layout.kv_heads}, {layout.head_dim}]")
            if not contiguous(shape, strides):
                raise InvalidArgumentError(f"KV layer {i} is not contiguous")
        if num_blocks is None:
            num_blocks, on_cuda = n, is_cuda
        elif n != num_blocks or is_cuda != on_cuda:
            raise InvalidArgumentError("every KV layer must have the same blocks on the same device")
        ptrs.append(ptr)
        if is_cuda and stream == 0:
            import torch  # only CUDA tensors get here

            stream = torch.cuda.current_stream(device).cuda_stream
    if num_blocks == 0:
        raise InvalidArgumentError("the KV layers have 0 blocks: there is nothing to store into or load into")
    if on_cuda and backend == "host-emulated":
        raise InvalidArgumentError("CUDA KV tensors need a client with device 'cuda' (this one is host-emulated)")
    if not on_cuda and backend == "cuda":
        raise InvalidArgumentError("CPU KV tensors need a client with device 'host-emulated' (this one is cuda)")
    dense = kv_layout != "paged" or stride == run_elems * elem_want
    return KvView(ptrs, num_blocks, KINDS[kv_layout], 0 if dense else stride, stream, writable)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
