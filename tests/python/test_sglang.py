"""kvtier.sglang: SGLang's HiCacheStorage calls against a real kvtierd, with a host pool
that hands out page buffers as SGLang's HostKVCache does."""

import hashlib
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import torch

from kvtier_testing import sglang_standin

sglang_standin.install()

import kvtier  # noqa: E402
import kvtier.sglang  # noqa: E402
from kvtier.sglang import KvtierHiCacheStorage, key_hash  # noqa: E402
from kvtier_testing.daemon import wait_until  # noqa: E402

PAGE_TOKENS, LAYERS, HEADS, DIM = 16, 2, 2, 64
PAGE_BYTES = 2 * LAYERS * PAGE_TOKENS * HEADS * DIM * 2  # k and v, bf16


def config(socket, **kw):
    fields = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, is_mla_model=False, model_name="qwen-test",
                  extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang",
                                "class_name": "KvtierHiCacheStorage", "socket": socket, "timeout_ms": 1500})
    fields.update(kw)
    return SimpleNamespace(**fields)


class HostPool:
    """SGLang's page_first MHA host pool as the backend sees it (the real one drives the
    backend in tests/engines/test_sglang_hicache.py): kv_buffer [2, tokens, layers, heads,
    dim]; flat pages; per page its K and V buffers from a tensor of token indices."""

    layout, page_size, dtype = "page_first", PAGE_TOKENS, torch.bfloat16

    def __init__(self, pages):
        self.kv_buffer = torch.zeros(2, pages * PAGE_TOKENS, LAYERS, HEADS, DIM, dtype=torch.bfloat16)

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[:, index:index + PAGE_TOKENS]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(PAGE_BYTES // 2, dtype=torch.bfloat16)

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[:, index:index + PAGE_TOKENS] = data_page.reshape(2, PAGE_TOKENS, LAYERS, HEADS, DIM)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in indices.tolist()[::PAGE_TOKENS]:  # a tensor, as SGLang passes
            for kv in (0, 1):
                ptrs.append(self.kv_buffer[kv, i].data_ptr())
                sizes.append(PAGE_BYTES // 2)
        return ptrs, sizes


def backend(socket, pool=None, **cfg):
    s = KvtierHiCacheStorage(config(socket, **cfg), {})
    s.register_mem_pool_host(pool if pool is not None else HostPool(8))
    return s


def chain_keys(n, salt):
    keys, prev = [], salt.encode()
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()
        keys.append(prev.hex())
    return keys


def page(fill):
    return torch.full((PAGE_BYTES // 2,), fill, dtype=torch.bfloat16)


def test_set_get_exists_and_batches_round_trip_bytes(daemon):
    s = backend(daemon.socket)
    keys = chain_keys(4, "a")
    vals = [torch.randint(0, 255, (PAGE_BYTES,), dtype=torch.uint8).view(torch.bfloat16) for _ in keys]
    assert not s.exists(keys[0]) and s.get(keys[0]) is None
    assert s.set(keys[0], vals[0])
    assert s.batch_set(keys[1:], vals[1:])
    assert s.exists(keys[3]) and s.batch_exists(keys) == 4
    assert s.batch_exists(keys[:2] + chain_keys(2, "b")) == 2  # the leading run
    got = s.batch_get(keys)  # no targets: new uint8 tensors
    assert all(torch.equal(g, v.view(torch.uint8)) for g, v in zip(got, vals))
    dst = page(0)
    assert s.get(keys[2], dst) is dst and torch.equal(dst.view(torch.uint8), vals[2].view(torch.uint8))
    assert key_hash(keys[0]) == bytes.fromhex(keys[0]) and len(key_hash("not-hex")) == 32


def test_page_calls_move_bytes_between_the_host_pool_and_kvtier(daemon):
    pool_a, pool_b = HostPool(8), HostPool(8)
    a, b = backend(daemon.socket, pool_a), backend(daemon.socket, pool_b)  # two SGLang instances on the host
    pool_a.kv_buffer.view(torch.int16).random_(0, 1 << 14)
    keys = chain_keys(3, "z")
    src = torch.arange(2 * PAGE_TOKENS, 5 * PAGE_TOKENS)  # host pages 2, 3, 4
    assert a.batch_set_v1(keys, src) == [True] * 3
    assert b.batch_exists(keys) == 3
    dst = torch.arange(0, 3 * PAGE_TOKENS)  # into pages 0, 1, 2 of B's pool
    assert b.batch_get_v1(keys, dst) == [True] * 3
    assert torch.equal(pool_b.kv_buffer[:, :3 * PAGE_TOKENS], pool_a.kv_buffer[:, 2 * PAGE_TOKENS:5 * PAGE_TOKENS])
    # The generic call reads the same bytes: SGLang's flat page.
    assert torch.equal(b.get(keys[1], page(0)), pool_a.get_data_page(3 * PAGE_TOKENS))
    # A missing page ends the usable run: what follows it is not loaded.
    assert b.batch_get_v1([keys[0], chain_keys(1, "nope")[0], keys[2]], dst) == [True, False, False]


def test_another_model_or_rank_is_a_miss(daemon):
    a = backend(daemon.socket)
    keys = chain_keys(2, "m")
    assert a.batch_set(keys, [page(1)] * 2)
    assert backend(daemon.socket, model_name="another").batch_exists(keys) == 0
    assert backend(daemon.socket, tp_rank=1, tp_size=2).batch_exists(keys) == 0
    assert backend(daemon.socket, pp_rank=1, pp_size=2).batch_exists(keys) == 0
    assert backend(daemon.socket).batch_exists(keys) == 2


def test_a_stopped_daemon_costs_a_bounded_miss_and_the_backend_recovers(daemon):
    s = backend(daemon.socket)
    keys = chain_keys(2, "s")
    assert s.batch_set(keys, [page(1)] * 2)
    daemon.signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert s.batch_exists(keys) == 0  # a timeout: a miss, not a hang or an exception
        assert s.batch_get(keys) == [None, None]
        assert s.batch_set(chain_keys(1, "x"), [page(1)]) is False
        assert time.monotonic() - t0 < 6
    finally:
        daemon.signal(signal.SIGCONT)
    # Back once the daemon answers again (the backend's reconnect back-off decides when).
    wait_until(lambda: s.batch_exists(keys) == 2, "the backend finds the blocks again after SIGCONT")


def test_the_backend_subclasses_sglangs_interface_as_the_installed_modules_define_it(daemon):
    storage = sys.modules[sglang_standin.STORAGE]
    assert issubclass(KvtierHiCacheStorage, storage.HiCacheStorage)
    assert "HiCacheStorage" in kvtier.sglang.__doc__
    s = backend(daemon.socket)
    assert s.set(chain_keys(1, "stats")[0], page(3))
    stats = s.get_stats()
    assert isinstance(stats, sys.modules[sglang_standin.METRICS].StorageMetrics)
    assert stats.backup_pgs == [1] and s.get_stats().backup_pgs == []  # since the last read


def test_without_sglang_the_backend_imports_but_refuses_to_be_made_with_a_clear_error():
    # A fresh interpreter, the stand-in not installed: the shipped package carries none.
    probe = ("import sys; sys.modules['sglang'] = None\n"
             "from kvtier.sglang import KvtierHiCacheStorage, key_hash\n"
             "print('hash:', len(key_hash('x')))\n"
             "try:\n    KvtierHiCacheStorage(None, {})\nexcept ImportError as e:\n    print('made:', e)\n"
             "try:\n    import kvtier.sglang.backend\nexcept ImportError as e:\n    print('backend:', e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "hash: 32" in out.stdout, out.stderr
    assert "made: kvtier.sglang is SGLang's HiCache storage backend and needs SGLang installed" in out.stdout, out.stderr
    assert "backend: kvtier.sglang is SGLang's HiCache storage backend and needs SGLang installed" in out.stdout, out.stderr
