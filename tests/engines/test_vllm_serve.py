"""Real `vllm serve` processes with and without the kvtier connector, through
kvtier_testing.vllm_e2e on a small geometry: outputs equal to the server without kvtier,
external prefix hits as vLLM's own metrics count them, preemption, and a kvtierd kill -9
and restart that no request notices. Timings are the benchmark's business, not asserted."""

from kvtier_testing import vllm_e2e


def test_vllm_servers_share_prefixes_through_kvtier_and_survive_its_restart():
    a = vllm_e2e.parse_args(["--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2",
                             "--prompt-tokens", "1024", "--shared-prefix-tokens", "896", "--requests", "3",
                             "--max-tokens", "8"])
    out = vllm_e2e.run_in_tempdir(a)
    assert out["errors"] == 0, out["error_messages"]
    assert out["outputs_equal"] and out["outputs_compared"] == 4 * 3, out["error_messages"]
    # Every prompt of B found its 896-token prefix (28 blocks) that A stored.
    assert out["prefix_tokens_hit"] == 3 * 896
    assert out["preempted_requests"] > 0
    assert out["cache_killed_during_requests"]
    assert out["prefix_tokens_hit_after_restart"] > 0
