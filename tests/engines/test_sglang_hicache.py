"""kvtier's HiCache backend driven by the installed SGLang's own classes against a real
kvtierd: SGLang's StorageBackendFactory builds it from HiCacheStorageConfig, SGLang's real
host pools (MHATokenToKVPoolHost in every layout, MLATokenToKVPoolHost, MambaPoolHost, on
CPU tensors) hold the KV, and SGLang's HiCacheController methods make the calls (its
backup, hit query, page transfer and prefetch thread, with the generic or the page
interface as its attach step picks them). What is not SGLang's here: the controller is
made without its __init__/attach (they need torch.distributed groups and a device pool),
so each test sets the attributes those methods read and the get/set functions attach
would pick; the v2 calls of the hybrid controller are made directly with SGLang's
PoolTransfer objects."""

import json
import logging
import os
import queue
import re
import threading
import time

import msgspec
import pytest
import torch
import zmq
from sglang.srt.disaggregation.kv_events import BlockStored, KVEventBatch
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation, StorageOperation
from sglang.srt.mem_cache.device_pool_info import (KVBufferLayout, KVBuffers, MambaStateBufferInfo, MHABufferInfo,
                                                   MLABufferInfo)
from sglang.srt.mem_cache.hicache_storage import (STORAGE_BATCH_SIZE, HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo, PoolHitPolicy, PoolName, PoolTransfer,
                                                  PoolTransferResult)
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_storage_hash_str, hash_str_to_int64
from sglang.srt.observability.metrics_collector import StorageMetrics, StorageMetricsCollector

import kvtier
from kvtier_testing.daemon import Daemon

PAGE, LAYERS, HEADS, DIM, KV_DIM = 16, 2, 4, 8, 72
MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- SGLang's host pools on CPU tensors ----
def mha_pool(layout, tokens=640, heads=HEADS, layers=LAYERS):
    def bufs():
        return tuple(torch.zeros(tokens + PAGE, heads, DIM, dtype=torch.bfloat16) for _ in range(layers))

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    k, v = bufs(), bufs()
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=heads, head_dim=DIM, v_head_dim=DIM, dtype=torch.bfloat16,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers)


def mla_pool(layout, tokens=640):
    bufs = tuple(torch.zeros(tokens + PAGE, 1, KV_DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    info = MLABufferInfo(buffers=bufs, data_ptrs=torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
                         layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS, page_size=PAGE,
                         kv_lora_rank=KV_DIM - 8, qk_rope_head_dim=8, kv_cache_dim=KV_DIM, dtype=torch.bfloat16,
                         device=torch.device("cpu"))
    return MLATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=LAYERS,
                                target_layer_num=LAYERS)


def mamba_pool(slots=32):
    info = MambaStateBufferInfo(temporal=torch.zeros(LAYERS, slots, 4, 8, dtype=torch.float32),
                                conv=(torch.zeros(LAYERS, slots, 3, 16, dtype=torch.bfloat16),))
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu", layout="page_first")


def fill_random(pool, indices, seed):
    """Random bytes into the pool's pages at `indices`, through the pool's own setter."""
    g = torch.Generator().manual_seed(seed)
    page = int(getattr(pool, "page_size", 1) or 1)
    for i in range(0, len(indices), page):
        dummy = pool.get_dummy_flat_data_page()
        raw = dummy.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
        if dummy.is_floating_point():  # no NaN/inf bit patterns: compare by bytes anyway
            dummy.nan_to_num_(0.0, 0.0, 0.0)
        pool.set_from_flat_data_page(int(indices[i]), dummy)


def page_bytes(pool, indices):
    page = int(getattr(pool, "page_size", 1) or 1)
    return [pool.get_data_page(int(indices[i]), flat=True).contiguous().view(torch.uint8).clone()
            for i in range(0, len(indices), page)]


# ---- the backend, as SGLang's factory builds it ----
def storage_config(socket, pool=None, interface_v1=True, **kw):
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
             "socket": socket, "timeout_ms": 3000}
    if interface_v1:
        extra["interface_v1"] = 1
    base = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
                enable_storage_metrics=True, is_page_first_layout=getattr(pool, "layout", "") == "page_first",
                model_name="tiny-model", extra_config=extra)
    base.update(kw)
    return HiCacheStorageConfig(**base)


