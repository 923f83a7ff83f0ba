"""kvtier.vllm under vLLM's call sequence (kvtier.vllm_harness): two engine instances share
blocks through the daemon, KV bytes are exact, failures are misses and load errors."""

import multiprocessing as mp
import signal
import subprocess
import sys

import pytest
import torch

import kvtier
from kvtier_testing import vllm_harness as h  # installs vLLM's interface stand-in where vLLM is absent
from kvtier_testing import vllm_standin

import kvtier.vllm  # noqa: E402
from kvtier_testing.daemon import Daemon, wait_until

BS, LAYERS, HEADS, DIM = 16, 3, 2, 32


def make_engine(socket, dtype=torch.float32, model="test-llm", blocks=64, **extra):
    layers = [torch.zeros(2, blocks, BS, HEADS, DIM, dtype=dtype) for _ in range(LAYERS)]
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    cfg = h.vllm_config(model, LAYERS, HEADS, DIM, name, BS, extra={"socket": socket, "timeout_ms": 2000, **extra})
    return h.Engine(cfg, layers), layers


def fill(layers, block_ids, tokens, start):
    """A stand-in forward pass: token t's KV is a function of (t, its value), so two
    engines computing the same prefix write the same bytes."""
    for li, t in enumerate(layers):
        for pos in range(start, len(tokens)):
            b, off = block_ids[pos // BS], pos % BS
            t[0, b, off] = (tokens[pos] * 7 + li + pos) % 251
            t[1, b, off] = (tokens[pos] * 3 - li) % 241


def prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1000, (n,), generator=g).tolist()


def run(engine, layers, tokens, rid, finish=True):
    """Prefills a request; finished (its stores done before its blocks are freed) unless
    `finish` is False."""
    req = h.Request(rid, list(tokens), BS)
    step, ids = engine.prefill(req, lambda start, table: fill(layers, table, req.all_token_ids, start))
    if finish:
        engine.finish(req, ids)
    return req, step, ids


def test_a_prefix_stored_by_one_instance_is_loaded_exactly_by_another(daemon):
    a, la = make_engine(daemon.socket)
    b, lb = make_engine(daemon.socket)
    p = prompt(200, 1)  # 12 full blocks and a partial one
    req_a, step_a, ids_a = run(a, la, p, "a1")
    assert step_a.external_tokens == 0
    assert a.worker.stats["stored_blocks"] == 12
    # B's prompt shares 150 tokens: 9 full blocks (144 tokens) load, the rest is computed.
    q = p[:150] + prompt(90, 2)
    req_b, step_b, ids_b = run(b, lb, q, "b1")
    assert step_b.external_tokens == 144 and step_b.loaded_tokens == 144
    assert b.worker.stats["loaded_blocks"] == 9
    for t_a, t_b in zip(la, lb):
        for k in range(9):
            assert torch.equal(t_a[:, ids_a[k]], t_b[:, ids_b[k]]), f"block {k} differs"
    # A prompt that is wholly cached still computes its last token (vLLM needs one).
    req_c, step_c, _ = run(b, lb, p[:192], "c1")
    assert step_c.external_tokens == 176
    for e in (a, b):
        e.close()


def test_decode_steps_store_the_blocks_they_fill(daemon):
    a, la = make_engine(daemon.socket)
    req, step, ids = run(a, la, prompt(40, 3), "d1", finish=False)  # 2 full blocks + 8 tokens
    a.flush()
    stored = a.worker.stats["stored_blocks"]
    assert stored == 2
    for i in range(8):  # 8 more tokens fill block 2
        req.output_token_ids.append(5 + i)
        a.decode_step(req, ids, lambda: fill(la, ids, req.all_token_ids, req.num_tokens - 1))
    assert a.finish(req, ids)  # held: it had stores
    assert a.worker.stats["stored_blocks"] == 3
    b, lb = make_engine(daemon.socket)
    assert run(b, lb, req.all_token_ids + [1, 2], "d2")[1].external_tokens == 48
    a.close()
    b.close()


def test_another_layout_or_dtype_or_model_is_a_miss_never_foreign_bytes(daemon):
    a, la = make_engine(daemon.socket)
    p = prompt(100, 4)
    run(a, la, p, "m1")
    for kwargs in ({"dtype": torch.bfloat16}, {"model": "other-llm"}):
        b, lb = make_engine(daemon.socket, **kwargs)
        _, step, _ = run(b, lb, p, "m2")
        assert step.external_tokens == 0 and b.worker.stats["loaded_blocks"] == 0
        b.close()
    a.close()


