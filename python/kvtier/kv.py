"""Paged KV caches as kvtier's store/load helpers take them: per-layer tensors (torch or
numpy) checked against the client's layout, turned into data pointers."""

from __future__ import annotations

from typing import Sequence


def _shape_and_pointer(t):
    """(shape, element size, data pointer, is_cuda, contiguous) of a torch tensor or a
    numpy array."""
    if hasattr(t, "data_ptr"):  # torch
        return (tuple(t.shape), t.element_size(), t.data_ptr(), t.is_cuda, t.is_contiguous(),
                getattr(t, "device", None))
    iface = getattr(t, "__array_interface__", None)
    if iface is None:
        raise TypeError(f"a KV layer must be a torch tensor or a numpy array, not {type(t).__name__}")
    contiguous = t.flags["C_CONTIGUOUS"]
    return tuple(t.shape), t.itemsize, iface["data"][0], False, contiguous, None


def kv_args(client, kv_caches: Sequence, kv_layout: str):
    """Validates per-layer KV tensors against the client's layout; returns
    (layer pointers, num_blocks, layout kind (0 kv_first, 1 block_first), stream)."""
    from kvtier import DTYPE_BYTES, InvalidArgumentError  # late: kvtier imports this module

    layout = client.layout
    if kv_layout not in ("kv_first", "block_first"):
        raise InvalidArgumentError(f"kv_layout '{kv_layout}' is not kv_first or block_first")
    if len(kv_caches) != layout.layers:
        raise InvalidArgumentError(f"{len(kv_caches)} KV tensors for a layout of {layout.layers} layers")
    ptrs, num_blocks, stream, on_cuda = [], None, 0, None
    for i, t in enumerate(kv_caches):
        shape, elem, ptr, is_cuda, contiguous, device = _shape_and_pointer(t)
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
        if elem != DTYPE_BYTES.get(layout.dtype):
            raise InvalidArgumentError(f"KV layer {i} has {elem}-byte elements; the layout's dtype {layout.dtype} "
                                       f"has {DTYPE_BYTES.get(layout.dtype)}")
        if not contiguous:
            raise InvalidArgumentError(f"KV layer {i} is not contiguous")
        if num_blocks is None:
            num_blocks, on_cuda = n, is_cuda
        elif n != num_blocks or is_cuda != on_cuda:
            raise InvalidArgumentError("every KV layer must have the same blocks on the same device")
        ptrs.append(ptr)
        if is_cuda and stream == 0:
            import torch  # only CUDA tensors get here

            stream = torch.cuda.current_stream(device).cuda_stream
    backend = client.device_backend
    if on_cuda and backend == "host-emulated":
        raise InvalidArgumentError("CUDA KV tensors need a client with device 'cuda' (this one is host-emulated)")
    if not on_cuda and backend == "cuda":
        raise InvalidArgumentError("CPU KV tensors need a client with device 'host-emulated' (this one is cuda)")
    return ptrs, num_blocks, 0 if kv_layout == "kv_first" else 1, stream