def sglang(socket, pool, interface_v1=True, **kw):
    """The backend as SGLang's factory builds it, in SGLang's HiCacheController with what
    its storage methods read, and the get/set functions its attach step picks for a
    dynamic backend."""
    config = storage_config(socket, pool, interface_v1, **kw)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    ctl = HiCacheController.__new__(HiCacheController)
    ctl.storage_backend, ctl.storage_config = backend, config
    ctl.mem_pool_host = ctl.storage_host_pool = pool
    ctl.page_size = pool.page_size
    ctl.prefetch_sync_queue, ctl.prefetch_queue, ctl.prefetch_hit_queue = queue.Queue(), queue.Queue(), queue.Queue()
    ctl.prefetch_hits_sync_groups = []
    ctl.storage_stop_event = threading.Event()
    if bool(config.extra_config.get("interface_v1", 0)):  # attach_storage_backend's test
        ctl.page_get_func, ctl.page_set_func = ctl._page_get_zero_copy, ctl._page_set_zero_copy
    else:
        ctl.page_get_func, ctl.page_set_func = ctl._generic_page_get, ctl._generic_page_set
    return ctl


def tokens_for(pages, salt):
    return [(salt * 7919 + i * 31) % 30000 + 5 for i in range(pages * PAGE)]


def backup(ctl, pool, tokens, seed):
    """SGLang's write-back of `tokens` from the host pool: the bytes it wrote."""
    idx = pool.alloc(len(tokens))
    fill_random(pool, idx, seed)
    want = page_bytes(pool, idx)
    hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
    op = StorageOperation(idx, tokens, hash_value=hashes, prefix_keys=[])
    ctl._page_backup(op)
    assert op.completed_tokens == len(tokens)
    pool.free(idx)
    return hashes, want


def prefetch(ctl, pool, tokens):
    """SGLang's prefetch of `tokens`: hit query, then page transfer into fresh host pages.
    The bytes of each page it loaded."""
    op = PrefetchOperation("req", tokens, None, prefix_keys=[])
    hashes, hit_tokens = ctl._storage_hit_query(op)
    op.hash_value = hashes
    if hit_tokens == 0:
        return []
    op.host_indices = pool.alloc(hit_tokens)
    done = ctl._page_transfer(op)
    got = page_bytes(pool, op.host_indices[:done * PAGE])
    pool.free(op.host_indices)
    return got


def daemon_holds_nothing(socket):
    host = kvtier.ControlClient(socket).stats()["tiers"]["host"]
    return host["leased_pages"] == 0 and host["referenced_pages"] == 0


# ---- 1. the prefetch thread on a fresh backend ----
def test_the_prefetch_thread_answers_on_a_fresh_backend_and_after_a_store(daemon, caplog):
    pool = mha_pool("page_first")
    ctl = sglang(daemon.socket, pool)
    thread = threading.Thread(target=ctl.prefetch_thread_func, daemon=True)
    thread.start()
    tokens = tokens_for(40, 1)
    try:
        with caplog.at_level(logging.ERROR):
            ctl.prefetch_queue.put(PrefetchOperation("fresh", tokens, None, prefix_keys=[]))
            first = ctl.prefetch_hit_queue.get(timeout=20)
            assert first.storage_hit_count == 0
            backup(ctl, pool, tokens, seed=1)
            ctl.prefetch_queue.put(PrefetchOperation("again", tokens, None, prefix_keys=[]))
            second = ctl.prefetch_hit_queue.get(timeout=20)
        assert second.storage_hit_count == len(tokens)
        assert thread.is_alive()
        assert not [r for r in caplog.records if "storage query failed" in r.getMessage()], caplog.text
    finally:
        ctl.storage_stop_event.set()
        thread.join(timeout=10)