def test_blocks_gone_between_lookup_and_load_are_reported_as_load_errors(daemon):
    a, la = make_engine(daemon.socket)
    p = prompt(100, 5)
    run(a, la, p, "e1")
    b, lb = make_engine(daemon.socket)
    req = h.Request("e2", list(p), BS)
    for _ in range(10000):  # the lookup runs on the connector's thread: ask until it answers, as vLLM does
        ext, _ = b.scheduler.get_num_new_matched_tokens(req, 0)
        if ext is not None:
            break
    assert ext == 96
    # Evicted after the scheduler's lookup, before the worker's load.
    r = subprocess.run([__import__("os").path.join(__import__("os").environ["KVTIER_BIN_DIR"], "kvctl"), "evict",
                        "--tier", "host", "--bytes", "1GiB", "-s", daemon.socket], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ids = b.allocate(7)
    b._block_index = {x: i for i, x in enumerate(ids)}
    b.scheduler.update_state_after_alloc(req, h.KVCacheBlocks(ids), ext)
    meta = b.scheduler.build_connector_meta(h.SchedulerOutput(
        [h.NewRequestData("e2", p, (ids,), ext)], h.CachedRequestData(), {"e2": 100 - ext}))
    b.worker.bind_connector_metadata(meta)
    b.worker.start_load_kv(None)
    assert b.worker.get_block_ids_with_load_errors() == set(ids[:6])
    assert b.worker.get_block_ids_with_load_errors() == set()  # reported once
    a.close()
    b.close()


def wait_for_nvme_blocks(socket, n, timeout_s=10.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        t = kvtier.ControlClient(socket).stats()["tiers"].get("nvme", {})
        if t.get("ready") and t.get("blocks", 0) >= n and t.get("inflight_pages", 1) == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"NVMe did not hold {n} blocks within {timeout_s} s")


def test_a_daemon_that_is_gone_is_a_miss_and_the_connector_reconnects_when_it_is_back(tmp_path):
    d = Daemon(page_bytes=64 << 10, pages=128, nvme_bytes=32 << 20)
    try:
        a, la = make_engine(d.socket)
        p = prompt(120, 6)
        run(a, la, p, "r1")
        wait_for_nvme_blocks(d.socket, 7)  # written through before the crash
        d.kill9()
        # Gone: lookups miss at once, stores fail quietly, nothing raises.
        _, step, _ = run(a, la, p[:100] + [7, 8, 9], "r2")
        assert step.external_tokens == 0
        d.start()  # warm restart: the index survives (write-through to NVMe)
        # Past the reconnect back-off (it grows with the failures of the run above).
        for c in (*a.scheduler.clients, *a.worker.clients):
            wait_until(c.available, "the connectors reach the restarted kvtierd")
        _, step, _ = run(a, la, p, "r3")
        assert step.external_tokens == 112, "hits resume from the warm index without restarting the engine"
        assert a.scheduler.clients[0].reconnects >= 1
        a.close()
    finally:
        d.close()


def test_the_connector_subclasses_vllms_interface_as_the_installed_modules_define_it():
    assert "KVConnectorBase_V1" in kvtier.vllm.__doc__
    base = sys.modules[vllm_standin.BASE]
    assert kvtier.vllm.KVConnectorBase_V1 is base.KVConnectorBase_V1
    assert issubclass(kvtier.vllm.KvtierConnector, base.KVConnectorBase_V1)
    assert issubclass(kvtier.vllm.KvtierConnector, base.SupportsHMA)


def test_without_vllm_the_connector_imports_but_refuses_to_be_made_with_a_clear_error():
    # A fresh interpreter, the stand-in not installed: the shipped package carries none, so
    # the class imports (a deployment check, a config naming it) and making one fails.
    probe = ("import sys; sys.modules['vllm'] = None\n"
             "from kvtier.vllm import KvtierConnector\n"
             "try:\n    KvtierConnector(None, None)\nexcept ImportError as e:\n    print('made:', e)\n"
             "try:\n    import kvtier.vllm.scheduler\nexcept ImportError as e:\n    print('scheduler:', e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "made: kvtier.vllm is vLLM's KV connector and needs vLLM installed" in out.stdout, out.stderr
    assert "scheduler: kvtier.vllm is vLLM's KV connector and needs vLLM installed" in out.stdout, out.stderr
