"""kvtier.vllm driven by the installed vLLM: its Scheduler, Request and block hasher, its
connector factory loading kvtier.vllm by module path, its KV cache views for each layout,
against real kvtierd processes (kvtier_testing.vllm_engine says what stands in for the
model). Every run is compared token for token with the same vLLM scheduler without kvtier.
"""

import signal
import threading
import time

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.v1.kv_cache_layout import KVCacheLayout

import kvtier
import kvtier.vllm
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvtier_testing.vllm_engine import (BLOCK, Engine, prompt, reference, restart_before_the_load_of, serve,
                                       vllm_config)

# Layouts whose block of one layer is one dense run (vLLM's layer- or block-outermost
# pages); the others put heads outside blocks, which kvtier refuses by name.
SUPPORTED = [KVCacheLayout.LBHNC, KVCacheLayout.LBNHC, KVCacheLayout.BLHNC, KVCacheLayout.BLNHC]
REFUSED = [KVCacheLayout.LHBNC, KVCacheLayout.BHLNC]


def test_vllm_loads_kvtier_as_its_own_connector(model_dir, daemon):
    assert issubclass(kvtier.vllm.KvtierConnector, KVConnectorBase_V1)
    e = Engine(vllm_config(model_dir, daemon.socket), 64)
    try:
        assert isinstance(e.connector, kvtier.vllm.KvtierConnector)
        assert isinstance(e.worker, kvtier.vllm.KvtierConnector)
        handshake = e.worker.get_handshake_metadata()
        assert isinstance(handshake, kvtier.vllm.KvtierHandshake) and len(handshake.groups) == 1
        layout = handshake.groups[0]
        assert layout.kind == "full_attention" and layout.group == 0
        assert layout.layers == 2 and layout.kv_heads == 2 and layout.head_dim == 16 and layout.tokens_per_block == 16
        assert "|HNC|tp0of1|pp0of1" in layout.model and layout.kv_layout == "paged"
        assert e.connector.requires_kv_delivery is False
    finally:
        e.close()


LAYERWISE = {"layerwise_loads": True}


@pytest.mark.parametrize("layerwise", [False, True], ids=["whole", "layerwise"])
@pytest.mark.parametrize("layout", SUPPORTED, ids=lambda l: l.name)
def test_a_prefix_one_instance_computed_is_loaded_exactly_by_another(model_dir, daemon, layout, layerwise):
    # layerwise: B's loads move layer by layer while its forward runs, each layer waited for
    # by the stand-in model as vLLM's attention layers wait (wait_for_layer_load).
    p = prompt(300, 1)  # 18 full blocks and a partial one
    q = p[:260] + prompt(60, 2)  # shares 16 full blocks with p
    want = reference(model_dir, [("a", p, 8), ("b", q, 8)])
    a = Engine(vllm_config(model_dir, daemon.socket), 128, layout)
    b = Engine(vllm_config(model_dir, daemon.socket, extra=LAYERWISE if layerwise else None), 128, layout)
    try:
        assert serve(a, [("a", p, 8)]) == {"a": want["a"]}
        assert a.connector_stats.get("stored_blocks", 0) >= 18
        got = serve(b, [("b", q, 8)])
        assert got == {"b": want["b"]}
        assert b.connector_stats["layer_load_steps"] == (1 if layerwise else 0)
        assert b.connector_stats["loaded_blocks"] == 16
        assert b.connector_stats["load_failed_blocks"] == 0
        for i in range(16):  # the bytes B loaded are the bytes A computed
            assert b.block_bytes("b", i) == a.block_bytes("a", i)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("layout", REFUSED, ids=lambda l: l.name)
def test_layouts_with_heads_outside_blocks_are_refused_by_name(model_dir, daemon, layout):
    with pytest.raises(kvtier.InvalidArgumentError, match="dense run"):
        Engine(vllm_config(model_dir, daemon.socket), 64, layout)


