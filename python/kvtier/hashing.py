"""Chained block hashes, as an engine's prefix cache computes them.

hash_i = SHA-256(hash_{i-1} || tokens of block i), 32 bytes, over full blocks only: equal
hashes mean equal prefixes. vLLM computes its own (``request.block_hashes``, SHA-256 by
default) and the connector uses those as they are; this module is for engines and tests
that have none (the reference engine, the harness).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

ROOT = b"\x00" * 32  # the parent of a sequence's first block (no parent on the wire)


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    h = hashlib.sha256()
    h.update(parent)
    h.update(struct.pack(f"<{len(tokens)}i", *tokens))
    return h.digest()


def chain_hashes(tokens: Sequence[int], block_tokens: int, salt: bytes = b"") -> list:
    """The hashes of every full block of `tokens` (a partial last block has none)."""
    out, parent = [], hashlib.sha256(salt).digest() if salt else ROOT
    for start in range(0, len(tokens) - len(tokens) % block_tokens, block_tokens):
        parent = block_hash(parent, list(tokens[start:start + block_tokens]))
        out.append(parent)
    return out