# ---- 2. --enable-metrics ----
def test_get_stats_is_sglangs_storage_metrics_which_its_collector_logs(daemon):
    pool = mha_pool("page_first")
    ctl = sglang(daemon.socket, pool)
    backend = ctl.storage_backend
    tokens = tokens_for(10, 2)
    backup(ctl, pool, tokens, seed=2)
    assert len(prefetch(ctl, pool, tokens)) == 10
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert sum(stats.backup_pgs) == 10 and sum(stats.prefetch_pgs) == 10
    assert all(b > 0 for b in stats.prefetch_bandwidth + stats.backup_bandwidth)
    StorageMetricsCollector(labels={"model_name": "tiny-model"}).log_storage_metrics(stats)  # asserts its type
    again = backend.get_stats()
    assert again.prefetch_pgs == [] and again.backup_pgs == []


# ---- 3. the documented config uses the page interface ----
def test_the_documented_config_selects_sglangs_page_interface():
    docs = open(os.path.join(ROOT, "docs", "integrations.md")).read()
    found = re.search(r"--hicache-storage-backend-extra-config '(\{.*?\})'", docs, re.S)
    assert found, "docs/integrations.md shows no --hicache-storage-backend-extra-config"
    extra = json.loads(found.group(1))
    assert extra["module_path"] == "kvtier.sglang" and extra["class_name"] == "KvtierHiCacheStorage"
    # HiCacheController.attach_storage_backend's test for a dynamic backend.
    assert bool(extra.get("interface_v1", 0))
    import kvtier.sglang

    doc = json.loads(re.search(r"extra-config '(\{.*?\})'", kvtier.sglang.__doc__, re.S).group(1))
    assert bool(doc.get("interface_v1", 0))


# ---- 4. a page written by one interface is read byte-equal by the other ----
@pytest.mark.parametrize("kind,layout", [("mha", lay) for lay in MHA_LAYOUTS] + [("mla", lay) for lay in MLA_LAYOUTS])
def test_a_page_written_by_one_interface_reads_byte_equal_through_the_other(daemon, kind, layout):
    make = mha_pool if kind == "mha" else mla_pool
    mla = kind == "mla"
    for n, (write_v1, read_v1) in enumerate([(False, True), (True, False)]):
        writer_pool, reader_pool = make(layout), make(layout)
        writer = sglang(daemon.socket, writer_pool, write_v1, is_mla_model=mla)
        reader = sglang(daemon.socket, reader_pool, read_v1, is_mla_model=mla)
        tokens = tokens_for(6, 10 + n)
        _, want = backup(writer, writer_pool, tokens, seed=10 + n)
        got = prefetch(reader, reader_pool, tokens)
        assert len(got) == 6
        assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{layout}: v1 write {write_v1}, v1 read {read_v1}"
    assert daemon_holds_nothing(daemon.socket)


# ---- 5. ranks, draft and side pools, batches, split heads ----
@pytest.mark.parametrize("other,hit", [
    (dict(pp_rank=1, pp_size=2), False),      # another pipeline stage: other layers
    (dict(attn_cp_rank=1, attn_cp_size=2), False),
    (dict(tp_rank=1, tp_size=2), False),      # MHA: another rank's heads
    (dict(dp_rank=3), True),                  # DP attention groups hold the same heads
])
def test_each_rank_slice_has_its_own_pages(daemon, other, hit):
    pool = mha_pool("page_first")
    tokens = tokens_for(4, 20)
    base = dict(pp_size=other.get("pp_size", 1), attn_cp_size=other.get("attn_cp_size", 1),
                tp_size=other.get("tp_size", 1))
    backup(sglang(daemon.socket, pool, **base), pool, tokens, seed=20)
    second_pool = mha_pool("page_first")
    second = sglang(daemon.socket, second_pool, **{**base, **other})
    assert len(prefetch(second, second_pool, tokens)) == (4 if hit else 0)