def test_different_layouts_never_share_blocks(model_dir, daemon):
    """Token-major and head-major pages hold other bytes for the same tokens: a miss."""
    p = prompt(200, 3)
    a = Engine(vllm_config(model_dir, daemon.socket), 64, KVCacheLayout.LBHNC)
    b = Engine(vllm_config(model_dir, daemon.socket), 64, KVCacheLayout.LBNHC)
    try:
        serve(a, [("a", p, 2)])
        serve(b, [("b", p, 2)])
        assert b.connector_stats.get("loaded_blocks", 0) == 0
        assert b.connector_stats["hit_blocks"] == 0
    finally:
        a.close()
        b.close()


def test_preempted_requests_load_again_and_generate_what_vllm_alone_does(model_dir, daemon):
    # 3 requests of 160 prompt + 120 output tokens (18 blocks each at the end) in 40
    # blocks: vLLM must preempt. A resumed request is looked up and loaded again.
    reqs = [(f"r{i}", prompt(160, 10 + i), 120) for i in range(3)]
    want = reference(model_dir, reqs)
    e = Engine(vllm_config(model_dir, daemon.socket), 40)
    try:
        got = serve(e, reqs)
        assert e.preempted, "vLLM preempted nothing: the test needs a smaller KV budget"
        assert got == want
        assert e.connector_stats["loaded_blocks"] > 0
        assert e.connector_stats["load_failed_blocks"] == 0
    finally:
        e.close()


def test_a_failed_load_is_recomputed_and_stored_again_but_nothing_computed_over_it(model_dir, daemon):
    # B's load fails (kvtierd restarted empty); the step computed over the missing blocks
    # stores nothing; vLLM recomputes the request from its first failed block and B stores
    # the recomputed blocks, which C loads, computing what vLLM alone computes.
    p = prompt(320, 4)
    want = reference(model_dir, [("a", p, 6), ("b", p, 6), ("c", p, 6)])
    a = Engine(vllm_config(model_dir, daemon.socket), 128)
    b = Engine(vllm_config(model_dir, daemon.socket), 128)
    c = Engine(vllm_config(model_dir, daemon.socket), 128)
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want["a"]}
        hook, fired = restart_before_the_load_of(daemon, "b")
        assert serve(b, [("b", p, 6)], before_worker=hook) == {"b": want["b"]}
        assert fired
        assert b.connector_stats["load_failed_blocks"] > 0
        assert b.connector_stats["stores_skipped_after_failed_load"] > 0
        assert b.connector_stats["stored_blocks"] == 20  # the recomputed prompt, once
        assert serve(c, [("c", p, 6)]) == {"c": want["c"]}
        assert c.connector_stats["loaded_blocks"] == 19  # all but the block of the last token
    finally:
        for e in (a, b, c):
            e.close()


def test_a_neighbours_stores_wait_for_a_failed_load_to_settle_and_are_kept(model_dir, daemon):
    # B's step has two requests: "b" loads a prefix A stored (its load fails: kvtierd
    # restarted empty before the worker loads) and "n" computes a prompt of its own and
    # finishes in that step (one token). The step's stores wait for the load to settle:
    # b's are dropped (vLLM recomputes b, whose recomputed blocks are stored after), n's
    # are kept, though n finished, and C finds them.
    p, q = prompt(320, 14), prompt(320, 15)  # 20 full blocks each
    want = reference(model_dir, [("a", p, 6), ("b", p, 6), ("n", q, 1), ("c", q, 6)])
    a = Engine(vllm_config(model_dir, daemon.socket), 128)
    # Lookups answered within the scheduler's call: both requests start in B's first step.
    b = Engine(vllm_config(model_dir, daemon.socket, extra={"lookup_wait_ms": 2000}), 128)
    c = Engine(vllm_config(model_dir, daemon.socket), 128)
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want["a"]}
        hook, fired = restart_before_the_load_of(daemon, "b")
        failing_step = []

        def both_in_one_step(out):
            if not fired and "b" in out.num_scheduled_tokens:
                assert "n" in out.num_scheduled_tokens, "the test needs b and n in one step"
                failing_step.append(True)
            hook(out)

        got = serve(b, [("b", p, 6), ("n", q, 1)], before_worker=both_in_one_step)
        assert fired and failing_step and got == {"b": want["b"], "n": want["n"]}
        assert b.finished["n"] is not None
        assert b.connector_stats["stores_skipped_after_failed_load"] >= 1  # b's, computed over the failure
        assert b.connector_stats["stored_blocks"] == 20 + 20  # n's, and b's recomputed ones
        assert serve(c, [("c", q, 6)]) == {"c": want["c"]}
        assert c.connector_stats["loaded_blocks"] == 19  # all but the block holding the last token
    finally:
        for e in (a, b, c):
            e.close()


