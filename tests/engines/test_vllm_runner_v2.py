"""kvtier's worker side driven by Model Runner V2's own connector driver,
``vllm.v1.worker.gpu.kv_connector.ActiveKVConnector`` (the default model runner on GPUs
where Triton is), through vLLM's Scheduler: ``pre_forward`` starts same-step loads only when
the scheduler says ``has_sync_kv_loads``, ``post_forward`` runs after sampling and starts
asynchronous loads there, ``no_forward`` serves steps without tokens. Model Runner V2
itself needs Triton and a GPU (vLLM 0.32 on this CPU falls back to the V1 runner: "Model
Runner V2 requires Triton"), so the stand-in model of kvtier_testing.vllm_engine runs
between the driver's calls, in the order the runner makes them. Every run is compared
token for token with vLLM's scheduler without kvtier."""

import pytest

from kvtier_testing.vllm_engine import (Engine, prompt, reference, restart_before_the_load_of, serve,
                                       vllm_config)


def v2(model_dir, socket, num_blocks=128, **kw):
    return Engine(vllm_config(model_dir, socket, **kw), num_blocks, runner="v2")


def test_model_runner_v2s_driver_is_vllms_own_and_registers_the_caches(model_dir, daemon):
    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

    e = v2(model_dir, daemon.socket, 64)
    try:
        assert isinstance(e.active, ActiveKVConnector) and e.active.kv_connector is e.worker
        assert e.worker.get_handshake_metadata() is not None  # register_kv_caches came through the driver
    finally:
        e.close()


@pytest.mark.parametrize("layerwise", [False, True], ids=["whole", "layerwise"])
def test_a_prefix_one_instance_computed_is_loaded_exactly_by_another(model_dir, daemon, layerwise):
    p = prompt(300, 1)
    q = p[:260] + prompt(60, 2)  # 16 shared full blocks
    want = reference(model_dir, [("a", p, 8), ("b", q, 8)])
    a = v2(model_dir, daemon.socket)
    b = v2(model_dir, daemon.socket, extra={"layerwise_loads": True} if layerwise else None)
    try:
        assert serve(a, [("a", p, 8)]) == {"a": want["a"]}
        assert serve(b, [("b", q, 8)]) == {"b": want["b"]}
        assert b.connector_stats["loaded_blocks"] == 16 and b.connector_stats["load_failed_blocks"] == 0
        assert b.connector_stats["layer_load_steps"] == (1 if layerwise else 0)
        for i in range(16):
            assert b.block_bytes("b", i) == a.block_bytes("a", i)
    finally:
        a.close()
        b.close()


def test_a_failed_load_is_recomputed_and_nothing_computed_over_it_is_stored(model_dir, daemon):
    p = prompt(320, 4)
    want = reference(model_dir, [("x", p, 6)])["x"]
    a, b, c = (v2(model_dir, daemon.socket) for _ in range(3))
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want}
        hook, fired = restart_before_the_load_of(daemon, "b")
        assert serve(b, [("b", p, 6)], before_worker=hook) == {"b": want}
        assert fired and b.connector_stats["load_failed_blocks"] > 0
        assert b.connector_stats["stores_skipped_after_failed_load"] > 0
        assert b.connector_stats["stored_blocks"] == 20
        assert serve(c, [("c", p, 6)]) == {"c": want}
        assert c.connector_stats["loaded_blocks"] == 19
    finally:
        for e in (a, b, c):
            e.close()


def test_preempted_requests_load_again_and_generate_what_vllm_alone_does(model_dir, daemon):
    reqs = [(f"r{i}", prompt(160, 10 + i), 120) for i in range(3)]
    want = reference(model_dir, reqs)
    e = v2(model_dir, daemon.socket, 40)
    try:
        assert serve(e, reqs) == want
        assert e.preempted, "vLLM preempted nothing: the test needs a smaller KV budget"
        assert e.connector_stats["loaded_blocks"] > 0 and e.connector_stats["load_failed_blocks"] == 0
    finally:
        e.close()