def test_mla_pages_are_shared_by_tp_ranks_but_not_by_pipeline_stages(daemon):
    pool = mla_pool("page_first")
    writer = sglang(daemon.socket, pool, is_mla_model=True, tp_size=2)
    tokens = tokens_for(3, 21)
    _, want = backup(writer, pool, tokens, seed=21)
    rank1_pool = mla_pool("page_first")
    rank1 = sglang(daemon.socket, rank1_pool, is_mla_model=True, tp_rank=1, tp_size=2)
    got = prefetch(rank1, rank1_pool, tokens)
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, want))
    stage1_pool = mla_pool("page_first")
    stage1 = sglang(daemon.socket, stage1_pool, is_mla_model=True, pp_rank=1, pp_size=2)
    assert prefetch(stage1, stage1_pool, tokens) == []


def test_parent_links_cross_sglangs_batches_and_events_use_sglangs_ids_and_page_size(tmp_path):
    endpoint = f"ipc://{tmp_path}/events.sock"
    with Daemon(page_bytes=64 << 10, pages=1024,
                extra_yaml=f"events: {{publish: '{endpoint}', flush_interval: 5ms}}\n") as d:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        time.sleep(0.5)
        pool = mha_pool("page_first", tokens=3 * STORAGE_BATCH_SIZE * PAGE)
        ctl = sglang(d.socket, pool, extra_config={
            "backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
            "socket": d.socket, "interface_v1": 1, "routable_id": "10.0.0.9:30000"})
        pages = STORAGE_BATCH_SIZE + 5
        tokens = tokens_for(pages, 30)
        hashes, _ = backup(ctl, pool, tokens, seed=30)
        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)  # SGLang's own event classes
        stored, topics, deadline = [], set(), time.monotonic() + 10
        while len(stored) < pages and time.monotonic() < deadline:
            if not sub.poll(100):
                continue
            topic, _, payload = sub.recv_multipart()
            topics.add(topic.decode())
            for e in decoder.decode(payload).events:
                assert isinstance(e, BlockStored)
                assert e.block_size == PAGE
                stored.extend(zip([e.parent_block_hash] + e.block_hashes[:-1], e.block_hashes))
        sub.close(linger=0)
        ctx.term()
    ids = [hash_str_to_int64(h) for h in hashes]
    assert [h for _, h in stored] == ids
    assert [p for p, _ in stored] == [None] + ids[:-1], "a batch's first page lost its parent"
    assert topics == {"kv@10.0.0.9:30000@tiny-model"}