def test_stores_held_for_a_load_the_scheduler_never_settles_are_dropped_and_their_requests_freed(model_dir, daemon):
    # As above, but the report of B's first step (b's load landed) never reaches the
    # scheduler: its worker metadata is lost on the way. The worker then holds every later
    # store, b's and n's, for a load that never settles; after SETTLE_STEPS steps it drops
    # them (nothing computed over an unconfirmed load is stored) and reports b and n
    # finished, so vLLM frees their blocks and the engine drains instead of holding them
    # for ever.
    from kvtier.vllm.worker import SETTLE_STEPS

    p, q = prompt(320, 14), prompt(320, 15)
    want = reference(model_dir, [("a", p, 6), ("b", p, 6), ("n", q, 1)])
    a = Engine(vllm_config(model_dir, daemon.socket), 128)
    b = Engine(vllm_config(model_dir, daemon.socket, extra={"lookup_wait_ms": 2000}), 128)
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want["a"]}
        lost, steps = [], []

        def lose_the_report_of_bs_load(outputs):
            steps.append(1)
            for o in outputs:
                meta = o.kv_connector_output.kv_connector_worker_meta
                if not lost and meta is not None and "b" in meta.loads:
                    o.kv_connector_output.kv_connector_worker_meta = None
                    lost.append(len(steps))

        got = serve(b, [("b", p, 6), ("n", q, 1)], after_worker=lose_the_report_of_bs_load, seconds=60)
        assert lost and got == {"b": want["b"], "n": want["n"]}
        assert len(steps) > SETTLE_STEPS  # drained only once the held stores were dropped
        assert b.connector_stats["stores_dropped_unsettled"] >= 20  # n's 20 blocks at least
        assert b.connector_stats["stored_blocks"] == 0
    finally:
        for e in (a, b):
            e.close()


def test_under_vllms_fail_policy_a_failed_load_fails_the_request_and_stores_nothing(model_dir, daemon):
    p = prompt(320, 5)
    a = Engine(vllm_config(model_dir, daemon.socket), 128)
    b = Engine(vllm_config(model_dir, daemon.socket, policy="fail"), 128)
    try:
        serve(a, [("a", p, 4)])
        hook, fired = restart_before_the_load_of(daemon, "b")
        serve(b, [("b", p, 4)], before_worker=hook)
        assert fired
        assert str(b.finished["b"]).lower().endswith("error")
        assert b.connector_stats.get("stored_blocks", 0) == 0
        assert b.connector_stats["stores_skipped_after_failed_load"] > 0
    finally:
        a.close()
        b.close()


def test_a_stalled_daemon_never_stalls_the_scheduler(model_dir, daemon):
    e = Engine(vllm_config(model_dir, daemon.socket), 64)
    try:
        e.add("r", prompt(200, 6), 2)
        daemon.signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            out = e.scheduler.schedule()  # the lookup is in flight: "not yet", the request waits
            took = time.monotonic() - t0
            assert took < 1.0, f"schedule() took {took:.2f} s with kvtierd stopped (timeout 3 s)"
            assert out.scheduled_new_reqs == []
        finally:
            daemon.signal(signal.SIGCONT)
        e.run()
        assert len(e.outputs["r"]) == 2
    finally:
        e.close()


