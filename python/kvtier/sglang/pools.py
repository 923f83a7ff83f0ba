"""Where a page's bytes are in SGLang's host pools and tensors: (address, length) segments
in the byte order of the pool's flat data page (``get_data_page(flat=True)``)."""

from __future__ import annotations

from typing import List, Optional

from kvtier.sglang.store import Segments


def flat_page_bytes(pool) -> int:
    """Bytes of one flat data page of an SGLang host pool."""
    page = pool.get_data_page(0, flat=True)
    return int(page.numel() * page.element_size())


def pool_segments(pool, host_indices, split: int, mla: bool) -> List[List[Segments]]:
    """Per page of `host_indices` (token indices of whole pages), per head slice (`split`
    of them: heterogeneous TP), its segments in `pool`."""
    import torch

    page = int(getattr(pool, "page_size", 1) or 1)
    if not isinstance(host_indices, torch.Tensor):
        host_indices = torch.as_tensor(host_indices, dtype=torch.int64)
    if split > 1:
        ptrs, sizes = pool.get_split_heads_page_buffer_meta(host_indices, split)
    else:
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
    pages = len(host_indices) // page
    per = len(ptrs) // max(pages, 1)
    out = []
    for p in range(pages):
        entries = [(int(ptrs[p * per + j]), int(sizes[p * per + j])) for j in range(per)]
        if split > 1:
            # [k, v] of each head slice in turn: one slice per store.
            out.append([entries[2 * i:2 * i + 2] for i in range(split)])
            continue
        if not mla and getattr(pool, "layout", "") == "layer_first" and hasattr(pool, "head_num"):
            # (k, v) per layer; the flat page is every layer's K, then every layer's V.
            entries = entries[0::2] + entries[1::2]
        out.append([entries])
    return out


def tensor_segments(t, page_bytes: int, split: int) -> Optional[List[Segments]]:
    """A whole flat page of `page_bytes` held by a CPU tensor, per head slice; None if `t`
    is not one."""
    if t is None or getattr(t, "device", None) is None or t.device.type != "cpu" or not t.is_contiguous():
        return None
    n = t.numel() * t.element_size()
    if n != page_bytes:
        return None
    base = t.data_ptr()
    if split == 1:
        return [[(base, n)]]
    # page_head's flat page is (k, v) x heads: slice i is its heads' K and V.
    half, share = n // 2, n // 2 // split
    return [[(base + i * share, share), (base + half + i * share, share)] for i in range(split)]