def test_draft_and_side_pools_go_through_the_v2_calls_with_sglangs_hit_policies(daemon):
    kv = mha_pool("page_first")
    draft = mha_pool("page_first", layers=1)  # the draft model's KV: another page size
    mamba = mamba_pool()
    ctl = sglang(daemon.socket, kv)
    backend = ctl.storage_backend
    backend.register_mem_host_pool_v2(draft, PoolName.DRAFT)
    backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    backend.on_host_pools_registered()
    tokens = tokens_for(5, 40)
    hashes, _ = backup(ctl, kv, tokens, seed=40)
    draft_idx = draft.alloc(5 * PAGE)
    fill_random(draft, draft_idx, 41)
    mamba_idx = mamba.alloc(1)
    fill_random(mamba, mamba_idx, 42)
    want_draft, want_mamba = page_bytes(draft, draft_idx), page_bytes(mamba, mamba_idx)
    extra = HiCacheStorageExtraInfo(prefix_keys=[])
    # Mamba keeps the state of the last page only (a trailing pool).
    put = backend.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=draft_idx, keys=hashes),
                                PoolTransfer(name=PoolName.MAMBA, host_indices=mamba_idx, keys=hashes[-1:],
                                             hit_policy=PoolHitPolicy.TRAILING_PAGES)], extra)
    assert put == {"draft": [True] * 5, "mamba": [True]}
    query = [PoolTransfer(name=PoolName.DRAFT, keys=hashes),
             PoolTransfer(name=PoolName.MAMBA, keys=hashes[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    result = backend.batch_exists_v2(hashes, query, extra)
    assert isinstance(result, PoolTransferResult)
    assert result.kv_hit_pages == 5 and result.restorable_prefix_pages == [5]
    assert result.extra_pool_hit_pages == {"kv": 5, "draft": 5, "mamba": 5}
    # A prefix that ends where no Mamba state was stored is not restorable.
    assert backend.batch_exists_v2(hashes[:4], query, extra).kv_hit_pages == 0
    new_draft, new_mamba = draft.alloc(5 * PAGE), mamba.alloc(1)
    got = backend.batch_get_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=new_draft, keys=hashes),
                                PoolTransfer(name=PoolName.MAMBA, host_indices=new_mamba, keys=hashes[-1:])], extra)
    assert got == {"draft": [True] * 5, "mamba": [True]}
    assert all(torch.equal(a, b) for a, b in zip(page_bytes(draft, new_draft), want_draft))
    assert torch.equal(page_bytes(mamba, new_mamba)[0], want_mamba[0])
    # Indices that do not match the keys: refused, nothing held.
    bad = backend.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=draft_idx[:PAGE], keys=hashes)], extra)
    assert bad == {"draft": [False] * 5}
    assert daemon_holds_nothing(daemon.socket)


def test_heterogeneous_tp_splits_a_page_into_the_heads_of_each_smaller_rank(daemon):
    # One rank at TP 1 (4 heads) and the two ranks of TP 2 (2 heads each): tp_lcm_size 2.
    wide = mha_pool("page_head", heads=4)
    writer = sglang(daemon.socket, wide, tp_lcm_size=2, should_split_heads=True)
    tokens = tokens_for(3, 50)
    _, want = backup(writer, wide, tokens, seed=50)
    mine = prefetch(writer, wide, tokens)  # its split pages, read back whole
    assert len(mine) == 3 and all(torch.equal(a, b) for a, b in zip(mine, want))
    for rank in (0, 1):
        narrow = mha_pool("page_head", heads=2)
        got = prefetch(sglang(daemon.socket, narrow, tp_rank=rank, tp_size=2, tp_lcm_size=2), narrow, tokens)
        assert len(got) == 3
        # page_head pages are [k|v][head][token][layer][dim]: rank r holds heads 2r and 2r+1.
        for page, whole in zip(got, want):
            heads = whole.view(2, 4, -1)[:, 2 * rank:2 * rank + 2]
            assert torch.equal(page.view(2, 2, -1), heads)


# ---- 6. values and targets of the wrong size ----
def test_wrong_sized_values_and_targets_fail_and_hold_nothing(daemon):
    pool = mha_pool("page_first")
    backend = sglang(daemon.socket, pool).storage_backend
    keys = get_storage_hash_str(tokens_for(2, 60), None, page_size=PAGE)
    page = pool.get_dummy_flat_data_page()
    for _ in range(300):
        assert backend.batch_set(keys, [page, page[:-1]]) is False
        assert backend.batch_set(keys[:1], [torch.zeros(7, dtype=torch.bfloat16)]) is False
    assert daemon_holds_nothing(daemon.socket)
    assert backend.batch_set(keys, [page, page]) is True
    assert backend.batch_get(keys, [page.clone(), page[:-1].clone()])[1] is None
    assert backend.batch_get(keys, [page.clone(), page.clone()])[1] is not None
    assert backend.batch_get_v1(keys, torch.arange(PAGE)) == [False, False]  # one page of indices for two keys
    assert daemon_holds_nothing(daemon.socket)