def test_a_request_that_finishes_while_its_blocks_are_copied_keeps_them_until_the_copy_is_done(model_dir, daemon):
    p = prompt(300, 11)  # 18 full blocks
    q = p[:290] + prompt(30, 12)  # shares them all
    want = reference(model_dir, [("a", p, 1), ("b", q, 4)])
    a = Engine(vllm_config(model_dir, daemon.socket), 64)
    b = Engine(vllm_config(model_dir, daemon.socket), 64)
    pool = a.scheduler.kv_cache_manager.block_pool
    free = pool.get_num_free_blocks()
    try:
        a.add("a", p, 1)  # one step: the prompt and its one token
        stopped = []

        def stop_kvtierd(out):  # after the scheduler's lookup, before the worker's step
            if "a" in out.num_scheduled_tokens and not stopped:
                daemon.signal(signal.SIGSTOP)
                stopped.append(time.monotonic())

        try:
            for _ in range(100):
                if a.step(stop_kvtierd) == ["a"]:
                    break
            assert stopped and a.outputs["a"] == want["a"]
            for _ in range(3):  # steps go on (the step did not wait for the copy) ...
                a.step()
            # ... and vLLM keeps the finished request's blocks while its stores are copied (a
            # pending free: vLLM waits for it rather than preempt)
            assert "a" in a.scheduler.requests and pool.get_num_free_blocks() < free
            assert a.connector.has_pending_block_frees()
            assert time.monotonic() - stopped[0] < 2.0, "within the client's 3 s timeout"
        finally:
            daemon.signal(signal.SIGCONT)
        a.run()  # the copy ends, the worker reports it sent, vLLM frees the blocks
        assert "a" not in a.scheduler.requests and pool.get_num_free_blocks() == free
        assert not a.connector.has_pending_block_frees()
        assert a.connector_stats["stored_blocks"] == 18 and a.connector_stats["store_refused_blocks"] == 0
        assert 0 < a.connector_stats["blocking_s"] < a.connector_stats["step_s"]
        assert serve(b, [("b", q, 4)]) == {"b": want["b"]}
        assert b.connector_stats["loaded_blocks"] == 18
        for i in range(18):  # what was copied after the request finished is what it computed
            assert b.block_bytes("b", i) == a.block_bytes("a", i)
    finally:
        a.close()
        b.close()


def test_blocks_vllm_hands_out_again_wait_for_the_copies_still_reading_them(model_dir, daemon):
    # As in the preemption test: 3 requests in 40 blocks. kvtierd is stopped from the first
    # step on, so every store stays queued; when vLLM preempts a request, its blocks go to
    # another in the same step, and the step must wait for their copies before it writes.
    reqs = [(f"r{i}", prompt(160, 30 + i), 120) for i in range(3)]
    ref = Engine(vllm_config(model_dir, None), 256)
    for rid, p, n in reqs:
        ref.add(rid, p, n)
    ref.run()
    a = Engine(vllm_config(model_dir, daemon.socket), 40)
    b = Engine(vllm_config(model_dir, daemon.socket), 256)
    timers = []

    def hook(out):
        if not timers and out.num_scheduled_tokens:
            daemon.signal(signal.SIGSTOP)
            timers.append(None)
        elif len(timers) == 1 and out.preempted_req_ids:
            timers.append(threading.Timer(0.5, daemon.signal, (signal.SIGCONT,)))  # within the 3 s timeout
            timers[-1].start()

    try:
        try:
            got = serve(a, reqs, before_worker=hook)
        finally:
            for t in timers[1:]:
                t.join()
            daemon.signal(signal.SIGCONT)
        assert a.preempted and len(timers) == 2
        assert got == {rid: ref.outputs[rid] for rid, _, _ in reqs}
        assert a.connector_stats["store_fence_waits"] >= 1
        assert a.connector_stats["store_refused_blocks"] == 0
        # What was copied is what the requests computed: B loads it (9 blocks a prompt).
        assert serve(b, [(rid, p, 1) for rid, p, _ in reqs]) == {rid: ref.outputs[rid][:1] for rid, _, _ in reqs}
        assert b.connector_stats["loaded_blocks"] == 27
        for rid, _, _ in reqs:
            for i in range(9):
                assert b.block_bytes(rid, i) == ref.block_bytes(rid, i), f"{rid} block {i}"
    finally:
        for e in (a, b, ref):
            e.close()


