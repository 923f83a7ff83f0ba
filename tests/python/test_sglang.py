"""kvtier.sglang: SGLang's HiCacheStorage calls against a real kvtierd, with a host pool
that hands out page buffers as SGLang's HostKVCache does."""

import hashlib
import signal
import time
from types import SimpleNamespace

import pytest
import torch

import kvtier
import kvtier.sglang
from kvtier.sglang import KvtierHiCacheStorage, key_hash

PAGE_TOKENS, LAYERS, HEADS, DIM = 16, 2, 2, 64
PAGE_BYTES = 2 * LAYERS * PAGE_TOKENS * HEADS * DIM * 2  # k and v, bf16


def config(socket, **kw):
    return SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, is_mla_model=False, model_name="qwen-test",
                           extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang",
                                         "class_name": "KvtierHiCacheStorage", "socket": socket, "timeout_ms": 1500},
                           **kw)


class HostPool:
    """SGLang's host KV pool as the storage backends see it (page_first layout): pages of
    PAGE_TOKENS tokens; get_page_buffer_meta gives each page's k and v buffers."""

    layout, page_size, dtype = "page_first", PAGE_TOKENS, torch.bfloat16

    def __init__(self, pages):
        self.kv_buffer = torch.zeros(pages, 2, PAGE_BYTES // 4, dtype=torch.uint8)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in range(0, len(indices), PAGE_TOKENS):
            page = int(indices[i]) // PAGE_TOKENS
            for kv in (0, 1):
                ptrs.append(self.kv_buffer[page, kv].data_ptr())
                sizes.append(self.kv_buffer[page, kv].numel())
        return ptrs, sizes


def chain_keys(n, salt):
    keys, prev = [], salt.encode()
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()
        keys.append(prev.hex())
    return keys


def test_set_get_exists_and_batches_round_trip_bytes(daemon):
    s = KvtierHiCacheStorage(config(daemon.socket), {})
    keys = chain_keys(4, "a")
    vals = [torch.randint(0, 255, (PAGE_BYTES,), dtype=torch.uint8) for _ in keys]
    assert not s.exists(keys[0]) and s.get(keys[0]) is None
    assert s.set(keys[0], vals[0])
    assert s.batch_set(keys[1:], vals[1:])
    assert s.exists(keys[3]) and s.batch_exists(keys) == 4
    assert s.batch_exists(keys[:2] + chain_keys(2, "b")) == 2  # the leading run
    got = s.batch_get(keys)
    assert all(torch.equal(g, v) for g, v in zip(got, vals))
    dst = torch.zeros(PAGE_BYTES // 2, dtype=torch.bfloat16)  # into a target tensor of another dtype
    assert s.get(keys[2], dst) is dst and torch.equal(dst.view(torch.uint8), vals[2])
    assert key_hash(keys[0]) == bytes.fromhex(keys[0]) and len(key_hash("not-hex")) == 32


def test_zero_copy_pages_move_between_the_host_pool_and_kvtier(daemon):
    pool_a, pool_b = HostPool(8), HostPool(8)
    a = KvtierHiCacheStorage(config(daemon.socket), {})
    a.register_mem_pool_host(pool_a)
    b = KvtierHiCacheStorage(config(daemon.socket), {})  # another SGLang instance on the host
    b.register_mem_pool_host(pool_b)
    pool_a.kv_buffer.random_(0, 255)
    keys = chain_keys(3, "z")
    src = torch.arange(2 * PAGE_TOKENS, 5 * PAGE_TOKENS)  # host pages 2, 3, 4
    assert a.batch_set_v1(keys, src) == [True] * 3
    assert b.batch_exists(keys) == 3
    dst = torch.arange(0, 3 * PAGE_TOKENS)  # into pages 0, 1, 2 of B's pool
    assert b.batch_get_v1(keys, dst) == [True] * 3
    assert torch.equal(pool_b.kv_buffer[0:3], pool_a.kv_buffer[2:5])
    # A missing page ends the usable run: what follows it is not loaded.
    assert b.batch_get_v1([keys[0], chain_keys(1, "nope")[0], keys[2]], dst) == [True, False, False]


def test_another_model_or_rank_is_a_miss(daemon):
    a = KvtierHiCacheStorage(config(daemon.socket), {})
    keys = chain_keys(2, "m")
    assert a.batch_set(keys, [torch.ones(PAGE_BYTES, dtype=torch.uint8)] * 2)
    other = config(daemon.socket)
    other.model_name = "another"
    o = KvtierHiCacheStorage(other, {})
    o.set(chain_keys(1, "warm")[0], torch.zeros(PAGE_BYTES, dtype=torch.uint8))
    assert o.batch_exists(keys) == 0
    r1 = config(daemon.socket)
    r1.tp_rank, r1.tp_size = 1, 2
    t = KvtierHiCacheStorage(r1, {})
    t.set(chain_keys(1, "warm2")[0], torch.zeros(PAGE_BYTES, dtype=torch.uint8))
    assert t.batch_exists(keys) == 0


def test_a_stopped_daemon_costs_a_bounded_miss_and_the_backend_recovers(daemon):
    s = KvtierHiCacheStorage(config(daemon.socket), {})
    keys = chain_keys(2, "s")
    assert s.batch_set(keys, [torch.ones(PAGE_BYTES, dtype=torch.uint8)] * 2)
    daemon.signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert s.batch_exists(keys) == 0  # a timeout: a miss, not a hang or an exception
        assert s.batch_get(keys) == [None, None]
        assert s.batch_set(chain_keys(1, "x"), [torch.ones(PAGE_BYTES, dtype=torch.uint8)]) is False
        assert time.monotonic() - t0 < 6
    finally:
        daemon.signal(signal.SIGCONT)
    time.sleep(0.3)
    assert s.batch_exists(keys) == 2, "back once the daemon answers again"


def test_the_module_imports_without_sglang():
    assert kvtier.sglang.HAVE_SGLANG is False
    assert "HiCacheStorage" in kvtier.sglang.__doc__