def test_long_prompts_are_stored_in_chunks_the_lease_cap_allows(model_dir):
    # A host tier of 160 pages with the default lease cap of half of it (80): a 100-block
    # prompt cannot be leased at once, but is stored 8 blocks a call.
    from kvtier_testing.daemon import Daemon

    with Daemon(page_bytes=64 << 10, pages=160) as d:
        p = prompt(100 * BLOCK + 5, 7)
        a = Engine(vllm_config(model_dir, d.socket, extra={"store_chunk_blocks": 8}, batched_tokens=4096), 256)
        b = Engine(vllm_config(model_dir, d.socket, batched_tokens=4096), 256)
        try:
            want = reference(model_dir, [("a", p, 2)])
            assert serve(a, [("a", p, 2)]) == want
            assert a.connector_stats["stored_blocks"] == 100
            assert serve(b, [("b", p, 2)]) == {"b": want["a"]}
            assert b.connector_stats["loaded_blocks"] == 100
        finally:
            a.close()
            b.close()


def test_with_an_eagle_drafter_the_last_hit_block_is_recomputed(model_dir, daemon):
    # vLLM drops the last block of its own prefix-cache hits when an EAGLE/MTP drafter
    # needs its hidden states (SpeculativeConfig.use_eagle_block_drop); a kvtier hit must
    # too. B's config carries vLLM's own SpeculativeConfig of an EAGLE drafter (the tiny
    # model as its draft model), which vLLM's Scheduler and the connector both read.
    p = prompt(6 * BLOCK + 3, 11)
    want = reference(model_dir, [("a", p, 2)])["a"]
    eagle = {"method": "eagle", "model": model_dir, "num_speculative_tokens": 2}
    a = Engine(vllm_config(model_dir, daemon.socket), 64)
    b = Engine(vllm_config(model_dir, daemon.socket, speculative=eagle), 64)
    try:
        assert serve(a, [("a", p, 2)]) == {"a": want}
        assert a.connector_stats["stored_blocks"] == 6
        spec = b.config.speculative_config
        assert type(spec).__name__ == "SpeculativeConfig" and spec.method == "eagle" and spec.use_eagle_block_drop()
        assert serve(b, [("b", p, 2)]) == {"b": want}
        assert b.connector_stats["hit_blocks"] == 5 and b.connector_stats["loaded_blocks"] == 5
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("algo,size", [("sha256", 32), ("xxhash", 16)])
def test_block_hashes_are_stored_as_vllm_makes_them(model_dir, daemon, algo, size):
    if algo == "xxhash":
        pytest.importorskip("xxhash")
    p = prompt(100, 8)
    a = Engine(vllm_config(model_dir, daemon.socket, hash_algo=algo), 64)
    b = Engine(vllm_config(model_dir, daemon.socket, hash_algo=algo), 64)
    try:
        serve(a, [("a", p, 2)])
        req = b.add("b", p, 2)
        assert {len(h) for h in req.block_hashes} == {size}
        b.run()
        assert b.connector_stats["loaded_blocks"] == 6
        with kvtier.Client(a.worker.get_handshake_metadata().groups[0].kvtier_layout(), daemon.socket, hash_bytes=size,
                           device="host-emulated") as c:
            assert c.lookup([bytes(h) for h in req.block_hashes[:6]]).matched == 6
    finally:
        a.close()
        b.close()


def fp8_config(model_dir, socket):
    """vllm_config with an fp8 KV cache, or the test skipped where vLLM refuses one on CPU."""
    try:
        return vllm_config(model_dir, socket, cache_dtype="fp8")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"this vLLM build refuses an fp8 KV cache on CPU: {e}")


def test_fp8_caches_are_stored_and_loaded_byte_exact(model_dir, daemon):
    cfg = fp8_config(model_dir, daemon.socket)
    p = prompt(200, 9)
    a = Engine(cfg, 64)
    b = Engine(vllm_config(model_dir, daemon.socket, cache_dtype="fp8"), 64)
    try:
        assert a.worker.get_handshake_metadata().groups[0].dtype == "fp8_e4m3"
        want = serve(a, [("x", p, 3)])
        assert serve(b, [("x", p, 3)]) == want
        assert b.connector_stats["loaded_blocks"] == 12
        for i in range(12):
            assert b.block_bytes("x", i) == a.block_bytes("x", i)
    finally:
        a.close()
        b.close()


def test_fp8_caches_of_other_kv_scales_or_encodings_never_share_blocks(model_dir, daemon, monkeypatch):
    # An fp8 cache's bytes are values divided by the layer's K/V scale (the checkpoint's):
    # the same bytes under other scales are other values. And ROCm's e4m3fnuz reads the same
    # bits as half of what e4m3fn does. Each is a namespace of its own: a miss, never a load.
    import types

    import torch
    from vllm.platforms import current_platform

    cfg = fp8_config(model_dir, daemon.socket)
    p = prompt(200, 10)
    a = Engine(cfg, 64)
    scaled_cfg = vllm_config(model_dir, daemon.socket, cache_dtype="fp8")
    for i in range(a.layers):  # the checkpoint's scales, as vLLM's attention layers hold them
        scaled_cfg.compilation_config.static_forward_context[a.names[i]] = types.SimpleNamespace(
            _k_scale_float=0.5, _v_scale_float=0.25)
    scaled = Engine(scaled_cfg, 64)
    try:
        want = serve(a, [("x", p, 3)])
        assert serve(scaled, [("x", p, 3)]) == want
        assert scaled.connector_stats["hit_blocks"] == 0 and scaled.connector_stats["stored_blocks"] == 12
        ours = a.worker.get_handshake_metadata().groups[0].model
        assert "|kvscales" in scaled.worker.get_handshake_metadata().groups[0].model and "|kvscales" not in ours
        monkeypatch.setattr(type(current_platform), "fp8_dtype", classmethod(lambda cls: torch.float8_e4m3fnuz))
        fnuz = Engine(vllm_config(model_dir, daemon.socket, cache_dtype="fp8"), 64)
        try:
            assert fnuz.worker.get_handshake_metadata().groups[0].model == ours + "|fp8e4m3fnuz"
            assert serve(fnuz, [("x", p, 3)]) == want
            assert fnuz.connector_stats["hit_blocks"] == 0
        finally:
            fnuz.close()
    finally:
        a.close()
        scaled.close()


def test_vllm_starts_and_serves_with_no_kvtierd(model_dir, tmp_path):
    p = prompt(120, 11)
    want = reference(model_dir, [("r", p, 4)])
    e = Engine(vllm_config(model_dir, str(tmp_path / "no-kvtierd.sock")), 64)  # the worker checks its cache offline
    try:
        assert serve(e, [("r", p, 4)]) == want
        assert e.connector_stats.get("stored_blocks", 0) == 0
    finally:
        e.close()


class _FailingLayer:
    """A KvLoad whose scatter of one layer fails (the device refused the copy)."""

    def __init__(self, load, layer: int, failed: list):
        self._load, self._layer, self._failed = load, layer, failed

    @property
    def loaded(self):
        return self._load.loaded

    def scatter(self, first, last, **kw):
        if first <= self._layer < last:
            self._failed.append(first)
            raise kvtier.InternalError(f"injected: layer {self._layer} not moved")
        self._load.scatter(first, last, **kw)

    def finish(self):
        self._load.finish()


@pytest.mark.parametrize("how", ["a layer fails to move", "the model does not wait"])
def test_a_layerwise_load_that_fails_midway_is_recomputed_and_nothing_computed_over_it_is_stored(
        model_dir, daemon, monkeypatch, how):
    # B's layer-wise load fails after the forward began: layer 1 of its blocks cannot be
    # moved (layer 0 was), or the model computes without waiting for its layers. vLLM hears
    # of it after the step, recomputes the request from its first loaded block, and the
    # blocks computed over the failed load are never stored; the recomputed ones are, and
    # C loads them and computes what vLLM alone computes.
    p = prompt(320, 23)
    want = reference(model_dir, [("a", p, 6), ("b", p, 6), ("c", p, 6)])
    a = Engine(vllm_config(model_dir, daemon.socket), 128)
    b = Engine(vllm_config(model_dir, daemon.socket, extra=LAYERWISE), 128)
    c = Engine(vllm_config(model_dir, daemon.socket, extra=LAYERWISE), 128)
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want["a"]}
        failed = []
        start_load = kvtier.Client.start_load
        if how == "a layer fails to move":
            def failing(self, view, chain, ids):
                load = start_load(self, view, chain, ids)
                return _FailingLayer(load, 1, failed) if not failed else load

            monkeypatch.setattr(kvtier.Client, "start_load", failing)
        else:
            monkeypatch.setattr(b.worker, "wait_for_layer_load", failed.append)
        got = serve(b, [("b", p, 6)])
        monkeypatch.undo()
        assert failed
        assert got == {"b": want["b"]}
        assert b.connector_stats["load_failed_blocks"] == 19
        assert b.connector_stats["stores_skipped_after_failed_load"] > 0
        assert b.connector_stats["stored_blocks"] == 20  # the recomputed prompt, once
        assert serve(c, [("c", p, 6)]) == {"c": want["c"]}
        assert c.connector_stats["loaded_blocks"] == 19
        assert c.connector_stats["layer_load_steps"] == 1
    finally:
        for e in (a, b, c):
            e.close()


def test_layerwise_loads_ask_vllm_for_piecewise_cuda_graphs_and_a_bad_value_is_named(model_dir, daemon):
    cls = KVConnectorFactory.get_connector_class(vllm_config(model_dir, daemon.socket).kv_transfer_config)
    assert cls is kvtier.vllm.KvtierConnector
    assert cls.requires_piecewise_for_cudagraph({"layerwise_loads": True}) is True
    assert cls.requires_piecewise_for_cudagraph({"layerwise_loads": "false"}) is False
    assert cls.requires_piecewise_for_cudagraph({}) is False
    with pytest.raises(kvtier.InvalidArgumentError, match="layerwise_loads"):
        Engine(vllm_config(model_dir, daemon.socket, extra={"layerwise_loads": "sometimes"}), 64)


def test_a_vllm_outside_the_supported_versions_is_refused_at_start_by_name(model_dir, daemon, monkeypatch):
    import vllm

    from kvtier.vllm.settings import SUPPORTED_VLLM

    assert ".".join(vllm.__version__.split(".")[:2]) in SUPPORTED_VLLM  # the installed one runs
    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(kvtier.FailedPreconditionError, match=r"supports vLLM 0\.32, 0\.33.*this is vLLM 0\.31\.2"):
        Engine(vllm_config(model_dir, daemon.socket), 64)
    e = Engine(vllm_config(model_dir, daemon.socket, extra={"allow_untested_vllm": True}), 64)
    e.close()


def test_vllm_knows_the_connector_by_name_through_kvtiers_plugin():
    # vLLM runs its general plugins in each process (the API server's too, where
    # MultiConnector looks its connectors' stats classes up by name).
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    assert KVConnectorFactory.get_connector_class_by_name("KvtierConnector") is kvtier.vllm.KvtierConnector
